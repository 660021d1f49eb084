"""The trainer end to end: main.py, resume, learning, drift, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from cbs_jax import config as config_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import run_setup
from cbs_jax import tasks
from cbs_jax import train
from cbs_jax.tasks import arithmetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_main(workdir, *overrides, config="configs/default.py:smoke"):
  cmd = [
      sys.executable,
      "-m",
      "cbs_jax.main",
      f"--config={config}",
      f"--workdir={workdir}",
      *overrides,
  ]
  return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)


def listing(d):
  out = {}
  for base, _, files in os.walk(d):
    for f in files:
      p = os.path.join(base, f)
      out[os.path.relpath(p, d)] = os.path.getsize(p)
  return out


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
  wd = str(tmp_path_factory.mktemp("smoke"))
  r = run_main(wd)
  assert r.returncode == 0, r.stderr[-3000:]
  return wd, r


@pytest.mark.slow
def test_main_writes_metrics_checkpoint_and_resumes(smoke_run):
  wd, r = smoke_run
  rows = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))
  assert [row["round"] for row in rows] == [0, 1, 2, 3, 4]
  for key in (
      "reward_mean",
      "loss",
      "entropy",
      "lr",
      "batch_size",
      "gen_seconds",
      "update_seconds",
      "tokens_per_s",
      "rollouts_seen",
      "kappa_k3",
      "noise_split/g2",
      "noise_ema/trace_intra",
  ):
    assert key in rows[1], key
  assert "eval_pass_rate" in rows[0] and "eval_pass_rate" in rows[2]
  assert sorted(os.listdir(os.path.join(wd, "checkpoints")), key=int)[-1] == "4"
  assert os.listdir(os.path.join(wd, "tb"))
  summary = json.load(open(os.path.join(wd, "summary.json")))
  assert summary["rounds"] == 4 and summary["rollouts_seen"] == 4 * 16
  # second call with more rounds resumes at round 4: no row duplicated or lost
  r2 = run_main(wd, "--config.train.num_rounds=6")
  assert r2.returncode == 0, r2.stderr[-3000:]
  rows2 = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))
  assert [row["round"] for row in rows2] == [0, 1, 2, 3, 4, 5, 6]
  assert rows2[:5] == rows
  assert json.load(open(os.path.join(wd, "summary.json")))["rollouts_seen"] == 6 * 16


@pytest.mark.slow
def test_on_policy_update_has_unit_ratios_zero_kappa_no_clipping(smoke_run):
  wd, _ = smoke_run
  for row in metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))[1:5]:
    assert row["num_updates"] == 1
    assert row["ratio_min"] == 1.0 and row["ratio_max"] == 1.0
    assert row["kappa_k1"] == 0.0 and row["kappa_k3"] == 0.0
    assert row["clip_frac_low"] == 0.0 and row["clip_frac_high"] == 0.0


@pytest.mark.slow
def test_checkpoint_of_another_model_shape_is_refused_and_kept(smoke_run):
  wd, _ = smoke_run
  before = listing(os.path.join(wd, "checkpoints"))
  r = run_main(wd, "--config.model.d_model=32")
  assert r.returncode != 0
  assert "model.d_model" in r.stderr and "different model" in r.stderr
  assert listing(os.path.join(wd, "checkpoints")) == before


class FirstDigitOne(arithmetic.ArithmeticTask):
  """Reward 1 iff the completion starts with '1': learnable in a few updates."""

  enumerable = False  # its accepted set is not arithmetic's

  def verify(self, problem, completion):
    return float(completion.startswith("1"))


@pytest.fixture
def easy_task(monkeypatch):
  monkeypatch.setitem(tasks.TASKS, "first_digit_one", FirstDigitOne)


def tiny_config(**over):
  c = config_lib.base_config()
  c.task.name = "first_digit_one"
  c.model.d_model, c.model.d_ff = 32, 64
  c.sft.steps, c.sft.batch_size, c.sft.eval_every = 10, 16, 0
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 8, 8
  c.optim.lr, c.optim.ref_batch = 1e-3, 64
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 12, 12, 128
  c.train.progress = False
  for k, v in over.items():
    section, field = k.split("__")
    c[section][field] = v
  return c


def test_tiny_run_on_an_easy_task_raises_reward(easy_task, tmp_path):
  s = train.train_and_evaluate(tiny_config(), str(tmp_path))
  assert s["final_pass_rate"] >= s["base_pass_rate"] + 0.3, s


@pytest.mark.slow
def test_reuse_makes_kappa_positive_and_growing(easy_task, tmp_path):
  c = tiny_config(
      batch__num_minibatches=2, batch__num_epochs=2, train__num_rounds=6, optim__lr=3e-3
  )
  train.train_and_evaluate(c, str(tmp_path))
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))[1:]
  kappa = np.array([r["kappa_k3_by_update"] for r in rows])  # rounds x 4 updates
  assert kappa.shape == (6, 4)
  assert np.all(kappa[:, 0] == 0.0)  # the first update of each round is on-policy
  assert np.all(kappa[:, 1:] > 0.0)
  mean = kappa.mean(axis=0)
  assert mean[3] > mean[1], mean  # later updates drift further


@pytest.mark.slow
def test_heldout_kappa_has_no_jump_at_the_epoch_boundary(tmp_path):
  """kappa on the probe (rollouts no update is fitted to) at the first update
  of the second epoch follows the first epoch's trend (a power law in the
  update index fitted on updates 1-3); kappa on the update's own minibatch is
  the biased one (it was fitted to at update 0)."""
  c = config_lib.base_config()
  c.task.kwargs.max_digits = 1
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.lr, c.sft.batch_size, c.sft.eval_every = 150, 1e-2, 64, 0
  c.sft.label_noise = 0.3
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 16, 8
  c.batch.num_minibatches, c.batch.num_epochs = 4, 2
  c.optim.lr, c.optim.ref_batch, c.optim.warmup_steps = 3e-3, 32, 0
  c.drift.probe_prompts = 16
  c.noise.split_every = 0
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 4, 0, 32
  c.train.eval_sampled, c.train.progress = False, False
  train.train_and_evaluate(c, str(tmp_path))
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))[1:]
  held = np.array([r["heldout_kappa_exact_by_update"] for r in rows])  # rounds x 8
  assert held.shape == (4, 8) and np.all(held[:, 0] == 0.0) and np.all(held[:, 1:] > 0)
  k3 = np.array([r["heldout_kappa_k3_by_update"] for r in rows])
  assert np.corrcoef(held[:, 1:].ravel(), k3[:, 1:].ravel())[0, 1] > 0.8  # same drift
  for kappa in held:
    j = np.arange(1, 4)
    slope, icpt = np.polyfit(np.log(j), np.log(kappa[1:4]), 1)
    predicted = np.exp(icpt + slope * np.log(4.0))
    assert 0.5 < kappa[4] / predicted < 2.0, (kappa, predicted)


BAD_CONFIGS = [
    ("--config.rl.clip_eps=10.0", "clip_eps"),  # unknown field
    ("--config.batch.num_prompts=abc", "num_prompts"),  # wrong type
    ("--config.optim.lr=-0.1", "optim.lr"),  # negative learning rate
    ("--config.batch.rollouts_per_prompt=1", "rollouts_per_prompt"),  # K < 2 for grpo
    ("--config.batch.num_minibatches=3", "num_minibatches"),  # P*K not divisible
    ("--config.rl.clip_eps_high=0", "clip_eps_high"),  # clip_eps <= 0
    ("--config.model.num_heads=3", "num_heads"),  # heads not dividing width
    ("--config.rl.loss=ppo2", "rl.loss"),  # unknown choice
]


@pytest.mark.slow
@pytest.mark.parametrize("flag,field", BAD_CONFIGS)
def test_bad_config_is_an_error_naming_the_field(flag, field, tmp_path):
  r = run_main(str(tmp_path / "w"), flag)
  assert r.returncode != 0
  assert field in r.stderr, r.stderr[-2000:]
  # nothing was written: validation happens before anything compiles or saves
  assert not os.path.exists(tmp_path / "w" / "checkpoints")


def test_validate_checks_ranges_in_process():
  c = config_lib.base_config()
  c.batch.staleness = -1
  with pytest.raises(ValueError, match="batch.staleness"):
    config_lib.validate(c)


def test_config_get_path_reads_a_field_and_names_a_missing_one():
  c = config_lib.base_config()
  c.batch.num_prompts, c.task.kwargs.ops = 12, "+*"
  assert config_lib.get_path(c, "batch.num_prompts") == 12
  assert config_lib.get_path(c, "task.kwargs.ops") == "+*"
  assert config_lib.get_path(c, "seed") == 0
  assert config_lib.get_path(c, "rl") is c.rl  # a section is a value too
  node, leaf = config_lib.parent_and_leaf(c, "task.kwargs.max_digits")
  assert node is c.task.kwargs and leaf == "max_digits"
  with pytest.raises(
      ValueError, match=r"'batch\.num_promts' \('num_promts' is not a field " r"of batch;"
  ):
    config_lib.get_path(c, "batch.num_promts")
  with pytest.raises(
      ValueError, match=r"'nope\.lr' \('nope' is not a field of the config " r"root;"
  ):
    config_lib.get_path(c, "nope.lr")
  with pytest.raises(ValueError, match=r"'seed\.x' \('x' is not a field of seed;"):
    config_lib.get_path(c, "seed.x")  # below a leaf


@pytest.mark.slow
def test_measure_tool_pools_batches_at_a_checkpoint(smoke_run):
  from cbs_jax import measure

  wd, _ = smoke_run
  config = __import__("configs.default", fromlist=["x"]).get_config("smoke")
  setup = run_setup.prepare(config)
  graphdef, params, rnd = measure.load_policy(config, wd, setup)
  assert rnd == json.load(open(os.path.join(wd, "summary.json")))["rounds"]  # the latest
  res = measure.measure(
      config, graphdef, params, setup, P=4, K=4, M=3, chunk_prompts=2, progress=False
  )
  assert res["exact"].n_batches == 3 and res["split"].n_batches == 3
  assert 1.0 <= res["completion_len"] <= setup.layout.completion_len  # a mean of lengths
  for s in (res["exact"], res["split"]):
    assert np.isfinite(s.trace_intra) and np.isfinite(s.g2)
    # a scale is reported only where G2 is significantly positive
    assert s.g2_positive == np.isfinite(s.b_noise)
  assert set(res["groups"]) <= {"embeddings", "attention", "mlp", "norms", "head"}
  table = measure.format_table(res)
  assert "trace_intra" in table and "by parameter group" in table
  with pytest.raises(ValueError, match="batches=1"):
    measure.measure(config, graphdef, params, setup, P=4, K=4, M=1, progress=False)


class OddFirstDigit(arithmetic.ArithmeticTask):
  """Reward 1 iff the completion starts with an odd digit: about half the
  rollouts of every group succeed, so the gradient signal is resolved early."""

  enumerable = False  # its accepted set is not arithmetic's

  def verify(self, problem, completion):
    return float(completion[:1] in "13579")


@pytest.mark.slow
def test_adaptive_batch_follows_the_tracker_within_buckets(monkeypatch, tmp_path):
  from cbs_jax import controller
  from cbs_jax import noise_tracker

  monkeypatch.setitem(tasks.TASKS, "first_digit_one", OddFirstDigit)
  c = tiny_config(train__num_rounds=12, train__eval_every=12, optim__lr=1e-4)
  c.batch.schedule = "adaptive"
  c.batch.adaptive_objective = "steps"  # N = the signal (the time objective: test_time_optimal.py)
  c.batch.adaptive_switch_warmup = 0  # the lr jumps to the rule's rate (asserted below)
  c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = 4, 16
  c.batch.adaptive_every = 2
  c.batch.adaptive_factor = 1.0
  c.batch.adaptive_hysteresis, c.batch.adaptive_z = 1.0, 0.5
  c.batch.num_prompts = 4
  c.noise.ema_decay = 0.5
  train.train_and_evaluate(c, str(tmp_path))
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))[1:]
  sizes = [r["batch_size"] for r in rows]
  # replay an independent tracker + controller on the split estimates the run logged
  ema = noise_tracker.NoiseEMA(0.5)
  ref = controller.AdaptiveBatch(8, 4, 16, 1.0, 2, prompts=4, hysteresis=1.0)
  expected = []
  for i, r in enumerate(rows):
    P = ref.update(i, ema.interval(0.5))
    expected.append(8 * P)
    ema.update(
        {k: r[f"noise_split/{k}"] for k in ("trace_intra", "trace_inter", "g2")},
        P // c.batch.num_minibatches,
        8,
    )
  assert sizes == expected
  assert set(sizes) <= {32, 64, 128}
  # the lr follows the sqrt rule from the rollouts per update (and the warmup)
  for i, r in enumerate(rows):
    assert r["lr"] == pytest.approx(
        1e-4 * np.sqrt(r["batch_size"] / 64) * min(1.0, (i + 1) / 5), rel=1e-6
    )


@pytest.mark.slow
def test_ppo_with_kl_penalty_runs_end_to_end(tmp_path):
  r = run_main(str(tmp_path), "--config.rl.kl_beta=0.1", config="configs/arithmetic_ppo.py:smoke")
  assert r.returncode == 0, r.stderr[-3000:]
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))[1:]
  assert len(rows) == 4
  assert all(np.isfinite(row["loss"]) and row["skipped_updates"] == 0 for row in rows)


@pytest.mark.slow
def test_exact_noise_by_ghost_matches_vmap_in_the_trainer(easy_task, tmp_path):
  """``noise.exact_method="ghost"`` (one forward + backward, Gram sums) logs
  the same exact per-rollout noise rows and per-update drift traces as the
  vmap path on the same run (same seed: same rollouts and updates)."""
  rows = {}
  for method in ("vmap", "ghost"):
    c = tiny_config(
        batch__num_minibatches=2,
        batch__num_epochs=2,
        train__num_rounds=2,
        noise__exact_every=1,
        noise__drift_every=1,
        noise__chunk_prompts=2,
        noise__exact_method=method,
    )
    wd = os.path.join(tmp_path, method)
    train.train_and_evaluate(c, wd)
    rows[method] = metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))[1:]
  keys = [k for k in rows["vmap"][0] if k.startswith("noise_exact/") or k.endswith("_by_update")]
  assert any(k.startswith("noise_exact/trace_intra") for k in keys), keys
  for a, b in zip(rows["vmap"], rows["ghost"]):
    for k in keys:
      if a[k] is None:  # an unresolved ratio (e.g. B_noise with |G|^2 <= 0)
        assert b[k] is None, k
        continue
      np.testing.assert_allclose(b[k], a[k], rtol=2e-3, atol=1e-6, err_msg=k)


def test_prepare_derives_the_model_config_and_leaves_the_config_as_it_was():
  c = config_lib.base_config()
  before = c.to_dict()
  setup = run_setup.prepare(c)
  assert c.to_dict() == before  # nothing is written back into the config
  assert setup.model.vocab_size == setup.tok.vocab_size != c.model.vocab_size
  assert {k: v for k, v in setup.model.items() if k != "vocab_size"} == {
      k: v for k, v in c.model.items() if k != "vocab_size"
  }
  with pytest.raises(AttributeError):
    setup.model.not_a_field = 1  # locked
