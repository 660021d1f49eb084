"""FLOP utilisation of the RL training update at three model sizes.

    python experiments/bench_scale.py            # quickstart, 1.07M and ~25M params
    python experiments/bench_scale.py --quick    # smaller batches, 3 repeats (smoke run)
    python experiments/bench_scale.py --dtype=bfloat16   # e.g. on a GPU / TPU

Runs unchanged on any jax backend (CPU, GPU, TPU): the model, the update and
the matmul peak all run on ``jax.devices()[0]``.

Cases (random init, seed 0; timings depend on shapes only):

* ``quickstart``: ``configs/default.py``'s model (d_model 64, 2 layers,
  ~0.1M params, the arithmetic task's 17-token vocabulary) at its round
  shape, 16 x 16 = 256 rollouts of 9 prompt + 5 completion tokens;
* ``1m``: d_model 128, 4 layers, 4 heads (head_dim 32), SwiGLU 512, vocab
  64 (1.07M params; the sampler benchmark's model), 256 rollouts x (8 + 48);
* ``25m``: d_model 512, 8 layers, 8 query / 4 key-value heads (head_dim 64),
  SwiGLU 1536, vocab 64 (25.2M params), 32 rollouts x (16 + 48);
* ``qwen2.5-0.5b`` (only when named in ``--cases``; an accelerator's case,
  ``experiments/device_check.py``): Qwen2.5-0.5B's dimensions
  (``model.PRESETS``, 494M params), 16 rollouts x (16 + 48).

The update is the trainer's: one jitted, donated optimizer step =
``jax.value_and_grad(objective.batch_loss)`` (GRPO's clipped policy loss,
token-mean aggregation, a k3 KL penalty to a reference policy with beta
0.04, off-policy ratios against stored behaviour log-probs) followed by
``updater.make_optimizer`` (global-norm clip + AdamW). Completion lengths are
random (1..Tc), as sampled rollouts' are; the compute covers every position.

FLOPs: ``systems.train_flops`` = 3 x a causal forward = 6 x A x tokens plus
causal attention (A = parameters a token multiplies, all but the gathered
input embedding; ``systems.ModelDims``). Peak: a square matmul in the
model's compute dtype (2048 on CPU, 8192 elsewhere), timed in the same run.
Timing: every case and the matmul are warmed up (compile excluded), then
timed round-robin (one call of each per repeat, so load from other processes
hits them alike); medians of ``--repeats``. MFU = FLOPs / median update time
/ median-timed matmul FLOP/s. Last line:

    RESULT train_mfu_vs_matmul=<25m case> mfu_<case>=<each case run>
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import run_setup
from cbs_jax import scoring
from cbs_jax import systems
from cbs_jax import updater as updater_lib
from configs import default as default_cfg

# name -> (model overrides of model.default_config(), rollouts, prompt len, completion len)
CASES = {  # name: (model preset or None = the quickstart's own, rollouts, prompt, completion)
    "quickstart": (None, 256, 9, 5),
    "1m": ("1m", 256, 8, 48),
    "25m": ("25m", 32, 16, 48),
    "qwen2.5-0.5b": ("qwen2.5-0.5b", 16, 16, 48),  # an accelerator's case (device_check.py)
}
DEFAULT_CASES = ("quickstart", "1m", "25m")


def case_config(name: str, dtype: str, quick: bool):
  c = default_cfg.get_config()
  over, n, tp, tc = CASES[name]
  if over is None:  # the quickstart's own model, vocabulary from its task
    setup = run_setup.prepare(c)
    spec = setup.sampling
    c.model.vocab_size = setup.model.vocab_size
  else:
    spec = scoring.SamplingSpec.from_config(c.sampling)
    c.model = model_lib.preset_config(over, c.model)
  c.model.dtype = dtype
  c.model.max_len = max(c.model.max_len, tp + tc)
  c.rl.kl_beta = 0.04
  if quick:
    n = max(n // 4, 8)
  return c, spec, n, tp, tc


def make_batch(graphdef, params, c, n, tp, tc, seed=0):
  """A synthetic rollout batch with the trainer's fields (objective.BATCH_KEYS)."""
  rng = np.random.default_rng(seed)
  V = c.model.vocab_size
  lens = rng.integers(1, tc + 1, n)
  b = dict(
      prompt=jnp.asarray(rng.integers(1, V, (n, tp)), jnp.int32),
      prompt_mask=jnp.ones((n, tp), bool),
      completion=jnp.asarray(rng.integers(1, V, (n, tc)), jnp.int32),
      completion_mask=jnp.asarray(np.arange(tc)[None] < lens[:, None], jnp.float32),
  )
  sc = jax.jit(scoring.score, static_argnums=(0, 6))(
      graphdef,
      params,
      b["prompt"],
      b["prompt_mask"],
      b["completion"],
      b["completion_mask"],
      scoring.SamplingSpec(),
  )
  logp = sc.logprobs
  noise = lambda s: 0.05 * jnp.asarray(rng.standard_normal((n, tc)), jnp.float32)
  b.update(
      logp_old=(logp + noise(1)) * b["completion_mask"],
      logp_ref=(logp + noise(2)) * b["completion_mask"],
      adv=jnp.asarray(np.repeat(rng.standard_normal((n, 1)), tc, 1), jnp.float32),
      returns=jnp.zeros((n, tc), jnp.float32),
      old_values=jnp.zeros((n, tc), jnp.float32),
      on_policy=jnp.zeros((n,), bool),
  )
  return b


def make_update(graphdef, c, spec):
  tx = updater_lib.make_optimizer(c.optim)
  rl_spec = rl.RLSpec.from_config(c.rl)

  def update(state, batch):
    params, opt_state = state
    (loss, _), grads = jax.value_and_grad(objective.batch_loss, has_aux=True)(
        params, graphdef, batch, objective.counts_of(batch), rl_spec, spec
    )
    updates, opt_state = tx.update(grads, opt_state, params)
    params = jax.tree.map(lambda p, u: p + u, params, updates)
    return (params, opt_state), loss

  return tx, jax.jit(update, donate_argnums=(0,))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--cases", default=",".join(DEFAULT_CASES), help=f"subset of {list(CASES)}")
  ap.add_argument("--repeats", type=int, default=7, help="timed calls per case (median)")
  ap.add_argument(
      "--dtype",
      default="float32",
      choices=sorted(model_lib.DTYPES),
      help="compute dtype of the model and of the matmul peak",
  )
  ap.add_argument("--quick", action="store_true", help="batches / 4, 3 repeats")
  args = ap.parse_args(argv)
  names = [s for s in args.cases.split(",") if s]
  bad = [s for s in names if s not in CASES]
  if bad or not names:
    ap.error(f"--cases: unknown {bad}; known {list(CASES)}")
  if "25m" not in names:
    ap.error("--cases must include 25m (the RESULT line's case)")
  repeats = 3 if args.quick else args.repeats

  dev = jax.devices()[0]
  dt = model_lib.DTYPES[args.dtype]
  mm_n = 2048 if dev.platform == "cpu" else 8192
  a = jax.random.normal(jax.random.key(0), (mm_n, mm_n), jnp.float32).astype(dt)
  matmul = jax.jit(lambda x: x @ x)
  arms = {"matmul": (lambda: matmul(a), 2.0 * mm_n**3)}
  info = {}
  for name in names:
    c, spec, n, tp, tc = case_config(name, args.dtype, args.quick)
    graphdef, params = model_lib.build(c.model, seed=0)
    batch = make_batch(graphdef, params, c, n, tp, tc)
    tx, update = make_update(graphdef, c, spec)
    holder = {"state": (params, tx.init(params))}

    def call(update=update, holder=holder, batch=batch):
      holder["state"], loss = update(holder["state"], batch)
      return loss

    dims = systems.ModelDims.from_config(c.model)
    flops = systems.train_flops(dims, n, tp, tc)
    arms[name] = (call, flops)
    info[name] = dict(
        params=model_lib.param_count(params),
        active=dims.active_params,
        n=n,
        tp=tp,
        tc=tc,
        flops=flops,
    )

  for name, (fn, _) in arms.items():  # compile + warm up
    t = time.perf_counter()
    jax.block_until_ready(fn())
    print(f"  warmed {name}: {time.perf_counter() - t:.1f} s", flush=True)
  times = {k: [] for k in arms}
  for r in range(repeats):
    for name, (fn, _) in arms.items():
      t = time.perf_counter()
      jax.block_until_ready(fn())
      times[name].append(time.perf_counter() - t)
  med = {k: float(np.median(v)) for k, v in times.items()}
  peak = arms["matmul"][1] / med["matmul"]

  print(
      f"jax {jax.__version__} on {dev.platform} ({dev.device_kind}); dtype {args.dtype}; "
      f"{mm_n}^2 matmul {peak / 1e9:.1f} GFLOP/s (median of {repeats}, interleaved)"
  )
  print(
      f"{'case':<11}{'params':>12}{'rollouts':>9}{'tokens':>8}{'GFLOP':>9}"
      f"{'ms':>10}{'GFLOP/s':>9}{'MFU':>7}"
  )
  mfu = {}
  for name in names:
    i = info[name]
    rate = i["flops"] / med[name]
    mfu[name] = rate / peak
    print(
        f"{name:<11}{i['params']:>12,}{i['n']:>9}{i['tp'] + i['tc']:>8}"
        f"{i['flops'] / 1e9:>9.2f}{med[name] * 1e3:>10.1f}{rate / 1e9:>9.1f}"
        f"{mfu[name]:>7.3f}"
    )
  each = " ".join(f"mfu_{k}={v:.3f}" for k, v in mfu.items())
  print(f"RESULT train_mfu_vs_matmul={mfu['25m']:.3f} {each}")


if __name__ == "__main__":
  main()
