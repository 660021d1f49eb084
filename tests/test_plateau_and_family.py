"""Two judgements the drift and clipping studies make: has a learning curve
stopped moving (``stats.plateau``), and which trend model a noise quantity
follows when many are fitted at once (``drift.choose_models`` with
``stats.holm``). Checked on synthetic data whose truth is known, against
independent computations (a brute-force Holm, Monte Carlo error rates)."""

import itertools

import numpy as np
import pytest

from cbs_jax import drift
from cbs_jax import stats

# ------------------------------------------------------------------ plateau


def _saturating(x, rng, noise):
  return 0.86 - 0.5 * np.exp(-x / 15.0) + rng.normal(0, noise, x.size)


def test_a_rising_curve_is_rising():
  rng = np.random.default_rng(0)
  x = np.arange(80.0)
  y = 0.4 + 0.004 * x + rng.normal(0, 0.01, x.size)  # still linear at round 80
  r = stats.plateau(x, y)
  assert r["verdict"] == "rising" and r["lo"] > 0
  assert r["n"] == 16 and r["x_from"] == 64.0
  assert r["slope"] == pytest.approx(0.004, rel=0.5)


def test_a_saturated_curve_and_a_noisy_plateau_are_plateaued():
  rng = np.random.default_rng(1)
  x = np.arange(200.0)
  assert stats.plateau(x, _saturating(x, rng, 0.005))["verdict"] == "plateaued"
  noisy = 0.7 + rng.normal(0, 0.08, x.size)
  r = stats.plateau(x, noisy)
  assert r["verdict"] == "plateaued" and r["lo"] < 0 < r["hi"]


def test_the_plateau_interval_has_its_coverage_on_flat_noise():
  """On a truly flat curve the 90% interval excludes 0 in ~10% of curves,
  half on each side (the t-interval's coverage, by Monte Carlo)."""
  rng = np.random.default_rng(2)
  x = np.arange(50.0)
  verdicts = [stats.plateau(x, rng.normal(0, 1, x.size))["verdict"] for _ in range(2000)]
  frac = np.mean([v != "plateaued" for v in verdicts])
  assert abs(frac - 0.10) < 3 * np.sqrt(0.1 * 0.9 / 2000)
  assert 0.3 < np.mean([v == "rising" for v in verdicts]) / frac < 0.7


def test_too_few_points_is_said_so():
  assert stats.plateau([1, 2, 3, 4, 5], [1, 2, 3, 4, 5])["verdict"] == "too few points"
  with pytest.raises(ValueError, match="last=0"):
    stats.plateau([1, 2], [1, 2], last=0)


# ------------------------------------------------------------------- Holm


def _holm_brute(p, alpha):
  """Holm by its definition: walk the sorted p-values, reject while p_(i)
  <= alpha / (m - i), stop at the first that is not."""
  p = np.asarray(p, float)
  order = np.argsort(p, kind="stable")
  reject = np.zeros(p.size, bool)
  for i, j in enumerate(order):
    if p[j] <= alpha / (p.size - i):
      reject[j] = True
    else:
      break
  return reject


@pytest.mark.parametrize("seed", range(5))
def test_holm_matches_its_definition(seed):
  rng = np.random.default_rng(seed)
  p = np.concatenate([rng.uniform(0, 0.02, 3), rng.uniform(0, 1, 7)])
  rng.shuffle(p)
  for alpha in (0.01, 0.05, 0.2):
    h = stats.holm(p, alpha)
    assert h["reject"] == _holm_brute(p, alpha).tolist() and h["m"] == 10
  # a test not made (NaN) neither counts nor is rejected
  h = stats.holm([0.01, np.nan, 0.02], 0.05)
  assert h["m"] == 2 and h["reject"] == [True, False, True]
  assert h["adjusted"][0] == pytest.approx(0.02) and np.isnan(h["adjusted"][1])


def _flat_family(rng, m, n=8):
  """m truly flat quantities measured at n drifts with known SEs."""
  kappa = np.linspace(0.0, 0.1, n)
  fits = {}
  for q in range(m):
    se = np.full(n, 0.05)
    fits[f"q{q}"] = drift.fit_trend(kappa, 1.0 + rng.normal(0, 0.05, n), se)
  return fits


@pytest.mark.parametrize("m", [1, 4, 10])
def test_model_choice_keeps_its_family_wise_error_rate_on_flat_data(m):
  """Flat data: the corrected procedure calls anything non-flat in at most
  ~alpha of the studies however many quantities (2 m tests) it judges;
  the uncorrected verdicts do not (1 - 0.95^(2m) for independent tests)."""
  rng = np.random.default_rng(m)
  sims, alpha = 400, 0.05
  any_corr, any_raw = 0, 0
  for _ in range(sims):
    chosen = drift.choose_models(_flat_family(rng, m), alpha)
    any_corr += any(f["verdict"] != "flat" for f in chosen.values())
    any_raw += any(f["verdict_uncorrected"] != "flat" for f in chosen.values())
    assert all(f["tests_in_family"] == 2 * m for f in chosen.values())
  se = np.sqrt(alpha * (1 - alpha) / sims)
  assert any_corr / sims <= alpha + 3 * se
  if m == 10:
    assert any_raw / sims > 0.3  # what the correction prevents


def test_a_real_quadratic_survives_the_correction():
  rng = np.random.default_rng(7)
  kappa = np.linspace(0.0, 0.1, 10)
  se = np.full(kappa.size, 0.01)
  fits = _flat_family(rng, 9, n=10)
  fits["noise"] = drift.fit_trend(kappa, 1.0 + 200.0 * kappa**2 + rng.normal(0, 0.01, 10), se)
  fits["broken"] = dict(verdict="unresolved", error="too few points")
  chosen = drift.choose_models(fits)
  assert chosen["noise"]["verdict"] == "quadratic"
  assert chosen["broken"] == fits["broken"]
  assert sum(f.get("verdict") == "flat" for f in chosen.values()) >= 8
  assert list(itertools.islice(chosen, 1)) == ["q0"]  # order kept
