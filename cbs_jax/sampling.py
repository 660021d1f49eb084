"""Batched generation with a KV cache.

Sequence layout (shared by generation, scoring and training, so importance
ratios compare like with like):

    [ prompt, left-padded to Tp ][ completion, right-padded to Tc ]

Prompt positions count from the first real token (``positions_from_mask``),
so the padding a prompt got does not change anything it produces. The
completion mask covers every sampled token up to and including the first
EOS; tokens after it are ``pad_id`` with mask 0 and log-prob 0.

``generate`` is one jitted function: a prefill over the prompt writes KV
slots ``[0, Tp)``, then a ``lax.while_loop`` samples one token per step into
slot ``Tp + t`` of a preallocated, donated cache, and stops early once every
sequence has emitted EOS. The log-probs it returns are those of the
distribution actually sampled from (temperature, top-k and top-p applied):
the behaviour log-probs GRPO's importance ratios need. ``scoring.score``
recomputes the same quantity by teacher forcing.
"""
from __future__ import annotations

import functools
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax.scoring import positions_from_mask, process_logits

Array = jax.Array


class SampleOutput(NamedTuple):
  tokens: Array    # B,Tc int32 completion tokens (pad after EOS)
  mask: Array      # B,Tc float32, 1 on sampled tokens up to and incl. EOS
  lengths: Array   # B int32, number of valid completion tokens
  logprobs: Array  # B,Tc float32 behaviour log-probs (0 where mask is 0)


def left_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int):
  """Host-side: left-pad token lists to ``length``; returns (tokens, mask) numpy."""
  toks = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, s in enumerate(seqs):
    if len(s) > length:
      raise ValueError(f"prompt {i} has {len(s)} tokens, longer than the "
                       f"prompt length {length}")
    if len(s):
      toks[i, length - len(s):] = s
      mask[i, length - len(s):] = True
  return toks, mask


def check_sampling_args(max_new_tokens, temperature, top_k, top_p):
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
  if not temperature > 0:
    raise ValueError(f"temperature must be > 0, got {temperature!r}")
  if not isinstance(top_k, (int, np.integer)) or top_k < 0:
    raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k!r}")
  if not 0.0 < top_p <= 1.0:
    raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def _check_tokens(name: str, tokens, vocab_size: int):
  if isinstance(tokens, jax.core.Tracer):
    return
  t = np.asarray(tokens)
  if t.size and (t.min() < 0 or t.max() >= vocab_size):
    bad = t[(t < 0) | (t >= vocab_size)].flat[0]
    raise ValueError(f"{name} holds token id {int(bad)} outside the vocabulary "
                     f"[0, {vocab_size})")


def generate(graphdef, params, prompt_BxTp, prompt_mask_BxTp, key, *,
             max_new_tokens: int, eos_id: int, pad_id: int,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             suppress_ids: Sequence[int] = ()) -> SampleOutput:
  """Sample completions for a batch of left-padded prompts (see module doc).
  ``suppress_ids``: token ids never sampled (``scoring.process_logits``)."""
  check_sampling_args(max_new_tokens, temperature, top_k, top_p)
  cfg = model_lib.config_of(graphdef, params)
  _check_tokens("prompt_BxTp", prompt_BxTp, cfg["vocab_size"])
  for name, v in (("eos_id", eos_id), ("pad_id", pad_id)):
    if not 0 <= int(v) < cfg["vocab_size"]:
      raise ValueError(f"{name}={v} outside the vocabulary [0, {cfg['vocab_size']})")
  if not isinstance(prompt_mask_BxTp, jax.core.Tracer):
    pm = np.asarray(prompt_mask_BxTp)
    if pm.size and not pm[:, -1].all():
      raise ValueError("prompt_mask_BxTp: prompts must be left-padded with at least one "
                       "real token (its last column all True)")
  B, Tp = prompt_BxTp.shape
  if Tp + max_new_tokens > cfg["max_len"]:
    raise ValueError(f"prompt length {Tp} + max_new_tokens {max_new_tokens} "
                     f"exceeds the KV cache (model.max_len={cfg['max_len']})")
  cache = model_lib.init_cache(cfg, B, Tp + max_new_tokens)
  out, _ = _generate(graphdef, params, jnp.asarray(prompt_BxTp).astype(jnp.int32),
                     jnp.asarray(prompt_mask_BxTp).astype(bool), key, cache,
                     max_new_tokens=int(max_new_tokens), eos_id=int(eos_id),
                     pad_id=int(pad_id), temperature=float(temperature),
                     top_k=int(top_k), top_p=float(top_p),
                     suppress_ids=tuple(int(i) for i in suppress_ids))
  return out


@functools.partial(
    jax.jit, donate_argnames=("cache",),
    static_argnames=("graphdef", "max_new_tokens", "eos_id", "pad_id",
                     "temperature", "top_k", "top_p", "suppress_ids"))
def _generate(graphdef, params, prompt, prompt_mask, key, cache, *,
              max_new_tokens, eos_id, pad_id, temperature, top_k, top_p, suppress_ids):
  B, Tp = prompt.shape
  S = Tp + max_new_tokens
  kv_mask = jnp.zeros((B, S), bool).at[:, :Tp].set(prompt_mask)
  out = model_lib.apply(graphdef, params, prompt, positions_from_mask(prompt_mask),
                        kv_mask, cache, 0)
  plen = prompt_mask.sum(-1).astype(jnp.int32)
  init = dict(t=jnp.int32(0), logits=out.logits[:, -1], cache=out.cache,
              kv_mask=kv_mask, done=jnp.zeros((B,), bool),
              tokens=jnp.full((B, max_new_tokens), pad_id, jnp.int32),
              logprobs=jnp.zeros((B, max_new_tokens), jnp.float32), key=key)

  def cond(s):
    return (s["t"] < max_new_tokens) & ~jnp.all(s["done"])

  def body(s):
    t = s["t"]
    key, sub = jax.random.split(s["key"])
    logp_all = process_logits(s["logits"], temperature, top_k, top_p, suppress_ids)
    tok = jax.random.categorical(sub, logp_all).astype(jnp.int32)
    lp = jnp.take_along_axis(logp_all, tok[:, None], -1)[:, 0]
    live = ~s["done"]
    tok = jnp.where(live, tok, pad_id)
    lp = jnp.where(live, lp, 0.0)
    kv_mask = jax.lax.dynamic_update_slice(s["kv_mask"], live[:, None], (0, Tp + t))
    o = model_lib.apply(graphdef, params, tok[:, None], (plen + t)[:, None],
                        kv_mask, s["cache"], Tp + t)
    return dict(
        t=t + 1, logits=o.logits[:, 0], cache=o.cache, kv_mask=kv_mask,
        done=s["done"] | (tok == eos_id),
        tokens=jax.lax.dynamic_update_slice(s["tokens"], tok[:, None], (0, t)),
        logprobs=jax.lax.dynamic_update_slice(s["logprobs"], lp[:, None], (0, t)),
        key=key)

  s = jax.lax.while_loop(cond, body, init)
  # a sequence's valid tokens are those sampled while it was live: up to EOS.
  live_len = jnp.where(
      jnp.any(s["tokens"] == eos_id, -1),
      jnp.argmax(s["tokens"] == eos_id, -1) + 1, s["t"])
  mask = jnp.arange(max_new_tokens)[None] < live_len[:, None]
  # the cache is returned so that its donated buffer is updated in place.
  return SampleOutput(s["tokens"], mask.astype(jnp.float32),
                      live_len.astype(jnp.int32), s["logprobs"]), s["cache"]
