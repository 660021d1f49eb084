"""cbs_jax's sampler against Tunix's vanilla sampler at equal model dimensions.

    pip install -e ".[peers]"                     # google-tunix, pinned
    python experiments/bench_peers.py             # B = 64, 256, 1,024
    python experiments/bench_peers.py --quick     # B = 16, one timed call (test suite)

Without Tunix installed it prints why and ``RESULT skipped=1`` and exits 0.

Models (random init, float32): the same shape on both sides, d_model 128, 4
layers, 4 query and 4 key-value heads of 32, SwiGLU 512, vocabulary 64, RoPE
theta 10,000, untied embeddings (1.07M parameters; ``model.PRESETS["1m"]``
here, ``tunix.models.llama3`` with that ``ModelConfig`` there). The weights
differ (each side's own init): only time and token counts are compared.

Workload: 8-token prompts of random ids (no padding), 48 new tokens,
temperature 1 over the full vocabulary (Tunix: ``top_p=1.0``, which draws
``jax.random.categorical``; cbs_jax: the default ``SamplingSpec``), EOS never
sampled (cbs_jax ``eos_id=None``; Tunix's EOS id is 64, outside the
vocabulary), so every sequence generates all 48 tokens on both sides:
checked from the outputs (lengths, no EOS id) every call.

Two timings per side, compile excluded (one warm-up call each), the arms
alternating call by call so that load from other processes hits both alike,
medians of ``--runs``:

* full call: what a user calls with host arrays or strings in and tokens out
  (cbs_jax ``sampling.generate``; Tunix ``Sampler.__call__`` on prompt
  strings of a one-character-per-id tokenizer, ``max_prompt_length`` = 8);
* device only: the jitted computation on device-resident inputs (cbs_jax
  ``sampling.make_sampler``'s function; Tunix's compiled prefill + decode on a
  sampling state prepared before the clock starts).

The decode roofline (``systems.generation_roofline`` with this machine's
matmul FLOP/s and read bandwidth, probed in the same run) gives each
side's fraction of it. Last line:

    RESULT sampler_vs_tunix_b<B>=<tunix / cbs_jax seconds, full call> ... decode_vs_roofline_b<B>=<cbs_jax>
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax import probes as probes_lib
from cbs_jax import sampling
from cbs_jax import scoring
from cbs_jax import systems

TUNIX_VERSION = "0.1.7"
PROMPT, NEW = 8, 48


class IdTokenizer:
  """One character per token id (chr(0x100 + id)): the prompts' ids pass
  through Tunix's string interface unchanged. No BOS; id 0 pads; EOS is
  ``eos`` (outside the vocabulary, so never sampled)."""

  def __init__(self, eos: int):
    self._eos = eos

  def encode(self, text, **kw):
    return [ord(c) - 0x100 for c in text]

  def decode(self, ids, **kw):
    return "".join(chr(0x100 + int(i)) for i in ids)

  def bos_id(self):
    return 0  # falsy: Tunix prepends no BOS

  def eos_id(self):
    return self._eos

  def pad_id(self):
    return 0


def tunix_arms(cfg, prompts: np.ndarray):
  """Tunix's sampler on the same shape: (full-call fn, device-only fn,
  tokens-of-an-output fn)."""
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from tunix.generate import sampler as tsampler  # pylint: disable=import-outside-toplevel
  from tunix.models.llama3 import model as tllama  # pylint: disable=import-outside-toplevel

  mc = tllama.ModelConfig(
      num_layers=cfg.num_layers,
      vocab_size=cfg.vocab_size,
      embed_dim=cfg.d_model,
      hidden_dim=cfg.d_ff,
      num_heads=cfg.num_heads,
      head_dim=cfg.d_model // cfg.num_heads,
      num_kv_heads=cfg.num_kv_heads,
      rope_theta=int(cfg.rope_theta),
      norm_eps=cfg.norm_eps,
  )
  transformer = tllama.Llama3(mc, rngs=nnx.Rngs(0))
  cache = tsampler.CacheConfig(
      cache_size=PROMPT + NEW,
      num_layers=cfg.num_layers,
      num_kv_heads=cfg.num_kv_heads,
      head_dim=cfg.d_model // cfg.num_heads,
  )
  tok = IdTokenizer(eos=cfg.vocab_size)
  s = tsampler.Sampler(transformer, tok, cache)
  strings = [tok.decode(row) for row in prompts]
  kw = dict(max_generation_steps=NEW, max_prompt_length=PROMPT, temperature=1.0, top_p=1.0)

  def full():
    return s(strings, seed=1, **kw)

  ids = jnp.asarray(prompts)
  graph_state = s._flattened_transformer_state  # pylint: disable=protected-access

  def fresh_state():
    st = s.init_sample_state(
        ids,
        total_sampling_steps=PROMPT + NEW,
        include_logits=False,
        forbidden_token_ids=None,
        temperature=1.0,
        top_p=1.0,
        top_k=None,
        seed=jax.random.PRNGKey(1),
        beam_size=None,
    )
    return jax.block_until_ready(st)

  def device(state):
    s.eos_ids = jnp.array([tok.eos_id()])
    st = s._compiled_prefill_fn(graph_state, state, None, echo=False)  # pylint: disable=protected-access
    return s._compiled_decode_fn(graph_state, st)  # pylint: disable=protected-access

  def tokens_of(out):
    return [np.asarray(t) for t in out.tokens]

  return full, device, fresh_state, tokens_of


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", default="64,256,1024")
  ap.add_argument("--runs", type=int, default=5, help="timed calls per arm (median)")
  ap.add_argument("--quick", action="store_true", help="B = 16, one timed call")
  args = ap.parse_args(argv)
  try:
    import tunix  # pylint: disable=import-outside-toplevel,unused-import
    from importlib import metadata  # pylint: disable=import-outside-toplevel

    version = metadata.version("google-tunix")
  except ImportError:
    print(
        f"SKIPPED: google-tunix is not installed (pip install -e '.[peers]' installs "
        f"google-tunix=={TUNIX_VERSION}); nothing to compare against."
    )
    print("RESULT skipped=1")
    return 0
  if args.quick:
    args.batches, args.runs = "16", 1
  batches = [int(b) for b in args.batches.split(",")]
  if args.runs < 1 or not batches or min(batches) < 1:
    ap.error("--runs and --batches must be positive")

  cfg = model_lib.preset_config("1m")
  cfg.max_len = PROMPT + NEW
  graphdef, params = model_lib.build(cfg, seed=0)
  spec = scoring.SamplingSpec()
  dims = systems.ModelDims.from_config(cfg)
  mm, bw = probes_lib.MatmulProbe(2048), probes_lib.BandwidthProbe(256)
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; google-tunix {version}"
      + (f" (pinned {TUNIX_VERSION})" if version != TUNIX_VERSION else "")
      + f"; {model_lib.param_count(params):,} params; prompt {PROMPT}, new {NEW}",
      flush=True,
  )
  rng = np.random.default_rng(0)
  rows = []
  for B in batches:
    prompts = rng.integers(1, cfg.vocab_size, (B, PROMPT)).astype(np.int32)
    pmask = np.ones((B, PROMPT), bool)
    key = jax.random.key(B)
    ours_jit = sampling.make_sampler(graphdef, max_new_tokens=NEW, eos_id=None, pad_id=0, spec=spec)
    d_prompts, d_mask = jnp.asarray(prompts), jnp.asarray(pmask)
    ours_full = lambda: sampling.generate(
        graphdef, params, prompts, pmask, key, max_new_tokens=NEW, eos_id=None, pad_id=0, spec=spec
    )
    ours_dev = lambda: ours_jit(params, d_prompts, d_mask, key)
    t_full, t_dev, t_state, t_tokens = tunix_arms(cfg, prompts)
    # warm-up (compiles), and the token checks on the warm-up outputs
    o = jax.block_until_ready(ours_full())
    jax.block_until_ready(ours_dev())
    ot = t_full()
    jax.block_until_ready(t_dev(t_state()))
    ours_lens = np.asarray(o.mask).sum(1)
    tun_lens = np.array([len(t) for t in t_tokens(ot)])
    if not (np.all(ours_lens == NEW) and np.all(tun_lens == NEW)):
      raise RuntimeError(
          f"B={B}: not every sequence generated {NEW} tokens (cbs_jax "
          f"{sorted(set(ours_lens.tolist()))}, Tunix {sorted(set(tun_lens.tolist()))})"
      )
    if any(np.any(t == cfg.vocab_size) for t in t_tokens(ot)):
      raise RuntimeError(f"B={B}: Tunix sampled the EOS id")
    times = {k: [] for k in ("ours_full", "ours_dev", "tunix_full", "tunix_dev", "mm", "bw")}
    for _ in range(args.runs):
      times["mm"].append(mm.probe())
      times["bw"].append(bw.probe())
      for name, fn in (("ours_full", ours_full), ("tunix_full", t_full)):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times[name].append(time.perf_counter() - t)
      t = time.perf_counter()
      jax.block_until_ready(ours_dev())
      times["ours_dev"].append(time.perf_counter() - t)
      state = t_state()  # prepared before the clock
      t = time.perf_counter()
      jax.block_until_ready(t_dev(state))
      times["tunix_dev"].append(time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in times.items()}
    acc = probes_lib.measured_accelerator(mm.flops(med["mm"]), bw.bandwidth(med["bw"]))
    roof = systems.generation_roofline(dims, acc, B, PROMPT, NEW)
    rows.append(
        dict(
            B=B,
            full=med["tunix_full"] / med["ours_full"],
            dev=med["tunix_dev"] / med["ours_dev"],
            ours_tok=B * NEW / med["ours_full"],
            tunix_tok=B * NEW / med["tunix_full"],
            ours_roof=B * NEW / med["ours_dev"] / roof["tokens_per_s"],
            tunix_roof=B * NEW / med["tunix_dev"] / roof["tokens_per_s"],
        )
    )
    r = rows[-1]
    print(
        f"  B={B}: full call cbs_jax {med['ours_full'] * 1e3:.1f} ms, Tunix "
        f"{med['tunix_full'] * 1e3:.1f} ms ({r['full']:.2f}x); device only "
        f"{med['ours_dev'] * 1e3:.1f} vs {med['tunix_dev'] * 1e3:.1f} ms ({r['dev']:.2f}x)",
        flush=True,
    )
  print()
  print(
      f"{'B':>6} {'cbs_jax tok/s':>14} {'Tunix tok/s':>12} {'full x':>7} {'device x':>9} "
      f"{'cbs_jax/roof':>13} {'Tunix/roof':>11}"
  )
  for r in rows:
    print(
        f"{r['B']:>6} {r['ours_tok']:>14,.0f} {r['tunix_tok']:>12,.0f} {r['full']:>7.2f} "
        f"{r['dev']:>9.2f} {r['ours_roof']:>13.3f} {r['tunix_roof']:>11.3f}"
    )
  print(
      "x = Tunix seconds / cbs_jax seconds (above 1: cbs_jax faster); roof: device-only tokens/s "
      "over the decode roofline of this machine"
  )
  fields = " ".join(f"sampler_vs_tunix_b{r['B']}={r['full']:.3f}" for r in rows)
  fields += " " + " ".join(f"device_vs_tunix_b{r['B']}={r['dev']:.3f}" for r in rows)
  fields += " " + " ".join(f"decode_vs_roofline_b{r['B']}={r['ours_roof']:.3f}" for r in rows)
  print(f"RESULT {fields}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
