"""Time of one round of optimizer updates: the old host loop vs the scanned round.

    python experiments/bench_update.py            # quickstart and off-policy shapes
    python experiments/bench_update.py --quick    # tiny shapes, a smoke run

Shapes: the quickstart (``configs/default.py``: P=16 x K=16, one update per
round with the split-microbatch noise gradient) and the off-policy study
(``configs/offpolicy.py``: P=64 x K=16, 4 minibatches x 2 epochs = 8 updates
per round, split noise on the first). The policy is a fresh init
(``model.build``): timings depend on shapes only. Its rewards are equal
in every group, so its advantages are all 0 and no update would move; the
benchmark then draws random advantages, so that the updates (and the check
below) have something to do. One real rollout batch of
each shape is drawn with ``train.round_batch``.

* host loop: what the trainer did before -- per update a ``jnp.take`` gather,
  a ``device_put`` and a dispatch of a jitted one-update function (split
  gradient on the first), learning rates from the host; metrics read once.
  The one-update function is ``updater.RoundUpdater`` called with a single
  update (U = 1) on the gathered minibatch.
* scanned: ``updater.RoundUpdater``: all updates of the round as one jitted
  call (gather inside, ``lax.scan`` over updates, learning rates as an array).

Both are warmed up from the same state (compile excluded), and the
parameters their warm-up rounds end at are compared (``check:`` line, and
``update_check`` in the RESULT line: the largest relative difference over
both shapes; the same updates in another program order their float sums
differently, so rounding only, not a changed update), then timed round-robin with a float32
2048^2 matmul (``probes.MatmulProbe``), each timed call right after an
untimed call of the same path, medians of ``--repeats``; the speed-up is
the median of the repeats' paired ratios host / scanned, with a 90% bootstrap
interval and its verdict against the goal of 1.5x (``stats.paired_ratio``,
``stats.goal_verdict``: met, not met or unresolved). MFU:
training FLOPs of every update (``systems.train_flops``: 3 x a causal
forward over prompt + completion tokens, = 6 x active params x tokens plus
attention; the split path's extra work is not counted) over the scanned
time, against the matmul's FLOP/s. Last line:

    RESULT update_speedup=<host/scanned at off-policy shapes> update_lo=<> update_hi=<> update_goal=<verdict> update_mfu_vs_matmul=<float> update_check=<max rel diff>
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import model as model_lib
from cbs_jax import probes
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import systems
from cbs_jax import train
from cbs_jax import updater as updater_lib
from configs import default as default_cfg
from configs import offpolicy as offpolicy_cfg

LEVEL = 0.9  # the speed-up's interval
GOAL = 1.5  # the scanned round at least this much faster than the host loop


def make_case(c):
  setup = run_setup.prepare(c)
  graphdef, params = model_lib.build(setup.model, seed=c.seed)
  batch, _, _ = train.round_batch(c, graphdef, params, params, setup, 0)
  if not np.any(np.asarray(batch["adv"])):
    # a fresh policy earns equal rewards in every group, so its advantages
    # are 0 and no update would move: random ones give the updates (and the
    # check below) something to do; the timings depend on the shapes only
    adv = np.random.default_rng(1).standard_normal(np.shape(batch["adv"]))
    batch["adv"] = jnp.asarray(adv, jnp.asarray(batch["adv"]).dtype)
  tx = updater_lib.make_optimizer(c.optim)
  P, K = c.batch.num_prompts, c.batch.rollouts_per_prompt
  M, E = c.batch.num_minibatches, c.batch.num_epochs
  P_mb = P // M
  rng = np.random.default_rng(0)
  idx = []
  for _ in range(E):
    perm = rng.permutation(P)
    for m in range(M):
      p = perm[m * P_mb : (m + 1) * P_mb]
      idx.append((p[:, None] * K + np.arange(K)[None]).reshape(-1))
  idx = np.stack(idx)
  lrs = np.full(len(idx), c.optim.lr, np.float32)
  updater = updater_lib.RoundUpdater(c, graphdef, tx, P_mb, setup.sampling, setup.rl)
  state = dict(params=params, opt_state=tx.init(params))
  copy = lambda t: jax.tree.map(jnp.copy, t)
  B_mb = idx.shape[1]
  whole = np.arange(B_mb)[None]  # the gathered minibatch, as one update

  def host_loop(st):
    rows = []
    for j in range(len(idx)):
      mb = {k: jnp.take(v, jnp.asarray(idx[j]), axis=0) for k, v in batch.items()}
      mb = jax.device_put(mb)
      st, m, _ = updater(st, mb, whole, lrs[j : j + 1], j == 0, split=j == 0)
      rows.append(m)
    jax.device_get(rows)
    return st

  def scanned(st):
    st, m, extras = updater(st, batch, idx, lrs, True, split=True)
    jax.device_get((m, extras))
    return st

  flops = systems.train_flops(
      setup.model, idx.size, batch["prompt"].shape[1], batch["completion"].shape[1]
  )
  return dict(
      host=host_loop,
      scanned=scanned,
      state=copy(state),
      flops=flops,
      updates=len(idx),
      rollouts=idx.shape[1],
      params=model_lib.param_count(params),
  )


def max_rel_diff(a, b) -> float:
  """The largest |a - b| / max|b| over the leaves of two pytrees."""
  return max(
      float(jnp.max(jnp.abs(x - y)) / jnp.maximum(jnp.max(jnp.abs(y)), 1e-30))
      for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
  )


def bench(case, repeats: int, mm) -> tuple[dict, tuple[float, float]]:
  """(times by path, (the two paths' warm-up rounds' largest relative
  parameter difference, how far the host loop's round moved the parameters
  by the same measure: the check is not vacuous))."""
  st = {k: case["state"] for k in ("host", "scanned")}
  for k in st:  # warm-up: compile, from the same state
    st[k] = case[k](jax.tree.map(jnp.copy, case["state"]))
  check = (
      max_rel_diff(st["scanned"]["params"], st["host"]["params"]),
      max_rel_diff(st["host"]["params"], case["state"]["params"]),
  )
  ts = {k: [] for k in list(st) + ["matmul"]}
  for _ in range(repeats):
    ts["matmul"].append(mm.probe())
    for k in st:
      # timed right after an untimed call of the same path: the steady state
      # of a run, where a round follows a round (floors.Probes.once)
      st[k] = jax.block_until_ready(case[k](st[k]))
      t = time.perf_counter()
      st[k] = case[k](st[k])
      ts[k].append(time.perf_counter() - t)
  return ts, check


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--repeats", type=int, default=10, help="timed repeats per path")
  ap.add_argument("--quick", action="store_true", help="tiny shapes, 2 repeats")
  args = ap.parse_args(argv)
  cases = {"quickstart": default_cfg.get_config(), "offpolicy": offpolicy_cfg.get_config()}
  repeats = args.repeats
  if args.quick:
    repeats = 2
    for c in cases.values():
      c.batch.num_prompts = 8 if c.batch.num_minibatches == 1 else 16
      c.batch.rollouts_per_prompt = 4
      c.noise.chunk_prompts = 2
  mm = probes.MatmulProbe(1024 if args.quick else 2048)
  print(
      f"{'shape':<12}{'params':>9}{'updates':>8}{'rollouts/upd':>13}"
      f"{'host ms':>10}{'scanned ms':>12}{'speedup':>9}{'MFU':>7}"
  )
  res = {}
  for name, c in cases.items():
    case = make_case(c)
    ts, check = bench(case, repeats, mm)
    t = {k: float(np.median(v)) for k, v in ts.items()}
    peak = mm.flops(t["matmul"])
    mfu = case["flops"] / t["scanned"] / peak
    res[name] = dict(
        speedup=stats.paired_ratio(ts["host"], ts["scanned"], LEVEL), mfu=mfu, check=check
    )
    print(
        f"{name:<12}{case['params']:>9}{case['updates']:>8}{case['rollouts']:>13}"
        f"{t['host'] * 1e3:>10.1f}{t['scanned'] * 1e3:>12.1f}"
        f"{res[name]['speedup'][0]:>9.2f}{mfu:>7.3f}  (matmul {peak / 1e9:.1f} GFLOP/s)"
    )
  check = max(v["check"][0] for v in res.values())
  print(
      "check: parameters after one round, scanned vs host loop, max rel diff "
      + ", ".join(f"{k} {v['check'][0]:.1e} (moved {v['check'][1]:.1e})" for k, v in res.items())
  )
  r, lo, hi = res["offpolicy"]["speedup"]
  verdict = stats.goal_verdict(lo, hi, GOAL, at_most=False)
  print(
      f"off-policy speedup, median of the {repeats} paired ratios host / scanned: {r:.3f} "
      f"[{lo:.3f}, {hi:.3f}] ({LEVEL:.0%} bootstrap): goal >= {GOAL}: {verdict}"
  )
  print(
      f"RESULT update_speedup={r:.3f} update_lo={lo:.3f} update_hi={hi:.3f} "
      f"update_goal={verdict.replace(' ', '_')} "
      f"update_mfu_vs_matmul={res['quickstart']['mfu']:.3f} update_check={check:.2e}"
  )


if __name__ == "__main__":
  main()
