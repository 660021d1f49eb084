"""Tests for cbs_jax.noise_stats: NoiseStats fields and flags, and pooling
with jackknife SEs (calibrated by Monte Carlo on ``tests/noise_model.py``)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import noise
from cbs_jax import noise_stats
from cbs_jax import noise_tracker
from tests.noise_model import cell_means, exact_batch, sample, truth


# ----------------------------------------------------------------------------
# Jackknife SE calibration.
# ----------------------------------------------------------------------------
def test_jackknife_coverage():
  """400 repetitions of pooling M=20 batches (P=8, K=4, t5 tails).

  Bound reasoning: for a mean of M=20 batches, est +- 1.96 * se(jackknife)
  is a z-interval with a t_19 pivot, nominal coverage P(|t_19|<1.96)=0.935;
  heavy tails lower it slightly. The binomial sd of a coverage over 400 reps
  is ~0.012, so [0.88, 0.99] is ~4.5 sd below / ~4.5 sd above 0.935.
  rms(se)/std(estimate) has a sampling sd of a few % over 400 reps with these
  tails: band [0.85, 1.15].
  """
  P, K, M, reps = 8, 4, 20, 400
  g = sample(np.random.default_rng(2024), reps * M, P, K)
  est = {k: np.asarray(v).reshape(reps, M) for k, v in exact_batch(g).items()}
  tru = truth(K)
  tru["b_noise"] = (tru["trace_intra"] + K * tru["trace_inter"]) / tru["g2"]
  names = ("trace_intra", "g2", "b_noise")
  vals = {k: [] for k in names}
  ses = {k: [] for k in names}
  for r in range(reps):
    st = noise_stats.pooled_estimates({k: v[r] for k, v in est.items()}, P, K)
    assert st.g2_positive, st.flag
    for k in names:
      vals[k].append(getattr(st, k))
      ses[k].append(getattr(st, k + "_se"))
  report = {}
  for k in names:
    x, s = np.array(vals[k]), np.array(ses[k])
    cover = np.mean(np.abs(x - tru[k]) <= 1.96 * s)
    se_ratio = np.sqrt(np.mean(s**2)) / x.std(ddof=1)
    report[k] = (cover, se_ratio)
    assert 0.88 <= cover <= 0.99, (k, cover)
    assert 0.85 <= se_ratio <= 1.15, (k, se_ratio)
  print("coverage, rms(se)/std:", report)


def test_jackknife_se_of_mean_is_std_over_sqrt_m():
  x = np.random.default_rng(0).normal(size=(3, 10)) + np.array([[5.0], [1.0], [2.0]])
  d = dict(trace_intra=x[0], trace_inter=x[1], g2=x[2])
  st = noise_stats.pooled_estimates(d, 4, 4)
  for k, row in zip(noise.ESTIMATE_KEYS, x):
    assert getattr(st, k) == pytest.approx(row.mean())
    assert getattr(st, k + "_se") == pytest.approx(row.std(ddof=1) / np.sqrt(10))
  assert st.b_noise == pytest.approx((x[0].mean() + 4 * x[1].mean()) / x[2].mean())
  assert st.ratio == pytest.approx(x[0].mean() / x[1].mean())
  # Manual delete-one jackknife of b_intra.
  th = np.array([np.delete(x[0], i).mean() / np.delete(x[2], i).mean() for i in range(10)])
  assert st.b_intra_se == pytest.approx(np.sqrt(0.9 * np.sum((th - th.mean()) ** 2)))


def test_pooled_accepts_moments_and_dicts():
  P, K = 4, 4
  g = sample(np.random.default_rng(8), 6, P, K)
  gm = [noise.moments_from_grads(jnp.asarray(x)) for x in g]
  sm = [noise.split_moments_from_quarters(jnp.asarray(q), P, K) for q in cell_means(g, 2, 2)]
  dicts = [noise.exact_estimates(x) for x in gm]
  a = noise_stats.pooled_estimates(gm, P, K)
  b = noise_stats.pooled_estimates(dicts, P, K)
  c = noise_stats.pooled_estimates(jax.vmap(noise.moments_from_grads)(jnp.asarray(g)), P, K)
  assert a.n_batches == 6 and a.g2 == pytest.approx(b.g2) == pytest.approx(c.g2)
  assert a.trace_intra_se == pytest.approx(c.trace_intra_se, rel=1e-5)
  s = noise_stats.pooled_estimates(sm, P, K)
  assert math.isfinite(s.g2) and math.isfinite(s.g2_se)
  with pytest.raises(ValueError, match="expected"):
    noise_stats.pooled_estimates(gm, P, 8)
  with pytest.raises(ValueError, match="M=1"):
    noise_stats.pooled_estimates(dicts[:1], P, K)


def test_pooled_not_significant_flagged():
  g2 = np.array([1.0, -1.2, 0.8, -0.5, 0.3])
  d = dict(trace_intra=np.full(5, 3.0), trace_inter=np.full(5, 1.0), g2=g2)
  st = noise_stats.pooled_estimates(d, 4, 4)
  assert not st.g2_positive
  assert st.flag.startswith("g2 not significantly positive (g2=")
  for k in ("b_intra", "b_inter", "b_noise", "b_simple", "b_noise_se"):
    assert math.isnan(getattr(st, k))
  assert st.trace_intra == 3.0 and st.ratio == pytest.approx(3.0)
  st2 = noise_stats.pooled_estimates(dict(d, g2=g2 + 5.0), 4, 4)
  assert st2.g2_positive and st2.flag == "" and math.isfinite(st2.b_noise_se)


def _fieller_least_ratio(tt, g2, z=2.0):
  """The least r >= 0 with (num - r den)^2 <= z^2 (vn - 2 r c + r^2 vd), by a
  dense grid: num, den the means of the per-batch values, (vn, vd, c) the
  covariance of the means (sample covariance / M). Independent of the
  jackknife and of the closed form."""
  M = len(tt)
  (vn, c), (_, vd) = np.cov(tt, g2, ddof=1) / M
  num, den = np.mean(tt), np.mean(g2)
  r = np.concatenate([[0.0], np.logspace(-3, 8, 400_001)])
  inside = (num - r * den) ** 2 <= z * z * (vn - 2 * r * c + r * r * vd)
  return float(r[np.argmax(inside)]) if inside.any() else math.inf


@pytest.mark.parametrize("g2_mean, resolved", [(0.05, False), (0.3, True), (2.0, True)])
def test_pooled_floor_is_the_least_b_noise_fieller_admits(g2_mean, resolved):
  """b_noise_floor against a grid search of Fieller's set on r >= 0, with
  the means' covariance from np.cov: G2 unresolved (b_noise nan, the floor
  still > 0) and resolved (the floor is the interval's lower end, below
  b_noise)."""
  rng = np.random.default_rng(3)
  M, P, K = 12, 4, 4
  ti = 40.0 + 5.0 * rng.standard_normal(M)
  tb = 2.0 + 0.5 * rng.standard_normal(M)
  g2 = g2_mean + 0.4 * rng.standard_normal(M) + 0.02 * (ti - 40.0)  # correlated with the trace
  st = noise_stats.pooled_estimates(dict(trace_intra=ti, trace_inter=tb, g2=g2), P, K)
  want = _fieller_least_ratio(ti + K * tb, g2)
  assert st.b_noise_floor == pytest.approx(want, rel=1e-4)
  assert 0 < st.b_noise_floor < math.inf
  if st.g2_positive:
    assert st.b_noise_floor < st.b_noise
  else:
    assert math.isnan(st.b_noise)
  assert st.g2_positive == resolved, (st.g2, st.g2_se)


def test_pooled_floor_is_zero_where_the_traces_are_not_resolved_either():
  rng = np.random.default_rng(4)
  d = dict(
      trace_intra=rng.standard_normal(10),
      trace_inter=rng.standard_normal(10),
      g2=rng.standard_normal(10),
  )
  st = noise_stats.pooled_estimates(d, 4, 4)
  assert not st.g2_positive and st.b_noise_floor == 0.0
  # one batch (noise_stats) or an EMA carries no floor
  assert math.isnan(
      noise_stats.noise_stats(dict(trace_intra=1.0, trace_inter=0.1, g2=1.0), 4, 4).b_noise_floor
  )


def test_pooled_floor_covers_the_true_b_noise_from_below():
  """A one-sided 2-SE bound: over 400 pools of M = 20 batches (the model of
  ``test_jackknife_coverage``, G2 resolved or not) the floor exceeds the
  true B_noise in at most 6% (nominal 2.3%; the jackknife SE's t_19 pivot
  gives ~3%, and 400 reps have a binomial sd of ~0.8%)."""
  P, K, M, reps = 8, 4, 20, 400
  g = sample(np.random.default_rng(2025), reps * M, P, K)
  est = {k: np.asarray(v).reshape(reps, M) for k, v in exact_batch(g).items()}
  tru = truth(K)
  b_true = (tru["trace_intra"] + K * tru["trace_inter"]) / tru["g2"]
  floors = np.array(
      [
          noise_stats.pooled_estimates({k: v[r] for k, v in est.items()}, P, K).b_noise_floor
          for r in range(reps)
      ]
  )
  assert np.all(np.isfinite(floors)) and np.all(floors >= 0)
  above = float(np.mean(floors > b_true))
  assert above <= 0.06, above
  assert np.median(floors) > 0.3 * b_true  # not vacuous


# ----------------------------------------------------------------------------
# noise_stats, two-batch stats, edge cases.
# ----------------------------------------------------------------------------
def test_noise_stats_fields():
  st = noise_stats.noise_stats(
      dict(trace_intra=8.0, trace_inter=2.0, g2=0.5), 16, 4, se={"g2": 0.1, "trace_intra_se": 1.0}
  )
  assert st.b_intra == 16.0 and st.b_inter == 4.0
  assert st.b_noise == st.b_simple == 16.0 + 4 * 4.0
  assert st.trace_total == 16.0 and st.ratio == 4.0
  assert st.g2_se == 0.1 and st.trace_intra_se == 1.0 and math.isnan(st.b_noise_se)
  assert st.g2_positive and st.flag == "" and (st.P, st.K) == (16, 4)
  neg = noise_stats.noise_stats(dict(trace_intra=8.0, trace_inter=2.0, g2=-0.5), 16, 4)
  assert not neg.g2_positive and "g2<=0" in neg.flag and math.isnan(neg.b_noise)
  tb = noise_stats.noise_stats(dict(trace_total=12.0, g2=2.0), 16, 4)
  assert tb.b_simple == tb.b_noise == 6.0 and math.isnan(tb.b_intra)


def test_zero_gradients_finite_and_flagged():
  z = jnp.zeros((4, 4, 6))
  ex = noise.exact_estimates(noise.moments_from_grads(z))
  sp = noise.split_estimates(noise.split_moments_from_quarters(jnp.zeros((2, 2, 6)), 4, 4))
  tb = noise.two_batch_estimates(0.0, 8, 0.0, 16)
  stats = [
      noise_stats.noise_stats(ex, 4, 4),
      noise_stats.noise_stats(sp, 4, 4),
      noise_stats.noise_stats(tb, 4, 4),
      noise_stats.pooled_estimates([ex, ex, ex], 4, 4),
      noise_tracker.NoiseEMA().update(ex, 4, 4),
  ]
  for st in stats:
    assert not st.g2_positive and st.flag == "zero gradient", st.flag
    for k in ("g2", "trace_total"):
      assert math.isfinite(getattr(st, k)) and getattr(st, k) == 0.0
    assert math.isnan(st.b_noise)
  assert stats[0].trace_intra == 0.0 and stats[0].trace_inter == 0.0


def test_value_errors_name_the_field():
  est = dict(trace_intra=1.0, trace_inter=1.0, g2=1.0)
  with pytest.raises(ValueError, match="intra-prompt variance undefined for K=1"):
    noise_stats.noise_stats(est, 4, 1)
  with pytest.raises(ValueError, match="inter-prompt variance undefined for P=1"):
    noise_stats.noise_stats(est, 1, 4)
  with pytest.raises(KeyError, match="lack"):
    noise_stats.noise_stats(dict(trace_intra=1.0, g2=1.0), 4, 4)
