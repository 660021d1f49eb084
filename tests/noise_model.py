"""A synthetic two-level gradient model with known truth, for the noise tests.

D-dim parameters:
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

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import noise

D = 12
_rng = np.random.default_rng(1234)
A_B = _rng.normal(size=(D, D))
A_B *= np.sqrt(2.0) / np.linalg.norm(A_B)  # tr Sigma_inter = 2 (lam=0)
A_I = _rng.normal(size=(D, D))
A_I *= np.sqrt(8.0) / np.linalg.norm(A_I)  # tr Sigma_f = 8 * 1.25 = 10
G_VEC = np.full(D, 1.0 / np.sqrt(D))  # |G|^2 = 1
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
  tr_f = ES2 * np.sum(A_I**2)
  return dict(
      trace_intra=tr_f, trace_inter=np.sum(A_B**2) + lam * (lam - 2.0) / K * tr_f, g2=float(G @ G)
  )


def assert_unbiased(samples, target, name, nsig=4.0):
  x = np.asarray(samples, np.float64).ravel()
  se = x.std(ddof=1) / np.sqrt(x.size)
  assert (
      abs(x.mean() - target) < nsig * se
  ), f"{name}: mean {x.mean():.5g} vs truth {target:.5g} (se {se:.3g})"


def exact_batch(g_RxPxKxD):
  return noise.exact_estimates(jax.vmap(noise.moments_from_grads)(jnp.asarray(g_RxPxKxD)))


def cell_means(g, m, n):
  """[R, P, K, D] -> [R, m, n, D]: contiguous prompt parts x rollout parts."""
  R, P, K, _ = g.shape
  return g.reshape(R, m, P // m, n, K // n, D).mean(axis=(2, 4))


def split_batch(g, m, n):
  R, P, K, _ = g.shape
  q = jnp.asarray(cell_means(g, m, n))
  sm = jax.vmap(lambda x: noise.split_moments_from_quarters(x, P, K))(q)
  return noise.split_estimates(sm)


def naive_split(q, P, K):
  """Pairwise definitions, loops; for m=n=2 these are docs/noise.md's split formulas."""
  m, n = q.shape[:2]
  N = P * K
  d_intra = np.mean(
      [
          np.mean([np.sum((q[a, b] - q[a, c]) ** 2) for b in range(n) for c in range(b + 1, n)])
          for a in range(m)
      ]
  )
  r = [q[a].mean(axis=0) for a in range(m)]
  d_inter = np.mean([np.sum((r[a] - r[c]) ** 2) for a in range(m) for c in range(a + 1, m)])
  cross = np.mean([r[a] @ r[c] for a in range(m) for c in range(m) if a != c])
  trI = N / (2 * m * n) * d_intra
  return dict(
      d_intra=d_intra,
      d_inter=d_inter,
      cross=cross,
      trace_intra=trI,
      trace_inter=P / (2 * m) * d_inter - trI / K,
      g2=cross,
  )
