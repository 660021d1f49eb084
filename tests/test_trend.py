"""A line over replicated points (cbs_jax.trend) and its lack-of-fit test
(cbs_jax.stats.lack_of_fit): against the textbook sums of squares, its
false-alarm rate on lines, its power on a curve, and the coverage of the
slope's and the crossing point's intervals on synthetic designs like the
noise-length study's (five groups, two replicates each)."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from cbs_jax import stats
from cbs_jax import trend

X = np.log([3.0, 20.0, 37.0, 70.0, 137.0])  # log completion lengths, like the study's


def design(reps=2):
  x = np.repeat(X, reps)
  return x, np.repeat(np.arange(X.size), reps)


def test_lack_of_fit_equals_the_textbook_sums_of_squares():
  rng = np.random.default_rng(0)
  x, g = design(3)
  y = 1.0 + 0.5 * x + 0.3 * x**2 + rng.normal(0, 0.2, x.size)
  got = stats.lack_of_fit(x, y, g)
  b, a = np.polyfit(x, y, 1)
  means = np.array([y[g == k].mean() for k in g])
  ss_pure = np.sum((y - means) ** 2)
  ss_lack = np.sum((means - (a + b * x)) ** 2)
  m, n = X.size, x.size
  F = (ss_lack / (m - 2)) / (ss_pure / (n - m))
  assert got["F"] == pytest.approx(F, rel=1e-9)
  assert got["p_value"] == pytest.approx(sps.f.sf(F, m - 2, n - m), rel=1e-9)
  assert (got["dof_lack"], got["dof_pure"]) == (3, 10)
  with pytest.raises(ValueError, match="replicate"):
    stats.lack_of_fit(X, X, np.arange(X.size))


def test_lack_of_fit_keeps_its_level_on_lines_and_finds_a_curve():
  rng = np.random.default_rng(1)
  x, g = design(2)
  flat = [stats.lack_of_fit(x, 2 + 0.4 * x + rng.normal(0, 0.3, x.size), g) for _ in range(2000)]
  alarm = np.mean([r["p_value"] < 0.05 for r in flat])
  assert 0.035 < alarm < 0.065  # ~5% false alarms (binomial SE 0.5%)
  curve = [
      stats.lack_of_fit(x, 0.4 * (x - 2.5) ** 2 + rng.normal(0, 0.1, x.size), g) for _ in range(200)
  ]
  assert np.mean([r["verdict"] == "misfits" for r in curve]) > 0.95


def test_slope_and_crossing_intervals_cover_the_truth():
  """A power law ratio = 2 L^0.6 with base-to-base scatter (log SD 0.25):
  the slope's and the 100:1 crossing's 90% intervals each cover the truth
  in 86-94% of 1,000 synthetic studies (binomial SE ~1%)."""
  rng = np.random.default_rng(2)
  x, g = design(2)
  a, b = math.log(2.0), 0.6
  x_true = (math.log(100.0) - a) / b
  hit_b, hit_x = [], []
  for _ in range(1000):
    y = a + b * x + rng.normal(0, 0.25, x.size)
    f = trend.fit(x, y, g, y_star=math.log(100.0))
    hit_b.append(f["b_lo"] <= b <= f["b_hi"])
    hit_x.append(f["x_star_lo"] <= x_true <= f["x_star_hi"])
  assert 0.86 <= np.mean(hit_b) <= 0.94, np.mean(hit_b)
  assert 0.86 <= np.mean(hit_x) <= 0.94, np.mean(hit_x)


def test_a_misfit_widens_the_interval_instead_of_hiding():
  """A curve read as a line: the lack-of-fit test says so and the slope's
  interval (from the group means' scatter) is wider than the replicates'
  scatter alone would make it."""
  rng = np.random.default_rng(4)
  x, g = design(2)
  y = 0.8 * (x - 2.5) ** 2 + rng.normal(0, 0.05, x.size)
  f = trend.fit(x, y, g)
  pure_se = 0.05 / math.sqrt(2) / math.sqrt(np.sum((X - X.mean()) ** 2))
  assert f["lack_of_fit"]["verdict"] == "misfits"
  assert f["b_se"] > 5 * pure_se


def test_a_flat_trend_never_reaches_the_target():
  """No slope: the crossing's interval is unbounded above, not a number."""
  rng = np.random.default_rng(3)
  x, g = design(2)
  f = trend.fit(x, 1.0 + rng.normal(0, 0.3, x.size), g, y_star=math.log(100.0))
  if f["b_lo"] < 0 < f["b_hi"]:
    assert math.isinf(f["x_star_hi"]) and math.isinf(f["x_star_lo"])
  # with the slope resolved, the crossing is a bounded interval around it
  steep = trend.fit(x, 1.0 + 0.8 * x + rng.normal(0, 0.05, x.size), g, y_star=math.log(100.0))
  assert steep["x_star_lo"] < steep["x_star"] < steep["x_star_hi"] < math.inf


def test_fit_rejects_bad_input_by_name():
  x, g = design(2)
  with pytest.raises(ValueError, match="finite"):
    trend.fit(x, np.where(g == 0, np.nan, x), g)
  with pytest.raises(ValueError, match=">= 3 groups"):
    trend.fit(np.arange(4.0), np.arange(4.0), np.array([0, 0, 1, 1]))
  with pytest.raises(ValueError, match="one length"):
    trend.fit(x, x[:-1], g)
