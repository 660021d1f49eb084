"""Tests for cbs_jax.rl against independent computations (numpy loops, hand
numbers, finite differences)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import rl

EPS = 1e-6


# ---------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------


def _np_advantages(name, r, eps=EPS):
  """Naive per-element loops in float64."""
  p, k = r.shape
  out = np.zeros_like(r, dtype=np.float64)
  all_vals = [r[i, j] for i in range(p) for j in range(k)]
  bmean = sum(all_vals) / len(all_vals)
  bstd = math.sqrt(sum((x - bmean) ** 2 for x in all_vals) / len(all_vals))
  for i in range(p):
    g = [float(x) for x in r[i]]
    mean = sum(g) / k
    std = math.sqrt(sum((x - mean) ** 2 for x in g) / k)
    for j in range(k):
      if name == "grpo":
        out[i, j] = (g[j] - mean) / (std + eps)
      elif name == "drgrpo":
        out[i, j] = g[j] - mean
      elif name == "rloo":
        others = [g[l] for l in range(k) if l != j]
        out[i, j] = g[j] - sum(others) / (k - 1)
      elif name == "batch_std":
        out[i, j] = (g[j] - mean) / (bstd + eps)
  return out


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "batch_std"])
def test_advantages_vs_loop(name):
  rng = np.random.default_rng(0)
  r = rng.normal(size=(5, 6)).astype(np.float32)
  r[1] = 0.7  # identical-reward group
  r[2] = (rng.random(6) < 0.5).astype(np.float32)  # binary rewards
  got = np.asarray(rl.compute_advantages(name, jnp.asarray(r)))
  want = _np_advantages(name, r.astype(np.float64))
  np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)
  assert np.all(np.isfinite(got))
  assert np.all(got[1] == 0.0)  # exactly zero, not ~0


@pytest.mark.parametrize("name", ["grpo", "drgrpo", "rloo", "batch_std"])
@pytest.mark.parametrize("value", [0.0, 1.0, 0.1, -3.3, 1e6])
def test_identical_group_exactly_zero(name, value):
  r = jnp.full((3, 7), value, jnp.float32)
  adv = np.asarray(rl.compute_advantages(name, r))
  assert np.all(adv == 0.0) and np.all(np.isfinite(adv))


def test_advantages_hand_numbers():
  r = jnp.array([[1.0, 0.0, 0.0, 0.0]])
  # mean 0.25, population std sqrt(0.1875) = 0.4330127
  np.testing.assert_allclose(
      rl.compute_advantages("grpo", r, eps=0.0),
      [[0.75 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127, -0.25 / 0.4330127]],
      rtol=1e-6,
  )
  np.testing.assert_allclose(
      rl.compute_advantages("rloo", r), [[1.0, -1 / 3, -1 / 3, -1 / 3]], rtol=1e-6
  )
  np.testing.assert_allclose(
      rl.compute_advantages("drgrpo", r), [[0.75, -0.25, -0.25, -0.25]], rtol=1e-6
  )


def test_advantages_errors():
  with pytest.raises(ValueError, match="grpo.*rloo|known"):
    rl.compute_advantages("nope", jnp.zeros((2, 2)))
  for name in ("grpo", "rloo", "drgrpo"):
    with pytest.raises(ValueError, match="K=1"):
      rl.compute_advantages(name, jnp.zeros((4, 1)))
  # batch_std has a batch-level scale, fine with K = 1
  adv = rl.compute_advantages("batch_std", jnp.arange(4.0).reshape(4, 1))
  np.testing.assert_allclose(adv, np.zeros((4, 1)))  # group mean = itself
  with pytest.raises(ValueError, match="PxK"):
    rl.compute_advantages("grpo", jnp.zeros((4,)))


def test_sequence_to_tokens_order():
  adv = jnp.array([[1.0, 2.0], [3.0, 4.0]])  # P=2, K=2
  mask = jnp.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 0]], jnp.float32)
  out = rl.sequence_to_tokens(adv, mask)
  np.testing.assert_array_equal(out, [[1, 1, 0], [2, 0, 0], [3, 3, 3], [0, 0, 0]])


# ---------------------------------------------------------------------------
# Policy losses: hand-built tokens hitting every clip boundary
# ---------------------------------------------------------------------------
# eps_low = eps_high = 0.2, logp_old = 0, logp = log r.  Per token
# (ratio, A, PPO objective, PPO d obj / d logp) worked by hand:
#  0: r=0.5, A=-1  clip low side active: obj = 0.8*-1 = -0.8, grad 0
#  1: r=0.5, A=+1  min(0.5, 0.8) = 0.5 (unclipped),            grad r A = 0.5
#  2: r=1.5, A=+1  clip high side active: obj 1.2,              grad 0
#  3: r=1.5, A=-1  min(-1.5, -1.2) = -1.5 (unclipped),          grad -1.5
#  4: r=1.1, A=+2  inside the range: 2.2,                       grad 2.2
#  5: r=4.0, A=-1  unclipped -4 (dual clip c=3: max(-4,-3)=-3, grad 0)
#  6: r=2.5, A=-1  unclipped -2.5 (dual clip c=3 inactive, 2.5 < 3)
#  7: r=0.9, A=-3  inside: -2.7,                                grad -2.7
R = np.array([0.5, 0.5, 1.5, 1.5, 1.1, 4.0, 2.5, 0.9], np.float32)
A = np.array([-1, 1, 1, -1, 2, -1, -1, -3], np.float32)
PPO_OBJ = np.array([-0.8, 0.5, 1.2, -1.5, 2.2, -4.0, -2.5, -2.7])
PPO_GRAD_OBJ = np.array([0.0, 0.5, 0.0, -1.5, 2.2, -4.0, -2.5, -2.7])
CLIP_LOW = np.array([1, 0, 0, 0, 0, 0, 0, 0], np.float32)
CLIP_HIGH = np.array([0, 0, 1, 0, 0, 0, 0, 0], np.float32)


def _inputs():
  logp = jnp.log(jnp.asarray(R))[None, :]
  logp_old = jnp.zeros_like(logp)
  adv = jnp.asarray(A)[None, :]
  mask = jnp.ones_like(logp)
  return logp, logp_old, adv, mask


def _token_grad(name, cfg, logp, logp_old, adv, mask):
  f = lambda lp: jnp.sum(rl.policy_loss(name, lp, logp_old, adv, mask, cfg)[0])
  return np.asarray(jax.grad(f)(logp))[0]


def test_ppo_values_grads_and_indicators():
  logp, logp_old, adv, mask = _inputs()
  cfg = rl.RLSpec()
  loss, aux = rl.policy_loss("ppo", logp, logp_old, adv, mask, cfg)
  np.testing.assert_allclose(loss[0], -PPO_OBJ, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(aux["ratio_BxT"][0], R, rtol=1e-6)
  np.testing.assert_array_equal(aux["clipped_low_BxT"][0], CLIP_LOW)
  np.testing.assert_array_equal(aux["clipped_high_BxT"][0], CLIP_HIGH)
  grad = _token_grad("ppo", cfg, logp, logp_old, adv, mask)
  np.testing.assert_allclose(grad, -PPO_GRAD_OBJ, rtol=1e-5, atol=1e-6)


def test_ppo_dual_clip():
  logp, logp_old, adv, mask = _inputs()
  cfg = rl.RLSpec(clip_eps_low=0.2, clip_eps_high=0.2, clip_c=3.0)
  loss, aux = rl.policy_loss("ppo", logp, logp_old, adv, mask, cfg)
  obj = PPO_OBJ.copy()
  obj[5] = -3.0  # floored at c*A
  gobj = PPO_GRAD_OBJ.copy()
  gobj[5] = 0.0
  np.testing.assert_allclose(loss[0], -obj, rtol=1e-5, atol=1e-6)
  np.testing.assert_array_equal(aux["dual_clipped_BxT"][0], [0, 0, 0, 0, 0, 1, 0, 0])
  grad = _token_grad("ppo", cfg, logp, logp_old, adv, mask)
  np.testing.assert_allclose(grad, -gobj, rtol=1e-5, atol=1e-6)
  # dual clip only ever binds with A < 0: flipping signs removes it
  loss2, aux2 = rl.policy_loss("ppo", logp, logp_old, -adv, mask, cfg)
  assert float(jnp.sum(aux2["dual_clipped_BxT"])) == 0.0


def test_ppo_asymmetric_clip_higher():
  # eps_high = 0.28 (DAPO clip-higher): r=1.25, A=1 is now inside.
  cfg = rl.RLSpec(clip_eps_low=0.2, clip_eps_high=0.28)
  logp = jnp.log(jnp.array([[1.25, 1.3, 0.79]]))
  adv = jnp.array([[1.0, 1.0, -1.0]])
  loss, aux = rl.ppo_loss(logp, jnp.zeros_like(logp), adv, jnp.ones_like(logp), cfg)
  np.testing.assert_allclose(loss[0], [-1.25, -1.28, 0.8], rtol=1e-5)
  np.testing.assert_array_equal(aux["clipped_high_BxT"][0], [0, 1, 0])
  np.testing.assert_array_equal(aux["clipped_low_BxT"][0], [0, 0, 1])


def test_rl_spec_validation_and_clip_c_off():
  logp, logp_old, adv, mask = _inputs()
  with pytest.raises(ValueError, match="clip_c"):
    rl.RLSpec(clip_c=0.5)
  with pytest.raises(ValueError, match="unknown policy loss"):
    rl.policy_loss("trpo", logp, logp_old, adv, mask, rl.RLSpec())
  # clip_c = 0 means off: plain PPO clipping (the hand numbers)
  l0, aux = rl.ppo_loss(logp, logp_old, adv, mask, rl.RLSpec(clip_c=0))
  np.testing.assert_allclose(l0[0], -PPO_OBJ, rtol=1e-5, atol=1e-6)
  assert float(jnp.sum(aux["dual_clipped_BxT"])) == 0.0


def test_cispo_values_and_grad_vs_ppo():
  logp, logp_old, adv, mask = _inputs()
  cfg = rl.RLSpec()
  loss, aux = rl.policy_loss("cispo", logp, logp_old, adv, mask, cfg)
  w = np.clip(R, 0.8, 1.2)
  np.testing.assert_allclose(loss[0], -w * A * np.log(R), rtol=1e-5, atol=1e-6)
  g_cispo = _token_grad("cispo", cfg, logp, logp_old, adv, mask)
  g_ppo = _token_grad("ppo", cfg, logp, logp_old, adv, mask)
  np.testing.assert_allclose(g_cispo, -w * A, rtol=1e-5)  # hand formula
  inside = (R >= 0.8) & (R <= 1.2)
  ppo_clipped = (CLIP_LOW + CLIP_HIGH) > 0
  np.testing.assert_allclose(g_cispo[inside], g_ppo[inside], rtol=1e-5)
  # where PPO's gradient is zero by clipping, CISPO's is not
  assert np.all(g_ppo[ppo_clipped] == 0.0)
  assert np.all(np.abs(g_cispo[ppo_clipped]) > 0.5)
  # and outside the range on PPO's unclipped side CISPO truncates the weight
  other = ~inside & ~ppo_clipped
  np.testing.assert_allclose(g_ppo[other], -R[other] * A[other], rtol=1e-5)
  np.testing.assert_allclose(g_cispo[other], -w[other] * A[other], rtol=1e-5)
  np.testing.assert_array_equal(aux["clipped_low_BxT"][0], R < 0.8)
  np.testing.assert_array_equal(aux["clipped_high_BxT"][0], R > 1.2)


def test_pg_values_and_grad():
  logp, logp_old, adv, mask = _inputs()
  loss, aux = rl.policy_loss("pg", logp, logp_old, adv, mask, rl.RLSpec())
  np.testing.assert_allclose(loss[0], -R * A, rtol=1e-5)
  g = _token_grad("pg", rl.RLSpec(), logp, logp_old, adv, mask)
  np.testing.assert_allclose(g, -R * A, rtol=1e-5)
  assert float(jnp.sum(aux["clipped_low_BxT"] + aux["clipped_high_BxT"])) == 0


@pytest.mark.parametrize("name", ["pg", "ppo", "cispo", "gspo"])
def test_on_policy_ratio_one_and_grad(name):
  rng = np.random.default_rng(1)
  logp = jnp.asarray(-rng.random((4, 6)) * 3, jnp.float32)
  adv = jnp.asarray(rng.normal(size=(4, 1)) * np.ones((1, 6)), jnp.float32)
  mask = jnp.asarray([[1] * 6, [1] * 4 + [0] * 2, [1] * 1 + [0] * 5, [1] * 6], jnp.float32)
  _, aux = rl.policy_loss(name, logp, logp, adv, mask, rl.RLSpec())
  assert np.all(np.asarray(aux["ratio_BxT"]) == 1.0)
  for mode in rl.AGGREGATIONS:
    w = rl.aggregation_weights(mask, mode, 4, float(mask.sum()), 6)
    f = lambda lp: jnp.sum(w * rl.policy_loss(name, lp, logp, adv, mask, rl.RLSpec())[0])
    g = jax.grad(f)(logp)
    np.testing.assert_allclose(g, -np.asarray(adv) * np.asarray(w), rtol=1e-6, atol=1e-8)


def test_losses_finite_with_garbage_on_padding():
  logp = jnp.array([[-1.0, -50.0, jnp.inf]])
  logp_old = jnp.array([[-1.2, 30.0, -jnp.inf]])
  mask = jnp.array([[1.0, 0.0, 0.0]])
  adv = jnp.ones_like(logp)
  for name in rl.POLICY_LOSSES:
    logp_ok = logp.at[0, 2].set(-3.0)  # logp itself must be finite for grad
    loss, aux = rl.policy_loss(name, logp_ok, logp_old, adv, mask, rl.RLSpec())
    assert np.all(np.isfinite(loss)) and np.all(loss[0, 1:] == 0)
    for mode in rl.AGGREGATIONS:
      g = jax.grad(
          lambda lp: rl.aggregate(
              rl.policy_loss(name, lp, logp_old, adv, mask, rl.RLSpec())[0], mask, mode, 1, 1, 3
          )
      )(logp_ok)
      assert np.all(np.isfinite(g)) and np.all(g[0, 1:] == 0)


# ---------------------------------------------------------------------------
# GSPO: token form + seq_mean_token_mean == sequence-level objective
# ---------------------------------------------------------------------------


def _np_gspo_objective(logp, logp_old, adv_B, mask, lo, hi):
  """Sequence-level GSPO objective, written directly (float64 loops)."""
  b, t = logp.shape
  total = 0.0
  for i in range(b):
    n = sum(mask[i])
    s = math.exp(sum(mask[i, j] * (logp[i, j] - logp_old[i, j]) for j in range(t)) / n)
    clipped = min(max(s, 1 - lo), 1 + hi)
    total += min(s * adv_B[i], clipped * adv_B[i])
  return total / b


def test_gspo_token_matches_sequence_gradient():
  rng = np.random.default_rng(2)
  b, t = 6, 5
  lo, hi = 0.05, 0.08
  lengths = [5, 3, 1, 4, 5, 2]
  mask = np.array([[1.0] * l + [0.0] * (t - l) for l in lengths])
  logp_old = -rng.random((b, t)) * 2
  # per-sequence drifts chosen to land inside / above / below the clip range
  shift = np.array([0.01, 0.2, -0.2, -0.01, 0.15, -0.15])[:, None]
  logp = logp_old + shift + 0.03 * rng.normal(size=(b, t))
  adv_B = np.array([1.0, 1.0, -1.0, -0.5, -2.0, 1.5])
  adv = adv_B[:, None] * mask
  cfg = rl.RLSpec(clip_eps_low=lo, clip_eps_high=hi)

  s = np.exp((mask * (logp - logp_old)).sum(1) / mask.sum(1))
  expect_clip = ((adv_B > 0) & (s > 1 + hi)) | ((adv_B < 0) & (s < 1 - lo))
  assert expect_clip.sum() == 2 and (~expect_clip).sum() == 4  # both kinds

  def f(lp):
    loss, _ = rl.policy_loss(
        "gspo",
        lp,
        jnp.asarray(logp_old, jnp.float32),
        jnp.asarray(adv, jnp.float32),
        jnp.asarray(mask, jnp.float32),
        cfg,
    )
    return rl.aggregate(
        loss, jnp.asarray(mask, jnp.float32), "seq_mean_token_mean", b, mask.sum(), t
    )

  lp32 = jnp.asarray(logp, jnp.float32)
  val = float(f(lp32))
  grad = np.asarray(jax.grad(f)(lp32))
  want_val = -_np_gspo_objective(logp, logp_old, adv_B, mask, lo, hi)
  np.testing.assert_allclose(val, want_val, rtol=1e-5)
  # central finite differences of the (negated) sequence objective
  h = 1e-6
  fd = np.zeros_like(logp)
  for i in range(b):
    for j in range(t):
      e = np.zeros_like(logp)
      e[i, j] = h
      fd[i, j] = -(
          _np_gspo_objective(logp + e, logp_old, adv_B, mask, lo, hi)
          - _np_gspo_objective(logp - e, logp_old, adv_B, mask, lo, hi)
      ) / (2 * h)
  np.testing.assert_allclose(grad, fd, rtol=1e-4, atol=1e-6)
  assert np.all(grad[expect_clip] == 0.0)
  assert np.all(np.abs(grad[~expect_clip][mask[~expect_clip] > 0]) > 1e-3)
  _, aux = rl.gspo_loss(
      lp32,
      jnp.asarray(logp_old, jnp.float32),
      jnp.asarray(adv, jnp.float32),
      jnp.asarray(mask, jnp.float32),
      cfg,
  )
  np.testing.assert_allclose(aux["ratio_BxT"], np.where(mask > 0, s[:, None], 1.0), rtol=1e-5)


# ---------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------


def _np_aggregate(loss, mask, mode, max_len):
  b, t = loss.shape
  if mode == "token_mean":
    n = sum(mask[i, j] for i in range(b) for j in range(t))
    return sum(loss[i, j] * mask[i, j] for i in range(b) for j in range(t)) / n
  total = 0.0
  for i in range(b):
    s = sum(loss[i, j] * mask[i, j] for j in range(t))
    n_i = sum(mask[i])
    if mode == "seq_mean_token_mean":
      total += s / n_i if n_i > 0 else 0.0
    else:
      total += s / max_len
  return total / b


def _batch():
  rng = np.random.default_rng(3)
  b, t = 8, 7
  lengths = rng.integers(0, t + 1, size=b)
  lengths[0] = 0  # an empty row
  mask = (np.arange(t)[None, :] < lengths[:, None]).astype(np.float32)
  logp_old = (-rng.random((b, t)) * 2).astype(np.float32)
  logp = (logp_old + 0.3 * rng.normal(size=(b, t))).astype(np.float32)
  adv = (rng.normal(size=(b, 1)) * np.ones((1, t))).astype(np.float32)
  return logp, logp_old, adv, mask


@pytest.mark.parametrize("mode", rl.AGGREGATIONS)
def test_aggregate_vs_numpy(mode):
  logp, logp_old, adv, mask = _batch()
  loss = np.random.default_rng(4).normal(size=mask.shape).astype(np.float32)
  b, t = mask.shape
  got = float(rl.aggregate(jnp.asarray(loss), jnp.asarray(mask), mode, b, mask.sum(), t))
  want = _np_aggregate(loss.astype(np.float64), mask, mode, t)
  np.testing.assert_allclose(got, want, rtol=1e-5)


@pytest.mark.parametrize("mode", rl.AGGREGATIONS)
@pytest.mark.parametrize("n_micro", [2, 4])
def test_microbatch_split_exact(mode, n_micro):
  logp, logp_old, adv, mask = map(jnp.asarray, _batch())
  b, t = mask.shape
  num_tokens = float(mask.sum())

  def loss_fn(lp, lo, a, m):
    l, _ = rl.policy_loss("ppo", lp, lo, a, m, rl.RLSpec())
    return rl.aggregate(l, m, mode, b, num_tokens, t)

  full_val, full_grad = jax.value_and_grad(loss_fn)(logp, logp_old, adv, mask)
  mb = b // n_micro
  vals, grads = [], []
  for s in range(0, b, mb):
    v, g = jax.value_and_grad(loss_fn)(
        logp[s : s + mb], logp_old[s : s + mb], adv[s : s + mb], mask[s : s + mb]
    )
    vals.append(float(v))
    grads.append(np.asarray(g))
  np.testing.assert_allclose(sum(vals), float(full_val), rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(np.concatenate(grads), full_grad, rtol=1e-6, atol=1e-8)


def test_aggregation_weights_hand_and_errors():
  mask = jnp.array([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0]])
  w = rl.aggregation_weights(mask, "seq_mean_token_mean", 3, 6, 4)
  np.testing.assert_allclose(w, [[1 / 6, 1 / 6, 0, 0], [1 / 12] * 4, [0] * 4], rtol=1e-6)
  w = rl.aggregation_weights(mask, "token_mean", 3, 6, 4)
  np.testing.assert_allclose(w, np.asarray(mask) / 6, rtol=1e-6)
  w = rl.aggregation_weights(mask, "seq_mean_token_sum_norm", 3, 6, 4)
  np.testing.assert_allclose(w, np.asarray(mask) / 12, rtol=1e-6)
  w = rl.aggregation_weights(jnp.zeros((2, 3)), "token_mean", 2, 0, 3)
  assert np.all(np.asarray(w) == 0)
  with pytest.raises(ValueError, match="unknown aggregation"):
    rl.aggregation_weights(mask, "sum", 3, 6, 4)
  # traced counts work under jit
  f = jax.jit(lambda m, n, k: rl.aggregation_weights(m, "token_mean", k, n, 4))
  np.testing.assert_allclose(f(mask, 6.0, 3), np.asarray(mask) / 6)


# ---------------------------------------------------------------------------
# KL penalty: exact enumeration and Monte Carlo
# ---------------------------------------------------------------------------


def _softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def test_kl_penalty_hand_numbers():
  logp = jnp.array([[math.log(0.5), math.log(0.2)]])
  logp_ref = jnp.array([[math.log(0.25), math.log(0.4)]])
  # k1 = log 2, log 0.5;  k3 = ref/p - 1 - log(ref/p) = 0.5-1+log2, 2-1-log2
  np.testing.assert_allclose(
      rl.kl_penalty(logp, logp_ref, "k1"), [[math.log(2), -math.log(2)]], rtol=1e-6
  )
  np.testing.assert_allclose(
      rl.kl_penalty(logp, logp_ref, "k3"), [[-0.5 + math.log(2), 1 - math.log(2)]], rtol=1e-5
  )
  np.testing.assert_allclose(
      rl.kl_penalty(logp, logp_ref, "k2"), [[0.5 * math.log(2) ** 2] * 2], rtol=1e-5
  )
  with pytest.raises(ValueError, match="k1"):
    rl.kl_penalty(logp, logp_ref, "k4")


def test_kl_penalty_exact_enumeration_sequences():
  """Two-token autoregressive toy: pi(x1) pi(x2 | x1) over V=4, enumerated.

  E_pi[sum_t k_t] must equal the exact sequence KL(pi || ref) for k1 and k3.
  """
  rng = np.random.default_rng(5)
  v = 4
  pi1, ref1 = _softmax(rng.normal(size=v)), _softmax(rng.normal(size=v))
  pi2, ref2 = _softmax(rng.normal(size=(v, v))), _softmax(rng.normal(size=(v, v)))
  seqs = [(a, c) for a in range(v) for c in range(v)]
  logp = np.array([[math.log(pi1[a]), math.log(pi2[a, c])] for a, c in seqs])
  logr = np.array([[math.log(ref1[a]), math.log(ref2[a, c])] for a, c in seqs])
  prob = np.array([pi1[a] * pi2[a, c] for a, c in seqs])
  ref_prob = np.array([ref1[a] * ref2[a, c] for a, c in seqs])
  kl_exact = float(np.sum(prob * np.log(prob / ref_prob)))
  for kind in ("k1", "k3"):
    k = np.asarray(
        rl.kl_penalty(jnp.asarray(logp, jnp.float32), jnp.asarray(logr, jnp.float32), kind)
    )
    np.testing.assert_allclose(np.sum(prob * k.sum(1)), kl_exact, rtol=1e-5)
  assert np.all(np.asarray(rl.kl_penalty(logp, logr, "k3")) >= 0)


def test_kl_penalty_monte_carlo():
  rng = np.random.default_rng(6)
  v, n = 6, 200_000
  p, q = _softmax(rng.normal(size=v)), _softmax(rng.normal(size=v))
  kl = float(np.sum(p * np.log(p / q)))
  x = rng.choice(v, size=n, p=p)
  logp = jnp.asarray(np.log(p)[x][None], jnp.float32)
  logq = jnp.asarray(np.log(q)[x][None], jnp.float32)
  for kind in ("k1", "k3"):
    vals_v = np.asarray(rl.kl_penalty(jnp.log(jnp.asarray(p)), jnp.log(jnp.asarray(q)), kind))
    sd = math.sqrt(np.sum(p * (vals_v - kl) ** 2))  # exact per-sample std
    est = float(jnp.mean(rl.kl_penalty(logp, logq, kind)))
    assert abs(est - kl) < 5 * sd / math.sqrt(n), (kind, est, kl)


# ---------------------------------------------------------------------------
# Entropy
# ---------------------------------------------------------------------------


def test_entropy_from_logits():
  rng = np.random.default_rng(7)
  logits = rng.normal(size=(2, 3, 5)) * 3
  want = np.zeros((2, 3))
  for i in range(2):
    for j in range(3):
      p = _softmax(logits[i, j])
      want[i, j] = -sum(pk * math.log(pk) for pk in p)
  got = rl.entropy_from_logits(jnp.asarray(logits, jnp.bfloat16))
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(rl.entropy_from_logits(jnp.asarray(logits)), want, rtol=1e-5)
  # uniform -> log V; huge logits stable; -inf entries contribute 0
  np.testing.assert_allclose(
      rl.entropy_from_logits(jnp.zeros((1, 1, 8))), [[math.log(8)]], rtol=1e-6
  )
  big = jnp.array([[[1e4, 1e4, -1e4]]])
  np.testing.assert_allclose(rl.entropy_from_logits(big), [[math.log(2)]], rtol=1e-6)
  ninf = jnp.array([[[0.0, 0.0, -jnp.inf]]])
  np.testing.assert_allclose(rl.entropy_from_logits(ninf), [[math.log(2)]], rtol=1e-6)


# ---------------------------------------------------------------------------
# GAE, value loss, terminal rewards
# ---------------------------------------------------------------------------


def _np_gae(rewards, values, mask, gamma, lam):
  b, t = rewards.shape
  adv = np.zeros((b, t))
  ret = np.zeros((b, t))
  for i in range(b):
    idx = [j for j in range(t) if mask[i, j] > 0]
    last_adv = 0.0
    for n in reversed(range(len(idx))):
      j = idx[n]
      next_v = values[i, idx[n + 1]] if n + 1 < len(idx) else 0.0
      delta = rewards[i, j] + gamma * next_v - values[i, j]
      last_adv = delta + gamma * lam * last_adv
      adv[i, j] = last_adv
      ret[i, j] = last_adv + values[i, j]
  return adv, ret


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0)])
def test_gae_vs_loop(gamma, lam):
  rng = np.random.default_rng(8)
  b, t = 5, 7
  lengths = np.array([7, 3, 1, 0, 5])
  mask = (np.arange(t)[None] < lengths[:, None]).astype(np.float32)
  mask[4, 2] = 0.0  # a gap inside a rollout
  values = rng.normal(size=(b, t)).astype(np.float32)
  rewards = (rng.normal(size=(b, t)) * (rng.random((b, t)) < 0.3)).astype(np.float32)
  adv, ret = rl.gae(jnp.asarray(rewards), jnp.asarray(values), jnp.asarray(mask), gamma, lam)
  want_adv, want_ret = _np_gae(rewards.astype(np.float64), values, mask, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)


def test_gae_gamma_lam_one_is_reward_to_go():
  mask = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  r = rl.terminal_rewards_to_tokens(jnp.array([2.0, -1.0]), jnp.asarray(mask))
  np.testing.assert_array_equal(r, [[0, 0, 2, 0], [0, -1, 0, 0]])
  values = jnp.array([[0.5, 1.0, 1.5, 9.0], [0.1, 0.2, 9.0, 9.0]])
  adv, ret = rl.gae(r, values, jnp.asarray(mask), 1.0, 1.0)
  np.testing.assert_allclose(ret, [[2, 2, 2, 0], [-1, -1, 0, 0]], rtol=1e-6)
  np.testing.assert_allclose(adv, [[1.5, 1.0, 0.5, 0], [-1.1, -1.2, 0, 0]], rtol=1e-6)


def test_terminal_rewards_to_tokens_edge_cases():
  mask = jnp.array([[0, 0, 0], [1, 0, 1], [1, 1, 1]], jnp.float32)
  out = rl.terminal_rewards_to_tokens(jnp.array([5.0, 3.0, 1]), mask)
  np.testing.assert_array_equal(out, [[0, 0, 0], [0, 0, 3], [0, 0, 1]])


def test_value_loss():
  v = jnp.array([[1.0, 2.0, 0.0]])
  ret = jnp.array([[0.0, 2.5, 7.0]])
  mask = jnp.array([[1.0, 1.0, 0.0]])
  np.testing.assert_allclose(rl.value_loss(v, ret, mask), [[0.5, 0.125, 0.0]], rtol=1e-6)
  old = jnp.array([[0.0, 2.4, 0.0]])
  # token 0: v_clip = 0 + clip(1, -.2, .2) = 0.2 -> 0.5*0.04 = 0.02;
  #   max(0.5, 0.02) = 0.5.  token 1: v_clip = 2.4 + clip(-.4) = 2.2
  #   -> 0.5*0.09 = 0.045; max(0.125, 0.045) = 0.125
  np.testing.assert_allclose(rl.value_loss(v, ret, mask, old, 0.2), [[0.5, 0.125, 0.0]], rtol=1e-6)
  # a case where the clipped branch wins: v=3, old=2, ret=4 ->
  v2 = jnp.array([[3.0]])
  ret2 = jnp.array([[4.0]])
  old2 = jnp.array([[2.0]])
  # v_clip = 2.2: 0.5*1.8^2 = 1.62 > 0.5*1 = 0.5
  np.testing.assert_allclose(
      rl.value_loss(v2, ret2, jnp.ones((1, 1)), old2, 0.2), [[1.62]], rtol=1e-5
  )
  g = jax.grad(lambda x: jnp.sum(rl.value_loss(x, ret2, jnp.ones((1, 1)), old2, 0.2)))(v2)
  assert float(g[0, 0]) == 0.0  # clipped branch: no gradient
  with pytest.raises(ValueError, match="old_values"):
    rl.value_loss(v, ret, mask, clip=0.2)


def test_symmetric_clip_ten_is_the_unclipped_importance_weighted_gradient():
  """clip_eps_low = clip_eps_high = 10: the PPO loss's gradient equals the
  plain importance-weighted policy gradient (``pg``), computed independently
  by hand as -r A dlogp, wherever no ratio leaves [1/11, 11]."""
  rng = np.random.default_rng(0)
  B, T = 6, 5
  logp = jnp.asarray(rng.normal(-1.5, 0.5, (B, T)), jnp.float32)
  logp_old = logp + jnp.asarray(rng.uniform(-2.0, 2.0, (B, T)), jnp.float32)
  ratio = np.exp(np.asarray(logp - logp_old))
  assert ratio.min() > 1 / 11 and ratio.max() < 11
  adv = jnp.asarray(rng.normal(size=(B, T)), jnp.float32)
  mask = jnp.asarray(rng.uniform(size=(B, T)) > 0.2, jnp.float32)
  cfg = rl.RLSpec(clip_eps_low=10.0, clip_eps_high=10.0)
  g_ppo = jax.grad(lambda lp: rl.ppo_loss(lp, logp_old, adv, mask, cfg)[0].sum())(logp)
  g_pg = jax.grad(lambda lp: rl.pg_loss(lp, logp_old, adv, mask, rl.RLSpec())[0].sum())(logp)
  by_hand = -ratio * np.asarray(adv) * np.asarray(mask)  # d(-r A)/dlogp = -r A
  np.testing.assert_allclose(g_ppo, by_hand, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(g_pg, by_hand, rtol=1e-5, atol=1e-6)
  _, aux = rl.ppo_loss(logp, logp_old, adv, mask, cfg)
  assert float(aux["clipped_BxT"].sum()) == 0.0
