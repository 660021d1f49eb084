"""Batched generation with a KV cache.

Sequence layout (shared by generation, scoring and training, so importance
ratios compare like with like):

    [ prompt, left-padded to Tp ][ completion, right-padded to Tc ]

Prompt positions count from the first real token (``positions_from_mask``),
so the padding a prompt got does not change anything it produces. The
completion mask covers every sampled token up to and including the first
EOS; tokens after it are ``pad_id`` with mask 0 and log-prob 0. With
``eos_id=None`` nothing stops early: every row gets all Tc tokens.

``make_sampler`` builds one jitted function (no host work, no checks: for
timing and for callers that hold device arrays); ``generate`` validates its
arguments and calls a cached one. Inside: a prefill over the prompt writes KV
slots ``[0, Tp)``, then decoding samples one token per step into slot
``Tp + t``. The decode steps are split into a few segments (length buckets,
``segment_bounds``): segment j runs as a ``lax.while_loop`` over a KV cache
of exactly ``Tp + t_j`` slots (t_j its last step), and the cache is padded to
the next bucket between segments, so attention reads only the slots written
so far rounded up to the bucket, not the whole preallocated cache. A segment's
loop stops early once every sequence has emitted EOS. The last token is
sampled without a forward over it.

Tokens are drawn by inverse-CDF sampling (``sample_tokens``: one uniform per
row, not one per vocabulary entry as Gumbel-max needs), exactly from the
processed distribution. The log-probs returned are those of the distribution
actually sampled from (``scoring.SamplingSpec``: temperature, top-k, top-p
and suppressed ids applied): the behaviour log-probs GRPO's importance ratios
need. ``scoring.score`` recomputes the same quantity by teacher forcing.
"""

from __future__ import annotations

import functools
import operator
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax.scoring import SamplingSpec, positions_from_mask, process_logits

Array = jax.Array


class SampleOutput(NamedTuple):
  tokens: Array  # B,Tc int32 completion tokens (pad after EOS)
  mask: Array  # B,Tc float32, 1 on sampled tokens up to and incl. EOS
  lengths: Array  # B int32, number of valid completion tokens
  logprobs: Array  # B,Tc float32 behaviour log-probs (0 where mask is 0)


def left_pad(seqs: Sequence[Sequence[int]], length: int, pad_id: int):
  """Host-side: left-pad token lists to ``length``; returns (tokens, mask) numpy."""
  toks = np.full((len(seqs), length), pad_id, np.int32)
  mask = np.zeros((len(seqs), length), bool)
  for i, s in enumerate(seqs):
    if len(s) > length:
      raise ValueError(
          f"prompt {i} has {len(s)} tokens, longer than the " f"prompt length {length}"
      )
    if len(s):
      toks[i, length - len(s) :] = s
      mask[i, length - len(s) :] = True
  return toks, mask


def check_sampling_args(max_new_tokens, spec):
  """The checks a ``SamplingSpec`` does not make itself (it is valid once built)."""
  if not isinstance(max_new_tokens, (int, np.integer)) or max_new_tokens <= 0:
    raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
  if not isinstance(spec, SamplingSpec):
    raise TypeError(f"spec must be a scoring.SamplingSpec, got {spec!r}")


def _check_tokens(name: str, tokens, vocab_size: int):
  if isinstance(tokens, jax.core.Tracer):
    return
  t = np.asarray(tokens)
  if t.size and (t.min() < 0 or t.max() >= vocab_size):
    bad = t[(t < 0) | (t >= vocab_size)].flat[0]
    raise ValueError(
        f"{name} holds token id {int(bad)} outside the vocabulary " f"[0, {vocab_size})"
    )


def sample_tokens(key, logp_BxV: Array) -> Array:
  """One token per row from ``exp(logp_BxV)`` by inverse-CDF sampling: the
  first index whose cumulative probability exceeds ``u * total``, u ~ U[0, 1)
  (one uniform per row). Zero-probability tokens (masked by top-k / top-p /
  suppression) are never drawn."""
  u = jax.random.uniform(key, logp_BxV.shape[:-1] + (1,), jnp.float32)
  return tokens_from_uniform(u, logp_BxV)


def tokens_from_uniform(u_Bx1: Array, logp_BxV: Array) -> Array:
  """``sample_tokens`` given its uniforms ``u_Bx1`` in [0, 1)."""
  p = jnp.exp(logp_BxV.astype(jnp.float32))
  cdf = jnp.cumsum(p, axis=-1)
  tok = jnp.sum(cdf <= u_Bx1 * cdf[..., -1:], axis=-1)
  V = p.shape[-1]
  # u * total can round up to the total: fall back to the last token of
  # non-zero probability (never a masked one)
  last = V - 1 - jnp.argmax((p > 0)[..., ::-1], axis=-1)
  return jnp.minimum(tok, last).astype(jnp.int32)


def segment_bounds(max_new_tokens: int, segments: int = 0) -> tuple:
  """Last-step bounds ``(t_1, ..., t_m = max_new_tokens)`` of the decode
  segments (length buckets). ``segments`` = 0: automatic, up to 4 segments of
  at least 8 steps (one compiled loop body each)."""
  if isinstance(segments, bool) or not isinstance(segments, (int, np.integer)) or segments < 0:
    raise ValueError(
        f"decode_segments must be an integer >= 0 (0 = automatic), " f"got {segments!r}"
    )
  n = int(segments) or max(1, min(4, max_new_tokens // 8))
  n = min(n, max_new_tokens)
  step = -(-max_new_tokens // n)
  return tuple(min(max_new_tokens, step * (j + 1)) for j in range(n) if step * j < max_new_tokens)


# Per graphdef object: hashing an NNX graphdef walks the whole module tree
# (~0.25 ms for the quickstart's 2-layer model), and a trainer passes the
# same object every round, so these caches are keyed by identity (the
# graphdef is kept alongside, so an id is never reused while its entry lives).
_CONFIGS: dict = {}  # id(graphdef) -> (graphdef, model config)
_SAMPLERS: dict = {}  # (id(graphdef), settings) -> (graphdef, jitted sampler)


def _by_identity(cache: dict, key, graphdef, make):
  hit = cache.get(key)
  if hit is not None and hit[0] is graphdef:
    return hit[1]
  value = make()
  if len(cache) >= 64:
    cache.clear()
  cache[key] = (graphdef, value)
  return value


def _config(graphdef, params):
  """The model config of ``graphdef`` (cached: ``config_of`` merges a module)."""
  return _by_identity(
      _CONFIGS, id(graphdef), graphdef, lambda: model_lib.config_of(graphdef, params)
  )


def generate(
    graphdef,
    params,
    prompt_BxTp,
    prompt_mask_BxTp,
    key,
    *,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    spec: SamplingSpec,
    decode_segments: int = 0,
) -> SampleOutput:
  """Sample completions for a batch of left-padded prompts (see module doc)
  from the distribution ``spec`` (``scoring.process_logits``).

  ``eos_id=None``: no early stop, every row samples ``max_new_tokens`` tokens.
  ``decode_segments``: number of KV-cache length buckets (``segment_bounds``; 0 = automatic)."""
  check_sampling_args(max_new_tokens, spec)
  cfg = _config(graphdef, params)
  _check_tokens("prompt_BxTp", prompt_BxTp, cfg["vocab_size"])
  for name, v in (("eos_id", eos_id), ("pad_id", pad_id)):
    if name == "eos_id" and v is None:
      continue
    try:
      ok = not isinstance(v, bool) and 0 <= operator.index(v) < cfg["vocab_size"]
    except TypeError:
      ok = False
    if not ok:
      raise ValueError(
          f"{name}={v!r} is not a token id in the vocabulary "
          f"[0, {cfg['vocab_size']})" + (" (None: eos_id only)" if v is None else "")
      )
  if not isinstance(prompt_mask_BxTp, jax.core.Tracer):
    pm = np.asarray(prompt_mask_BxTp)
    if pm.size and not pm[:, -1].all():
      raise ValueError(
          "prompt_mask_BxTp: prompts must be left-padded with at least one "
          "real token (its last column all True)"
      )
  B, Tp = np.shape(prompt_BxTp)
  if Tp + max_new_tokens > cfg["max_len"]:
    raise ValueError(
        f"prompt length {Tp} + max_new_tokens {max_new_tokens} "
        f"exceeds the KV cache (model.max_len={cfg['max_len']})"
    )
  sampler = make_sampler(
      graphdef,
      max_new_tokens=int(max_new_tokens),
      eos_id=eos_id,
      pad_id=pad_id,
      spec=spec,
      decode_segments=decode_segments,
  )
  return sampler(
      params, jnp.asarray(prompt_BxTp, jnp.int32), jnp.asarray(prompt_mask_BxTp, bool), key
  )


def make_sampler(
    graphdef,
    *,
    max_new_tokens: int,
    eos_id: int | None,
    pad_id: int,
    spec: SamplingSpec,
    decode_segments: int = 0,
):
  """The jitted sampler ``fn(params, prompt_BxTp, prompt_mask_BxTp, key) ->
  SampleOutput`` (arguments as ``generate``'s; int32 prompt, bool mask). No
  argument checks and no host work per call beyond jit's dispatch: the entry
  point for timing and for callers that hold device arrays. Cached per
  (graphdef, settings)."""
  settings = (
      int(max_new_tokens),
      None if eos_id is None else operator.index(eos_id),
      operator.index(pad_id),
      spec,
      segment_bounds(int(max_new_tokens), decode_segments),
  )
  return _by_identity(
      _SAMPLERS, (id(graphdef),) + settings, graphdef, lambda: _make_sampler(graphdef, *settings)
  )


@functools.lru_cache(maxsize=64)  # equal graphdefs (a model rebuilt) share one jit
def _make_sampler(graphdef, max_new_tokens, eos_id, pad_id, spec, bounds):
  Tc = max_new_tokens

  def process(logits):
    return process_logits(logits, spec)

  def sampler(params, prompt, prompt_mask, key):
    cfg = model_lib.config_of(graphdef, params)  # trace time only
    B, Tp = prompt.shape
    plen = prompt_mask.sum(-1).astype(jnp.int32)
    cache = model_lib.init_cache(cfg, B, Tp + bounds[0])
    kv_mask = jnp.concatenate([prompt_mask, jnp.zeros((B, bounds[0]), bool)], 1)
    out = model_lib.apply(
        graphdef, params, prompt, positions_from_mask(prompt_mask), kv_mask, cache, 0
    )
    s = dict(
        t=jnp.int32(0),
        logits=out.logits[:, -1],
        cache=out.cache,
        done=jnp.zeros((B,), bool),
        tokens=jnp.full((B, Tc), pad_id, jnp.int32),
        logprobs=jnp.zeros((B, Tc), jnp.float32),
        key=key,
    )

    def sample(s):
      """Sample token t from s["logits"] into s; returns (token, new s)."""
      key, sub = jax.random.split(s["key"])
      logp_all = process(s["logits"])
      tok = sample_tokens(sub, logp_all)
      lp = jnp.take_along_axis(logp_all, tok[:, None], -1)[:, 0]
      done = s["done"]
      if eos_id is not None:
        tok = jnp.where(done, pad_id, tok)
        lp = jnp.where(done, 0.0, lp)
        done = done | (tok == eos_id)
      t = s["t"]
      return tok, dict(
          s,
          key=key,
          done=done,
          tokens=jax.lax.dynamic_update_slice(s["tokens"], tok[:, None], (0, t)),
          logprobs=jax.lax.dynamic_update_slice(s["logprobs"], lp[:, None], (0, t)),
      )

    for j, t1 in enumerate(bounds):
      S = Tp + t1
      if j:  # next length bucket: pad every layer's cache to S slots
        grow = lambda x: jnp.pad(x, ((0, 0), (0, 0), (0, S - x.shape[2]), (0, 0)))
        s = dict(s, cache=jax.tree.map(grow, s["cache"]))
      # generated slots count as valid keys: causality limits each query to
      # slots <= its own, and rows that are done are discarded
      kv_mask = jnp.concatenate([prompt_mask, jnp.ones((B, t1), bool)], 1)
      last = t1 == Tc  # the final token needs no forward: stop one step early
      stop = t1 - 1 if last else t1

      def body(s, kv_mask=kv_mask):
        tok, s = sample(s)
        t = s["t"]
        o = model_lib.apply(
            graphdef, params, tok[:, None], (plen + t)[:, None], kv_mask, s["cache"], Tp + t
        )
        return dict(s, t=t + 1, logits=o.logits[:, 0], cache=o.cache)

      if eos_id is None:
        s = jax.lax.fori_loop(0, stop - (0 if j == 0 else bounds[j - 1]), lambda i, s: body(s), s)
      else:
        s = jax.lax.while_loop(lambda s, stop=stop: (s["t"] < stop) & ~jnp.all(s["done"]), body, s)
    _, s = sample(s)  # token Tc - 1 (or a pad row once every row is done)
    t_end = s["t"] + 1
    if eos_id is None:
      mask = jnp.ones((B, Tc), jnp.float32)
      return SampleOutput(s["tokens"], mask, jnp.full((B,), Tc, jnp.int32), s["logprobs"])
    is_eos = s["tokens"] == eos_id
    # a sequence's valid tokens are those sampled while it was live: up to EOS
    live_len = jnp.where(jnp.any(is_eos, -1), jnp.argmax(is_eos, -1) + 1, jnp.minimum(t_end, Tc))
    mask = jnp.arange(Tc)[None] < live_len[:, None]
    return SampleOutput(
        s["tokens"], mask.astype(jnp.float32), live_len.astype(jnp.int32), s["logprobs"]
    )

  return jax.jit(sampler)
