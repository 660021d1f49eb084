"""Cost of the gradient-noise instruments vs one plain training gradient.

Command (from the repository root):

    python experiments/bench_noise.py --base_dir=runs/default/sft_base

(without --base_dir the policy is a fresh init, ``model.build(config.model)``:
timings depend only on shapes, fixed by the layout, so both give the same
costs up to noise, but a fresh init solves nothing, every advantage is 0 and
so is every gradient, which makes the cross-checks vacuous (a warning says so).
A --base_dir holding a finished SFT checkpoint is loaded via ``sft.train_sft``.)

Setup: ``configs/default.py`` (arithmetic task, default small model, vocab from
the task tokenizer via ``train.prepare``), P = 16 prompts x K = 16 rollouts =
N = 256 rollouts, one real rollout batch built by ``train.round_batch``
(round 0, on-policy: the first update of a round). Paths, each ``jax.jit``-ed
and warmed up (compile excluded), timed with ``jax.block_until_ready``;
the paths are timed round-robin (one call of each per repeat, right after an
untimed call of the same path, the steady state of a run's updates) so that
load from other processes hits all of them alike; median of --repeats:

* plain  ``jax.value_and_grad(objective.batch_loss)``: one training gradient
  (with the per-token aux the trainer reads; "plain, grad only" drops the
  loss and aux outputs, to show what they cost)
* split  ``gradstats.split_grads`` (2 x 2 microbatch grid + SplitMoments)
* exact  ``gradstats.group_moments`` at ``config.noise.chunk_prompts`` (4),
         and at chunk 1, 2, 16 (the table)
* loop   naive per-example loop: one jitted step per rollout (grad of that
         rollout's ``rollout_losses`` on a batch of 1, GLOBAL counts of the
         batch), accumulating on device the prompt's gradient sum and the
         per-leaf squared norm; 256 + 16 dispatches per pass.

Breakdown of the split path: "split cells only" is ``gradstats.cell_grads``
and their mean (the batch gradient) without the moments: what the 2 x 2 grid
itself costs. "split separate" / "split vmapped" force the cells' form
(``gradstats.split_grads(cells=...)``): separate gradients, or one gradient
vmapped over the cells; "split" takes ``cells="auto"`` (on the CPU separate
for cells of at least ``gradstats.SEPARATE_MIN_ROWS`` token rows). Their
paired ratio, separate / vmapped, is printed and added to the RESULT line
(``separate_vs_vmapped``, its interval, the cells' rows and the form "auto"
took), so the threshold can be checked at any --prompts and --model.

Breakdown of the exact path (to see what it costs):

* vmap-grad only: the same ``lax.scan`` over chunks of ``vmap(grad)``, each
  chunk reduced to a single scalar (sum of squares) -- the per-example
  gradients must still be materialised, but no per-leaf/per-prompt reductions.
* prompt grads: ``vmap`` over prompts of the grad of each prompt's summed loss
  (P gradients of |theta|, what the group means alone need).
* ghost: ``ghost.moments_and_grad``, the same GroupMoments from ONE forward +
  backward, without per-rollout gradients: the model's taps (``model.Tapped``
  under ``nnx.capture``) give dL/dy of every parameter use for all rollouts
  at once; per-rollout squared norms of dense weights come from the Gram
  identity |sum_t x_t^T dy_t|_F^2 = sum_{t,s} (x_t . x_s)(dy_t . dy_s) and the
  prompt means from contractions keeping the prompt index (whichever exact
  form is cheaper per parameter); it returns the batch gradient too, so an
  exact-measured update needs no separate plain gradient. "ghost gram" /
  "ghost materialize" force one form everywhere.

Memory: XLA's compiled memory analysis of each jitted function,
``jax.jit(f).lower(*args).compile().memory_analysis()``; "temp MB" is
temp_size_in_bytes (scratch the executable allocates besides its arguments
and outputs); the argument and output sizes are printed too. For the loop it
is the analysis of one per-rollout step.

Cross-checks printed: split grad vs plain grad, and every exact variant's
GroupMoments (summed over leaves) vs the loop's (independent computation).

The goals (split <= 1.05x, ghost <= 1.2x a plain gradient) are read off
the repeats' paired ratios (split and plain are timed in the same repeat):
their median with a 90% bootstrap interval (``stats.paired_ratio``) and the
verdict ``met`` / ``not met`` / ``unresolved`` (``stats.goal_verdict``: the
interval on the goal's side, on the other, or across it). The last line is
    RESULT overhead_vs_plain_grad=<exact/plain> speedup_vs_loop=<loop/exact> split_overhead=<median paired split/plain> split_lo=<> split_hi=<> split_goal=<verdict> ghost_overhead=<...> ghost_lo=<> ghost_hi=<> ghost_goal=<verdict> separate_vs_vmapped=<median paired> separate_lo=<> separate_hi=<> cell_rows=<> auto_form=<>
with exact the vmap path at the config's chunk_prompts (ratio of medians)
and ghost ``ghost.moments_and_grad``.

``--split_only`` times the plain gradient, the split path in its forms and
its cells only (no exact paths, ghost or loop; the RESULT line then holds
the split fields):
the split goal at a larger model or batch in minutes, e.g.
``python experiments/bench_noise.py --model=1m --split_only --repeats 12``;
``--prompts`` sets P (N = P x 16).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import ghost
from cbs_jax import gradstats
from cbs_jax import model as model_lib
from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import run_setup
from cbs_jax import sft
from cbs_jax import stats
from cbs_jax import train
from configs import default as default_cfg

LEVEL = 0.9  # the goals' intervals


def load_params(config, setup, base_dir):
  if not base_dir:
    graphdef, params = model_lib.build(setup.model, seed=config.seed)
    return graphdef, params, f"fresh init (model.build, seed {config.seed})"
  ck = os.path.join(base_dir, "checkpoints")
  if not os.path.isdir(ck) or not os.listdir(ck):
    raise SystemExit(f"--base_dir={base_dir!r} holds no SFT checkpoint ({ck})")
  # a finished SFT checkpoint is loaded, not retrained (sft.train_sft returns early)
  graphdef, params, summary = sft.train_sft(config, setup, base_dir)
  return (
      graphdef,
      params,
      (
          f"SFT base {base_dir} (step {summary.get('sft_steps')}, "
          f"pass@1 {summary.get('base_pass_rate')})"
      ),
  )


# ---------------------------------------------------------------------------
# Naive loop: one jitted grad per rollout.
# ---------------------------------------------------------------------------
def make_loop(graphdef, rl_cfg, s_cfg, P, K):
  N = P * K

  def one_loss(params, batch, i, counts):
    ex = {k: jax.lax.dynamic_slice_in_dim(v, i, 1, axis=0) for k, v in batch.items()}
    L_B, _ = objective.rollout_losses(params, graphdef, ex, counts, rl_cfg, s_cfg)
    return L_B[0]

  def step(params, batch, i, counts, acc):
    g = jax.grad(one_loss)(params, batch, i, counts)
    g = [N * x for x in jax.tree.leaves(g)]
    sq = jnp.stack([jnp.sum(x * x) for x in g])  # [L]
    return [a + x for a, x in zip(acc, g)], sq

  step_j = jax.jit(step, donate_argnums=(4,))

  @jax.jit
  def group_sq(acc):
    return jnp.stack([jnp.sum((a / K) ** 2) for a in acc]), [a / K for a in acc]

  def run(params, batch, counts):
    sq_all, gsq_all, gsum = [], [], None
    for p in range(P):
      acc = [jnp.zeros(x.shape, jnp.float32) for x in jax.tree.leaves(params)]
      for k in range(K):
        acc, sq = step_j(params, batch, jnp.int32(p * K + k), counts, acc)
        sq_all.append(sq)
      gsq, gbar = group_sq(acc)
      gsq_all.append(gsq)
      gsum = gbar if gsum is None else [a + b for a, b in zip(gsum, gbar)]
    sum_sq = jnp.stack(sq_all).reshape(P, K, -1).sum(1).T  # [L, P]
    mean_sq = jnp.stack(gsq_all).T  # [L, P]
    batch_sq = jnp.stack([jnp.sum((s / P) ** 2) for s in gsum])
    return noise.GroupMoments(
        sum_sqnorm_P=sum_sq, mean_sqnorm_P=mean_sq, batch_mean_sqnorm=batch_sq, K=K
    )

  return run, step_j


# ---------------------------------------------------------------------------
# Breakdown pieces of the exact path.
# ---------------------------------------------------------------------------
def vmap_grad_only(params, graphdef, batch, P, K, rl_cfg, s_cfg, chunk_prompts):
  """group_moments' scan of vmap(grad), each chunk reduced to ONE scalar."""
  counts = objective.counts_of(batch)
  C = chunk_prompts

  per_rollout_grad = gradstats.per_rollout_grad_fn(graphdef, counts, rl_cfg, s_cfg)
  chunks = jax.tree.map(lambda x: x.reshape((P // C, C * K) + x.shape[1:]), batch)

  def body(acc, chunk):
    g = per_rollout_grad(params, chunk)
    return acc + sum(jnp.sum(x * x) for x in jax.tree.leaves(g)), None

  out, _ = jax.lax.scan(body, jnp.float32(0), chunks)
  return out


def split_cells_only(params, graphdef, batch, P, K, rl_cfg, s_cfg):
  """split_grads without its moments: the cell gradients' summed loss, mean
  (the batch gradient) and aux."""
  losses, q, aux = gradstats.cell_grads(params, graphdef, batch, P, K, rl_cfg, s_cfg)
  return jnp.sum(losses), jax.tree.map(gradstats.cell_mean, q), aux


def prompt_grads(params, graphdef, batch, P, K, rl_cfg, s_cfg):
  """N * grad of each prompt's summed loss / K = gbar_p, for all p (vmap over P)."""
  counts = objective.counts_of(batch)
  N = P * K

  def group_loss(p, grp):
    L_B, _ = objective.rollout_losses(p, graphdef, grp, counts, rl_cfg, s_cfg)
    return jnp.sum(L_B)

  groups = jax.tree.map(lambda x: x.reshape((P, K) + x.shape[1:]), batch)
  g = jax.vmap(jax.grad(group_loss), in_axes=(None, 0))(params, groups)
  return jax.tree.map(lambda x: (N / K) * x, g)


# ---------------------------------------------------------------------------
def mem_analysis(fn, *args):
  m = jax.jit(fn).lower(*args).compile().memory_analysis()
  if m is None:
    return None
  return dict(temp=m.temp_size_in_bytes, arg=m.argument_size_in_bytes, out=m.output_size_in_bytes)


def total_moments(m):
  s = gradstats.sum_leaves(m)
  return np.array([np.sum(s.sum_sqnorm_P), np.sum(s.mean_sqnorm_P), float(s.batch_mean_sqnorm)])


def rel(a, b):
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument(
      "--base_dir",
      default="",
      help="SFT base workdir (e.g. runs/default/sft_base); empty: fresh init",
  )
  ap.add_argument("--repeats", type=int, default=15, help="timed calls per path (median)")
  ap.add_argument(
      "--loop_repeats",
      type=int,
      default=0,
      help="timed passes of the naive loop (each 256 + 16 dispatches); " "0 = --repeats",
  )
  ap.add_argument("--no_ghost", action="store_true", help="skip the ghost-norm paths")
  ap.add_argument(
      "--model",
      default="",
      choices=[""] + sorted(model_lib.PRESETS),
      help="a model.PRESETS shape (random init, the task's vocabulary) instead of the config's",
  )
  ap.add_argument("--dtype", default="float32", choices=sorted(model_lib.DTYPES))
  ap.add_argument(
      "--quick", action="store_true", help="P=4 x K=4, 2 repeats, no breakdown (a smoke run)"
  )
  ap.add_argument(
      "--prompts",
      type=int,
      default=0,
      help="prompts P per batch (K stays the config's); 0 = the config's 16",
  )
  ap.add_argument(
      "--split_only",
      action="store_true",
      help="time the plain gradient and the split path only (no exact paths, ghost or "
      "loop): the split goal at a larger --model in minutes",
  )
  args = ap.parse_args(argv)
  config = default_cfg.get_config()
  if args.model:
    if args.base_dir:
      ap.error("--model builds a fresh policy; give it or --base_dir, not both")
    config.model = model_lib.preset_config(args.model, config.model, keep_vocab=True)
  config.model.dtype = args.dtype
  if args.prompts:
    config.batch.num_prompts = args.prompts
  if args.quick:
    args.repeats = 2
    config.batch.num_prompts, config.batch.rollouts_per_prompt = 4, 4
    config.noise.chunk_prompts = 2
  args.loop_repeats = args.loop_repeats or args.repeats
  setup = run_setup.prepare(config)  # validates, fixes vocab
  P, K = config.batch.num_prompts, config.batch.rollouts_per_prompt
  N = P * K
  C0 = config.noise.chunk_prompts
  rl_cfg, s_cfg = setup.rl, setup.sampling
  graphdef, params, origin = load_params(config, setup, args.base_dir)
  print(
      f"jax {jax.__version__} on {jax.devices()[0].platform} ({jax.device_count()} "
      f"device(s)); params {model_lib.param_count(params):,}; P={P} K={K} N={N}; "
      f"layout {setup.layout.prompt_len}+{setup.layout.completion_len} tokens; "
      f"policy: {origin}",
      flush=True,
  )

  t0 = time.perf_counter()
  batch, rewards, _ = train.round_batch(config, graphdef, params, params, setup, 0)
  batch["on_policy"] = jnp.ones((N,), bool)  # first update of an on-policy round
  batch = {k: batch[k] for k in objective.BATCH_KEYS}
  jax.block_until_ready(batch)
  print(
      f"rollout batch: {time.perf_counter() - t0:.1f} s, reward mean "
      f"{rewards.mean():.3f}, mixed groups {np.mean(rewards.std(1) > 0):.2f}, "
      f"valid completion tokens {float(batch['completion_mask'].sum()):.0f}",
      flush=True,
  )
  if not np.any(np.asarray(batch["adv"])):
    print(
        "WARNING: every advantage is 0 (no group has mixed rewards), so every "
        "gradient is 0: timings are valid (fixed shapes), the cross-checks are "
        "vacuous. Use --base_dir=runs/default/sft_base for a real policy."
    )
  counts = objective.counts_of(batch)

  def plain_fn(p, b):
    return jax.value_and_grad(objective.batch_loss, has_aux=True)(
        p, graphdef, b, objective.counts_of(b), rl_cfg, s_cfg
    )

  def split_fn(p, b):
    return gradstats.split_grads(p, graphdef, b, P, K, rl_cfg, s_cfg)

  def exact_fn(C):
    return lambda p, b: gradstats.group_moments(p, graphdef, b, P, K, rl_cfg, s_cfg, C)

  def plain_noaux_fn(p, b):
    return jax.grad(
        lambda q: objective.batch_loss(q, graphdef, b, objective.counts_of(b), rl_cfg, s_cfg)[0]
    )(p)

  paths = {"plain": plain_fn, "  plain, grad only (no aux)": plain_noaux_fn, "split": split_fn}
  exact_sizes = [] if args.split_only else sorted({C0, 1, 2, P}) if not args.quick else [C0]
  for C in exact_sizes:
    paths[f"exact c{C}"] = exact_fn(C)
  if args.split_only or not args.quick:
    paths["  split cells only"] = lambda p, b: split_cells_only(p, graphdef, b, P, K, rl_cfg, s_cfg)
    for form in ("separate", "vmapped"):
      paths[f"  split {form}"] = (
          lambda form: lambda p, b: gradstats.split_grads(
              p, graphdef, b, P, K, rl_cfg, s_cfg, cells=form
          )
      )(form)
  if not args.quick and not args.split_only:
    paths[f"  vmap-grad only c{C0}"] = lambda p, b: vmap_grad_only(
        p, graphdef, b, P, K, rl_cfg, s_cfg, C0
    )
    paths["  prompt grads (P)"] = lambda p, b: prompt_grads(p, graphdef, b, P, K, rl_cfg, s_cfg)
  ghost_forms = (
      []
      if args.no_ghost or args.split_only
      else (["auto"] if args.quick else ["auto", "gram", "materialize"])
  )
  for form in ghost_forms:
    name = "ghost" if form == "auto" else f"  ghost {form}"
    paths[name] = (
        lambda form: lambda p, b: ghost.moments_and_grad(
            p, graphdef, b, P, K, rl_cfg, s_cfg, form=form
        )
    )(form)

  jitted = {name: jax.jit(f) for name, f in paths.items()}
  mem, outs = {}, {}
  for name, f in paths.items():
    t = time.perf_counter()
    mem[name] = mem_analysis(f, params, batch)
    outs[name] = jax.block_until_ready(jitted[name](params, batch))  # compile + warm-up
    print(f"  compiled + warmed {name.strip()}: {time.perf_counter() - t:.1f} s", flush=True)

  with_loop = not args.split_only
  if with_loop:
    loop_run, loop_step = make_loop(graphdef, rl_cfg, s_cfg, P, K)
    acc0 = [jnp.zeros(x.shape, jnp.float32) for x in jax.tree.leaves(params)]
    m = loop_step.lower(params, batch, jnp.int32(0), counts, acc0).compile().memory_analysis()
    mem["loop"] = (
        dict(temp=m.temp_size_in_bytes, arg=m.argument_size_in_bytes, out=m.output_size_in_bytes)
        if m is not None
        else None
    )
    loop_mom = jax.block_until_ready(loop_run(params, batch, counts))  # compile + warm-up

  # ---- cross-checks
  (_, _), g_plain = outs["plain"]
  _, g_split, _, _ = outs["split"]
  d_split = max(rel(a, b) for a, b in zip(jax.tree.leaves(g_split), jax.tree.leaves(g_plain)))
  print(f"check: split grad vs plain grad, max rel diff {d_split:.1e}")
  if with_loop:
    ref = total_moments(loop_mom)
    print(
        f"check: loop totals [sum_k|g|^2, sum_p|gbar_p|^2, |gbar|^2] = "
        f"{ref[0]:.4e} {ref[1]:.4e} {ref[2]:.4e}"
    )
  for name in paths:
    if name.startswith("exact"):
      print(
          f"check: {name} moments vs loop, max rel diff "
          f"{rel(total_moments(outs[name]), ref):.1e}"
      )
  for name in paths:
    if name.strip().startswith("ghost"):
      gm, g_ghost, _ = outs[name]
      d_grad = max(rel(a, b) for a, b in zip(jax.tree.leaves(g_ghost), jax.tree.leaves(g_plain)))
      print(
          f"check: {name.strip()} moments vs loop: totals "
          f"{rel(total_moments(gm), ref):.1e}, per-leaf sum_k|g|^2 "
          f"{rel(gm.sum_sqnorm_P, loop_mom.sum_sqnorm_P):.1e}, per-leaf |gbar_p|^2 "
          f"{rel(gm.mean_sqnorm_P, loop_mom.mean_sqnorm_P):.1e}; its batch grad vs plain "
          f"grad {d_grad:.1e}"
      )
  if "  prompt grads (P)" in outs:
    g_pg = outs["  prompt grads (P)"]
    gb_sum = jax.tree.leaves(jax.tree.map(lambda x: jnp.mean(x, 0), g_pg))
    print(
        f"check: mean of prompt grads vs plain grad, max rel diff "
        f"{max(rel(a, b) for a, b in zip(gb_sum, jax.tree.leaves(g_plain))):.1e}"
    )
  print(flush=True)

  # ---- timing, round-robin; each timed call follows an untimed call of the
  # same path (a program that follows another program of other sizes can run
  # slower on the CPU: floors.Probes.once)
  times = {name: [] for name in paths}
  if with_loop:
    times["loop"] = []
  second = "split" if args.split_only else f"exact c{C0}"
  for r in range(args.repeats):
    for name in paths:
      jax.block_until_ready(jitted[name](params, batch))
      t = time.perf_counter()
      jax.block_until_ready(jitted[name](params, batch))
      times[name].append(time.perf_counter() - t)
    if with_loop and r < args.loop_repeats:
      t = time.perf_counter()
      jax.block_until_ready(loop_run(params, batch, counts))
      times["loop"].append(time.perf_counter() - t)
    print(
        f"  repeat {r + 1}/{args.repeats}: plain {times['plain'][-1] * 1e3:.1f} ms, "
        f"{second} {times[second][-1] * 1e3:.1f} ms",
        flush=True,
    )

  med = {k: float(np.median(v)) for k, v in times.items()}
  base = med["plain"]
  print()
  print(
      "memory: XLA compiled memory_analysis() of each jitted function "
      "(temp = scratch besides args/outputs; loop: one per-rollout step)"
  )
  bmin = min(times["plain"])
  print(
      f"{'path':<28} {'ms':>9} {'x plain':>8} {'min ms':>9} {'x (min)':>8} "
      f"{'temp MB':>9} {'arg MB':>7} {'out MB':>7}"
  )
  for name in list(paths) + (["loop"] if with_loop else []):
    mm = mem.get(name)
    mb = (lambda k: f"{mm[k] / 2**20:.2f}") if mm else (lambda k: "n/a")
    print(
        f"{name:<28} {med[name] * 1e3:>9.1f} {med[name] / base:>8.2f} "
        f"{min(times[name]) * 1e3:>9.1f} {min(times[name]) / bmin:>8.2f} "
        f"{mb('temp'):>9} {mb('arg'):>7} {mb('out'):>7}"
    )
  print(
      "ms = median, x plain = median / plain's median; min ms / x (min): the "
      "fastest call (least disturbed by other processes), ratio of minima"
  )
  loop_note = (
      f"loop median of {args.loop_repeats} passes of {N} + {P} dispatches = "
      f"{med['loop'] / (N + P) * 1e3:.2f} ms per dispatch; "
      if with_loop
      else ""
  )
  print(
      f"(median of {args.repeats} calls; {loop_note}plain / N = {base / N * 1e3:.2f} ms per rollout)"
  )
  result = []
  if with_loop:
    ex = med[f"exact c{C0}"]
    result.append(f"overhead_vs_plain_grad={ex / base:.3f} speedup_vs_loop={med['loop'] / ex:.2f}")
  for name, goal in (("split", 1.05), ("ghost", 1.2)):
    if name not in times:
      continue
    r, lo, hi = stats.paired_ratio(times[name], times["plain"], LEVEL)
    verdict = stats.goal_verdict(lo, hi, goal)
    print(
        f"{name} / plain, median of the {len(times[name])} paired ratios: {r:.3f} "
        f"[{lo:.3f}, {hi:.3f}] ({LEVEL:.0%} bootstrap): goal <= {goal}: {verdict}"
    )
    v = verdict.replace(" ", "_")
    result.append(f"{name}_overhead={r:.3f} {name}_lo={lo:.3f} {name}_hi={hi:.3f} {name}_goal={v}")
  if "  split separate" in times:
    r, lo, hi = stats.paired_ratio(times["  split separate"], times["  split vmapped"], LEVEL)
    rows = gradstats.cell_rows(batch, P, K)
    form = gradstats.cell_form("auto", rows, jax.device_count())
    print(
        f"split separate / split vmapped, median of the paired ratios: {r:.3f} "
        f"[{lo:.3f}, {hi:.3f}] ({LEVEL:.0%} bootstrap); cells of {rows} token rows: "
        f"cells='auto' takes {form!r} here (separate on the CPU from "
        f"{gradstats.SEPARATE_MIN_ROWS} rows)"
    )
    result.append(
        f"separate_vs_vmapped={r:.3f} separate_lo={lo:.3f} separate_hi={hi:.3f} "
        f"cell_rows={rows} auto_form={form}"
    )
  print("RESULT " + " ".join(result))


if __name__ == "__main__":
  main()
