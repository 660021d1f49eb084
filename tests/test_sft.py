"""The committed SFT config: loss falls and the base lands in the pass-rate
band; a base stopped at a pass rate (bases matched across formats)."""

import os

import pytest

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import run_setup
from cbs_jax import sft
from cbs_jax import train
from configs import batch_law
from configs import sft_arithmetic
from envs import call_at_default_level


def committed_sft_run(workdir: str) -> dict:
  """The committed SFT config trained in ``workdir``: its summary."""
  c = sft_arithmetic.get_config()
  c.train.progress = False
  return train.train_and_evaluate(c, workdir)


@pytest.mark.slow
def test_committed_sft_config_lands_in_the_band(tmp_path):
  # at XLA's default level: the run's cost is computing, not compiling (tests/envs.py)
  summary = call_at_default_level(committed_sft_run, str(tmp_path))
  c = sft_arithmetic.get_config()
  rows = metrics_lib.read_jsonl(os.path.join(tmp_path, "metrics.jsonl"))
  losses = [r["loss"] for r in rows]
  assert rows[0]["step"] == 1 and rows[-1]["step"] == c.sft.steps
  assert losses[-1] < 0.5 * losses[0], losses  # from ~log(vocab) to well below
  assert 0.2 <= summary["base_pass_rate"] <= 0.6, summary


def test_stop_at_pass_rate_ends_the_base_at_the_first_evaluation_that_reaches_it(tmp_path):
  """The stopped base is the reference run up to the first evaluation at or
  above the threshold (same losses and evaluations, nothing after), and a
  second call loads it instead of training on."""
  c = batch_law.get_config("quick")  # a base that learns in seconds
  c.train.progress = False
  c.sft.steps, c.sft.eval_every, c.train.eval_prompts = 80, 16, 64
  setup = run_setup.prepare(c)
  ref_dir = str(tmp_path / "ref")
  sft.train_sft(c, setup, ref_dir)
  evals = [
      (r["step"], r["eval_pass_rate"])
      for r in metrics_lib.read_jsonl(os.path.join(ref_dir, "metrics.jsonl"))
      if "eval_pass_rate" in r
  ]
  assert [s for s, _ in evals] == [16, 32, 48, 64, 80]
  thr = sorted(p for _, p in evals)[2]  # reached, at the latest, by the third-best evaluation
  assert thr > 0
  stop_step = next(s for s, p in evals if p >= thr)
  c.sft.stop_at_pass_rate = thr
  stop_dir = str(tmp_path / "stop")
  _, _, summary = sft.train_sft(c, setup, stop_dir)
  assert summary["stopped_at_pass_rate"] and summary["sft_steps"] == stop_step
  assert summary["base_pass_rate"] == dict(evals)[stop_step]
  ref_rows = metrics_lib.read_jsonl(os.path.join(ref_dir, "metrics.jsonl"))
  got_rows = metrics_lib.read_jsonl(os.path.join(stop_dir, "metrics.jsonl"))
  assert got_rows == [r for r in ref_rows if r["step"] <= stop_step]  # same training, then none
  _, _, summary2 = sft.train_sft(c, setup, stop_dir)  # loads, trains nothing
  assert summary2 == summary
  assert ckpt_lib.Checkpointer(os.path.join(stop_dir, "checkpoints")).latest_step() == stop_step
  # above every evaluation: the base trains to its last step, unflagged
  c.sft.stop_at_pass_rate = min(1.0, max(p for _, p in evals) + 0.01)
  _, _, full = sft.train_sft(c, setup, str(tmp_path / "full"))
  assert full["sft_steps"] == 80 and not full.get("stopped_at_pass_rate")
