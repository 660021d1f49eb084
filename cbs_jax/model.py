"""A small decoder-only transformer in the modern LLM style (Flax NNX).

Token embedding (optionally tied to the LM head), rotary position embedding,
RMSNorm, grouped-query attention, SwiGLU MLP, final norm and LM head, plus an
optional scalar value head for PPO's critic.

Options that imported Hugging Face checkpoints need (``hf.py``), all off by
default so the default model is unchanged: q/k/v projection biases
(``qkv_bias``, Qwen2), per-head RMSNorm of q and k before RoPE (``qk_norm``,
Qwen3), a head width other than ``d_model // num_heads`` (``head_dim``), the
RMSNorm epsilon (``norm_eps``) and RoPE frequency scaling (``rope_scaling``,
Hugging Face's "linear" and "llama3" types). ``rope_scaling`` is a
``"key=value,..."`` string, not a nested dict, so that the config stays a flat
hashable tuple inside the graphdef and one command-line flag overrides it.

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
import numpy as np
from flax import nnx

Array = jax.Array

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}
_NEG_INF = -1e30  # finite, so a query with no valid key gives a uniform row, not NaN


def default_config() -> ml_collections.ConfigDict:
  """The default small model (~0.1M parameters with a character vocabulary)."""
  c = ml_collections.ConfigDict()
  c.vocab_size = 32  # set from the task's tokenizer by the trainer
  c.d_model = 64  # residual width
  c.num_layers = 2  # transformer blocks
  c.num_heads = 4  # query heads
  c.num_kv_heads = 2  # key/value heads (GQA); must divide num_heads
  c.d_ff = 192  # SwiGLU hidden width
  c.max_len = 64  # longest prompt + completion the KV cache holds
  c.rope_theta = 10_000.0  # RoPE base
  c.rope_scaling = ""  # RoPE frequency scaling, Hugging Face's rope_scaling dict written
  # "key=value,...": "" = none; "rope_type=linear,factor=4";
  # "rope_type=llama3,factor=8,low_freq_factor=1,high_freq_factor=4,
  # original_max_position_embeddings=8192" (see rope_inv_freq)
  c.head_dim = 0  # per-head width; 0 = d_model // num_heads (Qwen3 sets its own)
  c.norm_eps = 1e-6  # RMSNorm epsilon (Hugging Face's rms_norm_eps)
  c.qkv_bias = False  # biases on the q/k/v projections (Qwen2, Qwen2.5)
  c.qk_norm = False  # RMSNorm over head_dim of each q and k head before RoPE (Qwen3)
  c.dtype = "float32"  # compute dtype: float32 | bfloat16
  c.param_dtype = "float32"  # stored parameter dtype: float32 | bfloat16 (``build`` makes
  # float32; the trainer and hf.load store this dtype, the
  # optimizer keeps a float32 master copy: precision.py)
  c.tie_embeddings = False  # share the embedding matrix with the LM head
  c.value_head = False  # scalar value head on the final hidden (PPO critic)
  return c


# Named model shapes for benchmarks and device checks (random init: timings
# depend on shapes only). "1m" and "25m" are the project's benchmark models;
# "qwen2.5-0.5b" has the dimensions of Qwen2.5-0.5B's config.json (hidden 896,
# 24 layers, 14 query / 2 key-value heads of 64, intermediate 4864, vocab
# 151,936, tied embeddings, q/k/v biases, rope theta 1e6).
SIZE_FIELDS = ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff")
SHAPE_FIELDS = SIZE_FIELDS + (
    "head_dim",
    "qkv_bias",
    "qk_norm",
    "tie_embeddings",
    "rope_theta",
)
PRESETS = {
    "1m": dict(vocab_size=64, d_model=128, num_layers=4, num_heads=4, num_kv_heads=4, d_ff=512),
    "25m": dict(vocab_size=64, d_model=512, num_layers=8, num_heads=8, num_kv_heads=4, d_ff=1536),
    "qwen2.5-0.5b": dict(
        vocab_size=151_936,
        d_model=896,
        num_layers=24,
        num_heads=14,
        num_kv_heads=2,
        d_ff=4864,
        head_dim=64,
        qkv_bias=True,
        tie_embeddings=True,
        rope_theta=1_000_000.0,
    ),
}


def preset_config(
    name: str, base: ml_collections.ConfigDict | None = None, keep_vocab: bool = False
) -> ml_collections.ConfigDict:
  """``base`` (default: ``default_config()``, copied) with the shape of the
  named preset; ``keep_vocab`` keeps ``base``'s vocabulary (a task's
  tokenizer). Fields a preset leaves out take their default values, so a
  preset never inherits a shape field from ``base``."""
  if name not in PRESETS:
    raise ValueError(f"unknown model preset {name!r}; known: {sorted(PRESETS)}")
  c = ml_collections.ConfigDict(base.to_dict() if base is not None else default_config())
  ref = default_config()
  shape = {k: ref[k] for k in SHAPE_FIELDS} | PRESETS[name]
  if keep_vocab:
    shape.pop("vocab_size")
  c.update(shape)
  return c


def validate_config(c: ml_collections.ConfigDict, prefix: str = "model") -> None:
  """Raise ValueError naming the field for any inconsistent model setting."""
  for name in SIZE_FIELDS + ("max_len",):
    v = c[name]
    if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
      raise ValueError(f"{prefix}.{name} must be a positive integer, got {v!r}")
  hd = c.get("head_dim", 0)
  if isinstance(hd, bool) or not isinstance(hd, int) or hd < 0:
    raise ValueError(
        f"{prefix}.head_dim must be a non-negative integer (0 = d_model // "
        f"num_heads), got {hd!r}"
    )
  if not hd and c.d_model % c.num_heads:
    raise ValueError(
        f"{prefix}.num_heads={c.num_heads} does not divide " f"{prefix}.d_model={c.d_model}"
    )
  if c.num_heads % c.num_kv_heads:
    raise ValueError(
        f"{prefix}.num_kv_heads={c.num_kv_heads} does not divide "
        f"{prefix}.num_heads={c.num_heads}"
    )
  if hd and hd % 2:
    raise ValueError(f"{prefix}.head_dim={hd} must be even for RoPE")
  if not hd and (c.d_model // c.num_heads) % 2:
    raise ValueError(
        f"head dim {prefix}.d_model/{prefix}.num_heads="
        f"{c.d_model // c.num_heads} must be even for RoPE"
    )
  if c.dtype not in DTYPES:
    raise ValueError(f"{prefix}.dtype={c.dtype!r} not in {sorted(DTYPES)}")
  if c.get("param_dtype", "float32") not in DTYPES:
    raise ValueError(f"{prefix}.param_dtype={c.get('param_dtype')!r} not in {sorted(DTYPES)}")
  if not c.rope_theta > 0:
    raise ValueError(f"{prefix}.rope_theta must be > 0, got {c.rope_theta!r}")
  eps = c.get("norm_eps", 1e-6)
  if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not 0 < eps < 1:
    raise ValueError(f"{prefix}.norm_eps must be in (0, 1), got {eps!r}")
  for name in ("qkv_bias", "qk_norm"):
    if not isinstance(c.get(name, False), bool):
      raise ValueError(f"{prefix}.{name} must be True or False, got {c.get(name)!r}")
  try:
    rope_inv_freq(head_dim_of(c), c.rope_theta, c.get("rope_scaling", ""))
  except ValueError as e:
    raise ValueError(f"{prefix}.rope_scaling={c.get('rope_scaling')!r}: {e}") from None


def head_dim_of(c) -> int:
  """Per-head width: ``c.head_dim``, or ``d_model // num_heads`` when it is 0 (unset)."""
  return c.get("head_dim", 0) or c.d_model // c.num_heads


# rope_type -> the keys its scaling takes (Hugging Face's names)
ROPE_SCALING_KEYS = {
    "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}


def parse_rope_scaling(text: str) -> dict:
  """``"rope_type=linear,factor=4"`` -> ``{"rope_type": "linear", "factor": 4.0}``;
  ``""`` -> ``{}``. ValueError naming a malformed entry, an unknown type or key."""
  if not isinstance(text, str):
    raise ValueError(f"expected a 'key=value,...' string, got {text!r}")
  out = {}
  for item in filter(None, (t.strip() for t in text.split(","))):
    key, sep, val = (t.strip() for t in item.partition("="))
    if not sep or not key or not val:
      raise ValueError(f"entry {item!r} is not 'key=value'")
    out[key] = val
  if not out:
    return {}
  kind = out.pop("rope_type", None)
  if kind not in ROPE_SCALING_KEYS:
    raise ValueError(f"rope_type={kind!r} is not one of {sorted(ROPE_SCALING_KEYS)}")
  want = ROPE_SCALING_KEYS[kind]
  if set(out) != set(want):
    raise ValueError(f"rope_type={kind} takes exactly the keys {list(want)}, got {sorted(out)}")
  params = {"rope_type": kind}
  for key in want:
    try:
      params[key] = float(out[key])
    except ValueError:
      raise ValueError(f"{key}={out[key]!r} is not a number") from None
    if not params[key] > 0 or not math.isfinite(params[key]):
      raise ValueError(f"{key}={out[key]!r} must be a finite number > 0")
  if kind == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
    raise ValueError(
        f"high_freq_factor={params['high_freq_factor']} must exceed "
        f"low_freq_factor={params['low_freq_factor']}"
    )
  return params


def format_rope_scaling(params: dict | None) -> str:
  """Inverse of ``parse_rope_scaling`` (``None`` or ``{}`` -> ``""``)."""
  if not params:
    return ""
  kind = params.get("rope_type")
  keys = ROPE_SCALING_KEYS.get(kind, ())
  return ",".join(
      [f"rope_type={kind}"] + [f"{k}={float(params[k])!r}" for k in keys if k in params]
  )


def rope_inv_freq(head_dim: int, theta: float, scaling: str = ""):
  """RoPE inverse frequencies ``theta^(-2i/head_dim)``, i < head_dim/2, after the
  scaling ``scaling`` names, as Hugging Face computes them: "linear" divides
  every frequency by ``factor`` (positions / factor); "llama3" divides the low
  frequencies (wavelength > original_max_position_embeddings / low_freq_factor)
  by ``factor``, keeps the high ones (wavelength < .../high_freq_factor) and
  interpolates between. Returns None for no scaling (``rope`` then uses its
  float32 default), else a float32 numpy array computed in float64."""
  params = parse_rope_scaling(scaling)
  if not params:
    return None
  inv = float(theta) ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
  factor = params["factor"]
  if params["rope_type"] == "linear":
    inv = inv / factor
  else:  # llama3
    lo, hi = params["low_freq_factor"], params["high_freq_factor"]
    old = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    scaled = np.where(wavelen > old / lo, inv / factor, inv)
    smooth = (old / wavelen - lo) / (hi - lo)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= old / hi) & (wavelen <= old / lo)
    inv = np.where(medium, smoothed, scaled)
  return inv.astype(np.float32)


def _param(rngs: nnx.Rngs, shape, axes, std) -> nnx.Param:
  value = std * jax.random.normal(rngs.params(), shape, jnp.float32)
  return nnx.Param(value, out_sharding=axes)


def dense(x: Array, w: Array) -> Array:
  """``x @ w`` over the last axis of ``x`` (``w``: [in, out]), with a backward
  pass whose weight gradient dW = X^T dY (X, dY: [tokens, in/out]) takes the
  tokens as rows of two row-major matrices. On a CPU, XLA otherwise often
  materialises the transpose of the WIDER operand (fused into its producer,
  a strided write ~10x slower per byte than a narrow one); here the narrower
  of X and dY is transposed explicitly and the product is a plain GEMM (1.3x
  faster RL updates at d_model 128, 2x at the quickstart's 64). Other
  platforms use XLA's own transpose rule (``lax.platform_dependent``).
  Reverse mode only (a ``jax.custom_vjp``)."""
  return _dense(x, w)


@jax.custom_vjp
def _dense(x, w):
  return jnp.dot(x, w)


def _dense_fwd(x, w):
  return jnp.dot(x, w), (x, w)


def _dw_cpu(x2, dy2):
  if x2.shape[1] <= dy2.shape[1]:
    return jax.lax.optimization_barrier(x2.T) @ dy2
  return (jax.lax.optimization_barrier(dy2.T) @ x2).T


def _dw_default(x2, dy2):
  return jax.lax.dot_general(x2, dy2, (((0,), (0,)), ((), ())))


def _dense_bwd(res, dy):
  x, w = res
  x2, dy2 = x.reshape(-1, x.shape[-1]), dy.reshape(-1, dy.shape[-1])
  dw = jax.lax.platform_dependent(x2, dy2, cpu=_dw_cpu, default=_dw_default)
  return jnp.dot(dy, w.T).astype(x.dtype), dw.astype(w.dtype)


_dense.defvjp(_dense_fwd, _dense_bwd)


class Tapped(nnx.Module):
  """Ghost-norm hooks (``ghost.py``). ``capture_taps`` is a class attribute,
  False, so the default forward traces no tap and its graphdef is unchanged;
  ``ghost.py`` sets it on a merged copy (``Module.set_attributes``) and runs
  the forward under ``nnx.capture``."""

  capture_taps = False

  def _tap(self, name: str, y: Array, x: Array | None = None) -> Array:
    """At the use of parameter ``name`` with output ``y`` (and input ``x``):
    record ``x`` as the ``nnx.Intermediate`` ``name + "_in"`` and add a zero
    ``nnx.Perturbation`` ``name`` to ``y``, whose gradient is dL/dy for every
    rollout at once. A no-op unless ``capture_taps``."""
    if not self.capture_taps:
      return y
    if x is not None:
      self.sow(nnx.Intermediate, name + "_in", x)
    return self.perturb(name, y)


class RMSNorm(Tapped):

  def __init__(self, dim: int, eps: float = 1e-6, axis: str = "embed"):
    self.scale = nnx.Param(jnp.ones((dim,), jnp.float32), out_sharding=(axis,))
    self.eps = eps

  def __call__(self, x: Array) -> Array:
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, -1, keepdims=True) + self.eps)
    return self._tap("scale", y * self.scale[...], y).astype(x.dtype)


def rope_sincos(
    positions_BxT: Array, head_dim: int, theta: float, inv_freq=None, num_positions=None
):
  """(sin, cos) of the RoPE angles at explicit integer positions, each
  [B, T, 1, head_dim/2] float32: computed once per forward and shared by every
  layer.

  With ``num_positions`` (static) sin and cos are evaluated once for each
  position 0 .. num_positions - 1 and looked up by position; a position
  outside that range gives NaN, not a wrong rotation. Why a table: XLA fuses
  a cheap producer into each of its consumers, so sin/cos of the [B, T]
  angles end up evaluated again inside every layer's q and k rotation, per
  element of the rotated heads (docs/planner.md, "RoPE as a table"); the
  looked-up rows it fuses instead are loads. Same values either way: the
  same float32 angle goes through the same sin and cos.

  ``inv_freq`` (head_dim/2 frequencies, see ``rope_inv_freq``) overrides the
  default ``theta^(-2i/head_dim)``, e.g. for a scaled RoPE."""
  d = head_dim
  if inv_freq is None:
    freq = theta ** (-jnp.arange(0, d, 2, dtype=jnp.float32) / d)
  else:
    freq = jnp.asarray(inv_freq, jnp.float32)
  if num_positions is None:
    ang = positions_BxT.astype(jnp.float32)[..., None] * freq  # B,T,D/2
    return jnp.sin(ang)[:, :, None, :], jnp.cos(ang)[:, :, None, :]
  ang = jnp.arange(num_positions, dtype=jnp.float32)[:, None] * freq  # S,D/2
  look = lambda table: jnp.take(table, positions_BxT, axis=0, mode="fill")[:, :, None, :]
  return look(jnp.sin(ang)), look(jnp.cos(ang))


def apply_rope(x_BxTxHxD: Array, sincos) -> Array:
  """Rotary embedding (rotate-half form) given ``rope_sincos``'s angles."""
  sin, cos = sincos
  x1, x2 = jnp.split(x_BxTxHxD.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)
  return out.astype(x_BxTxHxD.dtype)


def rope(x_BxTxHxD: Array, positions_BxT: Array, theta: float, inv_freq=None) -> Array:
  """Rotary embedding (rotate-half form) at explicit integer positions.

  ``inv_freq`` (D/2 frequencies, see ``rope_inv_freq``) overrides the default
  ``theta^(-2i/D)``, e.g. for a scaled RoPE."""
  return apply_rope(x_BxTxHxD, rope_sincos(positions_BxT, x_BxTxHxD.shape[-1], theta, inv_freq))


class LayerCache(NamedTuple):
  k: Array  # B,KVH,S,Dh (head-major: a head's slots are contiguous)
  v: Array  # B,KVH,S,Dh


class Attention(Tapped):

  def __init__(self, c, rngs: nnx.Rngs):
    d, h, kv = c.d_model, c.num_heads, c.num_kv_heads
    dh = head_dim_of(c)
    self.num_heads, self.num_kv_heads, self.head_dim = h, kv, dh
    self.theta = c.rope_theta
    self.rope_scaling = c.get("rope_scaling", "")
    std = 1.0 / math.sqrt(d)
    self.wq = _param(rngs, (d, h, dh), ("embed", "heads", "head_dim"), std)
    self.wk = _param(rngs, (d, kv, dh), ("embed", "kv_heads", "head_dim"), std)
    self.wv = _param(rngs, (d, kv, dh), ("embed", "kv_heads", "head_dim"), std)
    self.wo = _param(
        rngs, (h, dh, d), ("heads", "head_dim", "embed"), 1.0 / math.sqrt(d * 2 * c.num_layers)
    )
    # q/k/v biases (Qwen2), zero-initialised; None (static) when off
    bias = c.get("qkv_bias", False)
    zeros = lambda n, axis: nnx.Param(
        jnp.zeros((n, dh), jnp.float32), out_sharding=(axis, "head_dim")
    )
    self.bq = zeros(h, "heads") if bias else None
    self.bk = zeros(kv, "kv_heads") if bias else None
    self.bv = zeros(kv, "kv_heads") if bias else None
    # per-head q/k RMSNorm over head_dim (Qwen3)
    qk_norm, eps = c.get("qk_norm", False), c.get("norm_eps", 1e-6)
    self.q_norm = RMSNorm(dh, eps, axis="head_dim") if qk_norm else None
    self.k_norm = RMSNorm(dh, eps, axis="head_dim") if qk_norm else None

  def __call__(self, x_BxTxD, sincos, kv_mask_BxS, cache, cache_index):
    """``sincos``: ``rope_sincos`` of the T new tokens' positions."""
    dt = x_BxTxD.dtype
    B, T, _ = x_BxTxD.shape
    KV, G, Dh = self.num_kv_heads, self.num_heads // self.num_kv_heads, self.head_dim
    x = x_BxTxD

    def proj(param):  # [D, heads, Dh] weight as one [D, heads * Dh] GEMM
      w = param[...]
      return dense(x, w.reshape(w.shape[0], -1).astype(dt)).reshape(B, T, -1, Dh)

    q = self._tap("wq", proj(self.wq), x)
    k = self._tap("wk", proj(self.wk), x)
    v = self._tap("wv", proj(self.wv), x)
    if self.bq is not None:
      q = self._tap("bq", q + self.bq[...].astype(dt))
      k = self._tap("bk", k + self.bk[...].astype(dt))
      v = self._tap("bv", v + self.bv[...].astype(dt))
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    q, k = apply_rope(q, sincos), apply_rope(k, sincos)
    # head-major layout, batch dims leading: [B, KV, rows, Dh] with the G query
    # heads of a key/value head stacked along the rows (row = g * T + t). XLA's
    # CPU dot is fast on this layout and ~30x slower on [B, T, KV, G, Dh].
    q = q.reshape(B, T, KV, G, Dh).transpose(0, 2, 3, 1, 4).reshape(B, KV, G * T, Dh)
    k = k.transpose(0, 2, 1, 3)
    v = v.transpose(0, 2, 1, 3)
    if cache is None:
      keys, vals, start = k, v, 0
    else:
      keys = jax.lax.dynamic_update_slice(cache.k, k.astype(cache.k.dtype), (0, 0, cache_index, 0))
      vals = jax.lax.dynamic_update_slice(cache.v, v.astype(cache.v.dtype), (0, 0, cache_index, 0))
      cache = LayerCache(keys, vals)
      start = cache_index
    S = keys.shape[2]
    scores = jnp.einsum("bkqd,bksd->bkqs", q, keys.astype(dt))
    scores = scores.astype(jnp.float32) * (1.0 / math.sqrt(Dh))
    q_slot = start + jnp.tile(jnp.arange(T), G)  # [G*T]
    allowed = (jnp.arange(S)[None, :] <= q_slot[:, None])[None, None] & kv_mask_BxS[
        :, None, None, :
    ]  # B,1,G*T,S
    scores = jnp.where(allowed, scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt)
    out = jnp.einsum("bkqs,bksd->bkqd", probs, vals.astype(dt))  # B,KV,G*T,Dh
    out = out.reshape(B, KV, G, T, Dh).transpose(0, 3, 1, 2, 4).reshape(B, T, self.num_heads, Dh)
    wo = self.wo[...]
    y = dense(out.reshape(B, T, -1), wo.reshape(-1, wo.shape[-1]).astype(dt))
    return self._tap("wo", y, out), cache


class SwiGLU(Tapped):

  def __init__(self, c, rngs: nnx.Rngs):
    d, f = c.d_model, c.d_ff
    self.w_gate = _param(rngs, (d, f), ("embed", "mlp"), 1.0 / math.sqrt(d))
    self.w_up = _param(rngs, (d, f), ("embed", "mlp"), 1.0 / math.sqrt(d))
    self.w_down = _param(rngs, (f, d), ("mlp", "embed"), 1.0 / math.sqrt(f * 2 * c.num_layers))

  def __call__(self, x):
    dt = x.dtype
    gate = self._tap("w_gate", dense(x, self.w_gate[...].astype(dt)), x)
    up = self._tap("w_up", dense(x, self.w_up[...].astype(dt)), x)
    h = jax.nn.silu(gate) * up
    return self._tap("w_down", dense(h, self.w_down[...].astype(dt)), h)


class Block(nnx.Module):

  def __init__(self, c, rngs: nnx.Rngs):
    eps = c.get("norm_eps", 1e-6)
    self.attn_norm = RMSNorm(c.d_model, eps)
    self.attn = Attention(c, rngs)
    self.mlp_norm = RMSNorm(c.d_model, eps)
    self.mlp = SwiGLU(c, rngs)

  def __call__(self, x, sincos, kv_mask, cache, cache_index):
    a, cache = self.attn(self.attn_norm(x), sincos, kv_mask, cache, cache_index)
    x = x + a
    return x + self.mlp(self.mlp_norm(x)), cache


class Output(NamedTuple):
  logits: Array  # B,T,V float32
  values: Array | None  # B,T float32 (value head) or None
  cache: Any  # tuple of LayerCache or None


class Transformer(Tapped):
  """Decoder-only policy (and optional critic)."""

  def __init__(self, c: ml_collections.ConfigDict, rngs: nnx.Rngs):
    validate_config(c)
    # hashable (graphdefs are static jit arguments); read it back with config_of
    self.config = tuple(sorted((c.to_dict() if hasattr(c, "to_dict") else dict(c)).items()))
    self.dtype = DTYPES[c.dtype]
    self.embed = _param(rngs, (c.vocab_size, c.d_model), ("vocab", "embed"), 1.0)
    self.blocks = nnx.List([Block(c, rngs) for _ in range(c.num_layers)])
    self.final_norm = RMSNorm(c.d_model, c.get("norm_eps", 1e-6))
    self.lm_head = (
        None
        if c.tie_embeddings
        else _param(rngs, (c.d_model, c.vocab_size), ("embed", "vocab"), 1.0 / math.sqrt(c.d_model))
    )
    self.value = _param(rngs, (c.d_model, 1), ("embed", None), 1e-3) if c.value_head else None

  def __call__(
      self, tokens_BxT: Array, positions_BxT: Array, kv_mask_BxS: Array, cache=None, cache_index=0
  ) -> Output:
    x = self._tap("embed", self.embed[...][tokens_BxT].astype(self.dtype))
    a = self.blocks[0].attn
    # positions count the real tokens before a slot, so they lie in [0, S)
    sincos = rope_sincos(
        positions_BxT,
        a.head_dim,
        a.theta,
        rope_inv_freq(a.head_dim, a.theta, a.rope_scaling),
        num_positions=kv_mask_BxS.shape[1],
    )
    new_cache = []
    for i, block in enumerate(self.blocks):
      x, lc = block(x, sincos, kv_mask_BxS, None if cache is None else cache[i], cache_index)
      new_cache.append(lc)
    h = self.final_norm(x)
    if self.lm_head is None:  # tied: the embedding table is the head
      logits = self._tap("embed_head", dense(h, self.embed[...].T.astype(self.dtype)), h)
    else:
      logits = self._tap("lm_head", dense(h, self.lm_head[...].astype(self.dtype)), h)
    logits = logits.astype(jnp.float32)
    values = None
    if self.value is not None:
      h32 = h.astype(jnp.float32)
      values = self._tap("value", dense(h32, self.value[...]), h32)[..., 0]
    return Output(logits, values, None if cache is None else tuple(new_cache))


def init_cache(c, batch: int, slots: int) -> tuple:
  """Zeroed KV cache: one LayerCache of shape [batch, kv_heads, slots, head_dim]."""
  dh = head_dim_of(c)
  shape = (batch, c.num_kv_heads, slots, dh)
  dt = DTYPES[c.dtype]
  return tuple(LayerCache(jnp.zeros(shape, dt), jnp.zeros(shape, dt)) for _ in range(c.num_layers))


def build(c: ml_collections.ConfigDict, seed: int = 0):
  """Build the model; returns (graphdef, params). Parameters are float32."""
  with nnx.use_eager_sharding(False):
    model = Transformer(c, nnx.Rngs(params=seed))
  return nnx.split(model, nnx.Param)


def apply(
    graphdef, params, tokens_BxT, positions_BxT, kv_mask_BxS, cache=None, cache_index=0
) -> Output:
  """Pure functional forward: merge (trace-time only) and call."""
  return nnx.merge(graphdef, params)(tokens_BxT, positions_BxT, kv_mask_BxS, cache, cache_index)


def config_of(graphdef, params) -> ml_collections.ConfigDict:
  """The model config a (graphdef, params) pair was built from."""
  return ml_collections.ConfigDict(dict(nnx.merge(graphdef, params).config))


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))


def logical_axes(params):
  """Pytree of logical axis-name tuples, one per parameter (for sharding)."""
  return jax.tree.map(
      lambda v: v.get_metadata().get("out_sharding"),
      params,
      is_leaf=lambda v: isinstance(v, nnx.Variable),
  )
