"""cbs_jax.study's readers of a finished run, against values worked out by
hand from a metrics.jsonl written here."""

import json

import pytest

from cbs_jax import study


def _write(tmp_path, rows):
  with open(tmp_path / "metrics.jsonl", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  return str(tmp_path)


def _run(
    N=64,
    works=(5.0, 0.2, 0.3, 0.1, 0.25, 0.9),
    passes=(None, None, 0.50, None, 0.56, None),
    eval_s=0.7,
):
  """Round 0 evaluates the base; round r >= 1 logs ``works[r - 1]`` seconds
  of generation + update (2:3 split) and, when ``passes[r - 1]`` is set, an
  evaluation of ``eval_s`` seconds."""
  rows = [dict(round=0, rollouts_seen=0, eval_expected_pass=0.4, eval_expected_seconds=9.0)]
  for r, (w, p) in enumerate(zip(works, passes), 1):
    row = dict(
        round=r, rollouts_seen=r * N, num_updates=1, gen_seconds=0.4 * w, update_seconds=0.6 * w
    )
    if p is not None:
      row.update(eval_expected_pass=p, eval_expected_seconds=eval_s)
    rows.append(row)
  return rows


def test_time_to_target_splits_training_compile_and_eval(tmp_path):
  d = _write(tmp_path, _run())
  # work per round: 5.0 (round 1, compile), 0.2, 0.3, 0.1, 0.25, 0.9; evaluations
  # at rounds 3 (0.50) and 5 (0.56); target 0.55 is first met at round 5, so
  # round 6 is never counted.
  t = study.time_to_target(d, 0.55)
  steady = (0.2 + 0.25) / 2  # median of rounds 2-5: 0.1, 0.2, 0.25, 0.3
  assert t["train"] == pytest.approx(steady + 0.2 + 0.3 + 0.1 + 0.25)
  assert t["compile"] == pytest.approx(5.0 - steady)
  assert t["eval"] == pytest.approx(2 * 0.7)  # round 0's base evaluation is not counted
  assert t["total"] == pytest.approx(5.0 + 0.2 + 0.3 + 0.1 + 0.25 + 2 * 0.7)
  assert (t["rollouts"], t["rounds"]) == (5 * 64, 5)
  # a target met at round 1's evaluation: no later rounds to take a median
  # over, so round 1 is all training
  t = study.time_to_target(_write(tmp_path, _run(works=(5.0,), passes=(0.6,))), 0.55)
  assert (t["train"], t["compile"], t["rounds"]) == (pytest.approx(5.0), 0.0, 1)


def test_time_to_target_none_when_never_reached_and_no_negative_compile(tmp_path):
  assert study.time_to_target(_write(tmp_path, _run()), 0.9) is None
  # a first round faster than the median: no compile time, nothing negative
  t = study.time_to_target(_write(tmp_path, _run(works=(0.1, 0.2, 0.3, 0.1, 0.25))), 0.55)
  assert t["compile"] == 0.0 and t["train"] == pytest.approx(0.1 + 0.2 + 0.3 + 0.1 + 0.25)
