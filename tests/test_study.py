"""cbs_jax.study's readers of a finished run, against values worked out by
hand from a metrics.jsonl written here; to-target by hand; a study's
committed records (``study_report.save_records``) read back as made."""

import json
import math

import numpy as np
import pytest

from cbs_jax import report
from cbs_jax import study
from cbs_jax import study_report


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


def test_to_target_interpolates_every_x_of_the_curve_by_hand():
  # value crosses 0.5 a quarter of the way from the 2nd to the 3rd evaluation
  curve = dict(
      rounds=np.array([0.0, 4.0, 8.0]),
      rollouts=np.array([0.0, 256.0, 512.0]),
      seconds=np.array([0.0, 10.0, 30.0]),
      value=np.array([0.3, 0.4, 0.8]),
  )
  got = study.to_target(curve, [0.5, 0.9])
  assert got[0.5] == pytest.approx(dict(rounds=5.0, rollouts=320.0, seconds=15.0))
  assert got[0.9] == dict(rounds=None, rollouts=None, seconds=None)


def _record(name, N, seed, lr, values, collapsed=False):
  n = len(values)
  rounds = np.arange(n, dtype=np.float64) * 2
  return dict(
      name=name,
      N=N,
      P=N // 4,
      K=4,
      seed=seed,
      updates_per_round=1,
      lr=lr,
      summary=dict(rounds=int(rounds[-1]), stopped_collapsed=collapsed, ignored="x"),
      curve=dict(rounds=rounds, steps=rounds, rollouts=rounds * N, value=np.asarray(values)),
  )


def test_records_round_trip_through_the_committed_csv(tmp_path):
  """What --replot reads is what the study made: groups and runs in order
  (one run name in two groups kept apart), shape, seed, None lr, summary
  flags as booleans, curves to 10 significant digits, to-target from them."""
  groups = {
      "on": [
          _record("a", 16, 0, None, [0.2, 0.41, 0.63]),
          _record("b", 64, 1, 3e-4, [0.2, 0.3], collapsed=True),
      ],
      "off4": [_record("a", 16, 0, 6e-4, [0.2, 0.1 / 3, 0.7])],
  }
  out = report.Results("study", root=str(tmp_path))
  study_report.save_records(out, groups)
  back = study_report.load_records(out, [0.5])
  assert list(back) == ["on", "off4"]
  assert [[r["name"] for r in rs] for rs in back.values()] == [["a", "b"], ["a"]]
  for g, rs in groups.items():
    for want, got in zip(rs, back[g]):
      for k in study_report.RECORD_KEYS:
        assert got[k] == want[k], (g, k)
      assert got["summary"] == dict(
          rounds=want["summary"]["rounds"],
          rollouts_seen=None,
          stopped_at_target=None,
          stopped_collapsed=want["summary"]["stopped_collapsed"],
      )
      assert isinstance(got["summary"]["stopped_collapsed"], bool)
      for k, v in want["curve"].items():
        np.testing.assert_allclose(got["curve"][k], v, rtol=5e-10)  # 10 digits
      # the crossing of 0.5 between evaluations 1 and 2 (rounds 2 and 4), by hand
      v = want["curve"]["value"]
      if v.max() >= 0.5:
        r = 2 + 2 * (0.5 - v[1]) / (v[2] - v[1])
        assert got["to_target"][0.5]["rounds"] == pytest.approx(r)
        assert got["to_target"][0.5]["rollouts"] == pytest.approx(r * want["N"])
      else:
        assert got["to_target"][0.5]["rounds"] is None


def test_records_of_another_series_keep_nan_and_inf(tmp_path):
  """A per-round trajectory (an adaptive run's N and its signal's interval:
  nan where not logged, inf where unbounded) round-trips unchanged."""
  rec = dict(name="r", seed=2, traj=dict(N=[16, 32], lo=[math.nan, 1.5], hi=[math.inf, 9.0]))
  out = report.Results("study", root=str(tmp_path))
  study_report.save_records(out, {"adaptive": [rec]}, "_traj.csv", ("name", "seed"), "traj")
  (got,) = study_report.load_records(out, None, "_traj.csv", ("name", "seed"), "traj")["adaptive"]
  assert got["seed"] == 2 and "to_target" not in got
  np.testing.assert_array_equal(got["traj"]["N"], [16.0, 32.0])
  np.testing.assert_array_equal(got["traj"]["lo"], [math.nan, 1.5])
  np.testing.assert_array_equal(got["traj"]["hi"], [math.inf, 9.0])


def test_records_are_keyed_by_group_and_name(tmp_path):
  """Rows of two runs interleaved in the file still make two records, each
  with its own curve in file order; a name twice in one group is refused."""
  out = report.Results("study", root=str(tmp_path))
  study_report.save_records(
      out, {"g": [_record("a", 16, 0, None, [0.1, 0.2]), _record("b", 16, 1, None, [0.3, 0.4])]}
  )
  path = out.path(study_report.RECORDS)
  head, *lines = open(path).read().splitlines()
  with open(path, "w") as f:  # a, b, a, b
    f.write("\n".join([head, lines[0], lines[2], lines[1], lines[3]]) + "\n")
  a, b = study_report.load_records(out)["g"]
  assert (a["name"], b["name"]) == ("a", "b")
  np.testing.assert_array_equal(a["curve"]["value"], [0.1, 0.2])
  np.testing.assert_array_equal(b["curve"]["value"], [0.3, 0.4])
  with pytest.raises(ValueError, match=r"'g' names runs \['a'\]"):
    study_report.save_records(out, {"g": [_record("a", 16, 0, None, [0.1])] * 2})


def test_load_records_names_the_missing_file(tmp_path):
  out = report.Results("study", root=str(tmp_path))
  with pytest.raises(FileNotFoundError, match="study_curves.csv: no committed records"):
    study_report.load_records(out, [0.5])
