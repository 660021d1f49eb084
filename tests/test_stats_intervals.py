"""Tests for the interval pieces of cbs_jax.stats: Fieller's interval for a
ratio (against a brute-force scan of the ratios it must contain) and the
Student-t quantile matched to a normal quantile's coverage (against closed
forms and a Monte Carlo of the t-interval for a normal mean), and the
paired timing ratio with its goal verdict (against the plain median and a
Monte Carlo of its coverage under a shared, heavy-tailed machine state)."""

import math

import numpy as np
import pytest

from cbs_jax import stats

# (num, den, var_num, var_den, cov, z): resolved denominators, either sign,
# correlated or not, down to barely resolved.
RESOLVED = [
    (5.0, 1.0, 0.4, 0.04, 0.05, 2.0),
    (500.0, 1.0, 9e3, 0.2, -20.0, 2.0),
    (-3.0, 2.0, 1.0, 0.5, 0.3, 1.5),
    (4.0, -1.5, 2.0, 0.3, -0.6, 2.5),
    (1.0, 1.0, 0.01, 0.24, 0.0, 2.0),
]


def _scan(num, den, var_num, var_den, cov, z, lo, hi, n=400_001):
  r = np.linspace(lo, hi, n)
  keep = (num - r * den) ** 2 <= z * z * (var_num - 2 * r * cov + r * r * var_den)
  return r[keep], r[1] - r[0]


@pytest.mark.parametrize("args", RESOLVED)
def test_fieller_interval_is_the_set_of_unrejected_ratios(args):
  num, den = args[:2]
  lo, hi = stats.fieller_interval(*args)
  assert lo <= num / den <= hi
  width = hi - lo
  inside, step = _scan(*args, lo - width, hi + width)
  assert inside[0] == pytest.approx(lo, abs=2 * step)
  assert inside[-1] == pytest.approx(hi, abs=2 * step)
  assert np.all(np.diff(inside) < 1.5 * step)  # one interval, no gaps


def test_fieller_interval_is_skewed_away_from_zero_when_barely_resolved():
  lo, hi = stats.fieller_interval(1.0, 1.0, 0.01, 0.24, 0.0, 2.0)
  assert hi - 1.0 > 3 * (1.0 - lo)


@pytest.mark.parametrize("den,var_den", [(1.0, 0.3), (1.0, 1.0), (0.0, 0.1), (-0.5, 0.1)])
def test_fieller_interval_unbounded_when_the_denominator_is_not_resolved(den, var_den):
  args = (2.0, den, 0.5, var_den, 0.0, 2.0)
  assert stats.fieller_interval(*args) == (-math.inf, math.inf)
  # the set reaches both ends of any finite scan (whole line or line less an interval)
  inside, _ = _scan(*args, -1e4, 1e4, n=20_001)
  assert inside[0] == -1e4 and inside[-1] == 1e4


def _phi(z):
  return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@pytest.mark.parametrize("z", [0.5, 1.0, 2.0, 3.0])
def test_t_quantile_like_closed_forms_at_one_and_two_dof(z):
  p = _phi(z)
  assert stats.t_quantile_like(z, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-9)
  assert stats.t_quantile_like(z, 2) == pytest.approx(
      (2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-9
  )


def test_t_quantile_like_restores_the_normal_coverage_of_a_t_interval():
  """mean +- t s / sqrt(n) for n normal draws: coverage 2 Phi(z) - 1 (sd of
  the Monte Carlo coverage over 40,000 reps: ~0.001), while +- z s / sqrt(n)
  falls short by 0.04-0.15 at these n."""
  rng = np.random.default_rng(0)
  for n in (3, 4, 8):
    x = rng.standard_normal((40_000, n))
    half = x.std(axis=1, ddof=1) / math.sqrt(n)
    for z in (1.0, 2.0):
      nominal = 2 * _phi(z) - 1
      t = stats.t_quantile_like(z, n - 1)
      assert np.mean(np.abs(x.mean(axis=1)) <= t * half) == pytest.approx(nominal, abs=0.006)
      assert np.mean(np.abs(x.mean(axis=1)) <= z * half) < nominal - 0.03


def test_t_quantile_like_edge_cases():
  assert stats.t_quantile_like(2.0, 0.5) == math.inf
  assert stats.t_quantile_like(2.0, math.nan) == math.inf
  assert stats.t_quantile_like(2.0, math.inf) == 2.0
  qs = [stats.t_quantile_like(2.0, d) for d in (1, 1.5, 2, 3, 10, 100, 1e6)]
  assert all(a > b for a, b in zip(qs, qs[1:])) and qs[-1] == pytest.approx(2.0, rel=1e-5)


UNRESOLVED_DEN = [
    (5.0, 0.2, 0.5, 0.04, 0.01, 2.0),  # numerator resolved, denominator not
    (300.0, 0.5, 900.0, 0.3, -2.0, 2.0),
    (2.0, 0.0, 0.3, 0.5, 0.0, 2.0),  # denominator estimate exactly 0
]


@pytest.mark.parametrize("args", UNRESOLVED_DEN + RESOLVED[:2])
def test_fieller_lower_bound_is_the_least_unrejected_nonnegative_ratio(args):
  """The bound against a grid scan of Fieller's set on r >= 0: the least
  ratio the test does not reject, and every larger ratio up to far out is
  not rejected either where the denominator is unresolved."""
  num, den, var_num, var_den, cov, z = args
  b = stats.fieller_lower_bound(*args)
  assert 0 < b < math.inf
  span = 50 * b
  inside, step = _scan(*args, 0.0, span)
  assert inside[0] == pytest.approx(b, abs=2 * step)
  if den * den <= z * z * var_den:  # unbounded above on r >= 0
    assert inside[-1] == pytest.approx(span)
    assert np.all(np.diff(inside) < 1.5 * step)


def test_fieller_lower_bound_is_zero_when_zero_is_not_rejected():
  assert stats.fieller_lower_bound(0.1, 0.2, 1.0, 0.04, 0.0, 2.0) == 0.0  # num unresolved
  assert stats.fieller_lower_bound(0.1, 1.0, 1.0, 0.01, 0.0, 2.0) == 0.0  # lo < 0, clipped


def test_paired_ratio_is_the_median_of_pair_ratios_and_cancels_the_shared_state():
  rng = np.random.default_rng(0)
  speed = rng.uniform(0.6, 1.6, 25)  # the machine's state, shared within a pair
  den = 10.0 * speed * (1 + 0.01 * rng.standard_normal(25))
  num = 1.1 * 10.0 * speed * (1 + 0.01 * rng.standard_normal(25))
  med, lo, hi = stats.paired_ratio(num, den)
  assert med == pytest.approx(float(np.median(num / den)), rel=1e-12)
  assert lo <= med <= hi and 1.09 < lo and hi < 1.11  # the state spread is gone
  # broken pairs keep it: the same timings, paired at random, are far wider
  _, lo_x, hi_x = stats.paired_ratio(num, rng.permutation(den))
  assert hi_x - lo_x > 10 * (hi - lo)


def test_paired_ratio_interval_covers_the_true_median_ratio():
  """90% intervals from 15 pairs with heavy-tailed delays (one call in eight
  taken 1.5-3x longer, on either path) cover the true median ratio in about
  90% of 300 simulated benchmarks."""
  rng = np.random.default_rng(1)
  true, hits, n_sim = 1.05, 0, 300
  for _ in range(n_sim):
    speed = rng.uniform(0.8, 1.3, 15)
    delay = lambda: np.where(rng.random(15) < 0.125, rng.uniform(1.5, 3.0, 15), 1.0)
    den = speed * np.exp(0.02 * rng.standard_normal(15)) * delay()
    num = true * speed * np.exp(0.02 * rng.standard_normal(15)) * delay()
    _, lo, hi = stats.paired_ratio(num, den, n_boot=1000, seed=int(rng.integers(1 << 30)))
    hits += lo <= true <= hi
  # the median of the noise-free ratio is `true` by symmetry of the log errors
  # and of the delays; a percentile bootstrap of a median with 15 pairs is
  # somewhat conservative (order statistics)
  assert 0.84 <= hits / n_sim <= 0.99


def test_paired_ratio_claims_nothing_from_a_handful_of_pairs():
  med, lo, hi = stats.paired_ratio([1.0, 1.1, 1.2, 1.3], [1.0] * 4)
  assert med == pytest.approx(1.15) and (lo, hi) == (0.0, math.inf)
  assert stats.paired_ratio([3.0], [2.0]) == (1.5, 0.0, math.inf)
  assert stats.goal_verdict(lo, hi, 1.05) == "unresolved"
  assert stats.goal_verdict(lo, hi, 1.5, at_most=False) == "unresolved"


@pytest.mark.parametrize(
    "lo,hi,goal,at_most,want",
    [
        (1.01, 1.04, 1.05, True, "met"),
        (1.06, 1.10, 1.05, True, "not met"),
        (1.03, 1.07, 1.05, True, "unresolved"),
        (1.50, 1.70, 1.5, False, "met"),
        (1.10, 1.30, 1.5, False, "not met"),
        (1.40, 1.60, 1.5, False, "unresolved"),
    ],
)
def test_goal_verdict(lo, hi, goal, at_most, want):
  assert stats.goal_verdict(lo, hi, goal, at_most) == want


@pytest.mark.parametrize(
    "num,den,needle",
    [
        ([1.0, 2.0], [1.0], "num has 2 values, den 1"),
        ([], [], "no pairs"),
        ([1.0, 2.0], [1.0, 0.0], "expected positive"),
    ],
)
def test_paired_ratio_bad_input_names_the_problem(num, den, needle):
  with pytest.raises(ValueError, match=needle):
    stats.paired_ratio(num, den)
