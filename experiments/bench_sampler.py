"""Sampler throughput: KV-cache `sampling.generate` vs a naive full-recompute sampler.

Command (from the repository root):

    python experiments/bench_sampler.py

Model: `model.default_config()` with vocab_size 20 (the arithmetic task's
character vocabulary), random init (seed 0). Prompts: 12 random tokens,
left-padded (all full length). 48 new tokens per sequence, temperature 1.

Both samplers run every sequence for all 48 steps: EOS is made impossible
(see `forbid_token`), and the script checks mask.sum() == batch * 48. So the
tokens/s reported is (batch x 48 decode steps) / wall time of one call,
prefill included; it equals the number of valid generated tokens per second.

The naive sampler is one jitted `lax.fori_loop` over t that recomputes the
full forward (cache=None) over the fixed [prompt + 48] buffer, takes the
logits at position Tp + t - 1 and samples with the same `process_logits` and
the same key schedule as `generate`, so both draw the same tokens up to
float rounding (the fraction of identical tokens is printed).

Each sampler is compiled (warm-up call) before timing; the median of
--runs timed calls (jax.block_until_ready) is reported. The last line is
    RESULT tokens_per_s=<cached, batch 1024> speedup_vs_recompute=<at batch 1024>
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from cbs_jax import model as model_lib  # noqa: E402
from cbs_jax import sampling  # noqa: E402
from cbs_jax import scoring  # noqa: E402

VOCAB = 20
EOS_ID = VOCAB - 1
PAD_ID = 0


def forbid_token(graphdef, params, token: int, cfg):
  """Params under which `token` is never sampled (its logit is < -1000 always).

  The LM head has no bias, so a very negative logit needs a hidden feature of
  fixed sign: residual channel j is set to a constant 1 in every token
  embedding and no layer writes to it (its column of every attention output
  projection and MLP down projection is zeroed), so after the final RMSNorm it
  is 1 / rms(x) > 0. The head column of `token` reads only that channel, with
  weight -1e4. Throughput is unaffected (same shapes, same FLOPs).
  """
  m = nnx.merge(graphdef, params)
  j = cfg.d_model - 1
  m.embed[...] = m.embed[...].at[:, j].set(1.0)
  for block in m.blocks:
    block.attn.wo[...] = block.attn.wo[...].at[:, :, j].set(0.0)
    block.mlp.w_down[...] = block.mlp.w_down[...].at[:, j].set(0.0)
  head = jnp.zeros((cfg.d_model,), jnp.float32).at[j].set(-1e4)
  m.lm_head[...] = m.lm_head[...].at[:, token].set(head)
  return nnx.split(m, nnx.Param)


@functools.partial(jax.jit, static_argnames=("graphdef", "max_new_tokens",
                                             "temperature", "top_k", "top_p"))
def naive_generate(graphdef, params, prompt, prompt_mask, key, *, max_new_tokens,
                   temperature=1.0, top_k=0, top_p=1.0):
  """Sample by recomputing the whole forward each step (no KV cache, no EOS)."""
  B, Tp = prompt.shape
  T = Tp + max_new_tokens
  buf = jnp.zeros((B, T), jnp.int32).at[:, :Tp].set(prompt)
  mask = jnp.zeros((B, T), bool).at[:, :Tp].set(prompt_mask)
  lps = jnp.zeros((B, max_new_tokens), jnp.float32)

  def body(t, carry):
    buf, mask, lps, key = carry
    key, sub = jax.random.split(key)  # same key schedule as sampling.generate
    out = model_lib.apply(graphdef, params, buf, scoring.positions_from_mask(mask), mask)
    logits = jax.lax.dynamic_index_in_dim(out.logits, Tp + t - 1, 1, keepdims=False)
    logp_all = scoring.process_logits(logits, temperature, top_k, top_p)
    tok = jax.random.categorical(sub, logp_all).astype(jnp.int32)
    lp = jnp.take_along_axis(logp_all, tok[:, None], -1)
    buf = jax.lax.dynamic_update_slice(buf, tok[:, None], (0, Tp + t))
    mask = jax.lax.dynamic_update_slice(mask, jnp.ones((B, 1), bool), (0, Tp + t))
    lps = jax.lax.dynamic_update_slice(lps, lp, (0, t))
    return buf, mask, lps, key

  buf, mask, lps, _ = jax.lax.fori_loop(0, max_new_tokens, body, (buf, mask, lps, key))
  return buf[:, Tp:], lps


def median_time(fn, runs):
  out = jax.block_until_ready(fn())  # warm-up: compiles
  times = []
  for _ in range(runs):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return float(np.median(times)), out


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--batches", default="64,256,1024")
  ap.add_argument("--new_tokens", type=int, default=48)
  ap.add_argument("--prompt_len", type=int, default=12)
  ap.add_argument("--runs", type=int, default=3)
  args = ap.parse_args()
  batches = [int(b) for b in args.batches.split(",")]
  n_new, Tp = args.new_tokens, args.prompt_len

  cfg = model_lib.default_config()
  cfg.vocab_size = VOCAB
  graphdef, params = model_lib.build(cfg, seed=0)
  graphdef, params = forbid_token(graphdef, params, EOS_ID, cfg)
  print(f"jax {jax.__version__} on {jax.devices()[0].platform} "
        f"({jax.device_count()} device(s)); model params "
        f"{model_lib.param_count(params):,}; d_model {cfg.d_model}, layers "
        f"{cfg.num_layers}, heads {cfg.num_heads}/{cfg.num_kv_heads} kv, vocab "
        f"{cfg.vocab_size}; prompt {Tp}, new tokens {n_new}, median of {args.runs}")
  print("tokens/s = batch x decode steps / wall time (every sequence runs all "
        f"{n_new} steps: EOS id {EOS_ID} is never sampled; checked via mask.sum())")

  rows = []
  rng = np.random.default_rng(0)
  for B in batches:
    prompts = rng.integers(1, EOS_ID, (B, Tp)).astype(np.int32)
    pmask = np.ones((B, Tp), bool)
    key = jax.random.key(B)
    prompts_j, pmask_j = jnp.asarray(prompts), jnp.asarray(pmask)

    t_cached, out = median_time(lambda: sampling.generate(
        graphdef, params, prompts_j, pmask_j, key, max_new_tokens=n_new,
        eos_id=EOS_ID, pad_id=PAD_ID), args.runs)
    n_valid = int(np.asarray(out.mask).sum())
    if n_valid != B * n_new:
      raise RuntimeError(f"cached sampler produced {n_valid} valid tokens, "
                         f"expected {B * n_new} (EOS was sampled?)")
    t_naive, (naive_tokens, naive_lps) = median_time(lambda: naive_generate(
        graphdef, params, prompts_j, pmask_j, key, max_new_tokens=n_new), args.runs)
    if (np.asarray(naive_tokens) == EOS_ID).any():
      raise RuntimeError("naive sampler sampled the forbidden EOS id")
    same = float((np.asarray(naive_tokens) == np.asarray(out.tokens)).mean())
    # per-row prefix agreement: after the first differing token the rows diverge
    lp_diff = float(np.abs(np.asarray(naive_lps) - np.asarray(out.logprobs))[
        np.cumprod(np.asarray(naive_tokens) == np.asarray(out.tokens), 1) > 0].max())
    tok_cached, tok_naive = B * n_new / t_cached, B * n_new / t_naive
    rows.append((B, tok_cached, tok_naive, tok_cached / tok_naive, t_cached, t_naive,
                 same, lp_diff))
    print(f"  batch {B}: cached {t_cached * 1e3:.1f} ms, naive {t_naive * 1e3:.1f} ms, "
          f"identical tokens {same:.4f}", flush=True)

  print()
  print(f"{'batch':>6} {'cached tok/s':>14} {'naive tok/s':>13} {'speedup':>8} "
        f"{'cached ms':>10} {'naive ms':>10} {'same tok':>9} {'max|dlogp|':>11}")
  for B, tc, tn, sp, ms_c, ms_n, same, lpd in rows:
    print(f"{B:>6} {tc:>14,.0f} {tn:>13,.0f} {sp:>8.2f} {ms_c * 1e3:>10.1f} "
          f"{ms_n * 1e3:>10.1f} {same:>9.4f} {lpd:>11.2e}")
  last = rows[-1]
  print(f"RESULT tokens_per_s={last[1]:.1f} speedup_vs_recompute={last[3]:.3f}")


if __name__ == "__main__":
  main()
