"""Tests for cbs_jax.hf (Hugging Face checkpoint import/export).

Parity: tiny randomly initialised transformers models (Qwen2, Llama with tied
embeddings and with "linear" / "llama3" RoPE scaling, Qwen3 with a head_dim
that is not d_model / num_heads) are saved with ``save_pretrained`` and
imported; logits on random tokens (also a left-padded batch with explicit
HF position ids) and greedy continuations (ours through the KV cache, theirs
by full recomputation) are compared with the torch implementation, which is
independent of ours. All weights are re-drawn at random scales (HF
initialises biases to zero and norms to one, which would hide mapping bugs).
The parity tests skip without the ``parity`` extra; the error and roundtrip
tests need only safetensors/tokenizers.
"""

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import hf
from cbs_jax import model as model_lib
from cbs_jax import run_setup
from envs import host_devices

PARITY_SKIP = "parity extra not installed: pip install -e .[parity]"
VOCAB = 100
LOGITS_ATOL = 1e-4
# bf16 params + compute vs the float32 torch reference, max |log-prob diff| over
# every vocabulary entry at every position; measured 0.010-0.012 on these models
BF16_LOGPROB_ATOL = 0.05

_apply = jax.jit(model_lib.apply, static_argnums=0)


def _torch():
  pytest.importorskip("transformers", reason=PARITY_SKIP)
  return pytest.importorskip("torch", reason=PARITY_SKIP)


def _tokenizer_files(dirname, n_tokens):
  """A word-level tokenizer.json with ``n_tokens`` ids, Qwen-style special
  tokens (no BOS, pad = eos = <|endoftext|>)."""
  tokenizers = pytest.importorskip("tokenizers")
  vocab = {"<|endoftext|>": 0, "<unk>": 1}
  for i in range(2, n_tokens):
    vocab[f"w{i}"] = i
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  tok.save(os.path.join(dirname, "tokenizer.json"))
  with open(os.path.join(dirname, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)


FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen2_tied": ("Qwen2Config", "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "llama_tied": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"tie_word_embeddings": True, "rope_theta": 500000.0},
    ),
    "llama_linear": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ),
    # original 64 / factors 1, 4: head_dim 16 frequencies fall in all three bands
    "llama3": (
        "LlamaConfig",
        "LlamaForCausalLM",
        {
            "rope_scaling": {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        },
    ),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 32}),
}


def _hf_model(family, seed=0):
  torch = _torch()
  import transformers  # pylint: disable=import-outside-toplevel

  cfg_cls, model_cls, extra = FAMILIES[family]
  if not hasattr(transformers, model_cls):
    pytest.skip(f"installed transformers has no {model_cls}")
  cfg = getattr(transformers, cfg_cls)(
      vocab_size=VOCAB,
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      num_key_value_heads=2,
      intermediate_size=96,
      max_position_embeddings=128,
      rms_norm_eps=1e-6,
      **extra,
  )
  torch.manual_seed(seed)
  m = getattr(transformers, model_cls)(cfg).eval()
  with torch.no_grad():
    for name, p in m.named_parameters():
      if "norm" in name:
        p.copy_(1.0 + 0.2 * torch.randn_like(p))
      elif "embed" in name:
        p.normal_(0.0, 1.0)
      else:
        p.normal_(0.0, 0.5 / p.shape[-1] ** 0.5 if p.ndim == 2 else 0.3)
  return m


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
  """family -> (torch model, checkpoint dir), built lazily."""
  cache = {}

  def get(family):
    if family not in cache:
      m = _hf_model(family)
      d = str(tmp_path_factory.mktemp(family))
      m.save_pretrained(d, safe_serialization=True)
      _tokenizer_files(d, VOCAB - 10)
      cache[family] = (m, d)
    return cache[family]

  return get


def _torch_logits(m, tokens, mask=None, position_ids=None):
  torch = _torch()
  with torch.no_grad():
    kw = {}
    if mask is not None:
      kw["attention_mask"] = torch.tensor(np.asarray(mask, np.int64))
    if position_ids is not None:
      kw["position_ids"] = torch.tensor(np.asarray(position_ids, np.int64))
    return m(torch.tensor(np.asarray(tokens, np.int64)), **kw).logits.float().numpy()


def _ours(gd, params, tokens, mask=None):
  tokens = np.asarray(tokens, np.int32)
  mask = np.ones(tokens.shape, bool) if mask is None else np.asarray(mask, bool)
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0).astype(np.int32)
  return np.asarray(
      _apply(gd, params, jnp.asarray(tokens), jnp.asarray(pos), jnp.asarray(mask)).logits
  )


def _greedy_ours(gd, params, cfg, prompt, n):
  """Greedy decode through the KV cache (prefill, then one token per step)."""
  B, T = prompt.shape
  S = T + n
  cache = model_lib.init_cache(cfg, B, S)
  kv = jnp.zeros((B, S), bool).at[:, :T].set(True)
  pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
  out = _apply(gd, params, jnp.asarray(prompt, jnp.int32), pos, kv, cache, 0)
  toks = []
  for t in range(n):
    tok = jnp.argmax(out.logits[:, -1], -1).astype(jnp.int32)
    toks.append(np.asarray(tok))
    if t == n - 1:
      break
    kv = kv.at[:, T + t].set(True)
    out = _apply(gd, params, tok[:, None], jnp.full((B, 1), T + t, jnp.int32), kv, out.cache, T + t)
  return np.stack(toks, 1)


def _greedy_torch(m, prompt, n):
  seq = np.asarray(prompt)
  for _ in range(n):
    nxt = _torch_logits(m, seq)[:, -1].argmax(-1)
    seq = np.concatenate([seq, nxt[:, None]], 1)
  return seq[:, prompt.shape[1] :]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_logits_and_greedy_parity(saved, family):
  m, d = saved(family)
  gd, params, cfg, tok = hf.load(d)
  assert cfg.qkv_bias == family.startswith("qwen2")
  assert cfg.qk_norm == (family == "qwen3")
  assert cfg.tie_embeddings == family.endswith("tied")
  assert bool(cfg.rope_scaling) == (family in ("llama_linear", "llama3"))
  assert tok is not None and tok.vocab_size == VOCAB - 10
  rng = np.random.default_rng(1)
  tokens = rng.integers(0, VOCAB, (3, 40))
  diff = np.abs(_ours(gd, params, tokens) - _torch_logits(m, tokens)).max()
  print(f"{family}: max |logits diff| = {diff:.2e}")
  assert diff <= LOGITS_ATOL, diff

  # left padding: HF gets the same explicit positions; compare real tokens only
  mask = np.ones(tokens.shape, bool)
  mask[0, :7], mask[2, :19] = False, False
  pos = np.maximum(np.cumsum(mask, 1) - 1, 0)
  ours = _ours(gd, params, np.where(mask, tokens, 0), mask)
  theirs = _torch_logits(m, np.where(mask, tokens, 0), mask, pos)
  assert np.abs(ours - theirs)[mask].max() <= LOGITS_ATOL

  prompt = rng.integers(0, VOCAB, (4, 6))
  np.testing.assert_array_equal(
      _greedy_ours(gd, params, cfg, prompt, 10), _greedy_torch(m, prompt, 10)
  )


def test_rope_scaling_is_exercised(saved):
  """The scaled RoPE changes the logits here, so parity above is not vacuous."""
  _, d = saved("llama3")
  gd, params, cfg, _ = hf.load(d)
  cfg2 = model_lib.default_config()
  cfg2.update(cfg.to_dict())
  cfg2.rope_scaling = ""
  gd2, _ = hf._abstract(cfg2)  # pylint: disable=protected-access
  tokens = np.random.default_rng(2).integers(0, VOCAB, (2, 40))
  assert np.abs(_ours(gd, params, tokens) - _ours(gd2, params, tokens)).max() > 1e-2


@pytest.mark.parametrize("family", ["qwen2", "llama3", "qwen3"])
def test_bf16_logprobs_bounded(saved, family):
  m, d = saved(family)
  gd, params, cfg, _ = hf.load(d, dtype="bfloat16")
  assert cfg.dtype == "bfloat16"
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))
  tokens = np.random.default_rng(3).integers(0, VOCAB, (3, 40))
  ours = jax.nn.log_softmax(_ours(gd, params, tokens), -1)
  ref = jax.nn.log_softmax(_torch_logits(m, tokens), -1)
  diff = float(np.abs(np.asarray(ours) - np.asarray(ref)).max())
  print(f"{family}: bf16 max |log-prob diff| = {diff:.3f}")
  assert 0 < diff <= BF16_LOGPROB_ATOL, diff


@pytest.mark.parametrize("family", ["qwen2", "llama_tied", "qwen3"])
def test_export_roundtrip_and_transformers_reload(saved, tmp_path, family):
  m, d = saved(family)
  import transformers  # pylint: disable=import-outside-toplevel

  gd, params, cfg, _ = hf.load(d)
  out = hf.export(gd, params, cfg, str(tmp_path / "out"), source_dir=d)
  assert os.path.isfile(os.path.join(out, "tokenizer.json"))
  gd2, params2, cfg2, tok2 = hf.load(out)
  assert cfg2.to_dict() == cfg.to_dict()
  assert tok2 is not None
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  m2 = getattr(transformers, FAMILIES[family][1]).from_pretrained(out).eval()
  tokens = np.random.default_rng(4).integers(0, VOCAB, (2, 20))
  np.testing.assert_allclose(_torch_logits(m2, tokens), _torch_logits(m, tokens), atol=1e-5)


# ---------------------------------------------------------------------------
# Without transformers: roundtrip and errors on checkpoints we export
# ---------------------------------------------------------------------------


def _tiny(**kw):
  c = model_lib.default_config()
  c.vocab_size, c.d_model, c.d_ff, c.max_len = VOCAB, 32, 48, 64
  c.update(kw)
  return c


@pytest.mark.parametrize(
    "kw",
    [
        dict(qkv_bias=True),
        dict(qk_norm=True, head_dim=16),
        dict(tie_embeddings=True, rope_scaling="rope_type=linear,factor=2.0"),
    ],
)
def test_roundtrip_own_model(tmp_path, kw):
  c = _tiny(**kw)
  gd, params = model_lib.build(c, seed=1)
  hf.export(gd, params, None, str(tmp_path / "ck"))
  gd2, params2, c2, tok = hf.load(str(tmp_path / "ck"), max_len=c.max_len)
  assert tok is None and c2.to_dict() == c.to_dict()
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(params2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 12))
  np.testing.assert_array_equal(_ours(gd, params, tokens), _ours(gd2, params2, tokens))


def test_bf16_export_and_sharded_index(tmp_path):
  """bfloat16 tensors, and a checkpoint split over two files with an index."""
  safetensors_np = pytest.importorskip("safetensors.numpy")
  from safetensors import safe_open  # pylint: disable=import-outside-toplevel

  c = _tiny(qkv_bias=True)
  gd, params = model_lib.build(c, seed=2)
  src = str(tmp_path / "one")
  hf.export(gd, params, c, src, dtype="bfloat16")
  with safe_open(os.path.join(src, "model.safetensors"), framework="np") as f:
    tensors = {k: f.get_tensor(k) for k in f.keys()}
  assert all(t.dtype == jnp.bfloat16 for t in tensors.values())
  split = tmp_path / "split"
  split.mkdir()
  names = sorted(tensors)
  halves = {
      "model-00001-of-00002.safetensors": names[::2],
      "model-00002-of-00002.safetensors": names[1::2],
  }
  weight_map = {}
  for fname, keys in halves.items():
    safetensors_np.save_file({k: tensors[k] for k in keys}, str(split / fname))
    weight_map.update({k: fname for k in keys})
  (split / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  (split / "config.json").write_text((tmp_path / "one" / "config.json").read_text())
  _, p1, _, _ = hf.load(src, dtype="bfloat16")
  _, p2, c2, _ = hf.load(str(split), dtype="bfloat16")
  assert c2.dtype == "bfloat16"
  for a, b in zip(jax.tree.leaves(p1), jax.tree.leaves(p2)):
    assert a.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


@pytest.fixture()
def ckpt(tmp_path):
  c = _tiny(qkv_bias=True)
  gd, params = model_lib.build(c, seed=0)
  d = str(tmp_path / "ck")
  hf.export(gd, params, c, d)
  return d


def _edit_config(d, **kw):
  path = os.path.join(d, "config.json")
  cfg = json.load(open(path))
  cfg.update(kw)
  json.dump(cfg, open(path, "w"))


def test_unsupported_architecture(ckpt):
  _edit_config(ckpt, architectures=["GPT2LMHeadModel"], model_type="gpt2")
  with pytest.raises(
      ValueError,
      match=r"unsupported architecture GPT2LMHeadModel.*"
      r"Qwen2ForCausalLM, Qwen3ForCausalLM, LlamaForCausalLM",
  ):
    hf.load(ckpt)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}, "rope_scaling type 'yarn'"),
        ("use_sliding_window", True, "sliding-window"),
        ("hidden_act", "gelu", "hidden_act='gelu'"),
    ],
)
def test_unsupported_features(ckpt, field, value, needle):
  _edit_config(ckpt, **{field: value})
  with pytest.raises(ValueError, match=needle):
    hf.load(ckpt)


def test_shape_mismatch_names_tensor_and_shapes(ckpt):
  _edit_config(ckpt, intermediate_size=40)
  with pytest.raises(
      ValueError,
      match=re_escape(
          "checkpoint tensor model.layers.0.mlp.down_proj.weight has shape (32, 48), "
          "config expects (32, 40)"
      ),
  ):
    hf.load(ckpt)


def re_escape(s):
  import re  # pylint: disable=import-outside-toplevel

  return re.escape(s)


def test_missing_and_extra_tensors(ckpt, tmp_path):
  _edit_config(ckpt, architectures=["LlamaForCausalLM"], model_type="llama")
  with pytest.raises(ValueError, match=r"q_proj\.bias.* not used"):
    hf.load(ckpt)
  _edit_config(ckpt, architectures=["Qwen3ForCausalLM"], model_type="qwen3")
  with pytest.raises(ValueError, match=r"lacks tensor model\.layers\.0\.self_attn\.k_norm"):
    hf.load(ckpt)


def test_tokenizer_vocab_larger_than_model(ckpt):
  _tokenizer_files(ckpt, VOCAB + 50)
  with pytest.raises(ValueError, match=r"has 150 ids .*vocab_size=100"):
    hf.load(ckpt)
  _tokenizer_files(ckpt, VOCAB)
  tok = hf.load(ckpt)[3]
  assert tok.vocab_size == VOCAB
  assert tok.eos_id == tok.pad_id == tok.bos_id == 0  # Qwen style: no BOS -> pad


@pytest.mark.parametrize("existing", [False, True])
def test_half_written_export_leaves_nothing(tmp_path, monkeypatch, existing):
  c = _tiny()
  gd, params = model_lib.build(c, seed=0)
  out = tmp_path / "out"
  if existing:
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
  real = hf._host  # pylint: disable=protected-access
  calls = {"n": 0}

  def failing(x):  # the third tensor's bytes never arrive
    calls["n"] += 1
    if calls["n"] == 3:
      raise OSError("disk full")
    return real(x)

  monkeypatch.setattr(hf, "_host", failing)
  with pytest.raises(OSError, match="disk full"):
    hf.export(gd, params, c, str(out))
  monkeypatch.undo()
  assert calls["n"] == 3
  left = sorted(os.listdir(out)) if out.exists() else []
  assert left == (["notes.txt"] if existing else [])
  assert sorted(os.listdir(tmp_path)) == (["out"] if existing else [])
  hf.export(gd, params, c, str(out))  # and a retry succeeds
  assert {"config.json", "model.safetensors"} <= set(os.listdir(out))


def test_export_replaces_existing_checkpoint(ckpt):
  c = _tiny()
  gd, params = model_lib.build(c, seed=5)
  with open(os.path.join(ckpt, "model.safetensors.index.json"), "w") as f:
    json.dump({"weight_map": {"x": "model-00001-of-00002.safetensors"}}, f)
  hf.export(gd, params, c, ckpt)
  _, p2, c2, _ = hf.load(ckpt, max_len=c.max_len)
  assert c2.to_dict() == c.to_dict()
  for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(p2)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_export_checks_shapes_against_config():
  c = _tiny()
  gd, params = model_lib.build(c, seed=0)
  with pytest.raises(
      ValueError,
      match=r"parameter blocks/0/mlp/w_down .*has shape "
      r"\(48, 32\), model_config expects \(64, 32\)",
  ):
    hf.export(gd, params, _tiny(d_ff=64), "/nonexistent/never")


@pytest.mark.slow
def test_sharded_load_on_mesh(tmp_path):
  """8 CPU devices, (data 2, fsdp 2, tensor 2) mesh: every parameter lands on its
  param_shardings sharding with the single-device values."""
  c = _tiny(qkv_bias=True, num_heads=4, num_kv_heads=2)
  gd, params = model_lib.build(c, seed=3)
  d = str(tmp_path / "ck")
  hf.export(gd, params, c, d)
  np.savez(str(tmp_path / "ref.npz"), *[np.asarray(x) for x in jax.tree.leaves(params)])
  script = textwrap.dedent(f"""
      import numpy as np, jax
      from cbs_jax import hf, sharding
      mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)
      gd, params, c, _ = hf.load({d!r}, mesh=mesh)
      want = jax.tree.leaves(sharding.param_shardings(params, mesh))
      ref = np.load({str(tmp_path / "ref.npz")!r})
      leaves = jax.tree.leaves(params)
      assert len(leaves) == len(want) == len(ref.files)
      n_split = 0
      for i, (x, s) in enumerate(zip(leaves, want)):
        assert x.sharding.is_equivalent_to(s, x.ndim), (i, x.sharding, s)
        n_split += any(a is not None for a in s.spec)
        np.testing.assert_array_equal(np.asarray(x), ref[f"arr_{{i}}"])
      assert n_split > 0
      print("OK", n_split)
  """)
  env = host_devices(8)
  r = subprocess.run(
      [sys.executable, "-c", script],
      env=env,
      capture_output=True,
      text=True,
      timeout=300,
      check=False,
  )
  assert r.returncode == 0 and "OK" in r.stdout, r.stdout + r.stderr


# Qwen2.5-0.5B's config.json (public values), for the pod config's model shape
QWEN25_05B = {
    "architectures": ["Qwen2ForCausalLM"],
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151643,
    "hidden_act": "silu",
    "hidden_size": 896,
    "initializer_range": 0.02,
    "intermediate_size": 4864,
    "max_position_embeddings": 32768,
    "max_window_layers": 24,
    "model_type": "qwen2",
    "num_attention_heads": 14,
    "num_hidden_layers": 24,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0,
    "sliding_window": 32768,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}


@pytest.mark.parametrize("arg", [None, "smoke"])
def test_gsm8k_qwen_config_builds_and_validates(arg):
  from cbs_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import tasks  # pylint: disable=import-outside-toplevel
  from configs import gsm8k_qwen  # pylint: disable=import-outside-toplevel

  c = gsm8k_qwen.get_config(arg)
  config_lib.validate(c)
  if arg is None:
    want = hf.model_config_from_hf(QWEN25_05B, dtype="bfloat16", max_len=c.model.max_len)
    want.param_dtype = "bfloat16"
    assert c.model.to_dict() == want.to_dict()
    _, abstract = hf._abstract(want)  # pylint: disable=protected-access
    # Qwen2.5-0.5B's published parameter count (embeddings tied)
    assert sum(int(np.prod(x.shape)) for x in jax.tree.leaves(abstract)) == 494_032_768
  else:
    task = tasks.make_task(c.task.name, **c.task.kwargs.to_dict())
    assert task.name == "gsm8k"
    gd, params = model_lib.build(c.model, seed=0)
    assert model_lib.param_count(params) > 0


@pytest.mark.parametrize(
    "extra,theta,scaling",
    [
        ({"rope_theta": 5e5, "rope_scaling": None}, 5e5, ""),
        (
            {"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 4.0}},
            5e5,
            "rope_type=linear,factor=4.0",
        ),
        (
            {
                "rope_theta": 5e5,
                "rope_scaling": {  # Llama 3.1's config.json
                    "factor": 8.0,
                    "low_freq_factor": 1.0,
                    "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192,
                    "rope_type": "llama3",
                },
            },
            5e5,
            "rope_type=llama3,factor=8.0,low_freq_factor=1.0,high_freq_factor=4.0,"
            "original_max_position_embeddings=8192.0",
        ),
        (
            {"rope_parameters": {"rope_type": "default", "rope_theta": 1e6}},
            1e6,
            "",
        ),  # transformers 5
        (
            {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
            1e4,
            "rope_type=linear,factor=2.0",
        ),
        ({}, 1e4, ""),
    ],
)
def test_rope_config_formats(extra, theta, scaling):
  cfg = dict(QWEN25_05B, architectures=["LlamaForCausalLM"], model_type="llama")
  cfg.pop("rope_theta")
  cfg.update(extra)
  c = hf.model_config_from_hf(cfg)
  assert (c.rope_theta, c.rope_scaling) == (theta, scaling)
  assert model_lib.format_rope_scaling(model_lib.parse_rope_scaling(scaling)) == scaling


@pytest.mark.parametrize(
    "text,needle",
    [
        ("rope_type=yarn,factor=2", "rope_type='yarn'"),
        ("rope_type=linear", "takes exactly the keys"),
        ("rope_type=linear,factor=0", "must be a finite number > 0"),
        ("rope_type=linear,factor", "not 'key=value'"),
    ],
)
def test_bad_rope_scaling_config(text, needle):
  c = _tiny(rope_scaling=text)
  with pytest.raises(ValueError, match=needle):
    model_lib.validate_config(c)


# ---------------------------------------------------------------------------
# The GSM8K config from a checkpoint, end to end (tiny random Qwen2)
# ---------------------------------------------------------------------------


def _bpe_tokenizer_files(dirname, texts, vocab_size):
  """A byte-level BPE tokenizer.json trained on ``texts`` (so any text
  encodes), Qwen-style special tokens: no BOS, pad = eos = <|endoftext|>."""
  tokenizers = pytest.importorskip("tokenizers")
  tok = tokenizers.Tokenizer(tokenizers.models.BPE())
  tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = tokenizers.decoders.ByteLevel()
  trainer = tokenizers.trainers.BpeTrainer(
      vocab_size=vocab_size,
      special_tokens=["<|endoftext|>"],
      initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
  )
  tok.train_from_iterator(texts, trainer)
  tok.save(os.path.join(dirname, "tokenizer.json"))
  with open(os.path.join(dirname, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "bos_token": None}, f)


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
  """The smoke config's model as a random Qwen2 checkpoint (q/k/v biases,
  tied embeddings, our exporter: parity above shows transformers reads it
  the same) with a 400-id byte-level BPE tokenizer of the example lines."""
  from cbs_jax.tasks import gsm8k  # pylint: disable=import-outside-toplevel
  from configs import gsm8k_qwen  # pylint: disable=import-outside-toplevel

  c = gsm8k_qwen.get_config("smoke")
  gd, params = model_lib.build(c.model, seed=7)
  params = jax.tree.map(  # non-zero biases, so that they matter
      lambda x: x + 0.1 * jax.random.normal(jax.random.key(1), x.shape), params
  )
  d = str(tmp_path_factory.mktemp("tiny_qwen"))
  hf.export(gd, params, c.model, d, dtype="bfloat16")
  task = gsm8k.GSM8KTask()
  _bpe_tokenizer_files(d, [p.prompt + p.solution for p in task.problems], 400)
  return d


def test_gsm8k_tokenizer_roundtrips_solutions(tiny_qwen):
  from cbs_jax.tasks import gsm8k  # pylint: disable=import-outside-toplevel

  tok = hf.load_tokenizer(tiny_qwen, 512)
  assert tok.vocab_size == 400 and tok.eos_id == tok.pad_id == tok.bos_id
  task = gsm8k.GSM8KTask()
  for p in task.problems:  # a correct completion, through the tokenizer, earns 1
    assert task.verify(p, tok.decode(tok.encode(p.solution))) == 1.0
  P, C = task.token_lengths(tok)
  assert 0 < P < task.max_prompt_len and 0 < C < task.max_completion_len


@pytest.mark.slow
def test_gsm8k_qwen_smoke_run_from_checkpoint(tiny_qwen, tmp_path):
  """configs/gsm8k_qwen.py:smoke from the checkpoint: GRPO rounds run, the
  layout is in the checkpoint tokenizer's tokens, EOS is sampleable (pad =
  eos is not suppressed), parameters stay bfloat16."""
  from cbs_jax import checkpoint as ckpt_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import train  # pylint: disable=import-outside-toplevel
  from configs import gsm8k_qwen  # pylint: disable=import-outside-toplevel

  c = gsm8k_qwen.get_config("smoke")
  c.hf_checkpoint = tiny_qwen
  setup = run_setup.prepare(c)
  tok = setup.tok
  assert setup.model.vocab_size == 512 and tok.eos_id not in setup.sampling.suppress_ids
  assert setup.layout.prompt_len == setup.task.token_lengths(tok)[0] + 1
  summary = train.train_and_evaluate(c, str(tmp_path))
  assert summary["rounds"] == 2 and summary["sft"] == {"hf_checkpoint": tiny_qwen}
  rows = metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))
  assert [r["round"] for r in rows] == [0, 1, 2]
  for r in rows[1:]:
    assert 0.0 <= r["reward_mean"] <= 1.0 and r["completion_len"] > 0
    assert np.isfinite(r["loss"]) and np.isfinite(r["noise_split/trace_intra"])
  assert "eval_pass_rate" in rows[-1]
  ck = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"))
  assert ck.read_meta()["model"]["param_dtype"] == "bfloat16"
  ck.close()


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("d_model", 32, "config.model.d_model=32 vs checkpoint 64 (hidden_size)"),
        ("qkv_bias", False, "config.model.qkv_bias=False vs checkpoint True (architectures)"),
        ("vocab_size", 1000, "config.model.vocab_size=1000 vs checkpoint 512 (vocab_size)"),
    ],
)
def test_run_config_disagreeing_with_checkpoint(tiny_qwen, field, value, needle):
  from cbs_jax import train  # pylint: disable=import-outside-toplevel
  from configs import gsm8k_qwen  # pylint: disable=import-outside-toplevel

  c = gsm8k_qwen.get_config("smoke")
  c.hf_checkpoint = tiny_qwen
  c.model[field] = value
  with pytest.raises(ValueError, match=re_escape(needle)):
    run_setup.prepare(c)
