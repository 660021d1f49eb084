"""Advantage estimators, per-token policy losses, aggregation, KL, entropy, GAE.

Pure ``jax.numpy`` functions over arrays (no model code), grouped in
registries so that configs select them by name:

* ``ADVANTAGES`` / ``compute_advantages`` -- group-relative advantages from a
  ``rewards_PxK`` grid (P prompts x K rollouts).
* ``POLICY_LOSSES`` / ``policy_loss`` -- per-token surrogate losses
  (``ppo``, ``cispo``, ``pg``, ``gspo``) returning ``(loss_BxT, aux)``.
* ``AGGREGATIONS`` / ``aggregation_weights`` / ``aggregate`` -- how per-token
  losses are summed into the batch loss, with GLOBAL counts so microbatching
  is exact.
* ``kl_penalty``, ``entropy_from_logits``.
* PPO critic pieces: ``terminal_rewards_to_tokens``, ``gae``, ``value_loss``.
* ``RLSpec`` -- every setting of ``config.rl`` as one frozen, hashable,
  validated value; the losses and ``token_advantages`` read it.

Conventions
-----------
* Token arrays are ``_BxT`` with ``B = P*K`` rollouts ordered prompt-major:
  rollout ``b = p*K + k`` (so ``adv_PxK.reshape(B)`` is the rollout order).
* ``mask_BxT`` is float {0, 1} over completion tokens.  Every per-token output
  of this module is exactly 0 at masked positions, and log-ratios at masked
  positions are replaced by 0 *before* ``exp`` so garbage log-probs on padding
  can never produce inf/NaN values or gradients.
* Behaviour (``logp_old``) and reference (``logp_ref``) log-probs are inputs;
  they are passed through ``jax.lax.stop_gradient`` anyway.
* Losses are quantities to MINIMISE (negated surrogate objectives).
"""

from __future__ import annotations

import dataclasses
import numbers
from typing import Callable

import jax
import jax.numpy as jnp

sg = jax.lax.stop_gradient

Array = jax.Array


# ---------------------------------------------------------------------------
# Advantages
# ---------------------------------------------------------------------------


def _as_float(x) -> Array:
  x = jnp.asarray(x)
  if not jnp.issubdtype(x.dtype, jnp.floating):
    x = x.astype(jnp.float32)
  return x


def _group_centred(rewards_PxK: Array) -> Array:
  """r - group mean, computed with a shift by the group's first reward.

  ``(r - r_0) - mean(r - r_0)`` equals ``r - mean(r)`` mathematically, is
  better conditioned numerically, and -- the reason for the shift -- gives
  EXACTLY zero for a group whose rewards are all identical (``r - r_0`` is
  exactly 0 there, so is its mean), whatever the reward value and K.
  """
  shifted = rewards_PxK - rewards_PxK[:, :1]
  return shifted - jnp.mean(shifted, axis=1, keepdims=True)


def grpo_advantages(rewards_PxK: Array, eps: float = 1e-6, ddof: int = 0) -> Array:
  """GRPO (Shao et al. 2024): ``(r - mean_g) / (std_g + eps)``.

  Choices: ``std_g`` is the group std over the K rollouts with ``ddof``
  (``config.rl.adv_std_ddof``). cbs_jax's default is ddof=0 (the population
  std); TRL, verl and Tunix normalise with ddof=1 (``torch.std``'s default),
  which divides by a std larger by sqrt(K/(K-1)), so their advantages are
  ours times sqrt((K-1)/K) -- ours are sqrt(K/(K-1)) larger (1.033x at
  K=16). ``eps`` (default 1e-6) is added to the std, not inside the sqrt.
  A group with identical rewards gets exactly zero advantages (0 / eps).
  """
  centred = _group_centred(rewards_PxK)
  k = rewards_PxK.shape[1]
  std = jnp.sqrt(jnp.sum(jnp.square(centred), axis=1, keepdims=True) / (k - ddof))
  return centred / (std + eps)


def drgrpo_advantages(rewards_PxK: Array, eps: float = 1e-6, ddof: int = 0) -> Array:
  """Dr. GRPO (Liu et al. 2025): ``r - mean_g`` (no std normalisation).

  ``eps`` and ``ddof`` are accepted for a uniform signature and unused.
  """
  del eps, ddof
  return _group_centred(rewards_PxK)


def rloo_advantages(rewards_PxK: Array, eps: float = 1e-6, ddof: int = 0) -> Array:
  """RLOO (Ahmadian et al. 2024): ``r_k - mean_{j != k} r_j``.

  Computed as ``K/(K-1) * (r_k - mean_g)`` (an identity), so identical groups
  give exactly zero.  ``eps`` and ``ddof`` are unused.
  """
  del eps, ddof
  k = rewards_PxK.shape[1]
  return _group_centred(rewards_PxK) * (k / (k - 1))


def batch_std_advantages(rewards_PxK: Array, eps: float = 1e-6, ddof: int = 0) -> Array:
  """``(r - mean_g) / (std_batch + eps)``.

  Group-mean baseline, but the scale is the std (with ``ddof``) of all
  P*K rewards of the batch (as in Hu et al. 2025 / "REINFORCE++ baseline"),
  which avoids GRPO's up-weighting of low-variance groups.  Identical groups
  get exactly zero (their centred rewards are exactly 0).
  """
  flat = rewards_PxK.reshape(-1)
  shifted = flat - flat[0]
  centred = shifted - jnp.mean(shifted)
  std = jnp.sqrt(jnp.sum(jnp.square(centred)) / (flat.shape[0] - ddof))
  return _group_centred(rewards_PxK) / (std + eps)


ADVANTAGES: dict[str, Callable[..., Array]] = {
    "grpo": grpo_advantages,
    "drgrpo": drgrpo_advantages,
    "rloo": rloo_advantages,
    "batch_std": batch_std_advantages,
}
_NEEDS_GROUP = ("grpo", "drgrpo", "rloo")


def compute_advantages(name: str, rewards_PxK, eps: float = 1e-6, ddof: int = 0) -> Array:
  """Dispatch to ``ADVANTAGES[name]`` after validating the inputs.

  Raises ValueError for an unknown ``name`` (listing the known ones), for
  rewards that are not 2-D ``PxK``, and for K < 2 with a group-baseline
  estimator (grpo/drgrpo/rloo have no baseline with a single rollout).
  """
  if name not in ADVANTAGES:
    raise ValueError(f"unknown advantage estimator {name!r}; known: {sorted(ADVANTAGES)}")
  rewards_PxK = _as_float(rewards_PxK)
  if rewards_PxK.ndim != 2:
    raise ValueError(f"rewards must be PxK (2-D), got shape {rewards_PxK.shape}")
  k = rewards_PxK.shape[1]
  if name in _NEEDS_GROUP and k < 2:
    raise ValueError(
        f"advantage estimator {name!r} needs K >= 2 rollouts per prompt, " f"got K={k}"
    )
  return ADVANTAGES[name](rewards_PxK, eps, ddof)


def sequence_to_tokens(adv_seq, mask_BxT) -> Array:
  """Broadcast per-rollout values (``PxK`` or ``B``) onto tokens: ``BxT``.

  ``PxK`` is flattened prompt-major (b = p*K + k); the result is multiplied
  by the mask (0 on padding).
  """
  mask_BxT = jnp.asarray(mask_BxT)
  adv_B = jnp.asarray(adv_seq).reshape(-1)
  if adv_B.shape[0] != mask_BxT.shape[0]:
    raise ValueError(f"{adv_B.shape[0]} rollout values for {mask_BxT.shape[0]} rows")
  return adv_B[:, None] * mask_BxT


# ---------------------------------------------------------------------------
# Policy losses
# ---------------------------------------------------------------------------


def _masked_log_ratio(logp_BxT, logp_old_BxT, mask_BxT) -> Array:
  """``logp - sg(logp_old)`` on valid tokens, exactly 0 on padding."""
  valid = mask_BxT > 0
  return jnp.where(valid, logp_BxT - sg(logp_old_BxT), 0.0)


def ppo_loss(logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec: RLSpec):
  """PPO clipped surrogate (Schulman et al. 2017), optional dual clip.

  Objective per token ``min(r A, clip(r, 1-eps_low, 1+eps_high) A)`` with
  ``r = exp(logp - sg(logp_old))`` and the clip range of ``spec``
  (``clip_eps_low``, ``clip_eps_high``); loss = -objective.  Dual clip
  (``spec.clip_c = c > 1``, Ye et al. 2020): for A < 0 the objective becomes
  ``max(min(...), c A)``, i.e. it is floored at ``c A`` once ``r > c``.

  Implemented with explicit clip indicators instead of ``jnp.minimum`` (same
  values; the gradient is unambiguous at ties such as r = 1):
    clipped_high = (A > 0) & (r > 1 + eps_high)   -> objective (1+eps_high) A
    clipped_low  = (A < 0) & (r < 1 - eps_low)    -> objective (1-eps_low) A
    dual_clipped = (A < 0) & (r > c)              -> objective c A
  elsewhere the objective is r A with gradient ``r A dlogp``; where clipped
  the objective is constant (zero gradient).

  Returns ``(loss_BxT, aux)``; aux holds ``ratio_BxT`` (1 on padding),
  float 0/1 masked indicators ``clipped_low_BxT``, ``clipped_high_BxT``,
  ``dual_clipped_BxT`` and ``clipped_BxT`` (any of them).
  """
  lo, hi, c = spec.clip_eps_low, spec.clip_eps_high, spec.clip_c
  mask = mask_BxT.astype(logp_BxT.dtype)
  adv = sg(adv_BxT)
  ratio = jnp.exp(_masked_log_ratio(logp_BxT, logp_old_BxT, mask))
  r_val = sg(ratio)
  clipped_high = (adv > 0) & (r_val > 1.0 + hi) & (mask > 0)
  clipped_low = (adv < 0) & (r_val < 1.0 - lo) & (mask > 0)
  obj = jnp.where(
      clipped_high, (1.0 + hi) * adv, jnp.where(clipped_low, (1.0 - lo) * adv, ratio * adv)
  )
  if c:
    dual = (adv < 0) & (r_val > c) & (mask > 0)
    obj = jnp.where(dual, c * adv, obj)
  else:
    dual = jnp.zeros_like(clipped_high)
  loss = -obj * mask
  f = lambda b: b.astype(logp_BxT.dtype)
  aux = {
      "ratio_BxT": ratio,
      "clipped_low_BxT": f(clipped_low),
      "clipped_high_BxT": f(clipped_high),
      "dual_clipped_BxT": f(dual),
      "clipped_BxT": f(clipped_low | clipped_high | dual),
  }
  return loss, aux


def cispo_loss(logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec: RLSpec):
  """CISPO (MiniMax-M1, 2025): ``-sg(clip(r, 1-eps_low, 1+eps_high)) A logp``.

  The IS weight is clipped and stop-gradiented; the gradient
  ``-clip(r) A dlogp`` flows through every token, so unlike PPO no token is
  dropped.  Relation to PPO's gradient ``-r A dlogp`` (unclipped) / 0
  (clipped): identical where ``1-eps_low <= r <= 1+eps_high``; nonzero where
  PPO's is zero by clipping; and also different (truncated weight
  ``1 -+ eps`` vs ``r``) where r is outside the range on PPO's pessimistic
  side (A > 0 with r < 1-eps_low, A < 0 with r > 1+eps_high).  MiniMax-M1
  in practice sets only an upper bound (make ``clip_eps_low`` close to 1 for
  that).  The loss VALUE is ``-w A logp`` (only its gradient is meaningful).

  aux: ``ratio_BxT``; ``clipped_low_BxT`` / ``clipped_high_BxT`` mark tokens
  whose weight was truncated (r < 1-eps_low / r > 1+eps_high), for either
  sign of A, since CISPO truncates the weight irrespective of the sign;
  ``weight_BxT`` the clipped weight.  clip_c is ignored.
  """
  lo, hi = spec.clip_eps_low, spec.clip_eps_high
  mask = mask_BxT.astype(logp_BxT.dtype)
  adv = sg(adv_BxT)
  ratio = jnp.exp(_masked_log_ratio(logp_BxT, logp_old_BxT, mask))
  weight = sg(jnp.clip(ratio, 1.0 - lo, 1.0 + hi))
  logp_valid = jnp.where(mask > 0, logp_BxT, 0.0)
  loss = -weight * adv * logp_valid * mask
  r_val = sg(ratio)
  f = lambda b: b.astype(logp_BxT.dtype)
  aux = {
      "ratio_BxT": ratio,
      "weight_BxT": weight,
      "clipped_low_BxT": f((r_val < 1.0 - lo) & (mask > 0)),
      "clipped_high_BxT": f((r_val > 1.0 + hi) & (mask > 0)),
  }
  return loss, aux


def pg_loss(logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec: RLSpec):
  """Plain importance-weighted policy gradient: loss ``-r A`` (no clipping).

  Gradient ``-r A dlogp``; on-policy (r = 1) this is REINFORCE with
  advantage A.  aux clip indicators are all zero; ``spec`` is unused.
  """
  del spec
  mask = mask_BxT.astype(logp_BxT.dtype)
  adv = sg(adv_BxT)
  ratio = jnp.exp(_masked_log_ratio(logp_BxT, logp_old_BxT, mask))
  loss = -ratio * adv * mask
  zeros = jnp.zeros_like(loss)
  return loss, {"ratio_BxT": ratio, "clipped_low_BxT": zeros, "clipped_high_BxT": zeros}


def gspo_loss(logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec: RLSpec):
  """GSPO-token (Zheng et al. 2025), sequence-level clipped ratio.

  Sequence ratio ``s_i = exp(sum_t m (logp - logp_old) / len_i)`` (length-
  normalised; ``len_i = sum_t m``, empty rows get s_i = 1).  Token form
  ``s_it = sg(s_i) * exp(logp_t - sg(logp_t))`` (value s_i, gradient
  ``s_i dlogp_t``); per-token loss ``-min(s_it A, clip(s_it) A)`` with the
  clip decision taken on s_i (PPO-style: high side for A > 0, low for A < 0).
  Aggregated with ``seq_mean_token_mean`` this gives exactly the gradient of
  the sequence-level GSPO objective ``mean_i min(s_i A_i, clip(s_i) A_i)``
  when A is constant over a sequence's tokens (its usual use); a per-token A
  gives the GSPO-token generalisation.  GSPO's paper uses much smaller
  eps (e.g. clip_eps_low=3e-4, clip_eps_high=4e-4); clip_c is ignored.

  aux: ``ratio_BxT`` = s_i broadcast to valid tokens (1 on padding),
  ``token_ratio_BxT`` the per-token ratio, clip indicators (per token,
  constant over a sequence if A is).
  """
  lo, hi = spec.clip_eps_low, spec.clip_eps_high
  mask = mask_BxT.astype(logp_BxT.dtype)
  adv = sg(adv_BxT)
  log_ratio = _masked_log_ratio(logp_BxT, logp_old_BxT, mask)
  len_B = jnp.sum(mask, axis=1)
  seq_log_ratio = jnp.sum(log_ratio * mask, axis=1) / jnp.maximum(len_B, 1.0)
  s_B = sg(jnp.exp(seq_log_ratio))
  logp_valid = jnp.where(mask > 0, logp_BxT, 0.0)
  s_tok = s_B[:, None] * jnp.exp(logp_valid - sg(logp_valid))
  s_val = jnp.broadcast_to(s_B[:, None], mask.shape)
  clipped_high = (adv > 0) & (s_val > 1.0 + hi) & (mask > 0)
  clipped_low = (adv < 0) & (s_val < 1.0 - lo) & (mask > 0)
  obj = jnp.where(
      clipped_high, (1.0 + hi) * adv, jnp.where(clipped_low, (1.0 - lo) * adv, s_tok * adv)
  )
  loss = -obj * mask
  f = lambda b: b.astype(logp_BxT.dtype)
  aux = {
      "ratio_BxT": jnp.where(mask > 0, s_val, 1.0),
      "token_ratio_BxT": jnp.exp(log_ratio),
      "clipped_low_BxT": f(clipped_low),
      "clipped_high_BxT": f(clipped_high),
  }
  return loss, aux


POLICY_LOSSES: dict[str, Callable[..., tuple[Array, dict]]] = {
    "ppo": ppo_loss,
    "cispo": cispo_loss,
    "pg": pg_loss,
    "gspo": gspo_loss,
}


def policy_loss(name: str, logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec: RLSpec):
  """Dispatch to ``POLICY_LOSSES[name]`` (clip range from ``spec``); ValueError
  on an unknown name."""
  if name not in POLICY_LOSSES:
    raise ValueError(f"unknown policy loss {name!r}; known: {sorted(POLICY_LOSSES)}")
  return POLICY_LOSSES[name](logp_BxT, logp_old_BxT, adv_BxT, mask_BxT, spec)


# ---------------------------------------------------------------------------
# Aggregation
# ---------------------------------------------------------------------------

AGGREGATIONS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")


def aggregation_weights(mask_BxT, mode: str, num_seqs, num_tokens, max_len) -> Array:
  """Per-token weights ``w_BxT`` with batch loss = ``sum(w * loss_BxT)``.

  The counts are GLOBAL (whole batch, not the microbatch): ``num_seqs`` =
  rollouts N, ``num_tokens`` = valid completion tokens, ``max_len`` = the
  fixed completion length T (Dr. GRPO's constant).  Hence the weights of a
  token do not depend on how the batch is split, and summing microbatch
  losses reproduces the full-batch loss and gradient exactly.

    token_mean:              m / num_tokens           (DAPO)
    seq_mean_token_mean:     m / (len_i * num_seqs)   (GRPO / GSPO)
    seq_mean_token_sum_norm: m / (max_len * num_seqs) (Dr. GRPO)

  Guards: rows with len_i = 0 and num_tokens = 0 give weight 0 (never NaN).
  Counts may be Python numbers or traced scalars.
  """
  mask = jnp.asarray(mask_BxT)
  if not jnp.issubdtype(mask.dtype, jnp.floating):
    mask = mask.astype(jnp.float32)
  if mode == "token_mean":
    return mask / jnp.maximum(jnp.asarray(num_tokens, mask.dtype), 1.0)
  if mode == "seq_mean_token_mean":
    len_B = jnp.sum(mask, axis=1, keepdims=True)
    denom = jnp.maximum(len_B, 1.0) * jnp.asarray(num_seqs, mask.dtype)
    return jnp.where(len_B > 0, mask / denom, 0.0)
  if mode == "seq_mean_token_sum_norm":
    return mask / (jnp.asarray(max_len, mask.dtype) * jnp.asarray(num_seqs, mask.dtype))
  raise ValueError(f"unknown aggregation {mode!r}; known: {AGGREGATIONS}")


def aggregate(loss_BxT, mask_BxT, mode: str, num_seqs, num_tokens, max_len) -> Array:
  """Batch loss ``sum(w * loss_BxT)`` with ``aggregation_weights`` (scalar).

  Masked positions contribute exactly 0 even if ``loss_BxT`` is non-finite
  there (value only: keep losses finite on padding for clean gradients --
  every loss in this module is).
  """
  w = aggregation_weights(mask_BxT, mode, num_seqs, num_tokens, max_len)
  return jnp.sum(jnp.where(w != 0, w * loss_BxT, 0.0))


# ---------------------------------------------------------------------------
# KL penalty and entropy
# ---------------------------------------------------------------------------

KL_KINDS = ("k1", "k2", "k3")


def kl_penalty(logp_BxT, logp_ref_BxT, kind: str = "k3") -> Array:
  """Per-token estimator of KL(pi || pi_ref) from samples of pi (Schulman 2020).

  With ``d = logp - sg(logp_ref)``:
    k1 = d                          (unbiased, can be negative)
    k2 = d^2 / 2                    (biased, low variance, >= 0)
    k3 = exp(-d) - 1 + d            (unbiased, >= 0; = exp(logp_ref - logp)
                                      - (logp_ref - logp) - 1)
  Returns per-token values (unmasked: multiply by the mask / aggregate).
  ``logp_ref`` is stop-gradiented.
  """
  d = logp_BxT - sg(logp_ref_BxT)
  if kind == "k1":
    return d
  if kind == "k2":
    return 0.5 * jnp.square(d)
  if kind == "k3":
    return jnp.expm1(-d) + d
  raise ValueError(f"unknown KL estimator {kind!r}; known: {KL_KINDS}")


def entropy_from_logits(logits_BxTxV) -> Array:
  """Entropy of softmax(logits) over the last axis, computed in float32.

  Uses ``log_softmax`` (stable for large logits); terms with p = 0 (e.g.
  -inf logits of masked vocabulary entries) contribute exactly 0.
  """
  logp = jax.nn.log_softmax(jnp.asarray(logits_BxTxV).astype(jnp.float32), axis=-1)
  p = jnp.exp(logp)
  return -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)


# ---------------------------------------------------------------------------
# PPO critic pieces
# ---------------------------------------------------------------------------


def terminal_rewards_to_tokens(rewards_B, mask_BxT) -> Array:
  """Place each rollout's scalar reward on its LAST valid token (``BxT``).

  Rows with no valid token get all zeros.
  """
  mask = jnp.asarray(mask_BxT)
  t = mask.shape[1]
  valid = mask > 0
  last = t - 1 - jnp.argmax(valid[:, ::-1], axis=1)
  has_any = jnp.any(valid, axis=1)
  rewards_B = _as_float(rewards_B)
  onehot = jax.nn.one_hot(last, t, dtype=rewards_B.dtype)
  return onehot * jnp.where(has_any, rewards_B, 0.0)[:, None]


def gae(rewards_BxT, values_BxT, mask_BxT, gamma: float, lam: float):
  """Generalised advantage estimation (Schulman et al. 2016) over tokens.

  Reverse ``jax.lax.scan`` over time that visits VALID tokens only: a masked
  position passes the carry (value and advantage of the next valid token)
  through unchanged, so gaps in the mask are skipped and the value after a
  rollout's last valid token is 0 (episode ends).  At a valid token t with
  next valid token t':
      delta_t = r_t + gamma V_t' - V_t,   A_t = delta_t + gamma lam A_t'.
  Returns ``(adv_BxT, returns_BxT)`` with returns = A + V, both 0 on
  padding.  Rewards at masked positions are ignored.  Inputs are
  stop-gradiented (these are targets).  gamma = lam = 1 gives
  A_t = reward-to-go - V_t.
  """
  r = sg(_as_float(rewards_BxT))
  v = sg(_as_float(values_BxT)).astype(r.dtype)
  m = jnp.asarray(mask_BxT) > 0

  def step(carry, xs):
    next_v, next_a = carry
    r_t, v_t, m_t = xs
    delta = r_t + gamma * next_v - v_t
    a_t = delta + gamma * lam * next_a
    new_v = jnp.where(m_t, v_t, next_v)
    new_a = jnp.where(m_t, a_t, next_a)
    return (new_v, new_a), jnp.where(m_t, a_t, 0.0)

  init = (jnp.zeros(r.shape[0], r.dtype), jnp.zeros(r.shape[0], r.dtype))
  _, adv_TxB = jax.lax.scan(step, init, (r.T, v.T, m.T), reverse=True)
  adv = adv_TxB.T
  returns = jnp.where(m, adv + v, 0.0)
  return adv, returns


def value_loss(values_BxT, returns_BxT, mask_BxT, old_values=None, clip=None) -> Array:
  """Per-token critic loss ``0.5 (v - ret)^2`` (0 on padding).

  With ``clip`` set (PPO2 value clipping) it is
  ``max(0.5 (v - ret)^2, 0.5 (v_clip - ret)^2)`` with
  ``v_clip = old + clip(v - old, -clip, clip)``; requires ``old_values``.
  Returns and old values are stop-gradiented.  Aggregate with ``aggregate``.
  """
  v = values_BxT
  ret = sg(returns_BxT)
  mask = jnp.asarray(mask_BxT).astype(v.dtype)
  loss = 0.5 * jnp.square(v - ret)
  if clip is not None:
    if old_values is None:
      raise ValueError("value_loss: clip is set but old_values is None")
    old = sg(old_values)
    v_clip = old + jnp.clip(v - old, -clip, clip)
    loss = jnp.maximum(loss, 0.5 * jnp.square(v_clip - ret))
  return jnp.where(mask > 0, loss, 0.0) * mask


# ---------------------------------------------------------------------------
# Token-level advantages: the one entry point the trainer calls
# ---------------------------------------------------------------------------


def whiten(x_BxT, mask_BxT, eps: float = 1e-6) -> Array:
  """``(x - mean) / (std + eps)`` over the valid tokens of the whole batch
  (population std), 0 on padding. Couples every rollout of the batch."""
  m = jnp.asarray(mask_BxT).astype(jnp.float32)
  n = jnp.maximum(m.sum(), 1.0)
  mu = jnp.sum(x_BxT * m) / n
  sd = jnp.sqrt(jnp.sum(jnp.square(x_BxT - mu) * m) / n)
  return (x_BxT - mu) / (sd + eps) * m


def gae_advantages(
    rewards_PxK, mask_BxT, values_BxT, gamma: float, lam: float, whiten_batch: bool = True
):
  """PPO's advantages: the terminal reward on each rollout's last token,
  GAE(gamma, lam) against the critic's values, then (``whiten_batch``)
  whitened over the batch's valid tokens. Returns ``(adv_BxT, returns_BxT)``."""
  tok_r = terminal_rewards_to_tokens(jnp.asarray(rewards_PxK).reshape(-1), mask_BxT)
  adv, returns = gae(tok_r, values_BxT, mask_BxT, gamma, lam)
  return (whiten(adv, mask_BxT) if whiten_batch else adv * mask_BxT), returns


# every name ``config.rl.advantage`` accepts: the group estimators and GAE
ADVANTAGE_KINDS = tuple(ADVANTAGES) + ("gae",)


def token_advantages(spec: RLSpec, rewards_PxK, mask_BxT, values_BxT=None):
  """Advantages on tokens for the estimator ``spec.advantage``.

  Group estimators (``ADVANTAGES``) give one value per rollout, broadcast
  over its valid tokens, with zero returns; ``"gae"`` needs the critic's
  ``values_BxT``. Returns ``(adv_BxT, returns_BxT)``, both 0 on padding.
  """
  mask = jnp.asarray(mask_BxT)
  if spec.advantage == "gae":
    if values_BxT is None:
      raise ValueError("advantage 'gae' needs critic values (a model with a value head)")
    return gae_advantages(rewards_PxK, mask, values_BxT, spec.gamma, spec.lam, spec.adv_whiten)
  adv = compute_advantages(spec.advantage, rewards_PxK, spec.adv_eps, spec.adv_std_ddof)
  return sequence_to_tokens(adv, mask), jnp.zeros(mask.shape, jnp.float32)


# ---------------------------------------------------------------------------
# Settings: config.rl as one validated, hashable value
# ---------------------------------------------------------------------------

ALGOS = ("grpo", "ppo")  # grpo: group advantages; ppo: value head + GAE

# choices of each RLSpec field that selects from a registry (config.validate's
# error names the field and lists them)
_CHOICES = (
    ("algo", ALGOS),
    ("advantage", ADVANTAGE_KINDS),
    ("loss", tuple(POLICY_LOSSES)),
    ("aggregation", AGGREGATIONS),
    ("kl_estimator", KL_KINDS),
    ("adv_std_ddof", (0, 1)),
)
_NON_NEGATIVE = ("kl_beta", "vf_coef", "value_clip", "clip_c")
_POSITIVE = ("clip_eps_low", "clip_eps_high", "adv_eps")
_UNIT = ("gamma", "lam")
_FLOATS = (
    "adv_eps",
    "clip_eps_low",
    "clip_eps_high",
    "clip_c",
    "kl_beta",
    "gamma",
    "lam",
    "vf_coef",
    "value_clip",
)


def _number(field: str, v):
  """``v`` when it is a number (not a bool); else the error config.validate gives."""
  if isinstance(v, bool) or not isinstance(v, numbers.Real):
    raise ValueError(f"config.rl.{field} must be a number, got {v!r}")
  return v


@dataclasses.dataclass(frozen=True)
class RLSpec:
  """Every setting of ``config.rl`` (``config.base_config`` comments each):
  the algorithm, advantage estimator, policy loss, aggregation, KL penalty
  and PPO critic. Frozen and hashable (a static jit argument); checked on
  construction with ``config.validate``'s messages (``config.validate``
  builds one to check ``config.rl``), numbers normalised to float (int for
  ``adv_std_ddof``). Defaults are ``config.base_config().rl``'s.

  The clip range as the losses read it: ``clip_eps_low`` puts the ratio
  floor at ``1 - clip_eps_low`` (a value >= 1 puts it at or below 0, where
  no positive ratio reaches it: no lower clip, so ``clip_eps_low =
  clip_eps_high = 10`` is PPO with effectively no clipping);
  ``clip_eps_high`` the ceiling ``1 + clip_eps_high`` (DAPO's clip-higher
  sets it above clip_eps_low; GSPO clips the SEQUENCE ratio with much
  smaller values, e.g. 3e-4 / 4e-4); ``clip_c`` PPO's dual-clip constant (Ye
  et al. 2020), 0 = off, > 1 when on.
  """

  algo: str = "grpo"
  advantage: str = "grpo"
  adv_eps: float = 1e-6
  adv_std_ddof: int = 0
  adv_whiten: bool = True
  loss: str = "ppo"
  clip_eps_low: float = 0.2
  clip_eps_high: float = 0.2
  clip_c: float = 0.0
  aggregation: str = "token_mean"
  kl_beta: float = 0.0
  kl_estimator: str = "k3"
  gamma: float = 1.0
  lam: float = 0.95
  vf_coef: float = 0.5
  value_clip: float = 0.0

  def __post_init__(self):
    for field, choices in _CHOICES:
      v = getattr(self, field)
      if v not in choices:
        raise ValueError(f"config.rl.{field}={v!r} is not one of {list(choices)}")
    for field in _NON_NEGATIVE:
      v = _number(field, getattr(self, field))
      if not v >= 0:
        raise ValueError(f"config.rl.{field} must be >= 0, got {v!r}")
    for field in _POSITIVE:
      v = _number(field, getattr(self, field))
      if not v > 0:
        raise ValueError(f"config.rl.{field} must be > 0, got {v!r}")
    for field in _UNIT:
      v = _number(field, getattr(self, field))
      if not 0.0 <= v <= 1.0:
        raise ValueError(f"config.rl.{field} must be in [0, 1], got {v!r}")
    if self.clip_c and self.clip_c <= 1.0:
      raise ValueError(f"config.rl.clip_c must be > 1 when set (0 = off), got {self.clip_c!r}")
    if not isinstance(self.adv_whiten, bool):
      raise ValueError(f"config.rl.adv_whiten must be True or False, got {self.adv_whiten!r}")
    for field in _FLOATS:
      object.__setattr__(self, field, float(getattr(self, field)))
    object.__setattr__(self, "adv_std_ddof", int(self.adv_std_ddof))

  @classmethod
  def from_config(cls, rl_cfg) -> "RLSpec":
    """The spec of ``config.rl`` (every field; ValueError naming a bad one)."""
    return cls(**{f.name: rl_cfg[f.name] for f in dataclasses.fields(cls)})
