"""Fits with intervals: S(N) with bootstrap CIs, weighted trend verdicts.

Independent checks: synthetic data drawn from known laws (the truth is
known, so recovery and interval coverage are checked against it), and the
weighted least-squares coefficients against numpy's polyfit with weights.
"""

import math

import numpy as np
import pytest

from cbs_jax import batch_law
from cbs_jax import drift
from cbs_jax import stats

NS = 2 ** np.arange(6, 15)  # 64 .. 16,384


def _sweep(rng, ns=NS, seeds=3, s_min=50.0, b_crit=1000.0, cv=0.1):
  n = np.repeat(ns, seeds).astype(float)
  s = s_min * (1 + b_crit / n) * np.exp(rng.normal(0.0, cv, n.size))
  return n, s, np.tile(np.arange(seeds), len(ns))


def test_fit_recovers_the_law_exactly_without_noise():
  n = np.repeat(NS, 3).astype(float)
  s = 120.0 * (1 + 700.0 / n)
  fit = batch_law.fit_critical_batch(n, s, np.tile([0, 1, 2], len(NS)), n_boot=200)
  assert fit["S_min"] == pytest.approx(120.0) and fit["B_crit"] == pytest.approx(700.0)
  assert fit["E_min"] == pytest.approx(120.0 * 700.0) and fit["r2"] == pytest.approx(1.0)
  assert fit["B_crit_lo"] == pytest.approx(700.0) and fit["B_crit_hi"] == pytest.approx(700.0)
  assert fit["resolved"]
  # the hyperbola (S/S_min - 1)(E/E_min - 1) = 1 holds at every N
  assert np.allclose((s / fit["S_min"] - 1) * (n * s / fit["E_min"] - 1), 1.0)


def test_fit_recovers_a_known_b_crit_from_noisy_seeds():
  fit = batch_law.fit_critical_batch(*_sweep(np.random.default_rng(1)), n_boot=1000, level=0.99)
  assert fit["B_crit_lo"] < 1000.0 < fit["B_crit_hi"]
  assert abs(math.log(fit["B_crit"] / 1000.0)) < math.log(1.5)
  assert fit["resolved"]


def test_ninety_percent_interval_covers_the_truth_85_to_95_percent():
  rng = np.random.default_rng(2)
  hits = [batch_law.fit_critical_batch(*_sweep(rng), n_boot=400, seed=i) for i in range(200)]
  cover = np.mean([f["B_crit_lo"] <= 1000.0 <= f["B_crit_hi"] for f in hits])
  assert 0.85 <= cover <= 0.95, cover


def test_sweep_below_the_knee_is_unresolved():
  ns = 2 ** np.arange(3, 8)  # 8 .. 128, all far below B_crit = 1000
  fit = batch_law.fit_critical_batch(*_sweep(np.random.default_rng(3), ns=ns), n_boot=500)
  assert not fit["resolved"] and fit["verdict"] == "unresolved"
  assert fit["B_crit_hi"] > ns.max()
  assert "swept range" in fit["why"] or "degenerate" in fit["why"]


def test_censored_batch_sizes_are_left_out_and_listed():
  n, s, sd = _sweep(np.random.default_rng(4))
  s = s.astype(object)
  s[n == 64] = None
  s[(n == 128) & (sd == 1)] = None  # one seed never reached the target
  fit = batch_law.fit_critical_batch(n, list(s), sd, n_boot=200)
  assert fit["censored"] == [64.0, 128.0] and fit["n_min"] == 256.0


def test_fit_shortfalls_are_named():
  with pytest.raises(ValueError, match="distinct batch sizes"):
    batch_law.fit_critical_batch([64, 64, 128, 128], [10, 11, 5, 6])
  with pytest.raises(ValueError, match="N=128 has 2 seed"):
    batch_law.fit_critical_batch(
        [64] * 3 + [128] * 2 + [256] * 3, [9, 9, 9, 5, 5, 3, 3, 3], [0, 1, 2, 0, 1, 0, 1, 2]
    )


def test_ratio_interval_of_two_fits():
  a = batch_law.fit_critical_batch(*_sweep(np.random.default_rng(5), b_crit=4000.0), n_boot=800)
  b = batch_law.fit_critical_batch(*_sweep(np.random.default_rng(6), b_crit=500.0), n_boot=800)
  lo, hi = batch_law.bootstrap_ratio_interval(a["boot_B_crit"], b["boot_B_crit"])
  assert lo < 8.0 < hi and hi < 40


def test_wls_matches_numpy_weighted_polyfit():
  rng = np.random.default_rng(7)
  x = rng.uniform(0, 1, 40)
  se = rng.uniform(0.1, 1.0, 40)
  y = 1 + 2 * x - 3 * x**2 + rng.normal(0, se)
  X = np.stack([np.ones_like(x), x, x * x], 1)
  got = stats.wls(X, y, se).coef
  want = np.polyfit(x, y, 2, w=1 / se)[::-1]  # polyfit's w multiplies residuals
  np.testing.assert_allclose(got, want, rtol=1e-8)


@pytest.mark.parametrize("truth,least", [("quadratic", 0.9), ("linear", 0.85), ("flat", 0.85)])
def test_trend_verdict_linear_vs_quadratic(truth, least):
  """Over 100 synthetic data sets the verdict names the true law in most
  (a test at alpha = 0.05 calls a flat law 'linear' ~5% of the time)."""
  rng = np.random.default_rng(8)
  k = np.linspace(0.0, 0.1, 16)
  mean = {"quadratic": 100 + 4e4 * k**2, "linear": 100 + 800 * k, "flat": 100 + 0 * k}[truth]
  se = np.full_like(k, 3.0)
  fits = [drift.fit_trend(k, mean + rng.normal(0, se), se) for _ in range(100)]
  assert np.mean([f["verdict"] == truth for f in fits]) >= least
  assert fits[0]["weighted"] and fits[0]["n"] == 16


def test_trend_weights_follow_the_standard_errors():
  """A wild point with a huge SE must not drive the fit; unweighted, it does."""
  k = np.linspace(0.0, 0.1, 12)
  y = 100 + 500 * k
  se = np.ones_like(k)
  y2, se2 = y.copy(), se.copy()
  y2[-1] += 300.0
  se2[-1] = 1e4
  w = drift.fit_trend(k, y2, se2)
  u = drift.fit_trend(k, y2)
  assert w["linear"]["coef"][1] == pytest.approx(500.0, rel=1e-3)
  assert w["verdict"] == "linear"
  assert u["linear"]["coef"][1] > 1000.0  # unweighted, the wild point drives the slope
  with pytest.raises(ValueError, match="distinct kappa"):
    drift.fit_trend([0.1, 0.1, 0.1, 0.1], [1, 2, 3, 4])


def test_ratio_of_means_and_its_jackknife_against_monte_carlo():
  """Paired replicates with true ratio 1.3 and a noisy denominator (CV 0.5):
  the averaged within-replicate ratio is biased upward by ~CV^2; the ratio of
  means is not, and its jackknife SE matches the spread over 2,000 repeats."""
  rng = np.random.default_rng(0)
  n, reps = 60, 2000
  den = rng.gamma(4.0, 25.0, size=(reps, n))  # mean 100, CV 0.5
  num = 1.3 * rng.gamma(4.0, 25.0, size=(reps, n))  # independent of den, mean 130
  est = np.array([stats.ratio_of_means(a, b) for a, b in zip(num, den)])
  naive = (num / den).mean(1)
  assert abs(est[:, 0].mean() - 1.3) < 0.01
  assert naive.mean() > 1.3 * 1.25  # E[1/den] ~ (1 + CV^2) / E[den]
  assert est[:, 1].mean() == pytest.approx(est[:, 0].std(), rel=0.1)
  # the point estimate is sum / sum, checked by hand on a small case
  r, se = stats.ratio_of_means([1.0, 2.0, 3.0], [2.0, 2.0, 2.0])
  loo = np.array([5 / 4, 4 / 4, 3 / 4])
  assert r == 1.0 and se == pytest.approx(np.sqrt(2 / 3 * np.sum((loo - loo.mean()) ** 2)))
  with pytest.raises(ValueError, match="num has 2 values, den 3"):
    stats.ratio_of_means([1, 2], [1, 2, 3])
  with pytest.raises(ValueError, match="1 replicates"):
    stats.ratio_of_means([1], [1])


def test_r_squared_of_the_constant_model_is_exactly_zero_whatever_the_summation_order():
  """The constant (weighted-mean) model explains nothing: R² = 0 exactly, but
  1 - chi2/ss_tot leaves +-1e-16 whose sign depends on the order of the sums
  (a committed fits file differed between two processors by exactly that).
  Summed in shuffled orders, stats.r_squared gives 0.0 (not -0.0) every time;
  a real R² is unchanged to 12 decimals (closed form from numpy here)."""
  rng = np.random.default_rng(3)
  x = np.linspace(0.0, 1.0, 9)
  y = 2.0 + 0.7 * x + 0.1 * rng.standard_normal(9)
  w = 1.0 / (0.05 + 0.1 * x) ** 2
  raw = set()
  for perm in (rng.permutation(9) for _ in range(40)):
    ys, ws = y[perm], w[perm]
    mean = np.sum(ws * ys) / np.sum(ws)
    ss_tot = math.fsum(ws * (ys - mean) ** 2)
    chi2_const = float(np.sum(ws * (ys - mean) ** 2))  # summed in numpy's order
    raw.add(1.0 - chi2_const / ss_tot)
    r2 = stats.r_squared(chi2_const, ss_tot)
    assert r2 == 0.0 and math.copysign(1.0, r2) == 1.0
  assert any(v != 0.0 for v in raw)  # the unrounded value does wander
  slope, icpt = np.polyfit(x, y, 1, w=np.sqrt(w))
  ss_res = float(np.sum(w * (y - icpt - slope * x) ** 2))
  ss_tot = float(np.sum(w * (y - np.average(y, weights=w)) ** 2))
  assert stats.r_squared(ss_res, ss_tot) == pytest.approx(1.0 - ss_res / ss_tot, abs=1e-12)
  assert math.isnan(stats.r_squared(1.0, 0.0))
  # the fits that report it: a flat trend's constant model
  fit = drift.fit_trend([0.0, 0.1, 0.2, 0.3, 0.4], [1.0, 1.2, 0.9, 1.1, 1.0])
  assert fit["const"]["r2"] == 0.0
