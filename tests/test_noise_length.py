"""The noise-length study's analysis (experiments/noise_length.py) on
synthetic per-base tables with a known power law: the fits recover it,
unmatched bases stay out, the tables and figure are written, and the
design (every level at one target, >= 2 bases each) is what the
configuration says."""

import argparse
import math

import numpy as np
import pytest

from configs import noise_length as cfg
from tests import experiment_scripts

S = experiment_scripts.load("noise_length")
LENGTHS = {0: 3.3, 1: 19.5, 2: 36.0, 4: 69.0, 8: 136.0}


def row(arm, level, target, seed, ratio, matched=True, pass_rate=None):
  return dict(
      arm=arm,
      level=level,
      target=target,
      seed=seed,
      sft_steps=100,
      pass_rate=target if pass_rate is None else pass_rate,
      matched=matched,
      completion_len=LENGTHS[level],
      reward_mean=target,
      trace_intra=ratio,
      trace_intra_se=0.1,
      trace_inter=1.0,
      trace_inter_se=0.01,
      ratio=ratio,
      ratio_se=0.05 * ratio,
      P=64,
      K=16,
      batches=6,
  )


def synthetic(b=0.6, scatter=0.1, seed=0):
  """ratio = 2 L^b with log scatter, every point of the real design."""
  rng = np.random.default_rng(seed)
  out = []
  for p in S.points(quick=False):
    L = LENGTHS[p["level"]]
    pass_slope = 1.5 * (p["target"] - cfg.TARGET)  # the pass arm: log ratio rises with pass
    r = 2.0 * L**b * math.exp(pass_slope + scatter * rng.normal())
    out.append(row(p["arm"], p["level"], p["target"], p["seed"], r))
  return out


def test_design_every_level_at_the_target_and_the_pass_arm_at_one_length():
  pts = S.points(quick=False)
  length = [p for p in pts if p["arm"] == "length"]
  assert sorted({p["level"] for p in length}) == sorted(cfg.LEVELS)
  assert {p["target"] for p in length} == {cfg.TARGET}
  assert all(sum(p["level"] == lv for p in length) >= 2 for lv in cfg.LEVELS)  # >= 2 bases
  at_level = [p for p in pts if p["level"] == cfg.PASS_LEVEL]
  assert sorted({p["target"] for p in at_level}) == sorted(cfg.PASS_TARGETS)
  assert len({S.name(p) for p in pts}) == len(pts)
  # the overrides give level 0 the answer format, the others their steps
  assert S.overrides(dict(level=0, target=0.3, seed=1))["task.kwargs.solution_format"] == "answer"
  assert S.overrides(dict(level=4, target=0.3, seed=1))["task.kwargs.step_split"] == 4


def test_fits_recover_the_power_and_where_it_reaches_100():
  table = synthetic(b=0.6, scatter=0.05)
  f = S.fits(table, quick=False)
  L = f["length"]
  assert L["b_lo"] <= 0.6 <= L["b_hi"] and L["b_hi"] - L["b_lo"] < 0.2
  x100 = (math.log(100.0) - math.log(2.0)) / 0.6  # log length where 2 L^0.6 = 100
  assert L["x_star_lo"] <= x100 <= L["x_star_hi"]
  assert L["groups"] == len(cfg.LEVELS) and L["n"] == len(cfg.SEEDS) * len(cfg.LEVELS)
  P = f["pass"]
  assert (
      P["groups"] == len(cfg.PASS_TARGETS) and abs(P["b"] - 1.5) < 0.3
  )  # 1 dof: no coverage claim
  lines = "\n".join(S.fit_lines(f))
  assert "lack of fit" in lines and "extrapolation" in lines


def test_unmatched_bases_stay_out_of_the_fit():
  table = synthetic(scatter=0.05)
  ref = S.fits(table, quick=False)["length"]
  table.append(row("length", 8, cfg.TARGET, 9, 1e6, matched=False, pass_rate=0.05))
  got = S.fits(table, quick=False)["length"]
  assert got["b"] == pytest.approx(ref["b"]) and got["n"] == ref["n"]


def test_a_flat_trend_says_unresolved_not_a_length():
  f = S.fits(synthetic(b=0.0, scatter=0.3, seed=1), quick=False)
  if f["length"]["b_lo"] <= 0:
    assert "unresolved" in "\n".join(S.fit_lines(f))


def test_analyse_writes_the_table_fits_and_figure(tmp_path):
  args = argparse.Namespace(
      out=str(tmp_path), quick=False, replot=False, root=str(tmp_path / "runs")
  )
  S.analyse(args, synthetic(), 0.0, "python experiments/noise_length.py")
  d = tmp_path / "noise_length"
  for name in ("noise_length.md", "noise_length.csv", "noise_length.png", "manifest.json"):
    assert (d / name).stat().st_size > 0
  md = (d / "noise_length.md").read_text()
  assert "ratio ∝ length^" in md and "not matched (left out): none" in md


def test_matching_includes_its_bound_and_needs_the_target_reached():
  assert S.is_matched(True, 0.75, 0.7)  # |0.75 - 0.7| = 0.05 in floats is 0.05000000000000004
  assert S.is_matched(True, 0.25, 0.3)
  assert not S.is_matched(True, 0.7501, 0.7)
  assert not S.is_matched(False, 0.7, 0.7)  # stopped at the step cap, not at the target


def test_group_means_are_geometric_means_with_a_t_interval_on_logs():
  rows = [row("length", 2, 0.3, s, r) for s, r in enumerate((8.0, 12.0, 18.0))]
  rows.append(row("length", 4, 0.3, 0, 20.0))
  m2, m4 = S.group_means(rows)
  assert m2["n"] == 3 and m2["ratio"] == pytest.approx(12.0)  # (8 * 12 * 18)^(1/3) = 12
  logs = np.log([8.0, 12.0, 18.0])
  half = 2.919986 * logs.std(ddof=1) / math.sqrt(3)  # t(0.95, 2 dof) from a table
  assert m2["lo"] == pytest.approx(12.0 * math.exp(-half), rel=1e-5)
  assert m2["hi"] == pytest.approx(12.0 * math.exp(half), rel=1e-5)
  assert m4["n"] == 1 and math.isnan(m4["lo"])  # one base: no interval
  (by_target,) = S.group_means(rows, "target")  # every row at target 0.3: one group of 4
  assert by_target["target"] == 0.3 and by_target["n"] == 4


def test_token_counts_read_as_text():
  assert S._tokens(3497.2) == "3,497"
  assert S._tokens(8.99e19) == "9.0e+19"
  assert S._tokens(math.inf) == "∞" and S._tokens(math.nan) == "unbounded"
