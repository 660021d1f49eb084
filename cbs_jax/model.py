"""A small decoder-only transformer in the modern LLM style (Flax NNX).

Token embedding (optionally tied to the LM head), rotary position embedding,
RMSNorm, grouped-query attention, SwiGLU MLP, final norm and LM head, plus an
optional scalar value head for PPO's critic.

Every parameter carries logical axis names (``vocab``, ``embed``, ``heads``,
``kv_heads``, ``head_dim``, ``mlp``, ``layers``-free since layers are
separate modules) in its ``out_sharding`` metadata, so a mesh can shard it by
logical-axis rules without touching this file (see ``sharding.py``).

One forward covers both paths:
* teacher forcing: ``cache=None``; keys are the ``T`` input tokens, attention
  is causal and restricted to valid tokens (``kv_mask``);
* decoding: ``cache`` holds ``S`` key/value slots per layer; the ``T`` new
  tokens are written at slots ``[cache_index, cache_index + T)`` and attend to
  every valid slot at or before their own.

Positions are explicit inputs, so a left-padded prompt gets positions
0, 1, ... from its first real token and the result does not depend on how
much padding it got. Logits are returned in float32 whatever the compute
dtype.
"""
from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

Array = jax.Array

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_NEG_INF = -1e30  # finite, so a query with no valid key gives a uniform row, not NaN


def default_config() -> ml_collections.ConfigDict:
  """The default small model (~0.1M parameters with a character vocabulary)."""
  c = ml_collections.ConfigDict()
  c.vocab_size = 32        # set from the task's tokenizer by the trainer
  c.d_model = 64           # residual width
  c.num_layers = 2         # transformer blocks
  c.num_heads = 4          # query heads
  c.num_kv_heads = 2       # key/value heads (GQA); must divide num_heads
  c.d_ff = 192             # SwiGLU hidden width
  c.max_len = 64           # longest prompt + completion the KV cache holds
  c.rope_theta = 10_000.0  # RoPE base
  c.dtype = "float32"      # compute dtype: float32 | bfloat16 (params float32)
  c.tie_embeddings = False  # share the embedding matrix with the LM head
  c.value_head = False     # scalar value head on the final hidden (PPO critic)
  return c


def validate_config(c: ml_collections.ConfigDict, prefix: str = "model") -> None:
  """Raise ValueError naming the field for any inconsistent model setting."""
  for name in ("vocab_size", "d_model", "num_layers", "num_heads",
               "num_kv_heads", "d_ff", "max_len"):
    v = c[name]
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"{prefix}.{name} must be a positive integer, got {v!r}")
  if c.d_model % c.num_heads:
    raise ValueError(f"{prefix}.num_heads={c.num_heads} does not divide "
                     f"{prefix}.d_model={c.d_model}")
  if c.num_heads % c.num_kv_heads:
    raise ValueError(f"{prefix}.num_kv_heads={c.num_kv_heads} does not divide "
                     f"{prefix}.num_heads={c.num_heads}")
  if (c.d_model // c.num_heads) % 2:
    raise ValueError(f"head dim {prefix}.d_model/{prefix}.num_heads="
                     f"{c.d_model // c.num_heads} must be even for RoPE")
  if c.dtype not in DTYPES:
    raise ValueError(f"{prefix}.dtype={c.dtype!r} not in {sorted(DTYPES)}")
  if not c.rope_theta > 0:
    raise ValueError(f"{prefix}.rope_theta must be > 0, got {c.rope_theta!r}")


def _param(rngs: nnx.Rngs, shape, axes, std) -> nnx.Param:
  value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
  return nnx.Param(value, out_sharding=axes)


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float = 1e-6):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=("embed",))
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return (y * self.scale[...]).astype(x.dtype)


def rope(x_BxTxHxD: Array, positions_BxT: Array, theta: float) -> Array:
  """Rotary embedding (rotate-half form) at explicit integer positions."""
  d = x_BxTxHxD.shape[-1]
  freq = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  ang = positions_BxT.astype(jnp.float32)[..., None] * freq  # B,T,D/2
  sin, cos = jnp.sin(ang)[:, :, None, :], jnp.cos(ang)[:, :, None, :]
  x1, x2 = jnp.split(x_BxTxHxD.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x_BxTxHxD.dtype)


class LayerCache(NamedTuple):
  k: Array  # B,S,KVH,Dh
  v: Array  # B,S,KVH,Dh


class Attention(nnx.Module):

  def __init__(self, c, rngs: nnx.Rngs):
    d, h, kv = c.d_model, c.num_heads, c.num_kv_heads
    dh = d // h
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, dh
    self.theta = c.rope_theta
    std = 1.0 / math.sqrt(d)
    self.wq = _param(rngs, (d, h, dh), ("embed", "heads", "head_dim"), std)
    self.wk = _param(rngs, (d, kv, dh), ("embed", "kv_heads", "head_dim"), std)
    self.wv = _param(rngs, (d, kv, dh), ("embed", "kv_heads", "head_dim"), std)
    self.wo = _param(rngs, (h, dh, d), ("heads", "head_dim", "embed"),
                     1.0 / math.sqrt(d * 2 * c.num_layers))

  def __call__(self, x_BxTxD, positions_BxT, kv_mask_BxS, cache, cache_index):
    dt = x_BxTxD.dtype
    B, T, _ = x_BxTxD.shape
    q = jnp.einsum("btd,dhk->bthk", x_BxTxD, self.wq[...].astype(dt))
    k = jnp.einsum("btd,dhk->bthk", x_BxTxD, self.wk[...].astype(dt))
    v = jnp.einsum("btd,dhk->bthk", x_BxTxD, self.wv[...].astype(dt))
    q = rope(q, positions_BxT, self.theta)
    k = rope(k, positions_BxT, self.theta)
    if cache is None:
      keys, vals, start = k, v, 0
    else:
      keys = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype),
                                          (0, cache_index, 0, 0))
      vals = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype),
                                          (0, cache_index, 0, 0))
      cache = LayerCache(keys, vals)
      start = cache_index
    S = keys.shape[1]
    g = self.num_heads // self.num_kv_heads
    qg = q.reshape(B, T, self.num_kv_heads, g, self.head_dim)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, keys.astype(dt))
    scores = scores.astype(jnp.float32) / math.sqrt(self.head_dim)
    q_slot = start + jnp.arange(T)
    allowed = (jnp.arange(S)[None, :] <= q_slot[:, None])[None] & kv_mask_BxS[:, None, :]
    scores = jnp.where(allowed[:, None, None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, vals.astype(dt))
    out = out.reshape(B, T, self.num_heads, self.head_dim)
    return jnp.einsum("bthk,hkd->btd", out, self.wo[...].astype(dt)), cache


class SwiGLU(nnx.Module):

  def __init__(self, c, rngs: nnx.Rngs):
    d, f = c.d_model, c.d_ff
    self.w_gate = _param(rngs, (d, f), ("embed", "mlp"), 1.0 / math.sqrt(d))
    self.w_up = _param(rngs, (d, f), ("embed", "mlp"), 1.0 / math.sqrt(d))
    self.w_down = _param(rngs, (f, d), ("mlp", "embed"),
                         1.0 / math.sqrt(f * 2 * c.num_layers))

  def __call__(self, x):
    dt = x.dtype
    h = jax.nn.silu(x @ self.w_gate[...].astype(dt)) * (x @ self.w_up[...].astype(dt))
    return h @ self.w_down[...].astype(dt)


class Block(nnx.Module):

  def __init__(self, c, rngs: nnx.Rngs):
    self.attn_norm = RMSNorm(c.d_model)
    self.attn = Attention(c, rngs)
    self.mlp_norm = RMSNorm(c.d_model)
    self.mlp = SwiGLU(c, rngs)

  def __call__(self, x, positions, kv_mask, cache, cache_index):
    a, cache = self.attn(self.attn_norm(x), positions, kv_mask, cache, cache_index)
    x = x + a
    return x + self.mlp(self.mlp_norm(x)), cache


class Output(NamedTuple):
  logits: Array          # B,T,V float32
  values: Array | None   # B,T float32 (value head) or None
  cache: Any             # tuple of LayerCache or None


class Transformer(nnx.Module):
  """Decoder-only policy (and optional critic)."""

  def __init__(self, c: ml_collections.ConfigDict, rngs: nnx.Rngs):
    validate_config(c)
    # hashable (graphdefs are static jit arguments); read it back with config_of
    self.config = tuple(sorted((c.to_dict() if hasattr(c, "to_dict") else dict(c)).items()))
    self.dtype = DTYPES[c.dtype]
    self.embed = _param(rngs, (c.vocab_size, c.d_model), ("vocab", "embed"), 1.0)
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.d_model)
    self.lm_head = None if c.tie_embeddings else _param(
        rngs, (c.d_model, c.vocab_size), ("embed", "vocab"), 1.0 / math.sqrt(c.d_model))
    self.value = _param(rngs, (c.d_model, 1), ("embed", None), 1e-3) if c.value_head else None

  def __call__(self, tokens_BxT: Array, positions_BxT: Array, kv_mask_BxS: Array,
               cache=None, cache_index=0) -> Output:
    x = self.embed[...][tokens_BxT].astype(self.dtype)
    new_cache = []
    for i, block in enumerate(self.blocks):
      x, lc = block(x, positions_BxT, kv_mask_BxS,
                    None if cache is None else cache[i], cache_index)
      new_cache.append(lc)
    h = self.final_norm(x)
    head = self.embed[...].T if self.lm_head is None else self.lm_head[...]
    logits = (h @ head.astype(self.dtype)).astype(jnp.float32)
    values = None
    if self.value is not None:
      values = (h.astype(jnp.float32) @ self.value[...])[..., 0]
    return Output(logits, values, None if cache is None else tuple(new_cache))


def init_cache(c, batch: int, slots: int) -> tuple:
  """Zeroed KV cache: one LayerCache of shape [batch, slots, kv_heads, head_dim]."""
  dh = c.d_model // c.num_heads
  shape = (batch, slots, c.num_kv_heads, dh)
  dt = DTYPES[c.dtype]
  return tuple(LayerCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt))
               for _ in range(c.num_layers))


def build(c: ml_collections.ConfigDict, seed: int = 0):
  """Build the model; returns (graphdef, params). Parameters are float32."""
  with nnx.use_eager_sharding(False):
    model = Transformer(c, nnx.Rngs(params=seed))
  return nnx.split(model, nnx.Param)


def apply(graphdef, params, tokens_BxT, positions_BxT, kv_mask_BxS,
          cache=None, cache_index=0) -> Output:
  """Pure functional forward: merge (trace-time only) and call."""
  return nnx.merge(graphdef, params)(tokens_BxT, positions_BxT, kv_mask_BxS,
                                     cache, cache_index)


def config_of(graphdef, params) -> ml_collections.ConfigDict:
  """The model config a (graphdef, params) pair was built from."""
  return ml_collections.ConfigDict(dict(nnx.merge(graphdef, params).config))


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))


def logical_axes(params):
  """Pytree of logical axis-name tuples, one per parameter (for sharding)."""
  return jax.tree.map(lambda v: v.get_metadata().get("out_sharding"), params,
                      is_leaf=lambda v: isinstance(v, nnx.Variable))
