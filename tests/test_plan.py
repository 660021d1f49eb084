"""cbs_jax.plan: which noise record it reads from a run directory, and the
plan it makes when B_noise is only bounded from below, the usual end of a
run near its plateau (docs/planner.md, "Time to target")."""

import json
import math
import os
import types

import numpy as np
import pytest

from cbs_jax import plan
from configs import default
from tests import entry_points

ACC, CHIPS, TP, TC = "h100_sxm", 8, 9, 5


def _write(path, obj):
  with open(path, "w") as f:
    json.dump(obj, f)


def _summary(b_noise, floor, se=None, flag=""):
  nz = dict(rounds_pooled=500, K=16, b_noise=b_noise, b_noise_se=se, flag=flag)
  if floor is not None:
    nz["b_noise_floor"] = floor
  return dict(rounds=1000, noise=nz)


def _measure(b_noise, floor, se=None):
  return dict(K=16, P=64, M=24, exact=dict(b_noise=b_noise, b_noise_se=se, b_noise_floor=floor))


def test_load_noise_prefers_a_resolved_record_then_a_bound(tmp_path):
  d = str(tmp_path)
  unresolved = "g2 not significantly positive (g2=0.08, se=0.05)"
  _write(os.path.join(d, "summary.json"), _summary(math.nan, 6000.0, flag=unresolved))
  rec = plan.load_noise(d)  # the only record: bounded
  assert rec["b_noise"] is None and rec["b_noise_floor"] == 6000.0
  assert rec["source"].endswith("summary.json") and rec["flag"] == unresolved
  # a measurement with its own bound (a later round first) still loses to nothing resolved ...
  _write(os.path.join(d, "measure_round100_P64_K16.json"), _measure(math.nan, 900.0))
  _write(os.path.join(d, "measure_round900_P64_K16.json"), _measure(math.nan, 4000.0))
  rec = plan.load_noise(d)
  assert rec["b_noise_floor"] == 4000.0 and "round900" in rec["source"]
  # ... and any resolved record beats every bound, here the summary
  _write(os.path.join(d, "summary.json"), _summary(7000.0, 5000.0, se=900.0))
  rec = plan.load_noise(d)
  assert rec["b_noise"] == 7000.0 and rec["b_noise_se"] == 900.0
  assert rec["source"].endswith("summary.json")


@pytest.mark.parametrize("floor", [None, 0.0, math.nan])
def test_load_noise_without_a_positive_bound_says_why(tmp_path, floor):
  d = str(tmp_path)
  _write(os.path.join(d, "summary.json"), _summary(math.nan, floor, flag="g2 not significantly"))
  with open(os.path.join(d, "measure_round5_P4_K4.json"), "w") as f:
    f.write("{not json")
  with pytest.raises(ValueError) as e:
    plan.load_noise(d)
  msg = str(e.value)
  assert "no usable noise record" in msg and "b_noise=nan" in msg
  assert "measure_round5_P4_K4.json: unreadable" in msg
  assert ("b_noise_floor" in msg) == (floor is not None)
  with pytest.raises(ValueError, match="not a directory"):
    plan.load_noise(os.path.join(d, "nope"))


def _recommend(rec, **kw):
  return plan.recommend(rec, ACC, CHIPS, default.get_config().model, TP, TC, **kw)


@pytest.mark.parametrize("floor", [50.0, 6000.0, 2e5])
def test_a_bounded_b_gets_the_least_worst_case_slowdown_over_b_above_the_bound(floor):
  """The rows are at B = floor; the recommendation minimises the worst
  slowdown over every B >= floor, checked against the rows' own round times
  on 20,000 log-spaced B up to 1e10 (independent of the crossing points
  time_optimal evaluates)."""
  rec = dict(b_noise=None, b_noise_floor=floor, K=16, source="a run")
  for ns in (None, [16, 64, 256, 1024, 4096]):
    kw = {} if ns is None else dict(ns=ns, overheads=None)
    res = _recommend(rec, **kw)
    n = np.array([r["n"] for r in res["rows"]], float)
    t = np.array([r["round_s"] for r in res["rows"]])
    bs = np.concatenate([[floor], floor + np.logspace(-2, 10, 20000)])
    rel = (1 + bs[None, :] / n[:, None]) * t[:, None]
    worst = (rel / rel.min(axis=0)).max(axis=1)
    np.testing.assert_allclose([r["worst"] for r in res["rows"]], worst, rtol=1e-3)
    assert res["best"]["n"] == n[np.argmin(worst)]
    assert res["b"] is None and res["b_floor"] == floor
    for r in res["rows"]:
      assert r["s_rel"] == pytest.approx(1 + floor / r["n"])
    best_at = lambda b: n[np.argmin((1 + b / n) * t)]
    assert res["n_range_2se"] == (best_at(floor), n[np.argmin(t / n)])
    text = plan.format_report(res)
    assert f"B >= {floor:.4g} rollouts (B_noise unresolved" in text
    assert "worst" in text.splitlines()[5] and f"recommended: N={res['best']['n']}" in text
    assert any("not resolved" in s and "cbs_jax.measure" in s for s in res["reasoning"])


def test_a_resolved_b_is_planned_as_before_and_no_b_at_all_is_an_error():
  res = _recommend(dict(b_noise=3000.0, b_noise_se=300.0, b_noise_floor=2400.0, K=16))
  assert res["b"] == 3000.0 and res["b_floor"] is None
  assert all(r["worst"] is None for r in res["rows"])
  assert "worst" not in plan.format_report(res)
  with pytest.raises(ValueError, match="b_noise_floor"):
    _recommend(dict(b_noise=math.nan, b_noise_floor=0.0, K=16, flag="g2 not significantly"))


def test_plan_from_a_run_dir_whose_summary_only_bounds_b(tmp_path, monkeypatch):
  """The README's plan command, its flags parsed as its command line would
  be, on a workdir whose run ended near its plateau: config.json and a
  summary with b_noise nan but a floor."""
  d = str(tmp_path)
  _write(os.path.join(d, "config.json"), default.get_config().to_dict())
  _write(os.path.join(d, "summary.json"), _summary(math.nan, 6000.0, flag="g2 not significantly"))
  args = [f"--run_dir={d}", f"--accelerator={ACC}", f"--chips={CHIPS}"]
  flags = types.SimpleNamespace(**entry_points.absl_parse(monkeypatch, "cbs_jax.plan", args))
  res = plan.plan_from_flags(flags)
  assert res["b_floor"] == 6000.0 and res["K"] == 16 and res["chips"] == CHIPS
  assert res["best"]["worst"] == min(r["worst"] for r in res["rows"])
