"""Hugging Face checkpoints in and out: Qwen2 / Qwen2.5, Qwen3, Llama family.

    graphdef, params, model_config, tok = hf.load("Qwen2.5-0.5B", mesh=mesh)
    hf.export(graphdef, params, model_config, "out/", source_dir="Qwen2.5-0.5B")

A checkpoint is a directory with ``config.json`` and ``*.safetensors``
(``model.safetensors``, or shards listed by ``model.safetensors.index.json``),
optionally ``tokenizer.json`` (+ ``tokenizer_config.json``).

Choices made here:

* Architectures: ``config.json``'s ``architectures`` (or, when absent, its
  ``model_type``) must name one of ``SUPPORTED``; anything else is an error
  naming it and the supported ones. Features our decoder lacks are errors
  naming the config field: sliding-window attention, an activation other
  than SiLU, an o_proj / MLP bias, RoPE scaling types other than "linear"
  and "llama3".
* Config: ``rope_theta`` / ``rope_scaling`` are read from the legacy
  top-level keys or from transformers >= 5's ``rope_parameters``;
  ``max_position_embeddings`` becomes ``max_len`` unless ``max_len`` is given;
  ``tie_word_embeddings`` defaults to False (the default of all three HF
  config classes). Qwen2 always has q/k/v biases; Qwen3 always has q/k norms.
* Layouts: a HF Linear weight is [out, in]; ours is [in, out] with heads split
  out: q_proj [h*dh, d] -> wq [d, h, dh]; k/v_proj [kv*dh, d] -> wk/wv
  [d, kv, dh]; o_proj [d, h*dh] -> wo [h, dh, d]; gate/up_proj [f, d] ->
  w_gate/w_up [d, f]; down_proj [d, f] -> w_down [f, d]; embed_tokens [V, d]
  -> embed [V, d]; lm_head [V, d] -> lm_head [d, V]; q/k/v biases [n*dh] ->
  [n, dh]; norm weights as they are. HF's ``rotate_half`` RoPE pairs
  dimension i with i + dh/2, the split-halves form ``model.rope`` uses, so no
  permutation of q/k rows is needed (tests/test_hf.py checks logits parity).
* Every checkpoint tensor must be used, and every parameter found: an extra
  or missing tensor is an error naming it (``rotary_emb.inv_freq`` buffers
  are skipped, and so is ``lm_head.weight`` when the embeddings are tied). A
  tensor of the wrong shape is an error naming it with both shapes (HF
  layout).
* Streaming: tensors are read one at a time with ``safe_open``, converted to
  the target dtype on the host and placed on their device(s) before the next
  is read, so host memory peaks at about one tensor (twice, during the
  layout change), never the whole model. With a mesh each parameter goes
  straight onto its ``sharding.param_shardings`` sharding via
  ``jax.make_array_from_callback`` (each process transfers only its own
  shards; every process reads each full tensor once).
* Dtypes: ``dtype`` is the stored parameter dtype (float32 | bfloat16,
  ``model_config.param_dtype``); ``compute_dtype`` (default: ``dtype``)
  becomes ``model_config.dtype``.
* Runs (``config.hf_checkpoint``, train.prepare / start_run):
  ``run_model_config`` compares every architecture field of the run's
  ``config.model`` with ``config.json`` and names each disagreement with both
  values; the run then loads with its own dtypes and ``max_len``.
* Multi-process: every process reads each tensor and builds only its own
  shards; ``export`` gathers each tensor to every process and process 0
  writes.
* Tokenizer: ``tokenizer.json`` is wrapped in ``tasks.tokenizer.HFTokenizer``.
  Special tokens come from ``tokenizer_config.json`` (``eos_token``,
  ``pad_token``, ``bos_token``), falling back to ``config.json``'s
  ``eos_token_id`` / ``bos_token_id``; no pad -> the EOS token; no BOS (Qwen)
  -> the pad token. A tokenizer with more ids than the model's
  ``vocab_size`` is an error naming both; fewer is normal (padded vocab).
* Export writes ``config.json`` + one ``model.safetensors`` (HF layout,
  metadata format "pt" so transformers loads it) atomically: files are
  written into a temporary directory and renamed into place, weights first
  and ``config.json`` last, so a failed or killed export leaves no
  ``config.json`` (nothing ``load`` or transformers would take for a
  complete checkpoint). The value head (PPO critic) has no HF counterpart
  and is not written. The architecture is inferred: qk_norm -> Qwen3,
  qkv_bias -> Qwen2, neither -> Llama.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile

import jax
import ml_collections
import numpy as np
from flax import nnx
from jax.tree_util import DictKey

from cbs_jax import model as model_lib
from cbs_jax import sharding

SUPPORTED = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3", "LlamaForCausalLM": "llama"}
_MODEL_TYPES = {v: k for k, v in SUPPORTED.items()}
_DTYPES = {"float32": np.float32, "bfloat16": jax.numpy.bfloat16}
# safetensors dtype names <-> numpy
_ST_DTYPES = {"F32": np.float32, "BF16": jax.numpy.bfloat16, "F16": np.float16, "F64": np.float64}
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
)


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


def _read_json(path: str) -> dict:
  try:
    with open(path, encoding="utf-8") as f:
      out = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path} is not valid JSON ({e})") from e
  if not isinstance(out, dict):
    raise ValueError(f"{path} must hold a JSON object")
  return out


def architecture_of(hf_config: dict) -> str:
  """The supported architecture ``config.json`` names; ValueError otherwise."""
  archs = hf_config.get("architectures") or []
  if not archs and hf_config.get("model_type") in _MODEL_TYPES:
    archs = [_MODEL_TYPES[hf_config["model_type"]]]
  ok = [a for a in archs if a in SUPPORTED]
  if not ok:
    named = archs or [f"model_type={hf_config.get('model_type')!r}"]
    raise ValueError(
        f"unsupported architecture {', '.join(map(str, named))} in config.json; "
        f"supported: {', '.join(SUPPORTED)}"
    )
  return ok[0]


def _rope(hf_config: dict) -> tuple[float, str]:
  """(rope_theta, model rope_scaling string) from legacy or v5 config keys."""
  rp = hf_config.get("rope_parameters") or {}
  theta = hf_config.get("rope_theta", rp.get("rope_theta", 10_000.0))
  scaling = dict(hf_config.get("rope_scaling") or rp)
  kind = scaling.pop("rope_type", None) or scaling.pop("type", None) or "default"
  scaling.pop("type", None)
  scaling.pop("rope_theta", None)
  if kind == "default":
    return float(theta), ""
  if kind not in model_lib.ROPE_SCALING_KEYS:
    raise ValueError(
        f"config.json rope_scaling type {kind!r} is not supported; supported: "
        f"default, {', '.join(model_lib.ROPE_SCALING_KEYS)}"
    )
  keys = model_lib.ROPE_SCALING_KEYS[kind]
  missing = [k for k in keys if k not in scaling]
  if missing:
    raise ValueError(f"config.json rope_scaling type {kind!r} lacks {missing}")
  return float(theta), model_lib.format_rope_scaling(
      {"rope_type": kind, **{k: scaling[k] for k in keys}}
  )


def model_config_from_hf(
    hf_config: dict, dtype: str = "float32", max_len: int | None = None
) -> ml_collections.ConfigDict:
  """Our model config for a supported HF ``config.json`` dict (validated)."""
  arch = architecture_of(hf_config)
  kind = SUPPORTED[arch]

  def need(key):
    if key not in hf_config:
      raise ValueError(f"config.json ({arch}) lacks {key!r}")
    return hf_config[key]

  act = hf_config.get("hidden_act", "silu")
  if act != "silu":
    raise ValueError(f"config.json hidden_act={act!r} is not supported (SwiGLU needs 'silu')")
  if hf_config.get("use_sliding_window"):
    raise ValueError(
        "config.json use_sliding_window=true: sliding-window attention is not " "supported"
    )
  if hf_config.get("mlp_bias"):
    raise ValueError("config.json mlp_bias=true: MLP biases are not supported")
  if kind in ("llama", "qwen3") and hf_config.get("attention_bias"):
    raise ValueError(
        f"config.json attention_bias=true ({arch}): the o_proj bias it adds is " "not supported"
    )
  c = model_lib.default_config()
  c.vocab_size = int(need("vocab_size"))
  c.d_model = int(need("hidden_size"))
  c.num_layers = int(need("num_hidden_layers"))
  c.num_heads = int(need("num_attention_heads"))
  c.num_kv_heads = int(hf_config.get("num_key_value_heads") or c.num_heads)
  c.d_ff = int(need("intermediate_size"))
  hd = hf_config.get("head_dim")
  c.head_dim = (
      0 if not hd or (c.d_model % c.num_heads == 0 and hd == c.d_model // c.num_heads) else int(hd)
  )
  c.max_len = int(max_len or hf_config.get("max_position_embeddings") or 2048)
  c.rope_theta, c.rope_scaling = _rope(hf_config)
  c.norm_eps = float(hf_config.get("rms_norm_eps", 1e-6))
  c.qkv_bias = kind == "qwen2"
  c.qk_norm = kind == "qwen3"
  c.tie_embeddings = bool(hf_config.get("tie_word_embeddings", False))
  c.value_head = False
  c.dtype = dtype
  model_lib.validate_config(c, prefix="model_config (from config.json)")
  return c


# model config field -> the config.json key it comes from (for error messages)
_FIELD_SOURCES = {
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "head_dim": "head_dim",
    "rope_theta": "rope_theta",
    "rope_scaling": "rope_scaling",
    "norm_eps": "rms_norm_eps",
    "qkv_bias": "architectures",
    "qk_norm": "architectures",
    "tie_embeddings": "tie_word_embeddings",
}


def run_model_config(model_config, checkpoint_dir: str) -> ml_collections.ConfigDict:
  """The model config a run starting from ``checkpoint_dir`` uses: the
  architecture from its ``config.json``, ``dtype`` / ``param_dtype`` /
  ``max_len`` from ``model_config`` (the run's ``config.model``). Every
  architecture field of ``model_config`` must agree with the checkpoint:
  ValueError naming each disagreeing field with both values otherwise (and
  for ``value_head``, which no checkpoint has)."""
  checkpoint_dir = os.fspath(checkpoint_dir)
  cfg_path = os.path.join(checkpoint_dir, "config.json")
  if not os.path.isfile(cfg_path):
    raise ValueError(f"config.hf_checkpoint={checkpoint_dir!r} has no config.json")
  hf_config = _read_json(cfg_path)
  c = model_config_from_hf(hf_config, model_config.dtype, model_config.max_len)
  c.param_dtype = model_config.get("param_dtype", "float32")
  if model_config.get("value_head"):
    raise ValueError(
        f"config.model.value_head=True, but {cfg_path} has no value head "
        "(PPO's critic): use GRPO (config.rl.algo='grpo') from a checkpoint"
    )
  mine = dict(model_config.to_dict(), head_dim=model_lib.head_dim_of(model_config))
  theirs = dict(c.to_dict(), head_dim=model_lib.head_dim_of(c))
  bad = [k for k in _FIELD_SOURCES if mine.get(k) != theirs.get(k)]
  if bad:
    detail = "; ".join(
        f"config.model.{k}={mine.get(k)!r} vs checkpoint {theirs.get(k)!r} "
        f"({_FIELD_SOURCES[k]})"
        for k in bad
    )
    raise ValueError(f"config.model disagrees with {cfg_path}: {detail}")
  c.head_dim = model_config.get("head_dim", 0)  # the run's spelling (0 = derived)
  return c


def hf_config_from_model(c, dtype: str = "float32") -> dict:
  """A transformers ``config.json`` dict for our model config (see export)."""
  if c.get("qk_norm") and c.get("qkv_bias"):
    raise ValueError(
        "qk_norm=True with qkv_bias=True has no Hugging Face architecture "
        "(Qwen3's attention_bias also biases o_proj)"
    )
  arch = (
      "Qwen3ForCausalLM"
      if c.get("qk_norm")
      else "Qwen2ForCausalLM"
      if c.get("qkv_bias")
      else "LlamaForCausalLM"
  )
  scaling = model_lib.parse_rope_scaling(c.get("rope_scaling", ""))
  out = {
      "architectures": [arch],
      "model_type": SUPPORTED[arch],
      "vocab_size": c.vocab_size,
      "hidden_size": c.d_model,
      "intermediate_size": c.d_ff,
      "num_hidden_layers": c.num_layers,
      "num_attention_heads": c.num_heads,
      "num_key_value_heads": c.num_kv_heads,
      "head_dim": model_lib.head_dim_of(c),
      "hidden_act": "silu",
      "max_position_embeddings": c.max_len,
      "rms_norm_eps": c.get("norm_eps", 1e-6),
      "rope_theta": c.rope_theta,
      "rope_scaling": scaling or None,
      "tie_word_embeddings": bool(c.tie_embeddings),
      "torch_dtype": dtype,
      "attention_dropout": 0.0,
  }
  if arch == "LlamaForCausalLM":
    out.update(attention_bias=False, mlp_bias=False)
  else:
    out.update(use_sliding_window=False)
    if arch == "Qwen3ForCausalLM":
      out.update(attention_bias=False)
  return out


# ---------------------------------------------------------------------------
# Tensor name / layout map
# ---------------------------------------------------------------------------


# kind: how a HF tensor maps onto our parameter (see the module docstring)
def _to_ours(kind: str, w: np.ndarray, shape: tuple) -> np.ndarray:
  if kind == "in_heads":  # [n*dh, d] -> [d, n, dh]
    return w.T.reshape(shape)
  if kind == "out_heads":  # [d, h*dh] -> [h, dh, d]
    return w.T.reshape(shape)
  if kind == "linear":  # [out, in] -> [in, out]
    return w.T
  if kind == "bias_heads":  # [n*dh] -> [n, dh]
    return w.reshape(shape)
  return w  # copy


def _to_hf(kind: str, w: np.ndarray) -> np.ndarray:
  if kind == "in_heads":
    return w.reshape(w.shape[0], -1).T
  if kind == "out_heads":
    return w.reshape(-1, w.shape[-1]).T
  if kind == "linear":
    return w.T
  if kind == "bias_heads":
    return w.reshape(-1)
  return w


def _hf_shape(kind: str, shape: tuple) -> tuple:
  if kind == "in_heads":
    return (shape[1] * shape[2], shape[0])
  if kind == "out_heads":
    return (shape[2], shape[0] * shape[1])
  if kind == "linear":
    return (shape[1], shape[0])
  if kind == "bias_heads":
    return (shape[0] * shape[1],)
  return tuple(shape)


_LAYER = {
    ("attn", "wq"): ("self_attn.q_proj.weight", "in_heads"),
    ("attn", "wk"): ("self_attn.k_proj.weight", "in_heads"),
    ("attn", "wv"): ("self_attn.v_proj.weight", "in_heads"),
    ("attn", "wo"): ("self_attn.o_proj.weight", "out_heads"),
    ("attn", "bq"): ("self_attn.q_proj.bias", "bias_heads"),
    ("attn", "bk"): ("self_attn.k_proj.bias", "bias_heads"),
    ("attn", "bv"): ("self_attn.v_proj.bias", "bias_heads"),
    ("attn", "q_norm", "scale"): ("self_attn.q_norm.weight", "copy"),
    ("attn", "k_norm", "scale"): ("self_attn.k_norm.weight", "copy"),
    ("attn_norm", "scale"): ("input_layernorm.weight", "copy"),
    ("mlp_norm", "scale"): ("post_attention_layernorm.weight", "copy"),
    ("mlp", "w_gate"): ("mlp.gate_proj.weight", "linear"),
    ("mlp", "w_up"): ("mlp.up_proj.weight", "linear"),
    ("mlp", "w_down"): ("mlp.down_proj.weight", "linear"),
}
_TOP = {
    ("embed",): ("model.embed_tokens.weight", "copy"),
    ("final_norm", "scale"): ("model.norm.weight", "copy"),
    ("lm_head",): ("lm_head.weight", "linear"),
}


def hf_name(path: tuple) -> tuple[str, str]:
  """(HF tensor name, layout kind) of our parameter at ``path``
  (e.g. ``("blocks", 0, "attn", "wq")``); ValueError for one with no HF
  counterpart (the value head)."""
  if path and path[0] == "blocks":
    name, kind = _LAYER.get(tuple(path[2:]), (None, None))
    if name:
      return f"model.layers.{path[1]}.{name}", kind
  elif tuple(path) in _TOP:
    return _TOP[tuple(path)]
  raise ValueError(f"parameter {'/'.join(map(str, path))} has no Hugging Face counterpart")


def _abstract(c):
  """(graphdef, flat abstract params) of the model for config ``c``."""
  with nnx.use_eager_sharding(False):
    abs_model = nnx.eval_shape(lambda: model_lib.Transformer(c, nnx.Rngs(params=0)))
  graphdef, state = nnx.split(abs_model, nnx.Param)
  return graphdef, state


def _path_key(keypath) -> tuple:
  return tuple(k.key for k in keypath if isinstance(k, DictKey))


# ---------------------------------------------------------------------------
# Load
# ---------------------------------------------------------------------------


def _checkpoint_files(checkpoint_dir: str) -> list[str]:
  index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
  if os.path.isfile(index):
    weight_map = _read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
      raise ValueError(f"{index} has no weight_map")
    files = sorted(set(weight_map.values()))
    for f in files:
      if not os.path.isfile(os.path.join(checkpoint_dir, f)):
        raise ValueError(f"{index} lists {f}, which is not in {checkpoint_dir}")
    return [os.path.join(checkpoint_dir, f) for f in files]
  single = os.path.join(checkpoint_dir, "model.safetensors")
  if os.path.isfile(single):
    return [single]
  files = sorted(f for f in os.listdir(checkpoint_dir) if f.endswith(".safetensors"))
  if not files:
    raise ValueError(f"{checkpoint_dir} holds no *.safetensors file")
  return [os.path.join(checkpoint_dir, f) for f in files]


def _special_token(value) -> str | None:
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) and value else None


def load_tokenizer(checkpoint_dir: str, vocab_size: int | None = None):
  """``HFTokenizer`` for ``checkpoint_dir/tokenizer.json`` (None if absent);
  ValueError if it has more ids than ``vocab_size``."""
  path = os.path.join(checkpoint_dir, "tokenizer.json")
  if not os.path.isfile(path):
    return None
  import tokenizers  # pylint: disable=import-outside-toplevel
  from cbs_jax.tasks.tokenizer import HFTokenizer  # pylint: disable=import-outside-toplevel

  raw = tokenizers.Tokenizer.from_file(path)
  tc_path = os.path.join(checkpoint_dir, "tokenizer_config.json")
  tc = _read_json(tc_path) if os.path.isfile(tc_path) else {}
  cfg_path = os.path.join(checkpoint_dir, "config.json")
  cfg = _read_json(cfg_path) if os.path.isfile(cfg_path) else {}

  def from_id(key):
    tid = cfg.get(key)
    tid = tid[0] if isinstance(tid, list) and tid else tid
    return raw.id_to_token(tid) if isinstance(tid, int) else None

  eos = _special_token(tc.get("eos_token")) or from_id("eos_token_id")
  if eos is None:
    raise ValueError(
        f"{checkpoint_dir}: no EOS token (tokenizer_config.json has no eos_token, "
        "config.json no eos_token_id)"
    )
  pad = _special_token(tc.get("pad_token")) or from_id("pad_token_id") or eos
  bos = _special_token(tc.get("bos_token")) or from_id("bos_token_id") or pad
  tok = HFTokenizer(raw, pad_token=pad, bos_token=bos, eos_token=eos)
  if vocab_size is not None and tok.vocab_size > vocab_size:
    raise ValueError(
        f"tokenizer {path} has {tok.vocab_size} ids (added tokens included), more "
        f"than the model's vocab_size={vocab_size} (config.json): ids >= "
        f"{vocab_size} would have no embedding"
    )
  return tok


def load(
    checkpoint_dir: str,
    mesh=None,
    dtype: str = "float32",
    *,
    compute_dtype: str | None = None,
    rules: dict | None = None,
    max_len: int | None = None,
):
  """Import a Hugging Face checkpoint into the cbs_jax model.

  Args:
    checkpoint_dir: directory with config.json and *.safetensors.
    mesh: optional ``jax.sharding.Mesh``; each parameter is placed on its
      ``sharding.param_shardings(..., rules)`` sharding as it is read.
    dtype: stored parameter dtype, "float32" or "bfloat16".
    compute_dtype: the model's compute dtype (``model_config.dtype``);
      None = ``dtype``.
    rules: logical-axis rules for ``mesh`` (default ``sharding.DEFAULT_RULES``).
    max_len: ``model_config.max_len``; None = ``max_position_embeddings``.

  Returns:
    (graphdef, params, model_config, tokenizer or None).
  """
  checkpoint_dir = os.fspath(checkpoint_dir)
  if dtype not in _DTYPES:
    raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}")
  cfg_path = os.path.join(checkpoint_dir, "config.json")
  if not os.path.isfile(cfg_path):
    raise ValueError(f"{checkpoint_dir} has no config.json")
  hf_config = _read_json(cfg_path)
  c = model_config_from_hf(hf_config, compute_dtype or dtype, max_len)
  c.param_dtype = dtype
  tokenizer = load_tokenizer(checkpoint_dir, c.vocab_size)
  graphdef, abstract = _abstract(c)
  shardings = {}
  if mesh is not None:
    shardings = {
        _path_key(p): s
        for p, s in jax.tree_util.tree_leaves_with_path(
            sharding.param_shardings(abstract, mesh, rules)
        )
    }
  target = _DTYPES[dtype]

  from safetensors import safe_open  # pylint: disable=import-outside-toplevel

  with contextlib.ExitStack() as stack:
    where = {}  # tensor name -> open file
    for path in _checkpoint_files(checkpoint_dir):
      f = stack.enter_context(safe_open(path, framework="np"))
      for name in f.keys():
        if name in where:
          raise ValueError(f"checkpoint tensor {name} is in two files of {checkpoint_dir}")
        where[name] = f
    used = set()
    flat = []
    for path, var in nnx.to_flat_state(abstract):
      shape = tuple(var.get_value().shape)
      name, kind = hf_name(path)
      want = _hf_shape(kind, shape)
      if name not in where:
        raise ValueError(
            f"checkpoint {checkpoint_dir} lacks tensor {name} " f"(config expects shape {want})"
        )
      w = where[name].get_tensor(name)
      if tuple(w.shape) != want:
        raise ValueError(
            f"checkpoint tensor {name} has shape {tuple(w.shape)}, config " f"expects {want}"
        )
      used.add(name)
      w = np.ascontiguousarray(_to_ours(kind, w, shape), dtype=target)
      sh = shardings.get(tuple(path))
      if sh is None:
        value = jax.device_put(w)
      else:  # each process builds only its addressable shards
        value = jax.make_array_from_callback(shape, sh, lambda idx, w=w: w[idx])
      del w  # host copy released before the next tensor is read
      flat.append((path, var.replace(value)))
    extra = [
        n
        for n in where
        if n not in used
        and not n.endswith(_IGNORED_SUFFIXES)
        and not (c.tie_embeddings and n == "lm_head.weight")
    ]
    if extra:
      raise ValueError(
          f"checkpoint tensor(s) {', '.join(sorted(extra)[:5])}"
          f"{' ...' if len(extra) > 5 else ''} are not used by the cbs_jax "
          f"model built from config.json ({architecture_of(hf_config)})"
      )
  return graphdef, nnx.from_flat_state(flat), c, tokenizer


# ---------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------


def _st_dtype(dt) -> str:
  for k, v in _ST_DTYPES.items():
    if np.dtype(v) == np.dtype(dt):
      return k
  raise ValueError(
      f"dtype {dt} cannot be written to safetensors here " f"(supported: {sorted(_ST_DTYPES)})"
  )


def _host(x) -> np.ndarray:
  """Full host copy of one (possibly sharded, possibly multi-process) array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(jax.device_get(x))


def _write_safetensors(path: str, tensors: list, metadata: dict | None = None) -> None:
  """Stream ``tensors`` = [(name, shape, dtype, fetch)] into one safetensors
  file: the header (offsets from shapes) first, then each tensor's bytes as
  ``fetch()`` returns them, one tensor in host memory at a time."""
  header, offset = {}, 0
  for name, shape, dt, _ in tensors:
    n = int(np.prod(shape, dtype=np.int64)) * np.dtype(dt).itemsize
    header[name] = {
        "dtype": _st_dtype(dt),
        "shape": list(shape),
        "data_offsets": [offset, offset + n],
    }
    offset += n
  if metadata:
    header["__metadata__"] = metadata
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # data starts 8-byte aligned
  with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for name, shape, dt, fetch in tensors:
      a = np.ascontiguousarray(fetch(), dtype=dt)
      if tuple(a.shape) != tuple(shape):
        raise ValueError(f"tensor {name} has shape {a.shape}, header says {tuple(shape)}")
      f.write(a.tobytes())


def export(
    graphdef,
    params,
    model_config,
    out_dir: str,
    *,
    dtype: str | None = None,
    source_dir: str | None = None,
) -> str:
  """Write ``params`` as a Hugging Face checkpoint in ``out_dir``.

  Args:
    graphdef, params: the model (``model.build`` / ``load``).
    model_config: its config (None = ``model.config_of(graphdef, params)``);
      every parameter's shape is checked against it.
    out_dir: target directory (created if missing). An existing checkpoint
      there (config.json, *.safetensors, index) is replaced.
    dtype: tensor dtype written ("float32" | "bfloat16"); None = each
      parameter's own dtype.
    source_dir: optional checkpoint directory whose tokenizer files are copied
      and whose config.json token ids (bos/eos/pad_token_id) are kept.

  Returns:
    ``out_dir``.
  """
  out_dir = os.fspath(out_dir)
  c = model_lib.config_of(graphdef, params) if model_config is None else model_config
  if dtype is not None and dtype not in _DTYPES:
    raise ValueError(f"dtype={dtype!r} is not one of {sorted(_DTYPES)}")
  _, abstract = _abstract(c)
  want = {tuple(p): tuple(v.get_value().shape) for p, v in nnx.to_flat_state(abstract)}
  have = dict(nnx.to_flat_state(params))
  tensors = []
  for path, shape in want.items():
    name, kind = hf_name(path)
    if path not in have:
      raise ValueError(
          f"params lack {'/'.join(map(str, path))} ({name}), which "
          f"model_config expects with shape {shape}"
      )
    x = have[path].get_value()
    if tuple(x.shape) != shape:
      raise ValueError(
          f"parameter {'/'.join(map(str, path))} ({name}) has shape "
          f"{tuple(x.shape)}, model_config expects {shape}"
      )
    dt = np.dtype(_DTYPES[dtype]) if dtype else np.dtype(x.dtype)
    tensors.append(
        (name, _hf_shape(kind, shape), dt, lambda x=x, kind=kind: _to_hf(kind, _host(x)))
    )
  dtypes = {np.dtype(t[2]) for t in tensors}
  dt_name = "bfloat16" if dtypes == {np.dtype(_DTYPES["bfloat16"])} else "float32"
  hf_config = hf_config_from_model(c, dt_name)
  if source_dir is not None:
    src = _read_json(os.path.join(source_dir, "config.json"))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
      if key in src:
        hf_config[key] = src[key]

  if jax.process_index() != 0:  # every process gathers; one writes
    for *_, fetch in tensors:
      fetch()
    return out_dir
  parent = os.path.dirname(os.path.abspath(out_dir))
  os.makedirs(parent, exist_ok=True)
  fresh = not os.path.exists(out_dir)
  tmp = tempfile.mkdtemp(prefix=".export-", dir=parent if fresh else out_dir)
  try:
    _write_safetensors(os.path.join(tmp, "model.safetensors"), tensors, {"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w", encoding="utf-8") as f:
      json.dump(hf_config, f, indent=2)
    if source_dir is not None:
      for name in TOKENIZER_FILES:
        if os.path.isfile(os.path.join(source_dir, name)):
          shutil.copyfile(os.path.join(source_dir, name), os.path.join(tmp, name))
    if fresh:
      os.rename(tmp, out_dir)  # one atomic step
      return out_dir
    # existing directory: drop the old marker first, weights in, config.json last
    stale = [
        n
        for n in os.listdir(out_dir)
        if n == "config.json" or n.endswith(".safetensors") or n == "model.safetensors.index.json"
    ]
    for name in sorted(stale, key=lambda n: n != "config.json"):
      os.remove(os.path.join(out_dir, name))
    for name in sorted(os.listdir(tmp), key=lambda n: n == "config.json"):
      os.replace(os.path.join(tmp, name), os.path.join(out_dir, name))
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  return out_dir
