"""Teacher-forced scoring: log-probs of given completions under the policy.

The sampler's behaviour log-probs and the trainer's log-probs must be the
same quantity (same layout, same temperature / top-k / top-p processing), so
that on-policy importance ratios are exactly 1. This module holds that shared
definition; it depends on the model only, so the RL side (objective, SFT,
train) never imports the sampler.

Sequence layout: ``[prompt, left-padded to Tp][completion, right-padded to Tc]``;
positions count from the first real token (``positions_from_mask``).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from cbs_jax import model as model_lib

Array = jax.Array
_MASKED = -1e30


class ScoreOutput(NamedTuple):
  logprobs: Array        # B,Tc float32 log-probs of the given completion tokens
  values: Array | None   # B,Tc float32 critic values before each token, or None
  logits: Array          # B,Tc,V float32 (processed by temperature/top-k/top-p)


def positions_from_mask(mask_BxT: Array) -> Array:
  return jnp.maximum(jnp.cumsum(mask_BxT.astype(jnp.int32), axis=-1) - 1, 0)


def process_logits(logits: Array, temperature: float = 1.0, top_k: int = 0,
                   top_p: float = 1.0, suppress_ids: tuple = ()) -> Array:
  """Log-probs (float32) of the distribution sampled from after suppressing
  ``suppress_ids`` (token ids never emitted, e.g. PAD and BOS inside a
  completion), temperature, top-k (0 = off) and top-p (1.0 = off; ties at
  the threshold are kept)."""
  x = logits.astype(jnp.float32) / temperature
  if suppress_ids:
    x = x.at[..., jnp.asarray(suppress_ids, jnp.int32)].set(_MASKED)
  if top_k and top_k < x.shape[-1]:
    kth = jax.lax.top_k(x, top_k)[0][..., -1:]
    x = jnp.where(x < kth, _MASKED, x)
  if top_p < 1.0:
    srt = jnp.sort(x, axis=-1)[..., ::-1]
    p = jax.nn.softmax(srt, axis=-1)
    before = jnp.cumsum(p, axis=-1) - p  # probability mass strictly above
    keep = before < top_p
    thresh = jnp.min(jnp.where(keep, srt, jnp.inf), axis=-1, keepdims=True)
    x = jnp.where(x < thresh, _MASKED, x)
  return jax.nn.log_softmax(x, axis=-1)


def teacher_forcing_inputs(prompt_BxTp, prompt_mask_BxTp, completion_BxTc,
                           completion_mask_BxTc):
  """(tokens, positions, kv_mask) of the full [prompt][completion] sequence."""
  tokens = jnp.concatenate([prompt_BxTp, completion_BxTc], 1)
  mask = jnp.concatenate([prompt_mask_BxTp.astype(bool),
                          completion_mask_BxTc.astype(bool)], 1)
  return tokens, positions_from_mask(mask), mask


def score_from_output(out: model_lib.Output, prompt_len: int, completion_BxTc,
                      completion_mask_BxTc, temperature: float = 1.0, top_k: int = 0,
                      top_p: float = 1.0, suppress_ids: tuple = ()) -> ScoreOutput:
  """``score`` given the model's output over ``teacher_forcing_inputs`` (for
  callers that run the forward themselves, e.g. ``ghost.py``'s tapped one)."""
  Tp, Tc = prompt_len, completion_BxTc.shape[1]
  logits = jax.lax.dynamic_slice_in_dim(out.logits, Tp - 1, Tc, axis=1)
  logp_all = process_logits(logits, temperature, top_k, top_p, suppress_ids)
  logp = jnp.take_along_axis(logp_all, completion_BxTc[..., None], -1)[..., 0]
  logp = jnp.where(completion_mask_BxTc.astype(bool), logp, 0.0)
  values = None
  if out.values is not None:
    values = jax.lax.dynamic_slice_in_dim(out.values, Tp - 1, Tc, axis=1)
  return ScoreOutput(logp, values, logp_all)


def score(graphdef, params, prompt_BxTp, prompt_mask_BxTp, completion_BxTc,
          completion_mask_BxTc, temperature: float = 1.0, top_k: int = 0,
          top_p: float = 1.0, suppress_ids: tuple = ()) -> ScoreOutput:
  """Teacher-forced log-probs of the completion tokens (same layout and
  processing as ``generate``). Pure and jittable; differentiate through it."""
  out = model_lib.apply(graphdef, params, *teacher_forcing_inputs(
      prompt_BxTp, prompt_mask_BxTp, completion_BxTc, completion_mask_BxTc))
  return score_from_output(out, prompt_BxTp.shape[1], completion_BxTc, completion_mask_BxTc,
                           temperature, top_k, top_p, suppress_ids)
