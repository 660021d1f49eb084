"""The RL objective of a batch, written as a sum of per-rollout terms.

``rollout_losses`` returns ``L_B`` with batch loss ``L = sum_i L_i``: rollout
i's policy-loss terms weighted by the aggregation mode (with the update's
GLOBAL counts), its KL-penalty terms and, for PPO, its value-loss terms.
Because the counts are inputs, the same function gives

* the training loss (sum over the update's batch),
* any microbatch's exact share of it (sum over a subset, same counts), and
* per-rollout gradients ``g_i = N * grad L_i`` (``gradstats.py``), whose mean
  is exactly the batch gradient.

Advantages, behaviour and reference log-probs, returns and old values are
inputs, so ``L_i`` depends only on (params, rollout i).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cbs_jax import rl
from cbs_jax import scoring

Array = jax.Array

# Fields of a rollout batch (all leading dim B, rollouts prompt-major).
# ``on_policy`` (bool [B]) marks rollouts whose behaviour policy IS the current
# parameters: their old log-probs are taken from this very forward pass
# (stop-gradient), so their ratios are exactly 1 rather than 1 +- float noise
# between the sampler's and the trainer's kernels.
BATCH_KEYS = (
    "prompt",
    "prompt_mask",
    "completion",
    "completion_mask",
    "logp_old",
    "adv",
    "logp_ref",
    "returns",
    "old_values",
    "on_policy",
)


class Counts(NamedTuple):
  """Global normalisers of one optimizer update (arrays, so no recompiles)."""

  num_seqs: Array  # rollouts in the update's batch
  num_tokens: Array  # valid completion tokens in the update's batch
  max_len: Array  # completion length Tc (Dr. GRPO's constant)


def counts_of(batch) -> Counts:
  m = batch["completion_mask"]
  return Counts(
      jnp.asarray(m.shape[0], jnp.float32),
      jnp.maximum(jnp.sum(m), 1.0).astype(jnp.float32),
      jnp.asarray(m.shape[1], jnp.float32),
  )


def policy_losses(logp_BxT, batch, counts: Counts, rl_spec: rl.RLSpec, values_BxT=None):
  """Per-rollout loss terms ``L_B`` from per-token log-probs (no model).

  ``batch`` needs ``completion_mask``, ``adv`` and ``logp_old``; optional
  fields: ``on_policy`` (bool [B]: old log-probs taken from ``logp_BxT``
  itself, stop-gradient, so ratios are exactly 1), ``logp_ref`` (only when
  ``rl_spec.kl_beta``), ``returns`` and ``old_values`` (only for PPO's value
  loss, when ``values_BxT`` is given and ``rl_spec.algo == "ppo"``).
  Returns ``(L_B, aux)`` with the policy loss's per-token aux plus ``logp_old``.
  """
  mask = batch["completion_mask"]
  logp_old = batch["logp_old"]
  if "on_policy" in batch:
    logp_old = jnp.where(batch["on_policy"][:, None], jax.lax.stop_gradient(logp_BxT), logp_old)
  loss_BxT, aux = rl.policy_loss(rl_spec.loss, logp_BxT, logp_old, batch["adv"], mask, rl_spec)
  if rl_spec.kl_beta:
    loss_BxT = loss_BxT + rl_spec.kl_beta * mask * rl.kl_penalty(
        logp_BxT, batch["logp_ref"], rl_spec.kl_estimator
    )
  w_BxT = rl.aggregation_weights(
      mask, rl_spec.aggregation, counts.num_seqs, counts.num_tokens, counts.max_len
  )
  L_B = jnp.sum(w_BxT * loss_BxT, axis=-1)
  if values_BxT is not None and rl_spec.algo == "ppo":
    vl = rl.value_loss(
        values_BxT, batch["returns"], mask, batch["old_values"], rl_spec.value_clip or None
    )
    L_B = L_B + rl_spec.vf_coef * jnp.sum(w_BxT * vl, axis=-1)
  return L_B, dict(aux, logp_old=logp_old)


def rollout_losses(
    params, graphdef, batch, counts: Counts, rl_spec: rl.RLSpec, sampling_spec: scoring.SamplingSpec
):
  """Per-rollout loss contributions ``L_B`` (sum = batch loss) and per-token aux.

  Scores the completions by teacher forcing and applies ``policy_losses``
  (settings ``rl_spec``); ``sampling_spec`` is the distribution the
  behaviour log-probs were taken under (so that on-policy ratios are exactly 1).
  """
  mask = batch["completion_mask"]
  sc = scoring.score(
      graphdef,
      params,
      batch["prompt"],
      batch["prompt_mask"],
      batch["completion"],
      mask,
      sampling_spec,
  )
  L_B, aux = policy_losses(sc.logprobs, batch, counts, rl_spec, sc.values)
  aux = dict(aux, logp=sc.logprobs, entropy=rl.entropy_from_logits(sc.logits) * mask)
  return L_B, aux


def batch_loss(
    params, graphdef, batch, counts: Counts, rl_spec: rl.RLSpec, sampling_spec: scoring.SamplingSpec
):
  """Scalar loss (sum of ``rollout_losses``) and aux, for ``jax.grad``."""
  L_B, aux = rollout_losses(params, graphdef, batch, counts, rl_spec, sampling_spec)
  return jnp.sum(L_B), aux
