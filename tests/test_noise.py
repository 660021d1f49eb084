"""Tests for cbs_jax.noise (the estimators) against closed forms and naive
loops; the synthetic model with known truth is ``tests/noise_model.py``."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import noise
from tests.noise_model import assert_unbiased, exact_batch, naive_split, sample, split_batch, truth

# ----------------------------------------------------------------------------
# Unbiasedness.
# ----------------------------------------------------------------------------
CONFIGS = [(4, 2), (8, 4), (16, 16), (6, 8)]
R = 4000


@pytest.mark.parametrize("P,K", CONFIGS)
def test_unbiased_exact_split_two_batch(P, K):
  g = sample(np.random.default_rng(P * 100 + K), R, P, K)
  tru = truth(K)
  ests = {"exact": exact_batch(g)}
  for m, n in [(2, 2), (4, 2), (2, 4)]:
    if P % m == 0 and K % n == 0:
      ests[f"split{m}x{n}"] = split_batch(g, m, n)
  assert "split2x2" in ests
  for path, est in ests.items():
    for k in noise.ESTIMATE_KEYS:
      assert_unbiased(est[k], tru[k], f"{path} {k} (P={P}, K={K})")
  # Two-batch: nested (first P/2 prompts) and independent small batch.
  gd = g.astype(np.float64)
  big = np.sum(gd.mean(axis=(1, 2)) ** 2, -1)
  small_nested = np.sum(gd[:, : P // 2].mean(axis=(1, 2)) ** 2, -1)
  g2nd = sample(np.random.default_rng(P * 100 + K + 1), R, P // 2, K)
  small_indep = np.sum(g2nd.astype(np.float64).mean(axis=(1, 2)) ** 2, -1)
  tot = tru["trace_intra"] + K * tru["trace_inter"]
  for label, small in [("nested", small_nested), ("indep", small_indep)]:
    tb = noise.two_batch_estimates(small, P // 2 * K, big, P * K)
    assert_unbiased(tb["trace_total"], tot, f"two-batch {label} trace_total")
    assert_unbiased(tb["g2"], tru["g2"], f"two-batch {label} g2")


def test_unbiased_exchangeable_dependent_rollouts():
  """lam=1: rollouts centred within the group (sum to zero, like mean-baseline
  advantages). Sigma_inter(K) = Sigma_B - Sigma_f/K is then negative here and
  the estimators still hit the K-dependent truth."""
  for (P, K), lam in [((8, 4), 1.0), ((6, 8), 0.5)]:
    g = sample(np.random.default_rng(7 + K), R, P, K, lam=lam)
    tru = truth(K, lam)
    for path, est in [("exact", exact_batch(g)), ("split", split_batch(g, 2, 2))]:
      for k in noise.ESTIMATE_KEYS:
        assert_unbiased(est[k], tru[k], f"{path} {k} lam={lam}")
  assert truth(4, 1.0)["trace_inter"] < 0


def test_tests_have_power():
  """The same check rejects the naive (biased) estimators."""
  P, K = 4, 2
  g = sample(np.random.default_rng(99), R, P, K).astype(np.float64)
  tru = truth(K)
  gbar = g.mean(axis=(1, 2))
  naive_g2 = np.sum(gbar**2, -1)  # E = G2 + tr Cov
  gbar_p = g.mean(axis=2)
  S2 = np.sum((gbar_p - gbar[:, None]) ** 2, (1, 2)) / (P - 1)
  for x, t in [(naive_g2, tru["g2"]), (S2, tru["trace_inter"])]:
    with pytest.raises(AssertionError):
      assert_unbiased(x, t, "naive")


# ----------------------------------------------------------------------------
# Agreement with naive loops.
# ----------------------------------------------------------------------------
def naive_exact(g):
  """docs/noise.md's first forms, explicit subtraction, float64 loops."""
  P, K, _ = g.shape
  gbar_p = [sum(g[p, k] for k in range(K)) / K for p in range(P)]
  s2 = [
      sum(float(np.dot(g[p, k] - gbar_p[p], g[p, k] - gbar_p[p])) for k in range(K)) / (K - 1)
      for p in range(P)
  ]
  trI = sum(s2) / P
  gbar = sum(gbar_p) / P
  S2 = sum(float(np.dot(gbar_p[p] - gbar, gbar_p[p] - gbar)) for p in range(P)) / (P - 1)
  return dict(trace_intra=trI, trace_inter=S2 - trI / K, g2=float(np.dot(gbar, gbar)) - S2 / P)


@pytest.mark.parametrize("P,K", [(3, 4), (5, 2), (2, 7)])
def test_exact_matches_naive_loop(P, K):
  g = np.random.default_rng(P + 10 * K).normal(size=(P, K, 5)) + 0.7
  want = naive_exact(g)
  got = noise.exact_estimates(noise.moments_from_grads(jnp.asarray(g)))
  # Pytree form with the D axis split across leaves of different shapes.
  tree = {"a": jnp.asarray(g[..., :2].reshape(P, K, 2, 1)), "b": [jnp.asarray(g[..., 2:])]}
  got_tree = noise.exact_estimates(noise.moments_from_grads(tree))
  jitted = jax.jit(lambda x: noise.exact_estimates(noise.moments_from_grads(x)))
  got_jit = jitted(jnp.asarray(g))
  for k in noise.ESTIMATE_KEYS:
    for res in (got, got_tree, got_jit):
      np.testing.assert_allclose(float(res[k]), want[k], rtol=2e-5, atol=2e-5)


def test_split_matches_design_formulas_2x2():
  q = np.random.default_rng(3).normal(size=(2, 2, 7)) + 0.3
  P, K = 6, 4
  r1, r2 = q[0].mean(0), q[1].mean(0)
  trI = P * K / 8 * np.mean([np.sum((q[a, 0] - q[a, 1]) ** 2) for a in (0, 1)])
  want = dict(trace_intra=trI, trace_inter=P / 4 * np.sum((r1 - r2) ** 2) - trI / K, g2=r1 @ r2)
  got = noise.split_estimates(noise.split_moments_from_quarters(q, P, K))
  for k in want:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=1e-5)


@pytest.mark.parametrize("m,n", [(2, 2), (4, 2), (2, 4), (3, 3)])
def test_split_matches_naive_pairwise(m, n):
  q = np.random.default_rng(m * 10 + n).normal(size=(m, n, 9)) + 0.5
  P, K = 12, 12
  want = naive_split(q, P, K)
  sm = jax.jit(noise.split_moments_from_quarters, static_argnums=(1, 2))(jnp.asarray(q), P, K)
  assert (sm.prompt_parts, sm.rollout_parts) == (m, n)
  got = noise.split_estimates(sm)
  for k in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(float(getattr(sm, k)), want[k], rtol=1e-5)
  for k in noise.ESTIMATE_KEYS:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=1e-5, atol=1e-5)


def test_split_pytree_equals_flat():
  rng = np.random.default_rng(5)
  flat = rng.normal(size=(2, 2, 3 * 4 + 5 + 1)).astype(np.float32)
  tree = {
      "w": flat[..., :12].reshape(2, 2, 3, 4),
      "b": (flat[..., 12:17], flat[..., 17:].reshape(2, 2)),
  }
  tree = jax.tree_util.tree_map(jnp.asarray, tree)
  a = noise.split_moments_from_quarters(jnp.asarray(flat), 8, 4)
  b = noise.split_moments_from_quarters(tree, 8, 4)
  for k in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(float(getattr(a, k)), float(getattr(b, k)), rtol=1e-5)
  # bf16 leaves are accumulated in float32.
  c = noise.split_moments_from_quarters(
      jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), tree), 8, 4
  )
  assert c.cross.dtype == jnp.float32
  np.testing.assert_allclose(float(c.cross), float(a.cross), rtol=3e-2)


# ----------------------------------------------------------------------------
# Edge cases.
# ----------------------------------------------------------------------------
def test_value_errors_name_the_field():
  with pytest.raises(ValueError, match="K=1"):
    noise.exact_estimates(noise.moments_from_grads(jnp.ones((4, 1, 3))))
  with pytest.raises(ValueError, match="P=1"):
    noise.exact_estimates(noise.moments_from_grads(jnp.ones((1, 4, 3))))
  q = jnp.ones((2, 2, 3))
  with pytest.raises(ValueError, match="P=7"):
    noise.split_moments_from_quarters(q, 7, 4)
  with pytest.raises(ValueError, match="K=5"):
    noise.split_moments_from_quarters(q, 8, 5)
  with pytest.raises(ValueError, match="K=6"):
    noise.split_moments_from_quarters(jnp.ones((2, 4, 3)), 8, 6)
  with pytest.raises(ValueError, match="b_small"):
    noise.two_batch_estimates(1.0, 8, 1.0, 8)
  with pytest.raises(ValueError, match="P=1"):
    noise.check_batch_shape(1, 4)
  with pytest.raises(ValueError, match="K=1"):
    noise.check_batch_shape(4, 1)
