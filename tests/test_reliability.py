"""Reliability: preemption, determinism, non-finite updates, configs,
corrupted checkpoints, unwritable workdirs, restartable sweeps.

Faults are injected from the outside only (SIGKILL, tasks registered with
monkeypatch, files corrupted on disk, run functions that raise); production
code is not patched. Verifier fuzzing lives in tests/test_tasks.py.

Every run here is tiny; the session's persistent XLA compilation cache
(tests/conftest.py, inherited by the subprocesses) makes the second and later
compiles of the same program a file read.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import config as config_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import model as model_lib
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import sft as sft_lib
from cbs_jax import sweep
from cbs_jax import tasks
from cbs_jax import train
from cbs_jax.tasks import arithmetic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# --------------------------------------------------------------------- helpers

TIME_KEY = re.compile(r"seconds|_per_s$|time|wall")


def strip_time(x):
  """Drop wall-clock fields (gen_seconds, update_seconds, tokens_per_s, ...)."""
  if isinstance(x, dict):
    return {k: strip_time(v) for k, v in x.items() if not TIME_KEY.search(k)}
  if isinstance(x, list):
    return [strip_time(v) for v in x]
  return x


def canon(x):
  """JSON text of x (sorted keys): compares NaN equal to NaN, as a file would."""
  return json.dumps(x, sort_keys=True, default=float)


def read_rows(workdir):
  return metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))


def listing(d):
  """Every file and directory under d with (size, mtime_ns): any write shows."""
  out = {}
  for base, dirs, files in os.walk(d):
    for name in dirs + files:
      p = os.path.join(base, name)
      st = os.stat(p)
      out[os.path.relpath(p, d)] = (st.st_size if name in files else None, st.st_mtime_ns)
  return out


def load_state(workdir, step=None):
  """(step, state pytree) of a workdir's checkpoint, read directly with orbax."""
  mgr = ocp.CheckpointManager(os.path.join(workdir, "checkpoints"))
  try:
    step = mgr.latest_step() if step is None else step
    out = mgr.restore(
        step, args=ocp.args.Composite(state=ocp.args.StandardRestore(), meta=ocp.args.JsonRestore())
    )
    return step, jax.tree.map(np.asarray, out["state"]), out["meta"]
  finally:
    mgr.close()


def assert_trees_equal(a, b):
  la, ta = jax.tree.flatten_with_path(a)[0], jax.tree.structure(a)
  lb, tb = jax.tree.flatten_with_path(b)[0], jax.tree.structure(b)
  assert ta == tb
  for (path, x), (_, y) in zip(la, lb):
    assert x.dtype == y.dtype and x.shape == y.shape, path
    assert np.array_equal(x, y, equal_nan=True), jax.tree_util.keystr(path)


class FirstDigitOne(arithmetic.ArithmeticTask):
  """Reward 1 iff the completion starts with '1': learnable in a few updates,
  so gradients are non-zero and parameters really move."""

  enumerable = False  # its accepted set is not arithmetic's

  def verify(self, problem, completion):
    return float(completion.startswith("1"))


P_TINY = 8  # prompts per round; SFT batch (16) and eval set (32) differ from it,
# so a task can tell the trainer's per-round draws apart


def tiny_config(**over):
  c = config_lib.base_config()
  c.task.name = "first_digit_one"
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every = 5, 16, 0
  c.batch.num_prompts, c.batch.rollouts_per_prompt = P_TINY, 8
  c.optim.lr, c.optim.ref_batch, c.optim.warmup_steps = 3e-3, 64, 0
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 4, 0, 32
  c.train.checkpoint_every = 2
  c.train.progress = False
  for k, v in over.items():
    node = c
    *parents, leaf = k.split("__")
    for p in parents:
      node = node[p]
    node[leaf] = v
  return c


@pytest.fixture
def easy_task(monkeypatch):
  monkeypatch.setitem(tasks.TASKS, "first_digit_one", FirstDigitOne)


# ------------------------------------------------------- 1. preemption (SIGKILL)

PREEMPT_FLAGS = (
    "--config.train.checkpoint_every=2",
    "--config.train.eval_every=4",
    # 1-digit sums with a sharper SFT base: rewards are mixed, so
    # gradients (and the parameters) really change every round
    "--config.task.kwargs.max_digits=1",
    "--config.sft.steps=60",
    "--config.sft.lr=1e-2",
    # behaviour policy one round stale: the restored state must
    # include the parameter history, not only params + Adam
    "--config.batch.staleness=1",
    "--config.model.num_layers=1",
)  # halves the compile time


def main_cmd(workdir, num_rounds):
  return [
      sys.executable,
      "-m",
      "cbs_jax.main",
      "--config=configs/default.py:smoke",
      f"--workdir={workdir}",
      f"--config.train.num_rounds={num_rounds}",
      *PREEMPT_FLAGS,
  ]


def run_to_end(cmd, env, log):
  with open(log, "w") as f:
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=600)
  text = open(log).read()
  assert r.returncode == 0, text[-3000:]
  return text


def run_and_kill(cmd, env, workdir, kill_at_round, log):
  """Start cmd; SIGKILL it once metrics.jsonl shows round >= kill_at_round.

  Returns True if the kill landed mid-run, False if the run finished first.
  """
  with open(log, "w") as f:
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
  deadline = time.time() + 300
  try:
    while proc.poll() is None and time.time() < deadline:
      rows = read_rows(workdir)
      if rows and rows[-1].get("round", -1) >= kill_at_round:
        os.kill(proc.pid, signal.SIGKILL)
        break
      time.sleep(0.005)
    else:
      if proc.poll() is None:
        raise AssertionError(
            "run did not reach round %d in 300 s:\n%s" % (kill_at_round, open(log).read()[-3000:])
        )
  finally:
    if proc.poll() is None and time.time() >= deadline:
      proc.kill()
    proc.wait()
  if proc.returncode == -signal.SIGKILL:
    assert not os.path.exists(os.path.join(workdir, "summary.json"))
    ck = os.path.join(workdir, "checkpoints")
    print(
        f"killed: last metrics row {read_rows(workdir)[-1]['round']}, checkpoints "
        f"{sorted(os.listdir(ck), key=lambda x: (len(x), x)) if os.path.isdir(ck) else []}"
    )
    return True
  assert proc.returncode == 0, open(log).read()[-3000:]
  return False


@pytest.mark.slow
def test_sigkill_mid_run_then_restart_equals_uninterrupted_run(tmp_path):
  env = dict(os.environ)
  kills = (3, 9)  # two preemptions; the second one interrupts the resumed run
  for attempt in range(3):
    num_rounds = 24 * 2**attempt
    wd = str(tmp_path / f"killed{attempt}")
    landed = []
    for i, at in enumerate(kills):
      landed.append(
          run_and_kill(
              main_cmd(wd, num_rounds), env, wd, at, str(tmp_path / f"kill{attempt}_{i}.log")
          )
      )
      if not landed[-1]:
        break
    if all(landed):
      break  # else the run outpaced the kill: more rounds, fresh workdir
  else:
    pytest.fail("could not kill the run before it finished in 3 attempts")
  # what the kills left behind: rows past the last checkpoint may exist
  assert os.path.exists(os.path.join(wd, "checkpoints"))
  log = run_to_end(main_cmd(wd, num_rounds), env, str(tmp_path / "resume.log"))
  printed = [json.loads(l)["round"] for l in log.splitlines() if l.startswith('{"round"')]
  assert printed and printed[0] > kills[-1] - 2, printed  # it resumed, did not restart
  ref = str(tmp_path / "reference")
  run_to_end(main_cmd(ref, num_rounds), env, str(tmp_path / "ref.log"))

  rows, ref_rows = read_rows(wd), read_rows(ref)
  assert [r["round"] for r in rows] == list(range(num_rounds + 1))  # none lost or doubled
  assert [r["round"] for r in ref_rows] == list(range(num_rounds + 1))
  assert any(r.get("grad_norm") for r in ref_rows), "vacuous: parameters never moved"
  assert strip_time(rows) == strip_time(ref_rows)
  s = json.load(open(os.path.join(wd, "summary.json")))
  s_ref = json.load(open(os.path.join(ref, "summary.json")))
  assert canon(strip_time(s)) == canon(strip_time(s_ref))
  assert s["rounds"] == num_rounds and s["skipped_updates"] == 0
  step, state, meta = load_state(wd)
  step_ref, state_ref, meta_ref = load_state(ref)
  assert step == step_ref == num_rounds
  assert_trees_equal(state, state_ref)  # params, Adam moments, behaviour history
  assert canon(strip_time(meta)) == canon(strip_time(meta_ref))


# ---------------------------------------------------------------- 2. determinism


@pytest.mark.slow
def test_same_config_and_seed_give_identical_runs(easy_task, tmp_path):
  # one stale update per round: the programs every other test here compiles
  # (multi-update and exact-noise paths cost a compile each; the preemption
  # test and tests/test_train.py cover them)
  over = dict(batch__staleness=1, train__eval_every=2)
  runs = []
  for name in ("a", "b"):
    wd = str(tmp_path / name)
    summary = train.train_and_evaluate(tiny_config(**over), wd)
    runs.append((wd, summary))
  (wa, sa), (wb, sb) = runs
  ra, rb = read_rows(wa), read_rows(wb)
  assert [r["round"] for r in ra] == [0, 1, 2, 3, 4]
  assert "noise_split/g2" in ra[1] and "eval_pass_rate" in ra[2]
  assert ra[2]["kappa_k3"] > 0  # the stale behaviour policy really differs
  assert any(r.get("grad_norm") for r in ra[1:])
  assert strip_time(ra) == strip_time(rb)
  assert canon(strip_time(sa)) == canon(strip_time(sb))
  assert_trees_equal(load_state(wa)[1], load_state(wb)[1])
  # ... and a different seed really gives a different run (the check has teeth)
  sc = train.train_and_evaluate(tiny_config(seed=1, **over), str(tmp_path / "c"))
  assert strip_time(read_rows(str(tmp_path / "c"))) != strip_time(ra)
  del sc


# ------------------------------------------------------ 3. non-finite updates


class NaNRewards(FirstDigitOne):
  """The first prompt of chosen training rounds gets reward NaN (all K
  rollouts), so GRPO advantages of that group -- and the loss -- are NaN.
  Training rounds are told apart by their draw size (P_TINY)."""

  poison_rounds: frozenset = frozenset()

  # (no __init__ override: make_task reads the constructor's keyword names)
  def sample(self, rng, n, split="train"):
    problems = super().sample(rng, n, split)
    if n == P_TINY:
      self.train_draws = getattr(self, "train_draws", 0) + 1
      if self.train_draws in self.poison_rounds:
        # kept alive in the list, so identity checks stay unambiguous
        self.poisoned = getattr(self, "poisoned", []) + [problems[0]]
    return problems

  def verify(self, problem, completion):
    if any(problem is p for p in getattr(self, "poisoned", ())):
      return float("nan")
    return super().verify(problem, completion)


def nan_task(monkeypatch, rounds):
  cls = type("NaNRewardsAt", (NaNRewards,), {"poison_rounds": frozenset(rounds)})
  monkeypatch.setitem(tasks.TASKS, "nan_rewards", cls)


@pytest.mark.slow
def test_persistent_nan_loss_skips_updates_then_stops_naming_round(monkeypatch, tmp_path):
  nan_task(monkeypatch, range(3, 100))
  c = tiny_config(task__name="nan_rewards", train__num_rounds=8, train__max_consecutive_nonfinite=3)
  assert c.sft.batch_size != P_TINY != c.train.eval_prompts
  wd = str(tmp_path)
  with pytest.raises(train.NonFiniteError) as err:
    train.train_and_evaluate(c, wd)
  msg = str(err.value)
  assert "3 consecutive non-finite" in msg
  assert "round 5" in msg and "update 1" in msg, msg
  rows = read_rows(wd)
  assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]  # round 5 raised before its row
  assert [r["skipped_updates"] for r in rows[1:]] == [0, 0, 1, 2]
  assert rows[2]["loss"] is not None and rows[3]["loss"] is None  # NaN is written as null
  assert rows[3]["reward_mean"] is None
  assert not os.path.exists(os.path.join(wd, "summary.json"))
  # the skipped updates left every parameter and Adam moment untouched
  _, s2, m2 = load_state(wd, 2)
  _, s4, m4 = load_state(wd, 4)
  assert_trees_equal(s2, s4)
  assert m4["counters"]["skipped_updates"] == 2 and m4["counters"]["consecutive_nonfinite"] == 2


@pytest.mark.slow
def test_single_nan_round_is_skipped_and_training_continues(monkeypatch, tmp_path):
  nan_task(monkeypatch, {3})
  c = tiny_config(task__name="nan_rewards", train__num_rounds=6, train__max_consecutive_nonfinite=2)
  wd = str(tmp_path)
  summary = train.train_and_evaluate(c, wd)
  rows = read_rows(wd)
  assert [r["skipped_updates"] for r in rows[1:]] == [0, 0, 1, 1, 1, 1]
  assert rows[3]["loss"] is None and rows[3]["grad_norm"] is None
  for r in rows[4:]:  # optimizer state was not poisoned: later updates are finite
    assert r["loss"] is not None and np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"])
  assert any(r["grad_norm"] > 0 for r in rows[4:])
  assert summary["skipped_updates"] == 1 and summary["rounds"] == 6
  # the noise tracker skipped the NaN estimate instead of absorbing it
  assert (
      rows[3].get("noise_ema/flag", "").startswith("non-finite")
      or rows[3].get("noise_ema/g2") is not None
  )
  assert all(r["noise_ema/g2"] is not None for r in rows[4:])
  _, state, meta = load_state(wd)
  assert all(np.all(np.isfinite(x)) for x in jax.tree.leaves(state))
  assert meta["counters"]["consecutive_nonfinite"] == 0


@pytest.mark.slow
def test_update_that_makes_parameters_non_finite_is_skipped(easy_task, monkeypatch, tmp_path):
  """A finite loss and gradient can still give a non-finite update (here an
  infinite learning rate, injected through the lr rule): the guard must look
  at the update, or NaN parameters are accepted and checkpointed."""
  from cbs_jax import lr_rules

  monkeypatch.setattr(lr_rules, "lr_scale", lambda *a, **k: float("inf"))
  c = tiny_config(train__num_rounds=6, train__max_consecutive_nonfinite=3)
  wd = str(tmp_path)
  with pytest.raises(train.NonFiniteError) as err:
    train.train_and_evaluate(c, wd)
  _, state, _ = load_state(wd, 2)
  bad = [
      jax.tree_util.keystr(p)
      for p, x in jax.tree.flatten_with_path(state)[0]
      if not np.all(np.isfinite(x)) and "hyperparams" not in jax.tree_util.keystr(p)
  ]  # the lr record: reset each update
  assert not bad, f"checkpoint 2 holds non-finite {bad[:3]}; the run said: {err.value}"
  assert "round 3" in str(err.value)  # rounds 1, 2, 3 skipped


@pytest.mark.parametrize("field", ["optim.lr", "sft.lr"])
def test_infinite_learning_rate_is_rejected(field):
  c = config_lib.base_config()
  _set(c, field, float("inf"))
  with pytest.raises(ValueError, match=re.escape(f"config.{field}")):
    config_lib.validate(c)


# ------------------------------------------------------------------ 4. configs


def _ppo_no_value_head(c):
  c.rl.algo = "ppo"


def _odd_split(c):
  c.batch.num_prompts, c.batch.num_minibatches = 6, 2  # 3 prompts per update


def _chunk_not_dividing(c):
  c.noise.exact_every, c.noise.chunk_prompts = 1, 3


def _odd_head_dim(c):
  c.model.d_model, c.model.num_heads, c.model.num_kv_heads = 20, 4, 2


def _has(dotted):
  c = config_lib.base_config()
  for part in dotted.split("."):
    if part not in c:
      return False
    c = c[part]
  return True


def _default(dotted):
  c = config_lib.base_config()
  for part in dotted.split("."):
    c = c[part]
  return c


def _adaptive(c, **over):
  c.batch.schedule = "adaptive"
  for k, v in over.items():
    section, field = k.split("__")
    c[section][field] = v


# fields range-checked inline in config.validate (not in a module-level table)
_POSITIVE_FLOATS = (
    "optim.lr",
    "sft.lr",
    "sampling.temperature",
    "train.eval_temperature",
    "rl.clip_eps_low",
    "rl.clip_eps_high",
    "optim.eps",
    "rl.adv_eps",
)
_UNIT_INTERVAL = ("optim.b1", "optim.b2", "rl.gamma", "rl.lam", "sft.label_noise") + (
    "train.stop_at_pass_rate",
    "train.stop_below_pass_rate",
)
_MODEL_INTS = (
    "vocab_size",
    "d_model",
    "num_layers",
    "num_heads",
    "num_kv_heads",
    "d_ff",
    "max_len",
)

BAD_FIELDS = (
    [("task.name", "nope")]
    + [(f, "nope") for f in config_lib._CHOICES if isinstance(_default(f), str)]
    + [(f, 7) for f in config_lib._CHOICES if isinstance(_default(f), int)]
    + [(f, 0) for f in config_lib._POSITIVE]
    + [(f, -1) for f in config_lib._POSITIVE]
    + [
        (f, True)
        for f in config_lib._POSITIVE  # bools pass type-safe int assignment
        if isinstance(_default(f), int)
    ]
    + [(f, -1) for f in config_lib._NON_NEGATIVE]
    + [(f, 0.0) for f in _POSITIVE_FLOATS]
    + [(f, float("nan")) for f in _POSITIVE_FLOATS]
    + [(f, 1.5) for f in _UNIT_INTERVAL]
    + [(f, -0.1) for f in _UNIT_INTERVAL]
    + [
        ("sampling.top_p", 0.0),
        ("sampling.top_p", 1.5),
        ("sampling.top_p", float("nan")),
        ("noise.ema_decay", 1.0),
        ("noise.ema_decay", -0.5),
        ("rl.clip_c", 0.5),
        ("rl.clip_c", 1.0),
        ("optim.weight_decay", float("nan")),
    ]
    + [(f"model.{f}", 0) for f in _MODEL_INTS]
    + [
        ("model.num_heads", 3),
        ("model.num_kv_heads", 3),
        ("model.dtype", "float16"),
        ("model.rope_theta", 0.0),
    ]
)
BAD_CONSISTENCY = [  # (what, mutate, fields the message must name)
    (
        "grpo needs K >= 2",
        lambda c: setattr(c.batch, "rollouts_per_prompt", 1),
        ["batch.rollouts_per_prompt"],
    ),
    (
        "minibatches must divide prompts",
        lambda c: setattr(c.batch, "num_minibatches", 3),
        ["batch.num_minibatches", "batch.num_prompts"],
    ),
    ("split needs even halves", _odd_split, ["noise.split_every"]),
    ("chunk must divide prompts", _chunk_not_dividing, ["noise.chunk_prompts"]),
    ("ppo needs a value head", _ppo_no_value_head, ["rl.algo", "model.value_head"]),
    ("rope needs an even head dim", _odd_head_dim, ["model.d_model", "model.num_heads"]),
] + (
    [  # the adaptive batch schedule (being added by the lead)
        (
            "adaptive max below min",
            lambda c: _adaptive(c, batch__adaptive_min_prompts=64, batch__adaptive_max_prompts=32),
            ["batch.adaptive_max_prompts", "batch.adaptive_min_prompts"],
        ),
        (
            "adaptive min not a multiple of the split unit",
            lambda c: _adaptive(c, batch__adaptive_min_prompts=9),
            ["batch.adaptive_min_prompts"],
        ),
        (
            "adaptive needs the noise tracker",
            lambda c: _adaptive(c, noise__split_every=0),
            ["batch.schedule", "noise.split_every"],
        ),
    ]
    if _has("batch.schedule")
    else []
)


def _set(c, dotted, value):
  *parents, leaf = dotted.split(".")
  for p in parents:
    c = c[p]
  c[leaf] = value


def _study_configs():
  """(module, variant) of every committed study config with named variants."""
  import importlib  # pylint: disable=import-outside-toplevel

  out = []
  for name in ("adaptive_batch", "batch_law", "noise_anatomy", "offpolicy"):
    mod = importlib.import_module(f"configs.{name}")
    out += [(name, v) for v in mod.VARIANTS]
  from configs import drift_noise  # pylint: disable=import-outside-toplevel

  out += [("drift_noise", v) for v in drift_noise.CLIP_VARIANTS + ("quick",)]
  out += [("drift_noise", f"{a}{m}") for a in ("pg", "clip") for m in drift_noise.REUSE]
  out += [("drift_noise", f"e{e}x{l}") for e, l in ((1, 1), (8, 1), (2, 4))]
  out += [("drift_noise", f"{v}@e4") for v in drift_noise.CLIP_VARIANTS]
  return out


@pytest.mark.parametrize("name,variant", _study_configs())
def test_every_study_config_variant_builds_validates_and_makes_its_task(name, variant):
  """A variant that fails only when its study reaches it (after an hour of
  the others) is caught here in milliseconds."""
  import importlib  # pylint: disable=import-outside-toplevel

  c = importlib.import_module(f"configs.{name}").get_config(variant)
  config_lib.validate(c)
  task = tasks.make_task(c.task.name, **c.task.kwargs.to_dict())
  assert task.name == c.task.name


def test_config_table_covers_every_checked_field():
  covered = {f for f, _ in BAD_FIELDS}
  checked = (
      set(config_lib._CHOICES)
      | set(config_lib._POSITIVE)
      | set(config_lib._NON_NEGATIVE)
      | set(_POSITIVE_FLOATS)
      | set(_UNIT_INTERVAL)
      | {"task.name", "sampling.top_p", "noise.ema_decay", "rl.clip_c"}
      | {f"model.{f}" for f in _MODEL_INTS + ("dtype", "rope_theta")}
  )
  assert checked <= covered, checked - covered
  config_lib.validate(config_lib.base_config())  # the defaults themselves are valid


@pytest.mark.parametrize("field,value", BAD_FIELDS, ids=lambda x: str(x))
def test_validate_names_the_bad_field(field, value):
  c = config_lib.base_config()
  _set(c, field, value)
  with pytest.raises(ValueError) as err:
    config_lib.validate(c)
  assert f"config.{field}" in str(err.value), str(err.value)


@pytest.mark.parametrize(
    "what,mutate,fields", BAD_CONSISTENCY, ids=[w for w, _, _ in BAD_CONSISTENCY]
)
def test_validate_names_fields_of_inconsistent_settings(what, mutate, fields):
  c = config_lib.base_config()
  mutate(c)
  with pytest.raises(ValueError) as err:
    config_lib.validate(c)
  for f in fields:
    assert f"config.{f}" in str(err.value), (what, str(err.value))


def test_prepare_names_task_fields(tmp_path):
  c = config_lib.base_config()
  c.model.max_len = 8  # shorter than prompt + completion of 3-digit arithmetic
  with pytest.raises(ValueError, match=r"config\.model\.max_len"):
    run_setup.prepare(c)
  c = config_lib.base_config()
  c.task.kwargs.max_digits = 0
  with pytest.raises(ValueError, match="max_digits"):
    run_setup.prepare(c)


@pytest.mark.parametrize(
    "field,value",
    [
        ("batch.num_prompts", "8"),
        ("batch.num_prompts", 8.5),
        ("model.d_model", "64"),
        ("optim.lr", "fast"),
        ("rl.loss", 3),
        ("train.progress", 1),
        ("seed", [0]),
    ],
)
def test_wrong_type_is_a_type_error_naming_the_field(field, value):
  c = config_lib.base_config()
  with pytest.raises(TypeError, match=field.split(".")[-1]):
    _set(c, field, value)


def test_unknown_field_is_an_error_naming_it():
  c = config_lib.base_config()
  c.lock()  # as main.py's config_flags(lock_config=True) does
  with pytest.raises(AttributeError, match="clip_eps"):
    c.rl.clip_eps = 10.0


@pytest.mark.parametrize("field", ["batch.num_prompts", "optim.lr", "sampling.top_p"])
def test_none_in_a_numeric_field_is_a_value_error_naming_it(field):
  c = config_lib.base_config()
  _set(c, field, None)
  with pytest.raises(ValueError, match=re.escape(f"config.{field}")):
    config_lib.validate(c)


# --------------------------------------------------------------- 6. checkpoints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished tiny run (checkpoints at rounds 2 and 4) to copy and corrupt."""
  wd = str(tmp_path_factory.mktemp("finished") / "run")
  mp = pytest.MonkeyPatch()
  mp.setitem(tasks.TASKS, "first_digit_one", FirstDigitOne)
  try:
    train.train_and_evaluate(tiny_config(), wd)
  finally:
    mp.undo()
  assert sorted(os.listdir(os.path.join(wd, "checkpoints")), key=int) == ["2", "4"]
  return wd


def _meta_garbage(wd):
  with open(os.path.join(wd, "checkpoints/4/meta/metadata"), "w") as f:
    f.write('{"round": 4, "st')  # torn JSON
  return "checkpoints/4"


def _meta_empty(wd):
  open(os.path.join(wd, "checkpoints/4/meta/metadata"), "w").close()
  return "checkpoints/4"


def _state_truncated(wd):
  d = os.path.join(wd, "checkpoints/4/state/ocdbt.process_0/d")
  for f in os.listdir(d):
    p = os.path.join(d, f)
    os.truncate(p, os.path.getsize(p) // 2)
  return "checkpoints/4"


def _state_metadata_deleted(wd):
  os.remove(os.path.join(wd, "checkpoints/4/state/_METADATA"))
  return "checkpoints/4"


def _state_manifest_deleted(wd):
  os.remove(os.path.join(wd, "checkpoints/4/state/manifest.ocdbt"))
  return "checkpoints/4"


def _state_dir_deleted(wd):
  shutil.rmtree(os.path.join(wd, "checkpoints/4/state"))
  return "checkpoints/4"


def _sft_meta_garbage(wd):
  d = os.path.join(wd, "sft_base/checkpoints")
  step = max(os.listdir(d), key=int)
  with open(os.path.join(d, step, "meta/metadata"), "w") as f:
    f.write("\x00garbage")
  return f"sft_base/checkpoints/{step}"


@pytest.mark.slow
@pytest.mark.parametrize(
    "corrupt",
    [
        _meta_garbage,
        _meta_empty,
        _state_truncated,
        _state_metadata_deleted,
        _state_manifest_deleted,
        _state_dir_deleted,
        _sft_meta_garbage,
    ],
    ids=lambda f: f.__name__.strip("_"),
)
def test_corrupted_checkpoint_is_a_clear_error_and_nothing_is_touched(
    corrupt, finished_run, easy_task, tmp_path
):
  wd = str(tmp_path / "run")
  shutil.copytree(finished_run, wd)
  bad = os.path.join(wd, corrupt(wd))
  before = listing(wd)
  with pytest.raises(ckpt_lib.CheckpointError) as err:  # a ValueError
    train.train_and_evaluate(tiny_config(train__num_rounds=6), wd)
  assert bad in str(err.value), str(err.value)[:500]
  assert listing(wd) == before  # nothing deleted, rewritten or added


@pytest.fixture
def no_compile(monkeypatch):
  """Fail if a run gets as far as building a model."""

  def boom(*a, **k):
    raise AssertionError("the run built a model before failing on its workdir")

  monkeypatch.setattr(model_lib, "build", boom)
  monkeypatch.setattr(sft_lib, "train_sft", boom)


def test_workdir_under_a_regular_file_fails_before_compiling(easy_task, no_compile, tmp_path):
  afile = tmp_path / "afile"
  afile.write_text("not a directory")
  wd = str(afile / "sub")  # cannot be created, even by root
  with pytest.raises(OSError) as err:
    train.train_and_evaluate(tiny_config(), wd)
  assert str(afile) in str(err.value), str(err.value)
  assert afile.read_text() == "not a directory"


def test_read_only_workdir_parent_fails_before_compiling(easy_task, no_compile, tmp_path):
  parent = tmp_path / "ro"
  parent.mkdir()
  parent.chmod(0o500)
  try:
    probe = parent / "probe"
    try:
      probe.mkdir()
      probe.rmdir()
      pytest.skip("running as root: chmod does not stop writes (see the test above)")
    except PermissionError:
      pass
    with pytest.raises(OSError) as err:
      train.train_and_evaluate(tiny_config(), str(parent / "run"))
    assert str(parent) in str(err.value), str(err.value)
  finally:
    parent.chmod(0o700)


# --------------------------------------------------------------------- 7. sweep


class InterruptibleTask(FirstDigitOne):
  """Raises KeyboardInterrupt when it is asked for training round
  ``interrupt_at`` (class-level, one-shot): a Ctrl-C in the middle of a run."""

  interrupt_at = None

  def sample(self, rng, n, split="train"):
    if n == P_TINY:
      self.train_draws = getattr(self, "train_draws", 0) + 1
      if type(self).interrupt_at == self.train_draws:
        type(self).interrupt_at = None
        raise KeyboardInterrupt
    return super().sample(rng, n, split)


@pytest.mark.slow
def test_interrupted_sweep_resumes_without_redoing_or_losing_runs(monkeypatch, tmp_path):
  monkeypatch.setitem(tasks.TASKS, "interruptible", InterruptibleTask)
  monkeypatch.setattr(InterruptibleTask, "interrupt_at", None)
  base = tiny_config(task__name="interruptible")
  overrides = [{"optim.lr": lr} for lr in (1e-3, 2e-3, 3e-3)]
  root = str(tmp_path / "sweep")
  calls, interrupted = [], []

  def run_fn(config, workdir):
    calls.append(os.path.basename(workdir))
    if len(calls) == 2 and not interrupted:  # once: the second run is interrupted
      interrupted.append(workdir)  # after its round-2 checkpoint
      InterruptibleTask.interrupt_at = 3
    return train.train_and_evaluate(config, workdir)

  with pytest.raises(KeyboardInterrupt):
    sweep.run_sweep(base, overrides, root, run_fn=run_fn, progress=False)
  names = [sweep.run_name(o) for o in overrides]
  assert names == ["optim.lr=0.001", "optim.lr=0.002", "optim.lr=0.003"]
  assert calls == names[:2]
  rows = sweep.read_results(root)
  assert [r["name"] for r in rows] == names[:1]  # the finished run's result is kept
  second = os.path.join(root, names[1])
  assert os.path.exists(os.path.join(second, "config.json"))
  assert not os.path.exists(os.path.join(second, "summary.json"))
  assert [r["round"] for r in read_rows(second)] == [0, 1, 2]
  first_listing = listing(os.path.join(root, names[0]))

  calls.clear()
  out = sweep.run_sweep(base, overrides, root, run_fn=run_fn, progress=False)
  assert calls == names[1:]  # the finished first run was not redone ...
  assert listing(os.path.join(root, names[0])) == first_listing  # ... nor touched
  rows = sweep.read_results(root)
  assert [r["name"] for r in rows] == names
  assert [r["overrides"] for r in rows] == overrides
  assert canon(rows) == canon(out)
  for r in rows:
    assert r["summary"]["rounds"] == 4 and r["summary"]["optimizer_steps"] == 4
  # the interrupted run resumed from its checkpoint: no round lost or doubled
  assert [r["round"] for r in read_rows(second)] == [0, 1, 2, 3, 4]

  # the ledger: the interrupted invocation (1 of 3 runs) and the one that finished
  led = report.ledger(root)
  assert [(r["ran"], r["of"], r["completed"]) for r in led["invocations"]] == [
      (1, 3, False),
      (2, 2, True),
  ]
  assert led["runs"] == 3 and led["wall_seconds"] == pytest.approx(
      sum(r["wall_seconds"] for r in led["invocations"])
  )
  assert all(r["wall_seconds"] > 0 for r in led["invocations"])

  # a third call finds everything done: nothing runs, nothing changes
  calls.clear()
  before = listing(root)
  again = sweep.run_sweep(base, overrides, root, run_fn=run_fn, progress=False)
  assert calls == [] and canon(again) == canon(rows)
  after = listing(root)
  assert {k: v for k, v in after.items() if k != "results.jsonl"} == {
      k: v for k, v in before.items() if k != "results.jsonl"
  }
  assert canon(sweep.read_results(root)) == canon(rows)
  assert report.ledger(root) == led  # a read-back adds no invocation
  # a study's manifest written by this read-back still says what the runs cost
  res = report.Results("study", root=str(tmp_path / "results"))
  doc = json.loads(open(res.manifest(wall_seconds=0.1, runs_root=root)).read())
  assert doc["wall_seconds"] == 0.1 and doc["ledger"] == led

  # a different config under the same names is refused, naming the field
  other = tiny_config(task__name="interruptible", train__num_rounds=5)
  with pytest.raises(ValueError, match=r"train\.num_rounds"):
    sweep.run_sweep(other, overrides, root, run_fn=run_fn, progress=False)
  assert calls == [] and listing(root) == after


def test_sweep_rejects_unknown_or_mistyped_fields_before_running(tmp_path):
  base = config_lib.base_config()
  ran = []
  run_fn = lambda c, w: ran.append(w)
  with pytest.raises(ValueError, match=r"batch\.num_promts"):
    sweep.run_sweep(
        base,
        [{"batch.num_prompts": 8}, {"batch.num_promts": 8}],
        str(tmp_path / "a"),
        run_fn=run_fn,
        progress=False,
    )
  with pytest.raises(ValueError, match="nope.lr"):
    sweep.run_sweep(base, [{"nope.lr": 1.0}], str(tmp_path / "b"), run_fn=run_fn, progress=False)
  with pytest.raises(TypeError, match=r"batch\.num_prompts"):
    sweep.run_sweep(
        base, [{"batch.num_prompts": "8"}], str(tmp_path / "c"), run_fn=run_fn, progress=False
    )
  with pytest.raises(ValueError, match=r"config\.optim\.lr"):  # validated up front
    sweep.run_sweep(
        base,
        [{"optim.lr": 1e-3}, {"optim.lr": -1.0}],
        str(tmp_path / "d"),
        run_fn=run_fn,
        progress=False,
    )
  assert ran == [] and not any(os.path.exists(tmp_path / x) for x in "abcd")


def test_sweep_names_are_filesystem_safe_and_distinct():
  assert sweep.run_name({}) == "base"
  n = sweep.run_name({"task.kwargs.ops": "+-*/", "model.dtype": "a b/c"})
  assert "/" not in n and " " not in n and n == re.sub(r"[^A-Za-z0-9._=+-]", "", n)
  long = sweep.run_name({f"f{i}": "x" * 40 for i in range(10)})
  assert len(long) <= 120
  assert long != sweep.run_name({f"f{i}": "x" * 40 for i in range(9)} | {"f9": "y"})
  assert sweep.grid({"a": [1, 2], "b": [3, 4, 5]})[:2] == [{"a": 1, "b": 3}, {"a": 1, "b": 4}]
  assert len(sweep.grid({"a": [1, 2], "b": [3, 4, 5], "c": 7})) == 6


@pytest.mark.slow
def test_sweep_cli_runs_the_grid(tmp_path):
  root = str(tmp_path / "sweep")
  cmd = [
      sys.executable,
      "-m",
      "cbs_jax.sweep",
      "--config=configs/default.py:smoke",
      f"--workdir={root}",
      *PREEMPT_FLAGS,  # the preemption test's programs: cached
      '--sweep={"seed": [0, 1]}',
      "--config.train.num_rounds=2",
  ]
  r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = sweep.read_results(root)
  assert [x["name"] for x in rows] == ["seed=0", "seed=1"]
  assert all(x["summary"]["rounds"] == 2 for x in rows)
  stored = json.load(open(os.path.join(root, "seed=1", "config.json")))
  assert stored["seed"] == 1 and stored["train"]["num_rounds"] == 2
  bad = subprocess.run(
      cmd[:-2] + ['--sweep={"batch.num_promts": [8]}'],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert bad.returncode != 0 and "batch.num_promts" in bad.stderr


@pytest.mark.slow
def test_sweep_with_two_workers_gives_the_single_process_results(tmp_path):
  """Two runs at once (spawned, pinned, single-threaded XLA) produce the same
  summaries as the same sweep run one at a time in this process."""
  base = config_lib.base_config()
  base.model.d_model, base.model.d_ff, base.model.num_layers = 32, 64, 1
  base.task.kwargs.max_digits = 1
  base.sft.steps, base.sft.batch_size, base.sft.eval_every = 5, 16, 0
  base.sft.base_dir = str(tmp_path / "sft_base")  # shared by every run
  base.batch.num_prompts, base.batch.rollouts_per_prompt = 2, 4
  base.train.num_rounds, base.train.eval_every, base.train.eval_prompts = 2, 0, 16
  base.train.eval_sampled, base.train.progress = False, False
  grid = sweep.grid({"seed": [0, 1]})
  one = sweep.run_sweep(base, grid, str(tmp_path / "one"), progress=False)
  two = sweep.run_sweep(base, grid, str(tmp_path / "two"), progress=False, workers=2)
  keys = ("final_pass_rate", "rollouts_seen", "optimizer_steps", "rounds")
  for a, b in zip(one, two):
    assert a["name"] == b["name"]
    for k in keys:
      assert a["summary"][k] == pytest.approx(b["summary"][k], rel=1e-5), k
  assert len(sweep.read_results(str(tmp_path / "two"))) == 2
  with pytest.raises(ValueError, match="workers"):
    sweep.run_sweep(base, grid, str(tmp_path / "three"), workers=0)


def _store_finished_run(root, name, stored_config):
  """A finished sweep run as older code left it: its config.json and summary."""
  wd = os.path.join(root, name)
  os.makedirs(wd, exist_ok=True)
  with open(os.path.join(wd, "config.json"), "w") as f:
    json.dump(stored_config, f)
  with open(os.path.join(wd, "summary.json"), "w") as f:
    json.dump({"final_pass_rate": 0.5}, f)


def test_stored_config_without_a_new_default_field_still_matches(tmp_path):
  """A run stored before the code gained a field (left at its default) is
  the same run; a non-default value of that field is another run."""
  base, root = config_lib.base_config(), str(tmp_path)
  stored = json.loads(json.dumps(base.to_dict(), default=str))
  del stored["train"]["stop_below_pass_rate"]  # as written by older code
  _store_finished_run(root, "base", stored)
  rows = sweep.run_sweep(base, [{}], root, progress=False)
  assert rows[0]["summary"] == {"final_pass_rate": 0.5}  # read back, not rerun
  with pytest.raises(ValueError, match="train.stop_below_pass_rate"):
    sweep.run_sweep(
        base, [{"train.stop_below_pass_rate": 0.2}], root, names=["base"], progress=False
    )


def test_stored_config_with_a_retired_derived_field_still_matches(tmp_path):
  """Runs stored while the trainer wrote its derived sampler ids into the
  config (``sampling.suppress_ids``) are the same runs now that the ids live
  in the Setup; any other field the config lacks is still a difference."""
  base, root = config_lib.base_config(), str(tmp_path)
  stored = json.loads(json.dumps(base.to_dict(), default=str))
  stored["sampling"]["suppress_ids"] = [0, 1]  # as written by older code
  _store_finished_run(root, "base", stored)
  rows = sweep.run_sweep(base, [{}], root, progress=False)
  assert rows[0]["summary"] == {"final_pass_rate": 0.5}  # read back, not rerun
  stored["sampling"]["not_a_field"] = 1
  _store_finished_run(root, "base", stored)
  with pytest.raises(ValueError, match="sampling.not_a_field"):
    sweep.run_sweep(base, [{}], root, names=["base"], progress=False)


def test_a_run_stored_by_another_process_of_the_job_is_the_same_run(tmp_path):
  """The ``distributed.*`` fields say which process launched a run, not what
  it runs: process 1 of a pod sweep reads the config.json process 0 wrote
  as its own run; any other difference is still another run."""
  base, root = config_lib.base_config(), str(tmp_path)
  stored = json.loads(json.dumps(base.to_dict(), default=str))
  stored["distributed"].update(enabled=True, process_id=0, num_processes=2)
  _store_finished_run(root, "base", stored)
  here = config_lib.base_config()
  here.distributed.process_id, here.distributed.num_processes = 1, 2
  rows = sweep.run_sweep(here, [{}], root, progress=False)
  assert rows[0]["summary"] == {"final_pass_rate": 0.5}  # read back, not rerun
  with pytest.raises(ValueError, match="seed"):
    sweep.run_sweep(here, [{"seed": 7}], root, names=["base"], progress=False)


def test_a_distributed_sweep_runs_one_grid_point_at_a_time():
  c = config_lib.base_config()
  c.distributed.enabled = True
  with pytest.raises(ValueError, match="workers=2: a distributed sweep runs one grid point"):
    sweep.run_sweep(c, [{}], "unused", workers=2)


@pytest.mark.slow
def test_run_below_the_floor_stops_and_says_so(tmp_path):
  c = config_lib.base_config()
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.task.kwargs.max_digits = 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every = 5, 16, 0
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 2, 4
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 6, 2, 16
  c.train.eval_sampled, c.train.progress = False, False
  c.train.stop_below_pass_rate = 0.99  # a 5-step SFT base is far below it
  s = train.train_and_evaluate(c, str(tmp_path))
  assert s["stopped_collapsed"] and not s["stopped_at_target"] and s["rounds"] == 2
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  assert [r["round"] for r in rows] == [0, 1, 2]
  again = train.train_and_evaluate(c, str(tmp_path))  # a rerun does not continue it
  assert again["rounds"] == 2


@pytest.mark.slow
def test_checkpoint_without_a_new_default_model_field_is_the_same_model(tmp_path):
  """A checkpoint written before the model config gained a field (the
  field's default is what that model was) loads; another value does not."""
  ck = ckpt_lib.Checkpointer(str(tmp_path / "ck"))
  model = model_lib.default_config().to_dict()
  old = {k: v for k, v in model.items() if k != "qk_norm"}  # as older code wrote it
  ck.save(1, {"x": np.zeros(2, np.float32)}, {"model": old})
  ck.check_model(model, 1)
  with pytest.raises(ckpt_lib.CheckpointError, match="model.qk_norm"):
    ck.check_model(dict(model, qk_norm=True), 1)
  ck.close()


_SLEEPY_SWEEP = """
import os, sys, time
sys.path.insert(0, {root!r})
from cbs_jax import config as config_lib
from cbs_jax import sweep

def run(config, workdir):
  with open(os.path.join(workdir, "pid"), "w") as f:
    f.write(str(os.getpid()))
  time.sleep(120)
  return {{}}

if __name__ == "__main__":
  grid = sweep.grid({{"seed": [0, 1]}})
  sweep.run_sweep(config_lib.base_config(), grid, sys.argv[1], run_fn=run, workers=2, progress=False)
"""


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's"
)
def test_killing_a_sweep_takes_its_workers_with_it(tmp_path):
  """SIGKILL of a two-worker sweep: both workers are gone within seconds, so
  a restarted sweep never shares a run folder with an orphan still writing."""
  script = tmp_path / "sleepy_sweep.py"
  script.write_text(_SLEEPY_SWEEP.format(root=ROOT))
  root = tmp_path / "root"
  parent = subprocess.Popen([sys.executable, str(script), str(root)], cwd=ROOT)
  pid_files = [root / f"seed={s}" / "pid" for s in (0, 1)]
  deadline = time.time() + 120
  while not all(p.is_file() and p.read_text() for p in pid_files):
    assert parent.poll() is None and time.time() < deadline, "the workers never started"
    time.sleep(0.2)
  workers = [int(p.read_text()) for p in pid_files]
  parent.kill()
  parent.wait()
  deadline = time.time() + 15
  alive = workers
  while alive and time.time() < deadline:
    time.sleep(0.2)
    alive = [w for w in workers if _alive(w)]
  assert not alive, f"workers {alive} outlived their killed sweep"


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"  # a zombie has exited
  except FileNotFoundError:
    return False
