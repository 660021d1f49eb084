"""The adaptive batch size: the tracker's interval, the three controller
signals on synthetic trajectories (through the trainer's ``choose_prompts``),
bounds and buckets, the learning rate, checkpoint restore end to end, and
the experiment's ``--quick`` mode."""

import importlib.util
import json
import math
import os
import types

import numpy as np
import pytest
from scipy import stats

from cbs_jax import batch_law
from cbs_jax import config as config_lib
from cbs_jax import controller
from cbs_jax import metrics as metrics_lib
from cbs_jax import noise_tracker
from cbs_jax import stats as stats_lib
from cbs_jax import tasks
from cbs_jax import train
from cbs_jax.tasks import arithmetic
from configs import adaptive_batch
from tests import experiment_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIGNALS = controller.SIGNALS


# --------------------------------------------------------------- the interval


def test_interval_with_three_effective_rounds_keeps_its_coverage(monkeypatch):
  """decay 0.5: n_eff = 3 rounds, so the spread is estimated from 2 degrees of
  freedom. With the Student-t widening the interval covers the true B_noise
  at least at the normal's nominal 2 Phi(2) - 1 = 0.954 (it is conservative
  here: ~0.997); with the plain normal z = 2 it undercovers (~0.90, below
  0.93 by ~2 binomial SDs of 400 seeds)."""

  def coverage():
    covered = resolved = 0
    for seed in range(400):
      ema = noise_tracker.NoiseEMA(0.5)
      _feed(ema, np.random.default_rng(seed), 30, gsd=0.2)
      iv = ema.interval(2.0)
      resolved += iv["resolved"]
      covered += iv["resolved"] and iv["lo"] <= 500.0 <= iv["hi"]
    return resolved, covered / resolved

  resolved, widened = coverage()
  assert resolved >= 380 and widened >= 0.954
  monkeypatch.setattr(stats_lib, "t_quantile_like", lambda z, dof: z)
  _, plain = coverage()
  assert plain < 0.93 < widened


def _feed(ema, rng, n, b=500.0, gsd=0.5, K=16):
  """n per-round estimates with B_noise = b at K (all of it intra-prompt)."""
  T, G = [], []
  for _ in range(n):
    t, g = b * (1 + 0.3 * rng.standard_normal()), 1 + gsd * rng.standard_normal()
    ema.update(dict(trace_intra=t, trace_inter=0.0, g2=g), 16, K)
    T.append(t)
    G.append(g)
  return np.array(T), np.array(G)


def test_interval_is_the_fieller_set_of_the_weighted_moments():
  """Against an independent computation: weights decay^age, Kish's n_eff,
  weighted (co)variances, the Student-t quantile, and the Fieller set found
  by scanning r."""
  for seed, (n, decay, gsd) in enumerate([(40, 0.9, 0.5), (200, 0.99, 1.5), (12, 0.8, 0.3)]):
    rng = np.random.default_rng(seed)
    ema = noise_tracker.NoiseEMA(decay)
    T, G = _feed(ema, rng, n, gsd=gsd)
    iv = ema.interval(2.0)
    w = decay ** np.arange(n)[::-1]
    W = w.sum()
    n_eff = W**2 / np.sum(w**2)
    mt, mg = np.sum(w * T) / W, np.sum(w * G) / W
    k = n_eff / (n_eff - 1) / n_eff
    vt, vg = np.sum(w * (T - mt) ** 2) / W * k, np.sum(w * (G - mg) ** 2) / W * k
    c = np.sum(w * (T - mt) * (G - mg)) / W * k
    z = stats.t.ppf(stats.norm.cdf(2.0), n_eff - 1)
    assert iv["n_eff"] == pytest.approx(n_eff)
    assert iv["b_noise"] == pytest.approx(mt / mg)
    assert iv["resolved"] == (mg > z * math.sqrt(vg))
    assert iv["resolved"]
    r = np.linspace(0, 5 * mt / mg, 200_001)
    inside = r[(mt - r * mg) ** 2 <= z * z * (vt - 2 * r * c + r * r * vg)]
    step = r[1] - r[0]
    assert iv["lo"] == pytest.approx(max(inside[0], 0.0), abs=2 * step, rel=0.01)
    assert iv["hi"] == pytest.approx(inside[-1], abs=2 * step, rel=0.01)
    assert iv["hi"] - iv["b_noise"] > iv["b_noise"] - iv["lo"]  # skewed upward


def test_interval_unresolved_early_and_from_old_checkpoints():
  ema = noise_tracker.NoiseEMA(0.9)
  _feed(ema, np.random.default_rng(0), 2)
  iv = ema.interval()
  assert not iv["resolved"] and iv["lo"] == 0.0 and iv["hi"] == math.inf
  _feed(ema, np.random.default_rng(1), 30)
  assert ema.interval()["resolved"]
  old = {k: v for k, v in ema.state_dict().items() if not k.startswith("m_")}
  restored = noise_tracker.NoiseEMA(0.9)
  restored.load_state_dict(old)  # a checkpoint from before the moments were kept
  assert not restored.interval()["resolved"]
  assert restored.value() == pytest.approx(ema.value())


def test_interval_covers_a_fixed_b_noise_under_heavy_noise():
  """A per-round |G|^2 with an SD as large as its mean (the regime of a
  small batch): the interval still covers the true B_noise ~95% of the time."""
  covered = resolved = 0
  for seed in range(200):
    ema = noise_tracker.NoiseEMA(0.95)
    _feed(ema, np.random.default_rng(seed), 100, b=500.0, gsd=1.0)
    iv = ema.interval(2.0)
    resolved += iv["resolved"]
    covered += iv["resolved"] and iv["lo"] <= 500.0 <= iv["hi"]
  assert resolved >= 150
  assert covered / resolved >= 0.9


# --------------------------------------------------------------- the signals


def test_signal_interval_maps_each_signal():
  raw = dict(b_noise=1000.0, se=100.0, lo=800.0, hi=1300.0, resolved=True)
  adam = dict(b_noise=50.0, se=5.0, lo=40.0, hi=65.0, resolved=True)
  s = controller.signal_interval("b_noise", raw, adam)
  assert (s["value"], s["lo"], s["hi"], s["se"]) == (1000.0, 800.0, 1300.0, 100.0)
  s = controller.signal_interval("b_noise_adam", raw, adam)
  assert (s["value"], s["lo"], s["hi"]) == (50.0, 40.0, 65.0)
  s = controller.signal_interval("b_crit", raw, adam, b_crit_ratio=0.25)
  assert (s["value"], s["lo"], s["hi"], s["se"]) == (250.0, 200.0, 325.0, 25.0)
  unres = dict(b_noise=math.nan, se=math.nan, lo=0.0, hi=math.inf, resolved=False)
  s = controller.signal_interval("b_crit", unres, None, b_crit_ratio=0.25)
  assert not s["resolved"] and s["hi"] == math.inf and s["lo"] == 0.0
  with pytest.raises(ValueError, match="b_crit_ratio"):
    controller.signal_interval("b_crit", raw, adam)
  with pytest.raises(ValueError, match="adaptive_signal='nope'"):
    controller.signal_interval("nope", raw, adam)


def test_calibration_from_a_fits_file():
  fit = dict(B_crit=2000.0, B_crit_lo=1500.0, B_crit_hi=3000.0, resolved=True)
  doc = {
      "on": {"0.54": fit},
      "noise": [
          dict(b_noise=8000.0, b_noise_se=1000.0),
          dict(b_noise=12000.0, b_noise_se=2000.0),
          dict(b_noise=None, b_noise_se=None),
      ],
  }
  cal = batch_law.calibration_from_fits(doc, 0.54)
  w1, w2 = 1 / 1000.0**2, 1 / 2000.0**2
  b = (8000 * w1 + 12000 * w2) / (w1 + w2)
  se = 1 / math.sqrt(w1 + w2)
  assert cal["b_noise"] == pytest.approx(b) and cal["b_noise_se"] == pytest.approx(se)
  assert cal["ratio"] == pytest.approx(2000 / b)
  assert cal["lo"] == pytest.approx(1500 / (b + 2 * se))
  assert cal["hi"] == pytest.approx(3000 / (b - 2 * se))
  assert cal["resolved"]
  with pytest.raises(ValueError, match="target 0.58"):
    batch_law.calibration_from_fits(doc, 0.58)
  with pytest.raises(ValueError, match="no fit"):
    batch_law.calibration_from_fits({"on": {"0.54": {"error": "too few"}}}, 0.54)


def test_config_ratio_is_the_committed_studys(tmp_path):
  with open(os.path.join(ROOT, adaptive_batch.B_CRIT_FITS)) as f:
    cal = batch_law.calibration_from_fits(json.load(f), 0.54)
  assert cal["resolved"]
  assert adaptive_batch.b_crit_calibration()["ratio"] == cal["ratio"]
  # the committed study's B_crit / B_noise at 0.54 (its rerun from a clean
  # commit, 62bd3d8): a changed file shows up here as well as in its diff
  assert adaptive_batch.b_crit_calibration()["ratio"] == pytest.approx(
      3461.292473 / 4573.549196, rel=1e-6
  )
  assert adaptive_batch.get_config("b_crit").batch.adaptive_b_crit_ratio == cal["ratio"]
  with pytest.raises(FileNotFoundError, match="batch_law_on_policy_fits.json"):
    adaptive_batch.b_crit_calibration(str(tmp_path))


# ------------------------------------------- synthetic trajectories, trainer path


def _config(signal, **over):
  """An adaptive config aiming at N = the signal (objective "steps"; the
  time objective has its own tests in tests/test_time_optimal.py)."""
  c = config_lib.base_config()
  c.batch.schedule = "adaptive"
  c.batch.adaptive_objective = "steps"
  c.batch.adaptive_signal = signal
  c.batch.rollouts_per_prompt = 16
  c.batch.num_prompts = 16
  c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = 4, 512
  c.batch.adaptive_b_crit_ratio = 0.25
  c.optim.lr, c.optim.ref_batch = 3e-4, 256
  for k, v in over.items():
    section, field = k.split("__")
    c[section][field] = v
  config_lib.validate(c)
  return c


def simulate(c, raw_b, adam_b, rounds, seed, noise_frac=0.3, g_sd=None):
  """Drive the trainer's ``choose_prompts`` with both trackers fed simulated
  per-round estimates (trace_intra, trace_inter, g2) around B_noise
  trajectories ``raw_b(t)``, ``adam_b(t)`` (rollouts at K): i.i.d. uniform
  +-``noise_frac`` on every component, or Gaussian |G|^2 with SD ``g_sd``."""
  rng = np.random.default_rng(seed)
  K = c.batch.rollouts_per_prompt
  run = types.SimpleNamespace(
      noise=noise_tracker.NoiseEMA(c.noise.ema_decay),
      noise_adam=noise_tracker.NoiseEMA(c.noise.ema_decay),
      controller=train.make_controller(c),
  )
  out = []
  for t in range(rounds):
    P, fields = train.choose_prompts(c, run, t)
    out.append((P, fields))
    for ema, b in ((run.noise, raw_b(t)), (run.noise_adam, adam_b(t))):
      u = lambda: 1 + noise_frac * rng.uniform(-1, 1)
      g = 1 + g_sd * rng.standard_normal() if g_sd else u()
      # B_noise = (trI + K trB) / G2 = b at the means: a third of it inter-prompt
      ema.update(dict(trace_intra=b * 2 / 3 * u(), trace_inter=b / 3 / K * u(), g2=g), P, K)
  return out, run


def _changes(sizes):
  return sum(a != b for a, b in zip(sizes, sizes[1:]))


FLAT_SETTINGS = {  # (ema decay, rounds between decisions)
    "experiment": (adaptive_batch.get_config("b_noise").noise.ema_decay, adaptive_batch.EVERY),
    "base_config": (
        config_lib.base_config().noise.ema_decay,
        config_lib.base_config().batch.adaptive_every,
    ),
    "every_round": (0.9, 1),
}


@pytest.mark.parametrize("signal", SIGNALS)
@pytest.mark.parametrize("setting", sorted(FLAT_SETTINGS))
def test_noisy_flat_signal_does_not_make_n_oscillate(signal, setting):
  """200 rounds of i.i.d. +-30% noise on every component of the per-round
  estimates, B_noise flat at the starting bucket and at a bucket boundary
  (sqrt2 x it); the tracker's real interval (NoiseEMA): at most one change,
  and the unread tracker runs away to show it is not the one read."""
  decay, every = FLAT_SETTINGS[setting]
  c = _config(signal, noise__ema_decay=decay, batch__adaptive_every=every)
  scale = c.batch.adaptive_b_crit_ratio if signal == "b_crit" else 1.0
  start = c.batch.num_prompts * c.batch.rollouts_per_prompt / scale  # signal at P = 16
  wild = lambda t: start * 4 ** (t / 50)
  for level in (start, start * math.sqrt(2)):
    flat = lambda t: level
    for seed in range(6):
      raw, adam = (wild, flat) if signal == "b_noise_adam" else (flat, wild)
      out, run = simulate(c, raw, adam, 200, seed)
      sizes = [P for P, _ in out]
      assert _changes(sizes) <= 1, (signal, setting, level, seed, sorted(set(sizes)))
      assert set(sizes) <= set(run.controller.buckets)


@pytest.mark.parametrize("signal", SIGNALS)
def test_flat_signal_with_a_small_batchs_noise_does_not_thrash(signal):
  """|G|^2 per round Gaussian with an SD five times its mean (one small
  batch's estimate is often negative), the experiment's settings: no
  oscillation over 200 rounds."""
  base = adaptive_batch.get_config("b_noise")
  c = _config(
      signal, noise__ema_decay=base.noise.ema_decay, batch__adaptive_every=base.batch.adaptive_every
  )
  scale = c.batch.adaptive_b_crit_ratio if signal == "b_crit" else 1.0
  flat = lambda t: 256.0 / scale
  for seed in range(8):
    out, _ = simulate(c, flat, flat, 200, seed, g_sd=5.0)
    assert _changes([P for P, _ in out]) <= 1, seed


@pytest.mark.parametrize("signal", SIGNALS)
def test_rising_signal_raises_n_within_bounds_and_buckets(signal):
  c = _config(signal, noise__ema_decay=0.95, batch__adaptive_every=10)
  scale = c.batch.adaptive_b_crit_ratio if signal == "b_crit" else 1.0
  rising = lambda t: 256.0 / scale * 2 ** (t / 40)  # 1000x over 400 rounds
  flat = lambda t: 256.0 / scale
  raw, adam = (flat, rising) if signal == "b_noise_adam" else (rising, flat)
  out, run = simulate(c, raw, adam, 400, seed=1)
  sizes = [P for P, _ in out]
  assert sizes[-1] == 512 and sizes[0] == 16  # rose to the upper bound
  assert all(b >= a for a, b in zip(sizes, sizes[1:]))  # never back down
  assert set(sizes) <= set(run.controller.buckets) == {4, 8, 16, 32, 64, 128, 256, 512}
  # the N logged follows the signal: the decision rounds' moves go towards it
  moved = [(f["adaptive/target_batch_size"], P) for P, f in out if f["adaptive/decision"]]
  assert all(P * 16 <= 2 * t or P == 512 for t, P in moved if t == t)
  # the same noise with the rise on neither tracker: N stays
  still, _ = simulate(c, flat, flat, 400, seed=1)
  assert {P for P, _ in still} == {16}


def test_falling_and_extreme_signals_stay_on_the_buckets():
  c = _config("b_noise", noise__ema_decay=0.9, batch__adaptive_every=5)
  out, run = simulate(c, lambda t: 256.0 * 2 ** (-t / 20), lambda t: 1.0, 300, seed=3)
  sizes = [P for P, _ in out]
  assert sizes[-1] == 4 and all(b <= a for a, b in zip(sizes, sizes[1:]))
  out, _ = simulate(c, lambda t: 1e9, lambda t: 1.0, 60, seed=3)
  assert {P for P, _ in out} == {16, 512}  # straight to the upper bound
  assert set(sizes) <= set(run.controller.buckets)


def test_logged_fields_follow_the_tracker_and_the_lr_rule():
  """The adaptive/* fields against an independent computation: the ratio of
  decayed sums of the fed estimates (x the b_crit ratio), the lr of the sqrt
  rule at the chosen rollouts per update."""
  c = _config("b_crit", noise__ema_decay=0.9, batch__adaptive_every=5)
  rng = np.random.default_rng(0)
  run = types.SimpleNamespace(
      noise=noise_tracker.NoiseEMA(0.9),
      noise_adam=noise_tracker.NoiseEMA(0.9),
      controller=train.make_controller(c),
  )
  T, G = [], []
  for t in range(60):
    P, f = train.choose_prompts(c, run, t)
    if len(T) >= 3:
      w = 0.9 ** np.arange(len(T))[::-1]
      assert f["adaptive/signal"] == pytest.approx(0.25 * np.dot(w, T) / np.dot(w, G))
    assert f["adaptive/prompts"] == P and f["adaptive/batch_size"] == 16 * P
    assert f["adaptive/lr"] == pytest.approx(3e-4 * math.sqrt(16 * P / 256))
    assert f["adaptive/decision"] == (t > 0 and t % 5 == 0)
    assert run.controller.prompts == P
    ti, tb, g = 4000 * rng.uniform(0.7, 1.3), 100 * rng.uniform(0.7, 1.3), rng.uniform(0.7, 1.3)
    run.noise.update(dict(trace_intra=ti, trace_inter=tb, g2=g), P, 16)
    run.noise_adam.update(dict(trace_intra=1.0, trace_inter=0.0, g2=1.0), P, 16)
    T.append(ti + 16 * tb)
    G.append(g)


# --------------------------------------------------------------- config, state


def test_config_checks_name_the_adaptive_fields():
  def bad(match, **over):
    c = config_lib.base_config()
    c.batch.schedule = "adaptive"
    for k, v in over.items():
      section, field = k.split("__")
      c[section][field] = v
    with pytest.raises(ValueError, match=match):
      config_lib.validate(c)

  bad(r"config\.batch\.num_prompts=24 .*not one of its buckets", batch__num_prompts=24)
  bad(r"config\.batch\.num_prompts=4 .*adaptive_min_prompts=8", batch__num_prompts=4)
  bad(r"config\.batch\.adaptive_b_crit_ratio > 0", batch__adaptive_signal="b_crit")
  bad(r"config\.batch\.adaptive_hysteresis must be >= 1", batch__adaptive_hysteresis=float("nan"))
  bad(r"config\.batch\.adaptive_factor must be finite", batch__adaptive_factor=float("inf"))
  bad(r"config\.batch\.adaptive_b_crit_ratio must be >= 0", batch__adaptive_b_crit_ratio=-1.0)
  for v in adaptive_batch.VARIANTS:
    config_lib.validate(adaptive_batch.get_config(v))
  with pytest.raises(ValueError, match="unknown adaptive_batch variant"):
    adaptive_batch.get_config("b_simple")


def test_controller_state_refuses_other_buckets_and_bad_arguments():
  ctl = controller.AdaptiveBatch(16, 8, 64, prompts=16)
  state = dict(ctl.state_dict(), prompts=32, changes=2)
  ctl.load_state_dict(state)
  assert (ctl.prompts, ctl.changes) == (32, 2)
  with pytest.raises(ValueError, match="differ from this config's"):
    controller.AdaptiveBatch(16, 8, 128).load_state_dict(state)
  with pytest.raises(ValueError, match="prompts=24 is not a bucket"):
    ctl.load_state_dict(dict(prompts=24))
  with pytest.raises(ValueError, match="starting prompts=12"):
    controller.AdaptiveBatch(16, 8, 64, prompts=12)
  with pytest.raises(ValueError, match="every=0"):
    controller.AdaptiveBatch(16, 8, 64, every=0)
  with pytest.raises(ValueError, match="factor"):
    controller.AdaptiveBatch(16, 8, 64, factor=float("nan"))


# --------------------------------------------------------------- end to end


class OddFirstDigit(arithmetic.ArithmeticTask):
  """Reward 1 iff the completion starts with an odd digit: about half of every
  group succeeds, so |G|^2 is resolved within a few rounds."""

  enumerable = False

  def verify(self, problem, completion):
    return float(completion[:1] in "13579")


class Interrupted(Exception):
  pass


def _tiny(base_dir, rounds):
  c = config_lib.base_config()
  c.task.name = "odd_first_digit"
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every, c.sft.base_dir = 10, 16, 0, base_dir
  c.batch.rollouts_per_prompt, c.batch.num_prompts = 8, 4
  c.batch.schedule = "adaptive"
  c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = 4, 8  # two shapes compile
  c.batch.adaptive_every, c.batch.adaptive_factor = 2, 20.0
  c.batch.adaptive_hysteresis, c.batch.adaptive_z = 1.0, 1.0
  c.batch.adaptive_objective = "steps"  # deterministic choices (no measured round times)
  c.batch.adaptive_switch_warmup = 0  # the lr jumps to the rule's (asserted below)
  c.noise.ema_decay = 0.7
  c.optim.lr, c.optim.ref_batch = 1e-4, 64
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = rounds, rounds, 32
  c.train.checkpoint_every = 5
  c.train.progress = False
  return c


@pytest.mark.slow
def test_resumed_adaptive_run_makes_the_same_choices(monkeypatch, tmp_path):
  """Uninterrupted vs killed after round 7 (last checkpoint: round 5, after
  the controller moved; round 6 is not a decision round, so only the
  restored controller state can give its N) and resumed: identical
  adaptive/* and tracker rows, batch sizes and learning rates."""
  monkeypatch.setitem(tasks.TASKS, "odd_first_digit", OddFirstDigit)
  base = str(tmp_path / "sft_base")  # one SFT base for both runs
  c = _tiny(base, 8)
  train.train_and_evaluate(c, str(tmp_path / "full"))
  full = metrics_lib.read_jsonl(str(tmp_path / "full" / "metrics.jsonl"))[1:]

  log_row = train.log_row

  def dies_after_round_7(trainer, row, bar):
    log_row(trainer, row, bar)
    if row["round"] == 7:
      raise Interrupted

  monkeypatch.setattr(train, "log_row", dies_after_round_7)
  with pytest.raises(Interrupted):
    train.train_and_evaluate(c, str(tmp_path / "cut"))
  monkeypatch.setattr(train, "log_row", log_row)
  train.train_and_evaluate(c, str(tmp_path / "cut"))
  cut = metrics_lib.read_jsonl(str(tmp_path / "cut" / "metrics.jsonl"))[1:]

  keys = lambda r: {
      k: v
      for k, v in r.items()
      if k.startswith(("adaptive/", "noise_ema/"))
      or k in ("round", "batch_size", "lr", "rollouts_seen")
  }
  assert [r["round"] for r in cut] == list(range(1, 9))
  assert [keys(r) for r in cut] == [keys(r) for r in full]
  sizes = [r["batch_size"] for r in full]
  assert set(sizes) == {32, 64} and sizes[0] == 32
  assert sizes[4] == 64 and not full[5]["adaptive/decision"], sizes  # moved before round 5
  for i, r in enumerate(full):  # lr: sqrt rule from the chosen N, and the warmup
    assert r["adaptive/lr"] == pytest.approx(1e-4 * math.sqrt(r["batch_size"] / 64))
    assert r["lr"] == pytest.approx(r["adaptive/lr"] * min(1.0, (i + 1) / 5), rel=1e-6)


# --------------------------------------------------------------- the experiment

# experiments/adaptive_batch.py --quick runs in tests/test_experiments_cli.py's
# batch-law chain (every signal, after the quick on-policy sweep it reads back).


def test_experiment_help_and_bad_flags(monkeypatch, capsys, tmp_path):
  monkeypatch.chdir(tmp_path)  # run from another directory, as from the command line
  main = experiment_scripts.load("adaptive_batch").main
  with pytest.raises(SystemExit) as done:
    main(["--help"])
  out = capsys.readouterr()
  assert done.value.code == 0, out.err
  for flag in (
      "--root",
      "--on_root",
      "--out",
      "--throughput",
      "--fits",
      "--signals",
      "--seeds",
      "--small_n",
      "--large_n",
      "--workers",
      "--quick",
  ):
    assert flag in out.out, flag
  with pytest.raises(SystemExit) as done:
    main(["--signals=b_simple"])
  err = capsys.readouterr().err
  assert done.value.code == 2 and "--signals: unknown ['b_simple']" in err, err
  assert not list(tmp_path.iterdir())  # nothing written


def _experiment_module():
  """experiments/adaptive_batch.py imported as a module (it is a script)."""
  path = os.path.join(ROOT, "experiments", "adaptive_batch.py")
  spec = importlib.util.spec_from_file_location("adaptive_batch_experiment", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _naive_ratio_interval(num, den, level, n_boot, rng):
  """Percentile interval of mean(num*) / mean(den*) over independent
  resamples of each arm (a plain loop)."""
  r = [
      np.mean(rng.choice(num, len(num))) / np.mean(rng.choice(den, len(den))) for _ in range(n_boot)
  ]
  return np.quantile(r, [(1 - level) / 2, (1 + level) / 2])


def test_experiment_ratio_interval_is_an_unpaired_percentile_bootstrap():
  exp = _experiment_module()
  num, den = [310.0, 270.0, 355.0], [200.0, 260.0, 240.0, 215.0]
  r, lo, hi = stats_lib.ratio_of_means_interval(num, den, level=0.9, n_boot=20000, seed=3)
  assert r == pytest.approx(np.mean(num) / np.mean(den))
  n_lo, n_hi = _naive_ratio_interval(num, den, 0.9, 20000, np.random.default_rng(0))
  assert lo == pytest.approx(n_lo, rel=0.02) and hi == pytest.approx(n_hi, rel=0.02)
  assert stats_lib.ratio_of_means_interval(num, den, seed=3) == stats_lib.ratio_of_means_interval(
      num, den, seed=3
  )
  assert stats_lib.ratio_of_means_interval(num, [200.0, None]) == (None, None, None)
  assert stats_lib.ratio_of_means_interval(num, [0.0, 10.0]) == (None, None, None)
  assert stats_lib.ratio_of_means_interval([], den) == (None, None, None)
