"""Tests for cbs_jax.drift against independent computations."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import drift
from cbs_jax import rl


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _f(stats):
  return {k: float(v) for k, v in stats.items()}


def test_keys_and_jit():
  rng = np.random.default_rng(0)
  lb = jnp.asarray(-rng.random((3, 5)), jnp.float32)
  lc = lb + 0.1 * jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  mask = jnp.asarray([[1, 1, 1, 0, 0], [1] * 5, [1, 0, 0, 0, 0]], jnp.float32)
  adv = jnp.asarray(rng.normal(size=(3, 5)), jnp.float32)
  eager = _f(drift.drift_stats(lb, lc, mask, 0.2, 0.28, adv))
  jitted = _f(jax.jit(drift.drift_stats)(lb, lc, mask, 0.2, 0.28, adv))
  assert set(eager) == set(drift.DRIFT_KEYS)
  for k in eager:
    assert math.isfinite(eager[k])
    np.testing.assert_allclose(jitted[k], eager[k], rtol=1e-6, atol=1e-7)


def test_exact_kl_vs_loop():
  rng = np.random.default_rng(1)
  p_logits, q_logits = rng.normal(size=(3, 6)), rng.normal(size=(3, 6))
  want = []
  for i in range(3):
    p, q = _softmax(p_logits[i]), _softmax(q_logits[i])
    want.append(sum(p[v] * math.log(p[v] / q[v]) for v in range(6)))
  np.testing.assert_allclose(drift.exact_kl(p_logits, q_logits), want, rtol=1e-5)
  assert float(drift.exact_kl(p_logits[0], p_logits[0])) == pytest.approx(0.0, abs=1e-7)
  # zero-probability entries of p contribute 0, not NaN
  pz = np.array([0.0, 0.0, -np.inf])
  np.testing.assert_allclose(drift.exact_kl(pz, np.zeros(3)), math.log(1.5), rtol=1e-6)


def test_kappa_exact_enumeration():
  """Behaviour b = (0.1, 0.2, 0.3, 0.4): a token list holding value v with
  multiplicity 10 b_v IS the behaviour distribution, so the token-means of
  drift_stats are exact expectations under b.  E_b[k1] = E_b[k3] = KL(b||c),
  E_b[r] = sum_v c_v = 1."""
  rng = np.random.default_rng(2)
  b = np.array([0.1, 0.2, 0.3, 0.4])
  c_logits = rng.normal(size=4)
  c = _softmax(c_logits)
  tokens = np.repeat(np.arange(4), [1, 2, 3, 4])  # 10 tokens
  rng.shuffle(tokens)
  # lay out as 3 rows x 5 with 5 padding slots holding garbage log-probs
  lb = np.full(15, 3.0)
  lc = np.full(15, -40.0)
  mask = np.zeros(15)
  slots = np.sort(rng.choice(15, size=10, replace=False))
  lb[slots] = np.log(b)[tokens]
  lc[slots] = np.log(c)[tokens]
  mask[slots] = 1
  stats = _f(
      drift.drift_stats(*(jnp.asarray(x.reshape(3, 5), jnp.float32) for x in (lb, lc, mask)))
  )
  kl = float(np.sum(b * np.log(b / c)))
  np.testing.assert_allclose(float(drift.exact_kl(np.log(b), c_logits)), kl, rtol=1e-5)
  np.testing.assert_allclose(stats["kappa_k1"], kl, rtol=1e-5)
  np.testing.assert_allclose(stats["kappa_k3"], kl, rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_mean"], 1.0, rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_max"], np.max(c / b), rtol=1e-5)
  np.testing.assert_allclose(stats["ratio_min"], np.min(c / b), rtol=1e-5)
  # ESS of the token weights: (E_b r)^2 / E_b r^2 = 1 / sum_v c_v^2 / b_v
  np.testing.assert_allclose(stats["ess"], 1.0 / np.sum(c**2 / b), rtol=1e-5)


def test_kappa_monte_carlo():
  """Sampled behaviour tokens: kappa within 5 exact standard errors of the
  exact KL (per-token std computed by enumeration; samples iid)."""
  rng = np.random.default_rng(3)
  v, shape = 8, (400, 250)
  n = shape[0] * shape[1]
  b, c = _softmax(rng.normal(size=v)), _softmax(rng.normal(size=v) * 0.7)
  kl = float(np.sum(b * np.log(b / c)))
  x = rng.choice(v, size=shape, p=b)
  stats = _f(
      drift.drift_stats(
          jnp.asarray(np.log(b)[x], jnp.float32),
          jnp.asarray(np.log(c)[x], jnp.float32),
          jnp.ones(shape, jnp.float32),
      )
  )
  k1_v = np.log(b / c)
  k3_v = c / b - 1 + k1_v
  for key, vals in (("kappa_k1", k1_v), ("kappa_k3", k3_v)):
    sd = math.sqrt(np.sum(b * (vals - kl) ** 2))
    assert abs(stats[key] - kl) < 5 * sd / math.sqrt(n), (key, stats[key], kl)
  # the k3 terms are never negative, so kappa_k3 >= 0 always
  assert stats["kappa_k3"] >= 0
  ess_exact = 1.0 / np.sum(c**2 / b)
  assert abs(stats["ess"] - ess_exact) < 0.05 * ess_exact


def test_clip_fractions_and_ratios_hand():
  # ratios, one row; eps_low = eps_high = 0.2
  r = np.array([0.5, 0.79, 0.81, 1.0, 1.19, 1.21, 2.0, 0.7, 3.0, 0.1], np.float64)
  mask = np.array([1, 1, 1, 1, 1, 1, 1, 1, 1, 0], np.float64)  # last padded
  adv = np.array([-1, 1, -1, 1, 1, 1, -1, -2, 0, -1], np.float64)
  lb = np.full_like(r, -1.0)
  lc = lb + np.log(r)
  args = [jnp.asarray(x[None], jnp.float32) for x in (lb, lc, mask)]
  s = _f(drift.drift_stats(*args))
  # valid: 9 tokens.  r < 0.8: 0.5, 0.79, 0.7 -> 3.  r > 1.2: 1.21, 2, 3 -> 3
  assert s["clip_frac_low"] == pytest.approx(3 / 9, abs=1e-7)
  assert s["clip_frac_high"] == pytest.approx(3 / 9, abs=1e-7)
  assert s["ratio_max"] == pytest.approx(3.0, rel=1e-6)
  assert s["ratio_min"] == pytest.approx(0.5, rel=1e-6)  # 0.1 is padding
  assert s["ratio_mean"] == pytest.approx(r[:9].mean(), rel=1e-6)
  assert s["ess"] == pytest.approx(r[:9].sum() ** 2 / (9 * (r[:9] ** 2).sum()), rel=1e-5)
  # with advantages: low counts only A < 0 (0.5, 0.7; not 0.79 with A>0),
  # high counts only A > 0 (1.21; not 2.0 with A<0, not 3.0 with A=0)
  s = _f(drift.drift_stats(*args, 0.2, 0.2, jnp.asarray(adv[None], jnp.float32)))
  assert s["clip_frac_low"] == pytest.approx(2 / 9, abs=1e-7)
  assert s["clip_frac_high"] == pytest.approx(1 / 9, abs=1e-7)
  # asymmetric eps: eps_low = 0.25 drops 0.79; eps_high = 1.5 keeps only 3.0
  s = _f(drift.drift_stats(*args, 0.25, 1.5))
  assert s["clip_frac_low"] == pytest.approx(2 / 9, abs=1e-7)
  assert s["clip_frac_high"] == pytest.approx(1 / 9, abs=1e-7)


def test_dual_clip_fraction_counts_what_the_dual_clip_alone_changes():
  """``clip_frac_dual``: tokens with A < 0 and r > c, counted by hand, and
  the same tokens where ``rl.ppo_loss`` with clip_c = c changes the per-token
  objective from r A (which the plain clip leaves alone for A < 0) to c A.
  Absent without a dual clip or without advantages."""
  r = np.array([0.5, 1.5, 2.5, 3.5, 4.0, 5.0, 1.0, 9.0], np.float64)
  adv = np.array([-1.0, -1.0, -1.0, -1.0, 1.0, -2.0, -1.0, -1.0], np.float64)
  mask = np.array([1, 1, 1, 1, 1, 1, 1, 0], np.float64)  # last padded
  lb = np.full_like(r, -1.0)
  lc = lb + np.log(r)
  row = lambda x: jnp.asarray(x[None], jnp.float32)
  s = _f(drift.drift_stats(row(lb), row(lc), row(mask), 0.2, 0.2, row(adv), 3.0))
  # A < 0 and r > 3 among the 7 valid: 3.5 and 5.0 (4.0 has A > 0, 9.0 is padding)
  assert s["clip_frac_dual"] == pytest.approx(2 / 7, abs=1e-7)
  on = rl.RLSpec(clip_c=3.0)
  off = rl.RLSpec()
  loss = lambda spec: np.asarray(
      rl.policy_loss("ppo", row(lc), row(lb), row(adv), row(mask), spec)[0]
  )[0]
  changed = ~np.isclose(loss(on), loss(off))
  assert changed.sum() / mask.sum() == pytest.approx(s["clip_frac_dual"], abs=1e-7)
  assert "clip_frac_dual" not in drift.drift_stats(row(lb), row(lc), row(mask), 0.2, 0.2, row(adv))
  assert "clip_frac_dual" not in drift.drift_stats(row(lb), row(lc), row(mask), dual_c=3.0)


def test_seq_ess_hand():
  # row log-ratio sums: log 2 + 0 = log 2; log 0.5; empty row excluded;
  # weights (2, 0.5): ESS = 2.5^2 / (2 * 4.25) = 0.735294...
  lc = jnp.array([[math.log(2.0), 0.0], [math.log(0.5), 7.0], [9.0, 9.0]])
  lb = jnp.zeros_like(lc)
  mask = jnp.array([[1.0, 1.0], [1.0, 0.0], [0.0, 0.0]])
  s = _f(drift.drift_stats(lb, lc, mask))
  assert s["seq_ess"] == pytest.approx(2.5**2 / (2 * 4.25), rel=1e-6)
  # huge sequence log-ratios do not overflow: weights e^1000, e^999
  lc = jnp.array([[500.0, 500.0], [999.0, 0.0]])
  s = _f(drift.drift_stats(jnp.zeros_like(lc), lc, jnp.ones_like(lc)))
  e = math.exp(-1.0)
  assert s["seq_ess"] == pytest.approx((1 + e) ** 2 / (2 * (1 + e * e)), rel=1e-5)


def test_on_policy():
  rng = np.random.default_rng(4)
  lp = jnp.asarray(-rng.random((4, 6)) * 5, jnp.float32)
  mask = jnp.asarray(rng.random((4, 6)) < 0.7, jnp.float32)
  adv = jnp.asarray(rng.normal(size=(4, 6)), jnp.float32)
  for a in (None, adv):
    s = _f(drift.drift_stats(lp, lp, mask, adv_BxT=a))
    assert s["kappa_k1"] == 0.0 and s["kappa_k3"] == 0.0
    assert s["clip_frac_low"] == 0.0 and s["clip_frac_high"] == 0.0
    assert s["ratio_mean"] == 1.0 and s["ratio_max"] == 1.0
    assert s["ratio_min"] == 1.0
    assert s["ess"] == pytest.approx(1.0, abs=1e-6)
    assert s["seq_ess"] == pytest.approx(1.0, abs=1e-6)


def test_all_zero_mask():
  lb = jnp.array([[-1.0, jnp.inf], [3.0, -jnp.inf]])
  lc = jnp.array([[-50.0, 2.0], [jnp.nan, 0.0]])
  s = _f(jax.jit(drift.drift_stats)(lb, lc, jnp.zeros((2, 2))))
  for k, v in s.items():
    assert math.isfinite(v), k
    assert v == (1.0 if k in ("ess", "seq_ess") else 0.0), (k, v)
