"""Teacher-forced scoring: log-probs of given completions under the policy.

The sampler's behaviour log-probs and the trainer's log-probs must be the
same quantity (same layout, same temperature / top-k / top-p processing), so
that on-policy importance ratios are exactly 1. This module holds that shared
definition -- ``SamplingSpec``, the sampled distribution's settings, built
once and passed as one hashable value, and ``process_logits`` / ``score``,
which apply it; it depends on the model only, so the RL side (objective, SFT,
train) never imports the sampler.

Sequence layout: ``[prompt, left-padded to Tp][completion, right-padded to Tc]``;
positions count from the first real token (``positions_from_mask``).
"""

from __future__ import annotations

import dataclasses
import numbers
import operator
from typing import NamedTuple

import jax
import jax.numpy as jnp

from cbs_jax import model as model_lib

Array = jax.Array
_MASKED = -1e30


def _number(field: str, v):
  """``v`` when it is a number (not a bool); else the error config.validate gives."""
  if isinstance(v, bool) or not isinstance(v, numbers.Real):
    raise ValueError(f"config.sampling.{field} must be a number, got {v!r}")
  return v


@dataclasses.dataclass(frozen=True)
class SamplingSpec:
  """The distribution completions are sampled from: THE definition shared by
  the sampler's behaviour log-probs, teacher-forced scoring and the exact
  evaluation. Frozen and hashable (a static jit argument, a cache key);
  checked on construction with ``config.validate``'s messages, and its
  values normalised (floats, an int, a tuple of ints), so equal settings are
  equal specs.

  Attributes:
    temperature: logits are divided by it (> 0).
    top_k: keep the k most likely tokens (ties kept); 0 = off.
    top_p: keep the smallest nucleus of mass >= top_p (ties kept), in (0, 1];
      1.0 = off.
    suppress_ids: token ids never emitted (e.g. PAD and BOS inside a
      completion; ``train.prepare`` sets them from the tokenizer).
  """

  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  suppress_ids: tuple[int, ...] = ()

  def __post_init__(self):
    top_k = _number("top_k", self.top_k)
    if not top_k >= 0:
      raise ValueError(f"config.sampling.top_k must be >= 0, got {top_k!r}")
    if not isinstance(top_k, numbers.Integral):
      raise ValueError(f"config.sampling.top_k must be an integer (0 = off), got {top_k!r}")
    temperature = _number("temperature", self.temperature)
    if not temperature > 0:
      raise ValueError(f"config.sampling.temperature must be > 0, got {temperature!r}")
    if not 0.0 < _number("top_p", self.top_p) <= 1.0:
      raise ValueError(f"config.sampling.top_p must be in (0, 1], got {self.top_p!r}")
    try:
      ids = tuple(self.suppress_ids)
      ok = all(not isinstance(i, bool) and operator.index(i) >= 0 for i in ids)
    except TypeError:
      ok = False
    if not ok:
      raise ValueError(
          f"suppress_ids must be token ids (integers >= 0), " f"got {self.suppress_ids!r}"
      )
    object.__setattr__(self, "temperature", float(temperature))
    object.__setattr__(self, "top_k", int(top_k))
    object.__setattr__(self, "top_p", float(self.top_p))
    object.__setattr__(self, "suppress_ids", tuple(operator.index(i) for i in ids))

  @classmethod
  def from_config(cls, sampling_cfg, suppress_ids=()) -> "SamplingSpec":
    """The spec of ``config.sampling`` (its temperature, top_k, top_p) with
    ``suppress_ids`` (set from the tokenizer, not a config field)."""
    return cls(
        sampling_cfg.temperature, sampling_cfg.top_k, sampling_cfg.top_p, tuple(suppress_ids)
    )


class ScoreOutput(NamedTuple):
  logprobs: Array  # B,Tc float32 log-probs of the given completion tokens
  values: Array | None  # B,Tc float32 critic values before each token, or None
  logits: Array  # B,Tc,V float32 (processed by temperature/top-k/top-p)


def positions_from_mask(mask_BxT: Array) -> Array:
  return jnp.maximum(jnp.cumsum(mask_BxT.astype(jnp.int32), axis=-1) - 1, 0)


def process_logits(logits: Array, spec: SamplingSpec) -> Array:
  """Log-probs (float32) of the distribution ``spec`` samples from: after
  suppressing ``spec.suppress_ids``, temperature, top-k (0 = off) and top-p
  (1.0 = off; ties at the threshold are kept)."""
  top_k, top_p = spec.top_k, spec.top_p
  x = logits.astype(jnp.float32) / spec.temperature
  if spec.suppress_ids:
    x = x.at[..., jnp.asarray(spec.suppress_ids, jnp.int32)].set(_MASKED)
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


def teacher_forcing_inputs(prompt_BxTp, prompt_mask_BxTp, completion_BxTc, completion_mask_BxTc):
  """(tokens, positions, kv_mask) of the full [prompt][completion] sequence."""
  tokens = jnp.concatenate([prompt_BxTp, completion_BxTc], 1)
  mask = jnp.concatenate([prompt_mask_BxTp.astype(bool), completion_mask_BxTc.astype(bool)], 1)
  return tokens, positions_from_mask(mask), mask


def score_from_output(
    out: model_lib.Output,
    prompt_len: int,
    completion_BxTc,
    completion_mask_BxTc,
    spec: SamplingSpec,
) -> ScoreOutput:
  """``score`` given the model's output over ``teacher_forcing_inputs`` (for
  callers that run the forward themselves, e.g. ``ghost.py``'s tapped one)."""
  Tp, Tc = prompt_len, completion_BxTc.shape[1]
  logits = jax.lax.dynamic_slice_in_dim(out.logits, Tp - 1, Tc, axis=1)
  logp_all = process_logits(logits, spec)
  logp = jnp.take_along_axis(logp_all, completion_BxTc[..., None], -1)[..., 0]
  logp = jnp.where(completion_mask_BxTc.astype(bool), logp, 0.0)
  values = None
  if out.values is not None:
    values = jax.lax.dynamic_slice_in_dim(out.values, Tp - 1, Tc, axis=1)
  return ScoreOutput(logp, values, logp_all)


def score(
    graphdef,
    params,
    prompt_BxTp,
    prompt_mask_BxTp,
    completion_BxTc,
    completion_mask_BxTc,
    spec: SamplingSpec,
) -> ScoreOutput:
  """Teacher-forced log-probs of the completion tokens under ``spec`` (same
  layout and processing as ``generate``). Pure; jit it with
  ``static_argnums=(0, 6)`` (graphdef, spec); differentiate through it."""
  out = model_lib.apply(
      graphdef,
      params,
      *teacher_forcing_inputs(prompt_BxTp, prompt_mask_BxTp, completion_BxTc, completion_mask_BxTc),
  )
  return score_from_output(out, prompt_BxTp.shape[1], completion_BxTc, completion_mask_BxTc, spec)
