"""Sampler throughput against its roofline and against a full-recompute sampler.

Command (from the repository root):

    python experiments/bench_sampler.py            # batches 64, 256, 1024
    python experiments/bench_sampler.py --quick    # batches 16, 64, one run each

Model (``--model``, a ``model.PRESETS`` shape; default ``1m``): d_model 128,
4 layers, 4 heads (head_dim 32, no GQA), SwiGLU 512, vocab 64, float32
(1.07M parameters), random init (seed 0); ``--dtype=bfloat16`` computes in
bfloat16 with bfloat16 weights. Prompts: 8
random tokens (no padding); 48 new tokens per sequence, temperature 1,
``eos_id=None`` (no early stop), so every sequence runs all 48 steps and
tokens/s = batch x 48 / wall time of one call, prefill included.

Arms, all compiled ahead of time (``jit(...).lower(...).compile()``, compile
excluded) and timed round-robin with the roofline probes (one call of each
per run, so that load from other processes hits them alike), medians of
``--runs``:

* cached: ``sampling.make_sampler`` (the jitted entry point, no host work per
  call): prefill, then decode in KV-cache length buckets;
* generate: ``sampling.generate`` (argument checks + the cached sampler) at
  the smallest batch, to show the host work per call;
* naive: one jitted ``lax.fori_loop`` that recomputes the full forward
  (cache=None) over the fixed [prompt + 48] buffer every step and samples
  with the same ``process_logits`` / ``sample_tokens`` and key schedule, so
  both draw the same tokens up to float rounding (the fraction of identical
  tokens is printed). ``--naive_runs`` timed calls (it is slow).

Roofline (``systems.generation_roofline``): FLOPs per generated token
(2 x active params + attention, prefill included) and bytes per step
(weights once per step + the KV cache actually attended, Tp + t + 1
positions at step t), against a float32 2048^2 matmul's FLOP/s and a 256 MiB
read's bytes/s, both measured in this run (``probes.MatmulProbe``,
``probes.BandwidthProbe``, medians). ``decode_vs_roofline`` = achieved
tokens/s / the roofline's tokens/s. The roofline lets compute and memory
traffic overlap (each step takes the longer of the two); column ``serial``
is the fraction of it that a machine reaches if it runs the ops one after
another, each at the probes' rate -- the call's FLOPs at the matmul's FLOP/s
plus its bytes at the read's bytes/s (XLA's CPU runtime runs a step's
compute-bound matmuls and memory-bound attention in turn). The last line is

    RESULT tokens_per_s=<cached, batch 1024> speedup_vs_recompute=<at batch 1024> decode_vs_roofline=<at batch 1024>

followed, with ``--xla_option``, by ``option_speedup_b<B>=<x>`` for every batch,
and for batches 64 and 1,024 (the goals: at least 0.3 and 0.5 of the roofline)
by ``decode_lo_b<B>``, ``decode_hi_b<B>`` and ``decode_goal_b<B>``: each run's
call against the roofline of that run's probes, the median over runs with a
90% bootstrap interval and its verdict, met, not met or unresolved
(``stats.paired_ratio``, ``stats.goal_verdict``; at least 5 runs for an
interval).

``--xla_option NAME=VALUE`` (repeatable) adds an arm per batch: the cached
sampler compiled with those XLA compiler options (e.g.
``xla_cpu_experimental_ynn_fusion_type=``: no YNNPACK library fusions on a
CPU), timed in the same runs, and prints its speed-up over the default
compile and the fraction of the roofline it reaches.

``--profile`` traces two more calls of the cached sampler at the largest
batch and prints where their time went, by kind of XLA op
(``cbs_jax.op_profile``): which ops keep decode from its roofline.
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax import op_profile
from cbs_jax import probes as probes_lib
from cbs_jax import sampling
from cbs_jax import scoring
from cbs_jax import stats
from cbs_jax import systems

PAD_ID = 0
LEVEL = 0.9  # the goals' intervals
GOALS = {64: 0.3, 1024: 0.5}  # batch: least fraction of the decode roofline


def bench_config(preset: str = "1m", dtype: str = "float32"):
  c = model_lib.preset_config(preset)
  c.dtype = dtype
  return c


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens"))
def naive_generate(graphdef, params, prompt, prompt_mask, key, *, max_new_tokens):
  """Sample by recomputing the whole forward each step (no KV cache, no EOS),
  with the cached sampler's key schedule and token sampler."""
  B, Tp = prompt.shape
  T = Tp + max_new_tokens
  buf = jnp.zeros((B, T), jnp.int32).at[:, :Tp].set(prompt)
  mask = jnp.zeros((B, T), bool).at[:, :Tp].set(prompt_mask)
  lps = jnp.zeros((B, max_new_tokens), jnp.float32)

  def body(t, carry):
    buf, mask, lps, key = carry
    key, sub = jax.random.split(key)
    out = model_lib.apply(graphdef, params, buf, scoring.positions_from_mask(mask), mask)
    logits = jax.lax.dynamic_index_in_dim(out.logits, Tp + t - 1, 1, keepdims=False)
    logp_all = scoring.process_logits(logits, scoring.SamplingSpec())
    tok = sampling.sample_tokens(sub, logp_all)
    lp = jnp.take_along_axis(logp_all, tok[:, None], -1)
    buf = jax.lax.dynamic_update_slice(buf, tok[:, None], (0, Tp + t))
    mask = jax.lax.dynamic_update_slice(mask, jnp.ones((B, 1), bool), (0, Tp + t))
    lps = jax.lax.dynamic_update_slice(lps, lp, (0, t))
    return buf, mask, lps, key

  buf, mask, lps, _ = jax.lax.fori_loop(0, max_new_tokens, body, (buf, mask, lps, key))
  return buf[:, Tp:], lps


def timed(fn):
  t = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - t, out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", default="64,256,1024", help="comma-separated batch sizes")
  ap.add_argument("--new_tokens", type=int, default=48)
  ap.add_argument("--prompt_len", type=int, default=8)
  ap.add_argument("--runs", type=int, default=5, help="timed calls per arm (median)")
  ap.add_argument(
      "--naive_runs",
      type=int,
      default=1,
      help="timed calls of the full-recompute sampler per batch",
  )
  ap.add_argument(
      "--model", default="1m", choices=sorted(model_lib.PRESETS), help="model shape (random init)"
  )
  ap.add_argument(
      "--dtype",
      default="float32",
      choices=sorted(model_lib.DTYPES),
      help="compute dtype of the model and of the matmul probe",
  )
  ap.add_argument(
      "--xla_option",
      action="append",
      default=[],
      metavar="NAME=VALUE",
      help="also time the cached sampler compiled with this XLA compiler option (repeatable), "
      "in the same runs, e.g. xla_cpu_experimental_ynn_fusion_type= (no YNNPACK library "
      "fusions on a CPU)",
  )
  ap.add_argument(
      "--profile",
      action="store_true",
      help="also trace 2 calls at the largest batch and print their time by XLA op kind",
  )
  ap.add_argument("--quick", action="store_true", help="batches 16,64, one run each")
  args = ap.parse_args(argv)
  if args.quick:
    args.batches, args.runs, args.naive_runs = "16,64", 1, 1
  batches = [int(b) for b in args.batches.split(",")]
  if not batches or min(batches) <= 0 or min(args.runs, args.naive_runs) <= 0:
    ap.error("--batches, --runs and --naive_runs must be positive")
  n_new, Tp = args.new_tokens, args.prompt_len
  bad = [o for o in args.xla_option if "=" not in o]
  if bad:
    ap.error(f"--xla_option {bad[0]!r}: expected NAME=VALUE")
  options = dict(o.split("=", 1) for o in args.xla_option)

  cfg = bench_config(args.model, args.dtype)
  cfg.max_len = Tp + n_new
  graphdef, params = model_lib.build(cfg, seed=0)
  if args.dtype != "float32":  # weights stored in the compute dtype too, as served
    cfg.param_dtype = args.dtype
    params = jax.tree.map(lambda x: x.astype(model_lib.DTYPES[args.dtype]), params)
  dims = systems.ModelDims.from_config(cfg)
  print(
      f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} "
      f"device(s)), {jax.devices()[0].device_kind}; model {args.model}, {args.dtype}; params {model_lib.param_count(params):,} (active {dims.active_params:,}); "
      f"d_model {cfg.d_model}, layers {cfg.num_layers}, heads {cfg.num_heads}/"
      f"{cfg.num_kv_heads} kv, vocab {cfg.vocab_size}; prompt {Tp}, new tokens {n_new}; "
      f"decode buckets {sampling.segment_bounds(n_new)}"
      + (f"; also compiled with XLA options {options}" if options else ""),
      flush=True,
  )

  rng = np.random.default_rng(0)
  arms, data = {}, {}
  for B in batches:
    prompts = jnp.asarray(rng.integers(1, cfg.vocab_size, (B, Tp)), jnp.int32)
    pmask = jnp.ones((B, Tp), bool)
    key = jax.random.key(B)
    sampler = sampling.make_sampler(
        graphdef, max_new_tokens=n_new, eos_id=None, pad_id=PAD_ID, spec=scoring.SamplingSpec()
    )
    lowered = sampler.lower(params, prompts, pmask, key)
    cached = lowered.compile()
    naive = naive_generate.lower(
        graphdef, params, prompts, pmask, key, max_new_tokens=n_new
    ).compile()
    arms[f"cached {B}"] = functools.partial(cached, params, prompts, pmask, key)
    arms[f"naive {B}"] = functools.partial(naive, params, prompts, pmask, key)
    if options:
      arms[f"option {B}"] = functools.partial(lowered.compile(options), params, prompts, pmask, key)
    data[B] = (prompts, pmask, key)
  B0 = batches[0]
  host_kw = dict(max_new_tokens=n_new, eos_id=None, pad_id=PAD_ID, spec=scoring.SamplingSpec())
  np_prompts, np_mask = np.asarray(data[B0][0]), np.asarray(data[B0][1])
  arms[f"generate {B0}"] = lambda: sampling.generate(
      graphdef, params, np_prompts, np_mask, data[B0][2], **host_kw
  )
  jax.block_until_ready(arms[f"generate {B0}"]())  # compiles nothing new; warms the cache
  on_cpu = jax.devices()[0].platform == "cpu"
  mm_n = 2048 if on_cpu else 8192
  mm, bw = probes_lib.MatmulProbe(mm_n, args.dtype), probes_lib.BandwidthProbe(
      256 if on_cpu else 2048
  )
  probes = {"matmul": mm.probe, "bandwidth": bw.probe}

  times = {k: [] for k in list(arms) + list(probes)}
  outs = {}
  for r in range(args.runs):
    for name, fn in probes.items():
      times[name].append(fn())
    for name, fn in arms.items():
      if name.startswith("naive") and r >= args.naive_runs:
        continue
      dt, outs[name] = timed(fn)
      times[name].append(dt)
    print(
        f"  run {r + 1}/{args.runs}: "
        + ", ".join(f"{k} {times[k][-1] * 1e3:.0f} ms" for k in arms if k.startswith("cached")),
        flush=True,
    )
  med = {k: float(np.median(v)) for k, v in times.items()}
  flops, band = mm.flops(med["matmul"]), bw.bandwidth(med["bandwidth"])
  acc = probes_lib.measured_accelerator(flops, band, source="bench_sampler probes")
  print(
      f"measured: {flops / 1e9:.1f} GFLOP/s ({args.dtype} {mm_n}^2 matmul), {band / 1e9:.2f} "
      f"GB/s ({bw.nbytes >> 20} MiB read), ridge {flops / band:.1f} FLOP/byte; medians of {args.runs}"
  )

  # bytes per weight as stored (read every step), per KV entry in the compute dtype
  w_bytes = systems.DTYPE_BYTES[cfg.param_dtype]
  kv_bytes = systems.DTYPE_BYTES[cfg.dtype]
  rows = []
  for B in batches:
    out = outs[f"cached {B}"]
    if int(np.asarray(out.mask).sum()) != B * n_new:
      raise RuntimeError(
          f"cached sampler: {int(np.asarray(out.mask).sum())} valid tokens, "
          f"expected {B * n_new}"
      )
    naive_tokens, naive_lps = outs[f"naive {B}"]
    same = np.asarray(naive_tokens) == np.asarray(out.tokens)
    prefix = np.cumprod(same, 1) > 0  # rows diverge after their first differing token
    lp_diff = float(np.abs(np.asarray(naive_lps) - np.asarray(out.logprobs))[prefix].max())
    roof = systems.generation_roofline(
        dims, acc, B, Tp, n_new, weight_bytes=w_bytes, kv_bytes=kv_bytes
    )
    tok_c, tok_n = B * n_new / med[f"cached {B}"], B * n_new / med[f"naive {B}"]
    rows.append(
        dict(
            B=B,
            tok=tok_c,
            naive=tok_n,
            speedup=tok_c / tok_n,
            roof=roof["tokens_per_s"],
            vs_roof=tok_c / roof["tokens_per_s"],
            # ops one after another at the probes' rates: FLOPs, then bytes
            serial=roof["seconds"] / (roof["flops"] / flops + roof["bytes"] / band),
            fpt=roof["flops_per_token"],
            bps=roof["bytes_per_step"],
            bound=roof["bound"],
            ms=med[f"cached {B}"] * 1e3,
            same=float(same.mean()),
            lpd=lp_diff,
        )
    )

  print()
  print(
      f"{'batch':>6} {'tok/s':>9} {'naive':>8} {'speedup':>8} {'roofline':>9} "
      f"{'vs roof':>8} {'serial':>7} {'MFLOP/tok':>10} {'MB/step':>8} {'bound':>8} "
      f"{'ms/call':>8} {'same tok':>9} {'max|dlogp|':>10}"
  )
  for r in rows:
    print(
        f"{r['B']:>6} {r['tok']:>9,.0f} {r['naive']:>8,.0f} {r['speedup']:>8.2f} "
        f"{r['roof']:>9,.0f} {r['vs_roof']:>8.3f} {r['serial']:>7.3f} {r['fpt'] / 1e6:>10.3f} "
        f"{r['bps'] / 1e6:>8.1f} {r['bound']:>8} {r['ms']:>8.1f} {r['same']:>9.4f} "
        f"{r['lpd']:>10.1e}"
    )
  print(
      "serial: the fraction of the roofline a machine reaches that runs the ops one after "
      "another, each at the probes' rate (compute-bound matmuls, then memory-bound "
      "attention: their times add instead of overlapping)"
  )
  g = med[f"generate {B0}"]
  print(
      f"host work per call: generate {g * 1e3:.1f} ms vs make_sampler "
      f"{med[f'cached {B0}'] * 1e3:.1f} ms at batch {B0}"
  )
  speedups = {}
  if options:
    for r in rows:
      B = r["B"]
      a, b = outs[f"cached {B}"], outs[f"option {B}"]
      same = float(np.mean(np.asarray(a.tokens) == np.asarray(b.tokens)))
      speedups[B] = med[f"cached {B}"] / med[f"option {B}"]
      print(
          f"compiled with {options}: batch {B}: {speedups[B]:.3f}x the default's tokens/s "
          f"({med[f'option {B}'] * 1e3:.1f} vs {med[f'cached {B}'] * 1e3:.1f} ms), "
          f"{speedups[B] * r['vs_roof']:.3f} of the roofline; same tokens {same:.4f}"
      )
  print(f"tokens/s rising with batch: {all(a['tok'] < b['tok'] for a, b in zip(rows, rows[1:]))}")
  # the goals, per run: that run's call against the roofline of that run's probes
  goals = []
  for B in [r["B"] for r in rows if r["B"] in GOALS]:
    roof_s = [
        systems.generation_roofline(
            dims,
            probes_lib.measured_accelerator(mm.flops(f), bw.bandwidth(b)),
            B,
            Tp,
            n_new,
            weight_bytes=w_bytes,
            kv_bytes=kv_bytes,
        )["seconds"]
        for f, b in zip(times["matmul"], times["bandwidth"])
    ]
    frac, lo, hi = stats.paired_ratio(roof_s, times[f"cached {B}"], LEVEL)
    verdict = stats.goal_verdict(lo, hi, GOALS[B], at_most=False)
    v = verdict.replace(" ", "_")
    goals.append(f"decode_lo_b{B}={lo:.3f} decode_hi_b{B}={hi:.3f} decode_goal_b{B}={v}")
    print(
        f"batch {B}: decode at {frac:.3f} of its roofline [{lo:.3f}, {hi:.3f}] (median over "
        f"the {len(roof_s)} runs, each against its own probes; {LEVEL:.0%} bootstrap): goal "
        f">= {GOALS[B]}: {verdict}"
    )
  last = rows[-1]
  if args.profile:
    try:  # a diagnostic: a profiler that cannot trace here must not cost the RESULT
      prof = op_profile.profile(arms[f"cached {last['B']}"], calls=2)
    except (RuntimeError, ValueError, OSError) as e:
      print(f"--profile: no trace on this machine ({type(e).__name__}: {e})")
    else:
      print(
          f"where the time goes at batch {last['B']} (2 traced calls, "
          f"{prof['wall_s'] * 1e3:.0f} ms each; concurrent ops share the time they overlap):"
      )
      print(op_profile.format_table(prof))
  print(
      f"RESULT tokens_per_s={last['tok']:.1f} speedup_vs_recompute={last['speedup']:.3f} "
      f"decode_vs_roofline={last['vs_roof']:.3f}"
      + "".join(f" option_speedup_b{B}={x:.3f}" for B, x in speedups.items())
      + "".join(" " + g for g in goals)
  )


if __name__ == "__main__":
  main()
