"""Tests for cbs_jax.noise against closed forms and naive loops.

Synthetic two-level model with known truth (D-dim parameters):
  g_{p,k} = G + u_p + e_{p,k},
  u_p = A_B t_p                       (t: unit-variance Student-t, df=5),
  e_{p,k} = f_{p,k} - lam * mean_k f_{p,k},
  f_{p,k} = s_p A_I t_{p,k},  s_p in {0.5, 1.5} equiprobable (E s^2 = 1.25).
Truth (module docstring of cbs_jax.noise: C_p - D_p and Cov(mu_p) + E D_p):
  tr Sigma_intra = 1.25 |A_I|_F^2,
  tr Sigma_inter = |A_B|_F^2 + lam (lam - 2)/K * 1.25 |A_I|_F^2,
  |G|^2 = G.G.
lam = 0 gives independent rollouts; lam > 0 makes the rollouts of a prompt
exchangeable but dependent (as group-normalised advantages do).
"""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import noise

D = 12
_rng = np.random.default_rng(1234)
A_B = _rng.normal(size=(D, D))
A_B *= np.sqrt(2.0) / np.linalg.norm(A_B)      # tr Sigma_inter = 2 (lam=0)
A_I = _rng.normal(size=(D, D))
A_I *= np.sqrt(8.0) / np.linalg.norm(A_I)      # tr Sigma_f = 8 * 1.25 = 10
G_VEC = np.full(D, 1.0 / np.sqrt(D))            # |G|^2 = 1
ES2 = 1.25


def _t(rng, shape, df=5):
  return rng.standard_t(df, size=shape) * np.sqrt((df - 2) / df)


def sample(rng, R, P, K, lam=0.0, G=G_VEC):
  """R independent batches, [R, P, K, D] float32."""
  u = _t(rng, (R, P, 1, D)) @ A_B.T
  s = rng.choice([0.5, 1.5], size=(R, P, 1, 1))
  f = s * (_t(rng, (R, P, K, D)) @ A_I.T)
  e = f - lam * f.mean(axis=2, keepdims=True)
  return (G + u + e).astype(np.float32)


def truth(K, lam=0.0, G=G_VEC):
  tr_f = ES2 * np.sum(A_I ** 2)
  return dict(trace_intra=tr_f,
              trace_inter=np.sum(A_B ** 2) + lam * (lam - 2.0) / K * tr_f,
              g2=float(G @ G))


def assert_unbiased(samples, target, name, nsig=4.0):
  x = np.asarray(samples, np.float64).ravel()
  se = x.std(ddof=1) / np.sqrt(x.size)
  assert abs(x.mean() - target) < nsig * se, (
      f"{name}: mean {x.mean():.5g} vs truth {target:.5g} (se {se:.3g})")


def exact_batch(g_RxPxKxD):
  return noise.exact_estimates(
      jax.vmap(noise.moments_from_grads)(jnp.asarray(g_RxPxKxD)))


def cell_means(g, m, n):
  """[R, P, K, D] -> [R, m, n, D]: contiguous prompt parts x rollout parts."""
  R, P, K, _ = g.shape
  return g.reshape(R, m, P // m, n, K // n, D).mean(axis=(2, 4))


def split_batch(g, m, n):
  R, P, K, _ = g.shape
  q = jnp.asarray(cell_means(g, m, n))
  sm = jax.vmap(lambda x: noise.split_moments_from_quarters(x, P, K))(q)
  return noise.split_estimates(sm)


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
    for k in noise._KEYS3:
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
    for path, est in [("exact", exact_batch(g)),
                      ("split", split_batch(g, 2, 2))]:
      for k in noise._KEYS3:
        assert_unbiased(est[k], tru[k], f"{path} {k} lam={lam}")
  assert truth(4, 1.0)["trace_inter"] < 0


def test_tests_have_power():
  """The same check rejects the naive (biased) estimators."""
  P, K = 4, 2
  g = sample(np.random.default_rng(99), R, P, K).astype(np.float64)
  tru = truth(K)
  gbar = g.mean(axis=(1, 2))
  naive_g2 = np.sum(gbar ** 2, -1)                       # E = G2 + tr Cov
  gbar_p = g.mean(axis=2)
  S2 = np.sum((gbar_p - gbar[:, None]) ** 2, (1, 2)) / (P - 1)
  for x, t in [(naive_g2, tru["g2"]), (S2, tru["trace_inter"])]:
    with pytest.raises(AssertionError):
      assert_unbiased(x, t, "naive")


# ----------------------------------------------------------------------------
# Agreement with naive loops.
# ----------------------------------------------------------------------------
def naive_exact(g):
  """DESIGN.md first forms, explicit subtraction, float64 loops."""
  P, K, _ = g.shape
  gbar_p = [sum(g[p, k] for k in range(K)) / K for p in range(P)]
  s2 = [sum(float(np.dot(g[p, k] - gbar_p[p], g[p, k] - gbar_p[p]))
            for k in range(K)) / (K - 1) for p in range(P)]
  trI = sum(s2) / P
  gbar = sum(gbar_p) / P
  S2 = sum(float(np.dot(gbar_p[p] - gbar, gbar_p[p] - gbar))
           for p in range(P)) / (P - 1)
  return dict(trace_intra=trI, trace_inter=S2 - trI / K,
              g2=float(np.dot(gbar, gbar)) - S2 / P)


@pytest.mark.parametrize("P,K", [(3, 4), (5, 2), (2, 7)])
def test_exact_matches_naive_loop(P, K):
  g = np.random.default_rng(P + 10 * K).normal(size=(P, K, 5)) + 0.7
  want = naive_exact(g)
  got = noise.exact_estimates(noise.moments_from_grads(jnp.asarray(g)))
  # Pytree form with the D axis split across leaves of different shapes.
  tree = {"a": jnp.asarray(g[..., :2].reshape(P, K, 2, 1)),
          "b": [jnp.asarray(g[..., 2:])]}
  got_tree = noise.exact_estimates(noise.moments_from_grads(tree))
  jitted = jax.jit(lambda x: noise.exact_estimates(noise.moments_from_grads(x)))
  got_jit = jitted(jnp.asarray(g))
  for k in noise._KEYS3:
    for res in (got, got_tree, got_jit):
      np.testing.assert_allclose(float(res[k]), want[k], rtol=2e-5, atol=2e-5)


def naive_split(q, P, K):
  """Pairwise definitions, loops; for m=n=2 these are DESIGN.md's formulas."""
  m, n = q.shape[:2]
  N = P * K
  d_intra = np.mean([np.mean([np.sum((q[a, b] - q[a, c]) ** 2)
                              for b in range(n) for c in range(b + 1, n)])
                     for a in range(m)])
  r = [q[a].mean(axis=0) for a in range(m)]
  d_inter = np.mean([np.sum((r[a] - r[c]) ** 2)
                     for a in range(m) for c in range(a + 1, m)])
  cross = np.mean([r[a] @ r[c] for a in range(m) for c in range(m) if a != c])
  trI = N / (2 * m * n) * d_intra
  return dict(d_intra=d_intra, d_inter=d_inter, cross=cross,
              trace_intra=trI, trace_inter=P / (2 * m) * d_inter - trI / K,
              g2=cross)


def test_split_matches_design_formulas_2x2():
  q = np.random.default_rng(3).normal(size=(2, 2, 7)) + 0.3
  P, K = 6, 4
  r1, r2 = q[0].mean(0), q[1].mean(0)
  trI = P * K / 8 * np.mean([np.sum((q[a, 0] - q[a, 1]) ** 2) for a in (0, 1)])
  want = dict(trace_intra=trI,
              trace_inter=P / 4 * np.sum((r1 - r2) ** 2) - trI / K,
              g2=r1 @ r2)
  got = noise.split_estimates(noise.split_moments_from_quarters(q, P, K))
  for k in want:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=1e-5)


@pytest.mark.parametrize("m,n", [(2, 2), (4, 2), (2, 4), (3, 3)])
def test_split_matches_naive_pairwise(m, n):
  q = np.random.default_rng(m * 10 + n).normal(size=(m, n, 9)) + 0.5
  P, K = 12, 12
  want = naive_split(q, P, K)
  sm = jax.jit(noise.split_moments_from_quarters, static_argnums=(1, 2))(
      jnp.asarray(q), P, K)
  assert (sm.prompt_parts, sm.rollout_parts) == (m, n)
  got = noise.split_estimates(sm)
  for k in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(float(getattr(sm, k)), want[k], rtol=1e-5)
  for k in noise._KEYS3:
    np.testing.assert_allclose(float(got[k]), want[k], rtol=1e-5, atol=1e-5)


def test_split_pytree_equals_flat():
  rng = np.random.default_rng(5)
  flat = rng.normal(size=(2, 2, 3 * 4 + 5 + 1)).astype(np.float32)
  tree = {"w": flat[..., :12].reshape(2, 2, 3, 4),
          "b": (flat[..., 12:17], flat[..., 17:].reshape(2, 2))}
  tree = jax.tree_util.tree_map(jnp.asarray, tree)
  a = noise.split_moments_from_quarters(jnp.asarray(flat), 8, 4)
  b = noise.split_moments_from_quarters(tree, 8, 4)
  for k in ("d_intra", "d_inter", "cross"):
    np.testing.assert_allclose(float(getattr(a, k)), float(getattr(b, k)),
                               rtol=1e-5)
  # bf16 leaves are accumulated in float32.
  c = noise.split_moments_from_quarters(
      jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), tree), 8, 4)
  assert c.cross.dtype == jnp.float32
  np.testing.assert_allclose(float(c.cross), float(a.cross), rtol=3e-2)


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
    st = noise.pooled_estimates({k: v[r] for k, v in est.items()}, P, K)
    assert st.g2_positive, st.flag
    for k in names:
      vals[k].append(getattr(st, k))
      ses[k].append(getattr(st, k + "_se"))
  report = {}
  for k in names:
    x, s = np.array(vals[k]), np.array(ses[k])
    cover = np.mean(np.abs(x - tru[k]) <= 1.96 * s)
    se_ratio = np.sqrt(np.mean(s ** 2)) / x.std(ddof=1)
    report[k] = (cover, se_ratio)
    assert 0.88 <= cover <= 0.99, (k, cover)
    assert 0.85 <= se_ratio <= 1.15, (k, se_ratio)
  print("coverage, rms(se)/std:", report)


def test_jackknife_se_of_mean_is_std_over_sqrt_m():
  x = np.random.default_rng(0).normal(size=(3, 10)) + np.array([[5.], [1.], [2.]])
  d = dict(trace_intra=x[0], trace_inter=x[1], g2=x[2])
  st = noise.pooled_estimates(d, 4, 4)
  for k, row in zip(noise._KEYS3, x):
    assert getattr(st, k) == pytest.approx(row.mean())
    assert getattr(st, k + "_se") == pytest.approx(row.std(ddof=1) / np.sqrt(10))
  assert st.b_noise == pytest.approx((x[0].mean() + 4 * x[1].mean()) / x[2].mean())
  assert st.ratio == pytest.approx(x[0].mean() / x[1].mean())
  # Manual delete-one jackknife of b_intra.
  th = np.array([np.delete(x[0], i).mean() / np.delete(x[2], i).mean()
                 for i in range(10)])
  assert st.b_intra_se == pytest.approx(np.sqrt(0.9 * np.sum((th - th.mean()) ** 2)))


def test_pooled_accepts_moments_and_dicts():
  P, K = 4, 4
  g = sample(np.random.default_rng(8), 6, P, K)
  gm = [noise.moments_from_grads(jnp.asarray(x)) for x in g]
  sm = [noise.split_moments_from_quarters(jnp.asarray(q), P, K)
        for q in cell_means(g, 2, 2)]
  dicts = [noise.exact_estimates(x) for x in gm]
  a = noise.pooled_estimates(gm, P, K)
  b = noise.pooled_estimates(dicts, P, K)
  c = noise.pooled_estimates(jax.vmap(noise.moments_from_grads)(jnp.asarray(g)), P, K)
  assert a.n_batches == 6 and a.g2 == pytest.approx(b.g2) == pytest.approx(c.g2)
  assert a.trace_intra_se == pytest.approx(c.trace_intra_se, rel=1e-5)
  s = noise.pooled_estimates(sm, P, K)
  assert math.isfinite(s.g2) and math.isfinite(s.g2_se)
  with pytest.raises(ValueError, match="expected"):
    noise.pooled_estimates(gm, P, 8)
  with pytest.raises(ValueError, match="M=1"):
    noise.pooled_estimates(dicts[:1], P, K)


def test_pooled_not_significant_flagged():
  g2 = np.array([1.0, -1.2, 0.8, -0.5, 0.3])
  d = dict(trace_intra=np.full(5, 3.0), trace_inter=np.full(5, 1.0), g2=g2)
  st = noise.pooled_estimates(d, 4, 4)
  assert not st.g2_positive
  assert st.flag.startswith("g2 not significantly positive (g2=")
  for k in ("b_intra", "b_inter", "b_noise", "b_simple", "b_noise_se"):
    assert math.isnan(getattr(st, k))
  assert st.trace_intra == 3.0 and st.ratio == pytest.approx(3.0)
  st2 = noise.pooled_estimates(dict(d, g2=g2 + 5.0), 4, 4)
  assert st2.g2_positive and st2.flag == "" and math.isfinite(st2.b_noise_se)


# ----------------------------------------------------------------------------
# noise_stats, two-batch stats, EMA, edge cases.
# ----------------------------------------------------------------------------
def test_noise_stats_fields():
  st = noise.noise_stats(dict(trace_intra=8.0, trace_inter=2.0, g2=0.5), 16, 4,
                         se={"g2": 0.1, "trace_intra_se": 1.0})
  assert st.b_intra == 16.0 and st.b_inter == 4.0
  assert st.b_noise == st.b_simple == 16.0 + 4 * 4.0
  assert st.trace_total == 16.0 and st.ratio == 4.0
  assert st.g2_se == 0.1 and st.trace_intra_se == 1.0 and math.isnan(st.b_noise_se)
  assert st.g2_positive and st.flag == "" and (st.P, st.K) == (16, 4)
  neg = noise.noise_stats(dict(trace_intra=8.0, trace_inter=2.0, g2=-0.5), 16, 4)
  assert not neg.g2_positive and "g2<=0" in neg.flag and math.isnan(neg.b_noise)
  tb = noise.noise_stats(dict(trace_total=12.0, g2=2.0), 16, 4)
  assert tb.b_simple == tb.b_noise == 6.0 and math.isnan(tb.b_intra)


def test_zero_gradients_finite_and_flagged():
  z = jnp.zeros((4, 4, 6))
  ex = noise.exact_estimates(noise.moments_from_grads(z))
  sp = noise.split_estimates(noise.split_moments_from_quarters(jnp.zeros((2, 2, 6)), 4, 4))
  tb = noise.two_batch_estimates(0.0, 8, 0.0, 16)
  stats = [noise.noise_stats(ex, 4, 4), noise.noise_stats(sp, 4, 4),
           noise.noise_stats(tb, 4, 4),
           noise.pooled_estimates([ex, ex, ex], 4, 4),
           noise.NoiseEMA().update(ex, 4, 4)]
  for st in stats:
    assert not st.g2_positive and st.flag == "zero gradient", st.flag
    for k in ("g2", "trace_total"):
      assert math.isfinite(getattr(st, k)) and getattr(st, k) == 0.0
    assert math.isnan(st.b_noise)
  assert stats[0].trace_intra == 0.0 and stats[0].trace_inter == 0.0


def test_value_errors_name_the_field():
  with pytest.raises(ValueError, match="K=1"):
    noise.exact_estimates(noise.moments_from_grads(jnp.ones((4, 1, 3))))
  with pytest.raises(ValueError, match="P=1"):
    noise.exact_estimates(noise.moments_from_grads(jnp.ones((1, 4, 3))))
  est = dict(trace_intra=1.0, trace_inter=1.0, g2=1.0)
  with pytest.raises(ValueError, match="intra-prompt variance undefined for K=1"):
    noise.noise_stats(est, 4, 1)
  with pytest.raises(ValueError, match="inter-prompt variance undefined for P=1"):
    noise.noise_stats(est, 1, 4)
  q = jnp.ones((2, 2, 3))
  with pytest.raises(ValueError, match="P=7"):
    noise.split_moments_from_quarters(q, 7, 4)
  with pytest.raises(ValueError, match="K=5"):
    noise.split_moments_from_quarters(q, 8, 5)
  with pytest.raises(ValueError, match="K=6"):
    noise.split_moments_from_quarters(jnp.ones((2, 4, 3)), 8, 6)
  with pytest.raises(ValueError, match="b_small"):
    noise.two_batch_estimates(1.0, 8, 1.0, 8)
  with pytest.raises(ValueError, match="K=1"):
    noise.NoiseEMA().update(est, 4, 1)


def test_ema_bias_corrected_constant():
  ema = noise.NoiseEMA(decay=0.9)
  est = dict(trace_intra=7.3, trace_inter=1.1, g2=0.37)
  first = ema.update(est, 8, 4)
  assert first.trace_intra == 7.3 and first.trace_inter == 1.1 and first.g2 == 0.37
  for _ in range(20):
    st = ema.update(est, 8, 4)
    for k, v in est.items():
      assert getattr(st, k) == pytest.approx(v, rel=1e-12)


def test_ema_is_ratio_of_emas_and_checkpoints():
  beta = 0.8
  xs = [dict(trace_intra=1.0, trace_inter=0.5, g2=1.0),
        dict(trace_intra=9.0, trace_inter=0.1, g2=0.1),
        dict(trace_intra=2.0, trace_inter=2.0, g2=4.0)]
  ema = noise.NoiseEMA(decay=beta)
  for x in xs:
    st = ema.update(x, 8, 4)
  # Standard bias-corrected EMA by hand.
  def bc_ema(vals):
    e = 0.0
    for v in vals:
      e = beta * e + (1 - beta) * v
    return e / (1 - beta ** len(vals))
  num = bc_ema([x["trace_intra"] for x in xs])
  den = bc_ema([x["g2"] for x in xs])
  assert st.b_intra == pytest.approx(num / den, rel=1e-12)
  ema_of_ratios = bc_ema([x["trace_intra"] / x["g2"] for x in xs])
  assert abs(st.b_intra - ema_of_ratios) > 1.0
  # Non-finite updates are skipped and flagged.
  skipped = ema.update(dict(trace_intra=float("nan"), trace_inter=1.0, g2=1.0), 8, 4)
  assert "skipped" in skipped.flag and skipped.b_intra == pytest.approx(st.b_intra)
  # Checkpoint round trip through plain floats.
  sd = ema.state_dict()
  assert all(isinstance(v, float) for v in sd.values())
  other = noise.NoiseEMA()
  other.load_state_dict(sd)
  nxt = dict(trace_intra=3.0, trace_inter=0.2, g2=0.5)
  a, b = ema.update(nxt, 8, 4), other.update(nxt, 8, 4)
  for k in ("g2", "trace_intra", "trace_inter", "b_noise", "n_batches"):
    assert getattr(a, k) == getattr(b, k)
