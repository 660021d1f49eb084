"""Tests for cbs_jax.model.

Numerics are checked against independent computations: a float64 numpy
forward written from the parameter arrays (per sequence, padding stripped,
explicit loops over heads), and the model's own full teacher-forced forward
for the KV-cache path (a different code path: cache writes, slot masks,
incremental positions). Tiny models only (d_model 32, 2 layers, vocab 20).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from cbs_jax import model

from tiny import VOCAB
from tiny import tiny_config

KNOWN_AXES = {"vocab", "embed", "heads", "kv_heads", "head_dim", "mlp"}


@pytest.fixture(scope="module")
def tiny():
  cfg = tiny_config()
  gd, params = model.build(cfg, seed=0)
  return cfg, gd, params


_apply_jit = jax.jit(model.apply, static_argnums=0)


def left_padded_batch(lengths, T, seed=0, pad_id=0):
  """Random real tokens (never the pad id, so that bugs that read pads show)."""
  rng = np.random.default_rng(seed)
  toks = np.full((len(lengths), T), pad_id, np.int32)
  mask = np.zeros((len(lengths), T), bool)
  for i, n in enumerate(lengths):
    toks[i, T - n :] = rng.integers(1, VOCAB, n)
    mask[i, T - n :] = True
  return toks, mask


def positions(mask):
  """Independent of sampling.positions_from_mask: 0,1,.. from the first real token."""
  mask = np.asarray(mask)
  pos = np.zeros(mask.shape, np.int32)
  for i in range(mask.shape[0]):
    n = 0
    for t in range(mask.shape[1]):
      if mask[i, t]:
        pos[i, t] = n
        n += 1
  return pos


def full_forward(gd, params, toks, mask):
  return _apply_jit(gd, params, jnp.asarray(toks), jnp.asarray(positions(mask)), jnp.asarray(mask))


# ---------------------------------------------------------------------------
# Independent numpy forward (float64)
# ---------------------------------------------------------------------------


def _np_rmsnorm(x, scale, eps=1e-6):
  return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * scale


def _np_rope(x_TxHxD, pos_T, theta):
  """RoPE as a complex rotation of the pairs (i, i + D/2) by angle pos * theta^(-2i/D)."""
  D = x_TxHxD.shape[-1]
  half = D // 2
  inv_freq = np.array([theta ** (-2.0 * i / D) for i in range(half)])
  z = x_TxHxD[..., :half] + 1j * x_TxHxD[..., half:]
  z = z * np.exp(1j * pos_T[:, None, None] * inv_freq[None, None, :])
  return np.concatenate([z.real, z.imag], -1)


def _np_forward(cfg, pd, tokens_T):
  """Logits (and values) of ONE unpadded sequence, positions 0..T-1, float64."""
  f = lambda a: np.asarray(a, np.float64)
  T = len(tokens_T)
  H, KV = cfg.num_heads, cfg.num_kv_heads
  Dh = cfg.d_model // H
  group = H // KV
  pos = np.arange(T, dtype=np.float64)
  x = f(pd["embed"])[np.asarray(tokens_T)]
  for i in range(cfg.num_layers):
    b = pd["blocks"][i]
    a = b["attn"]
    h = _np_rmsnorm(x, f(b["attn_norm"]["scale"]))
    wq, wk, wv, wo = f(a["wq"]), f(a["wk"]), f(a["wv"]), f(a["wo"])
    q = _np_rope(np.einsum("td,dhk->thk", h, wq), pos, cfg.rope_theta)
    k = _np_rope(np.einsum("td,dhk->thk", h, wk), pos, cfg.rope_theta)
    v = np.einsum("td,dhk->thk", h, wv)
    attn_out = np.zeros((T, H, Dh))
    for head in range(H):
      kvh = head // group  # query heads [kvh*group, (kvh+1)*group) share kv head kvh
      for t in range(T):
        s = np.array([q[t, head] @ k[j, kvh] for j in range(t + 1)]) / np.sqrt(Dh)
        w = np.exp(s - s.max())
        w /= w.sum()
        attn_out[t, head] = sum(w[j] * v[j, kvh] for j in range(t + 1))
    x = x + np.einsum("thk,hkd->td", attn_out, wo)
    m = b["mlp"]
    h = _np_rmsnorm(x, f(b["mlp_norm"]["scale"]))
    g = h @ f(m["w_gate"])
    x = x + ((g / (1.0 + np.exp(-g))) * (h @ f(m["w_up"]))) @ f(m["w_down"])
  h = _np_rmsnorm(x, f(pd["final_norm"]["scale"]))
  head = f(pd["embed"]).T if cfg.tie_embeddings else f(pd["lm_head"])
  values = (h @ f(pd["value"]))[:, 0] if cfg.value_head else None
  return h @ head, values


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": True, "value_head": True}])
def test_every_param_has_logical_axes(overrides):
  cfg = tiny_config(**overrides)
  _, params = model.build(cfg, 0)
  axes = model.logical_axes(params)
  leaves = jax.tree_util.tree_leaves_with_path(nnx.to_pure_dict(params))
  axes_flat = dict(
      jax.tree_util.tree_leaves_with_path(axes, is_leaf=lambda x: isinstance(x, tuple))
  )
  assert len(leaves) == len(axes_flat) > 0
  for path, arr in leaves:
    names = axes_flat[path]
    assert isinstance(names, tuple), (path, names)
    assert len(names) == arr.ndim, (path, names, arr.shape)
    for n, size in zip(names, arr.shape):
      # None (replicated) is accepted only on a size-1 axis (the value head's output)
      assert n in KNOWN_AXES or (n is None and size == 1), (path, names)


def test_param_dtypes_and_config_roundtrip(tiny):
  cfg, gd, params = tiny
  for x in jax.tree.leaves(params):
    assert x.dtype == jnp.float32
  back = model.config_of(gd, params)
  assert back.to_dict() == cfg.to_dict()


# ---------------------------------------------------------------------------
# Independent numpy reference
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "heads,kv_heads,extra",
    [
        (4, 2, {}),  # GQA
        (4, 1, {}),  # MQA
        (4, 4, {}),  # MHA
        (2, 1, {"tie_embeddings": True, "value_head": True, "rope_theta": 100.0}),
    ],
)
def test_matches_naive_numpy_forward(heads, kv_heads, extra):
  cfg = tiny_config(num_heads=heads, num_kv_heads=kv_heads, **extra)
  gd, params = model.build(cfg, seed=3)
  pd = nnx.to_pure_dict(params)
  if cfg.value_head:  # the init scale (1e-3) is too small to see a bug in
    pd["value"] = jnp.asarray(np.random.default_rng(0).normal(size=pd["value"].shape), jnp.float32)
    nnx.replace_by_pure_dict(params, pd)
  lengths = [9, 5, 1]
  T = 11
  toks, mask = left_padded_batch(lengths, T, seed=1)
  out = full_forward(gd, params, toks, mask)
  for i, n in enumerate(lengths):
    ref_logits, ref_values = _np_forward(cfg, pd, toks[i, T - n :])
    np.testing.assert_allclose(np.asarray(out.logits[i, T - n :]), ref_logits, atol=1e-4, rtol=0)
    if cfg.value_head:
      np.testing.assert_allclose(np.asarray(out.values[i, T - n :]), ref_values, atol=1e-4, rtol=0)


# ---------------------------------------------------------------------------
# KV cache == full recompute
# ---------------------------------------------------------------------------


def _cached_logits(cfg, gd, params, toks, mask, chunks):
  """Feed the sequence through the cache path in the given chunk sizes."""
  B, T = toks.shape
  assert sum(chunks) == T
  cache = model.init_cache(cfg, B, T)
  pos = positions(mask)
  out, start = [], 0
  for size in chunks:
    end = start + size
    # the decoder only knows slots written so far: later slots are invalid
    kv_mask = np.zeros((B, T), bool)
    kv_mask[:, :end] = mask[:, :end]
    o = _apply_jit(
        gd,
        params,
        jnp.asarray(toks[:, start:end]),
        jnp.asarray(pos[:, start:end]),
        jnp.asarray(kv_mask),
        cache,
        start,
    )
    assert o.logits.shape == (B, size, cfg.vocab_size)
    cache = o.cache
    out.append(np.asarray(o.logits))
    start = end
  return np.concatenate(out, 1)


@pytest.mark.parametrize("chunks", [[1] * 10, [5, 1, 1, 1, 1, 1], [3, 4, 2, 1]])
def test_kv_cache_equals_full_recompute(tiny, chunks):
  cfg, gd, params = tiny
  lengths = [10, 6, 3]  # mixed, left-padded
  T = 10
  toks, mask = left_padded_batch(lengths, T, seed=2)
  full = np.asarray(full_forward(gd, params, toks, mask).logits)
  cached = _cached_logits(cfg, gd, params, toks, mask, chunks)
  # pad queries have no valid key: their rows are meaningless; compare real ones
  np.testing.assert_allclose(cached[mask], full[mask], atol=1e-5, rtol=0)


def test_kv_cache_larger_than_sequence(tiny):
  """A cache with more slots than used (as in generation) changes nothing."""
  cfg, gd, params = tiny
  toks, mask = left_padded_batch([7, 4], 7, seed=4)
  full = np.asarray(full_forward(gd, params, toks, mask).logits)
  B, T = toks.shape
  S = 16
  cache = model.init_cache(cfg, B, S)
  pos = positions(mask)
  kv = np.zeros((B, S), bool)
  kv[:, :4] = mask[:, :4]
  o = _apply_jit(
      gd, params, jnp.asarray(toks[:, :4]), jnp.asarray(pos[:, :4]), jnp.asarray(kv), cache, 0
  )
  got = [np.asarray(o.logits)]
  cache = o.cache
  for t in range(4, T):
    kv[:, t] = mask[:, t]
    o = _apply_jit(
        gd,
        params,
        jnp.asarray(toks[:, t : t + 1]),
        jnp.asarray(pos[:, t : t + 1]),
        jnp.asarray(kv),
        cache,
        t,
    )
    cache = o.cache
    got.append(np.asarray(o.logits))
  got = np.concatenate(got, 1)
  np.testing.assert_allclose(got[mask], full[mask], atol=1e-5, rtol=0)
  for lc in cache:
    assert lc.k.shape == (B, cfg.num_kv_heads, S, cfg.d_model // cfg.num_heads)
    np.testing.assert_array_equal(np.asarray(lc.k[:, T:]), 0.0)  # untouched slots


# ---------------------------------------------------------------------------
# Padding invariance and causality
# ---------------------------------------------------------------------------


def test_padding_does_not_change_results(tiny):
  _, gd, params = tiny
  prompt = np.array([5, 3, 17, 8, 2, 11], np.int32)
  n = len(prompt)
  ref = None
  for T in (n, n + 1, n + 4, 15):
    for pad_id in (0, 7):
      toks = np.full((1, T), pad_id, np.int32)
      toks[0, T - n :] = prompt
      mask = np.zeros((1, T), bool)
      mask[0, T - n :] = True
      lg = np.asarray(full_forward(gd, params, toks, mask).logits[0, T - n :])
      if ref is None:
        ref = lg
      np.testing.assert_allclose(lg, ref, atol=1e-5, rtol=0)


def test_padding_in_batch_with_other_sequences(tiny):
  """A sequence's logits do not depend on the other rows of the batch."""
  _, gd, params = tiny
  toks, mask = left_padded_batch([8, 3, 5], 8, seed=5)
  batch = np.asarray(full_forward(gd, params, toks, mask).logits)
  for i in range(3):
    alone = np.asarray(full_forward(gd, params, toks[i : i + 1], mask[i : i + 1]).logits)
    np.testing.assert_allclose(batch[i][mask[i]], alone[0][mask[i]], atol=1e-5, rtol=0)


def test_causality(tiny):
  _, gd, params = tiny
  toks, mask = left_padded_batch([10, 7], 10, seed=6)
  base = np.asarray(full_forward(gd, params, toks, mask).logits)
  j = 6
  changed = toks.copy()
  changed[:, j] = (changed[:, j] % (VOCAB - 1)) + 1  # a different real token
  assert np.all(changed[:, j] != toks[:, j])
  new = np.asarray(full_forward(gd, params, changed, mask).logits)
  np.testing.assert_allclose(new[:, :j][mask[:, :j]], base[:, :j][mask[:, :j]], atol=1e-6, rtol=0)
  # ... and it does change the logits at and after the changed token
  assert np.all(np.abs(new[:, j:] - base[:, j:]).max(-1) > 1e-4)


def test_masked_key_is_ignored(tiny):
  """A token whose kv_mask is False is invisible to the others (e.g. after EOS)."""
  _, gd, params = tiny
  toks, mask = left_padded_batch([8], 8, seed=7)
  m2 = mask.copy()
  m2[0, 3] = False
  pos = positions(mask)  # keep the positions; only hide slot 3
  a = _apply_jit(gd, params, jnp.asarray(toks), jnp.asarray(pos), jnp.asarray(m2))
  t2 = toks.copy()
  t2[0, 3] = (t2[0, 3] % (VOCAB - 1)) + 1
  b = _apply_jit(gd, params, jnp.asarray(t2), jnp.asarray(pos), jnp.asarray(m2))
  np.testing.assert_allclose(
      np.asarray(a.logits[0, 4:]), np.asarray(b.logits[0, 4:]), atol=1e-6, rtol=0
  )


@pytest.mark.parametrize("inv_freq", [None, np.array([1.0, 0.3, 0.01, 1e-4], np.float32)])
def test_rope_table_lookup_is_the_angles_at_each_position(inv_freq):
  """The forward's RoPE angles come from a table of S rows looked up by
  position: the same bits as sin/cos evaluated at each position, both close
  to float64 numpy, and NaN (not some other row) for a position outside the
  table."""
  head_dim, theta, S = 8, 100.0, 37
  pos = np.random.default_rng(0).integers(0, S, (3, 11)).astype(np.int32)
  lookup = jax.jit(lambda p: model.rope_sincos(p, head_dim, theta, inv_freq, num_positions=S))
  direct = jax.jit(lambda p: model.rope_sincos(p, head_dim, theta, inv_freq))
  freq = theta ** (-np.arange(0, head_dim, 2) / head_dim) if inv_freq is None else inv_freq
  ang = pos[..., None].astype(np.float64) * freq  # B, T, D/2
  for got, same, want in zip(lookup(pos), direct(pos), (np.sin(ang), np.cos(ang))):
    assert got.shape == (3, 11, 1, head_dim // 2)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(same))
    np.testing.assert_allclose(np.asarray(got)[:, :, 0], want, atol=2e-6, rtol=0)
  outside = np.array([[0, S, S + 5]], np.int32)
  for got in lookup(outside):
    assert np.all(np.isfinite(np.asarray(got[0, 0]))) and np.all(np.isnan(np.asarray(got[0, 1:])))


# ---------------------------------------------------------------------------
# dtypes, heads, config validation
# ---------------------------------------------------------------------------


def test_bfloat16_compute(tiny):
  cfg, _, params32 = tiny
  cfg16 = tiny_config(dtype="bfloat16")
  gd16, params16 = model.build(cfg16, seed=0)
  for a, b in zip(jax.tree.leaves(params32), jax.tree.leaves(params16)):
    assert b.dtype == jnp.float32  # params stay float32
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))  # same seed, same init
  toks, mask = left_padded_batch([9, 4], 9, seed=8)
  lg32 = np.asarray(full_forward(tiny[1], params32, toks, mask).logits)
  out16 = full_forward(gd16, params16, toks, mask)
  assert out16.logits.dtype == jnp.float32
  lg16 = np.asarray(out16.logits)
  assert np.all(np.isfinite(lg16))
  err = np.abs(lg16 - lg32)[mask].max()
  scale = np.abs(lg32[mask]).max()
  assert err < 0.05 * scale + 0.05, (err, scale)
  assert err > 0  # it really computed in bfloat16
  cache = model.init_cache(cfg16, 2, 9)
  assert cache[0].k.dtype == jnp.bfloat16


def test_value_head_and_tied_embeddings():
  cfg = tiny_config(value_head=True)
  gd, params = model.build(cfg, 0)
  toks, mask = left_padded_batch([6, 2], 6, seed=9)
  out = full_forward(gd, params, toks, mask)
  assert out.values.shape == (2, 6) and out.values.dtype == jnp.float32
  assert out.logits.shape == (2, 6, VOCAB)

  plain = model.build(tiny_config(), 0)
  assert full_forward(*plain, toks, mask).values is None

  cfg_t = tiny_config(tie_embeddings=True)
  gd_t, params_t = model.build(cfg_t, 0)
  assert "lm_head" not in params_t
  assert "lm_head" in plain[1]
  n_plain = model.param_count(plain[1])
  assert model.param_count(params_t) == n_plain - cfg.d_model * VOCAB
  out_t = full_forward(gd_t, params_t, toks, mask)
  assert out_t.logits.shape == (2, 6, VOCAB)
  assert np.all(np.isfinite(np.asarray(out_t.logits)))


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("num_heads", 5, "num_heads"),  # 5 does not divide 32
        ("num_kv_heads", 3, "num_kv_heads"),  # 3 does not divide 4
        ("num_kv_heads", 8, "num_kv_heads"),  # more kv heads than heads
        ("d_model", 12, "num_heads"),  # head dim 3: odd, RoPE needs even
        ("dtype", "float16", "dtype"),
        ("dtype", "bf16", "dtype"),
        ("vocab_size", 0, "vocab_size"),
        ("d_model", -32, "d_model"),
        ("num_layers", 0, "num_layers"),
        ("num_heads", 0, "num_heads"),
        ("num_kv_heads", 0, "num_kv_heads"),
        ("d_ff", 0, "d_ff"),
        ("max_len", -1, "max_len"),
        ("rope_theta", 0.0, "rope_theta"),
    ],
)
def test_bad_config_raises_naming_field(field, value, needle):
  cfg = tiny_config()
  cfg[field] = value
  with pytest.raises(ValueError, match=needle):
    model.validate_config(cfg)
  with pytest.raises(ValueError, match=needle):
    model.build(cfg, 0)


def test_good_configs_validate():
  model.validate_config(model.default_config())
  model.validate_config(tiny_config())
  model.validate_config(tiny_config(num_heads=8, num_kv_heads=1, d_model=32))


@pytest.mark.parametrize("branch", ["cpu", "accelerator"])
@pytest.mark.parametrize("lead,din,dout", [((3, 5), 4, 7), ((3, 5), 9, 2), ((6, 1), 8, 3)])
def test_dense_gradient_matches_autodiff_and_finite_differences(
    lead, din, dout, branch, monkeypatch
):
  """``model.dense``'s custom backward against jax's own transpose rule of
  ``x @ w`` and central differences, in both of its platform branches: the
  CPU's (the narrower operand transposed behind an optimisation barrier) and
  the one every other platform takes, forced here on the CPU by handing the
  CPU the accelerator's weight-gradient rule. The traced backward shows which
  branch ran (the barrier is the CPU rule's alone)."""
  if branch == "accelerator":
    monkeypatch.setattr(model, "_dw_cpu", model._dw_default)  # pylint: disable=protected-access
  probe = jax.make_jaxpr(jax.grad(lambda w_: jnp.sum(model.dense(jnp.ones((3, din)), w_))))
  assert ("optimization_barrier" in str(probe(jnp.ones((din, dout))))) == (branch == "cpu")
  rng = np.random.default_rng(din)
  x = jnp.asarray(rng.normal(size=(*lead, din)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(din, dout)), jnp.float32)
  c = jnp.asarray(rng.normal(size=(*lead, dout)), jnp.float32)
  f_custom = lambda x, w: jnp.sum(jnp.sin(model.dense(x, w)) * c)
  f_plain = lambda x, w: jnp.sum(jnp.sin(x @ w) * c)
  assert float(f_custom(x, w)) == pytest.approx(float(f_plain(x, w)), rel=1e-6)
  gx, gw = jax.jit(jax.grad(f_custom, argnums=(0, 1)))(x, w)
  px, pw = jax.grad(f_plain, argnums=(0, 1))(x, w)
  np.testing.assert_allclose(gx, px, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(gw, pw, rtol=1e-5, atol=1e-5)
  x64, w64, c64 = (np.asarray(a, np.float64) for a in (x, w, c))
  f64 = lambda w_: np.sum(np.sin(x64 @ w_) * c64)
  eps = 1e-6
  for i, j in [(0, 0), (din - 1, dout - 1), (din // 2, dout // 2)]:
    e = np.zeros_like(w64)
    e[i, j] = eps
    fd = (f64(w64 + e) - f64(w64 - e)) / (2 * eps)
    assert float(gw[i, j]) == pytest.approx(fd, rel=1e-4, abs=1e-4)
  # vmapped per-example gradients (gradstats' path) go through the same rule
  per = jax.vmap(
      jax.grad(lambda w_, xi, ci: jnp.sum(jnp.sin(model.dense(xi, w_)) * ci)), in_axes=(None, 0, 0)
  )(w, x, c)
  np.testing.assert_allclose(per.sum(0), pw, rtol=1e-5, atol=1e-5)
  # bfloat16 compute: the gradient keeps the operand dtypes
  gxb, gwb = jax.grad(lambda x, w: jnp.sum(model.dense(x, w).astype(jnp.float32)), argnums=(0, 1))(
      x.astype(jnp.bfloat16), w.astype(jnp.bfloat16)
  )
  assert gxb.dtype == gwb.dtype == jnp.bfloat16
