"""Does the planner predict this machine? Predicted vs measured rollouts/s by N.

    python experiments/bench_planner.py            # N = 64 ... 16,384 (~5 min on 2 cores)
    python experiments/bench_planner.py --quick    # N = 64, 256 (test suite)

The planner's round time (``systems.round_time``) is the roofline plus
``systems.Overheads``: a floor per generation step and per update, host
round trips and host work per rollout, and the fraction of the roofline the
kernels achieve. This script measures those overheads with their probes
(``floors.calibrate``: the sampler and one update at a few batch sizes, a
trivial round trip, the host's verification), then times real rounds of the
quickstart config (``configs/default.py``, noise instruments off: what the
planner models) at every N and sets the prediction beside the measurement,
in one run:

* measured: ``train.round_batch`` (prompts, generation with EOS, host
  verification, advantages) + one ``updater.RoundUpdater`` update, metrics read
  back; compile excluded, median of ``--repeats`` rounds, each timed right
  after an untimed round of the same N (as in a run at that N). The timings
  are interleaved: each repeat times the calibration probes
  (``floors.Probes.once``) and then one round at every N, so that drift of
  a shared machine hits the prediction and the measurement alike and both
  medians span the whole run;
* predicted: N / ``systems.round_time(..., overheads=...)`` with the
  calibrated overheads, and with none (the bare roofline, a lower bound) to
  show what the floors change.

The calibration sees one round only, of a single prompt (K rollouts, below
every N timed here: a round's fixed cost, ``floors.Probes.round_fixed_s``);
it times the sampler (no EOS), one update and the host's verification
separately, at its own batch sizes (``--decode_batches``,
``--update_batches``); the efficiency each probe
implies after the fitted floor is interpolated in log batch between the
probes (``systems.Overheads.*_efficiency_at``), so the rounds at the N
between probe batches are out of sample. Last line:

    RESULT planner_worst_ratio=<predicted/measured furthest from 1> within_25pct=<n>/<N values>
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import floors
from cbs_jax import model as model_lib
from cbs_jax import probes
from cbs_jax import systems
from cbs_jax import train
from cbs_jax import updater as updater_lib
from configs import default as default_cfg


def round_fn(config, graphdef, params, setup, n):
  """One trainer round of n rollouts (generation + verification +
  advantages, then one update); returns a callable and its state holder."""
  K = config.batch.rollouts_per_prompt
  P = n // K
  tx = updater_lib.make_optimizer(config.optim)
  updater = updater_lib.RoundUpdater(config, graphdef, tx, P, setup.sampling, setup.rl)
  idx = np.arange(n)[None]
  lrs = np.full((1,), config.optim.lr, np.float32)
  holder = {"state": dict(params=jax.tree.map(jnp.copy, params), opt_state=tx.init(params))}
  counter = [0]

  def run():
    counter[0] += 1
    p = holder["state"]["params"]
    t0 = time.perf_counter()
    batch, _, _ = train.round_batch(config, graphdef, p, p, setup, counter[0], P)
    batch["on_policy"] = jnp.ones((n,), bool)
    jax.block_until_ready(batch)
    t1 = time.perf_counter()
    holder["state"], m, _ = updater(holder["state"], batch, idx, lrs, True)
    jax.device_get(m)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1

  return run


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ns", default="64,128,256,512,1024,2048,4096,8192,16384")
  ap.add_argument(
      "--repeats", type=int, default=7, help="timed rounds per N and probe timings (medians)"
  )
  # the probes span the N the planner is asked about (their efficiencies are
  # interpolated in log batch between them and held beyond the ends)
  ap.add_argument("--decode_batches", default="16,256,4096,16384")
  ap.add_argument("--update_batches", default="64,256,1024,16384")
  ap.add_argument("--out", default="", help="write the table as JSON here")
  ap.add_argument("--quick", action="store_true", help="N = 64, 256; small calibration, 3 repeats")
  args = ap.parse_args(argv)
  if args.quick:
    # probe batches 16-32x apart and the median of 3: one slow call at a small
    # batch on a loaded machine (the test suite runs two at once) must not
    # leave the fit without a slope
    args.ns, args.repeats, args.decode_batches, args.update_batches = (
        "64,256",
        3,
        "16,512",
        "32,512",
    )
  ints = lambda s: [int(x) for x in s.split(",") if x]
  ns, dec_b, upd_b = ints(args.ns), ints(args.decode_batches), ints(args.update_batches)
  if args.repeats < 1:
    ap.error(f"--repeats must be >= 1, got {args.repeats}")

  config = default_cfg.get_config()
  config.noise.split_every = 0  # the planner models the training update alone
  K = config.batch.rollouts_per_prompt
  bad = [n for n in ns if n % K or n <= 0]
  if bad:
    ap.error(f"--ns: {bad} are not positive multiples of K = {K}")
  t = time.perf_counter()
  calib = floors.Probes(config, dec_b, upd_b)
  setup = calib.setup
  graphdef, params = model_lib.build(setup.model, seed=0)
  dims = systems.ModelDims.from_config(setup.model)
  Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
  runs = {}
  for n in ns:
    runs[n] = round_fn(config, graphdef, params, setup, n)
    runs[n]()  # compiles
  print(
      f"jax {jax.__version__} on {jax.devices()[0].device_kind}; compiled in "
      f"{time.perf_counter() - t:.0f} s",
      flush=True,
  )
  # the timings are interleaved: each repeat times one set of calibration
  # probes, then one round at every N, so that the machine's drift (on this
  # shared 2-core VM a small update's speed wanders by +-30% over seconds)
  # hits the probes and the rounds alike, and both medians are taken over
  # the whole run. Each timed round follows an untimed round of its own N,
  # as in a run at that N, after the process has gone quiet (a
  # 16,384-rollout update hands its 3.3 GiB temporary back to the kernel
  # for ~0.3 s after it returns; docs/planner.md, "Host memory")
  samples, parts = [], {n: [] for n in ns}
  usage = {n: [0, 0.0] for n in ns}
  for i in range(args.repeats):
    samples.append(calib.once())
    for n in ns:
      probes.settle()
      runs[n]()
      r0 = resource.getrusage(resource.RUSAGE_SELF)
      parts[n].append(runs[n]())
      r1 = resource.getrusage(resource.RUSAGE_SELF)
      # the kernel's page faults and system time, to tell a slow round's
      # cause from the numbers
      usage[n][0] += (r1.ru_minflt - r0.ru_minflt) / args.repeats
      usage[n][1] += (r1.ru_stime - r0.ru_stime) / args.repeats
    print(f"  repeat {i + 1}/{args.repeats}", flush=True)
  ov, raw = calib.fit(samples)
  acc = calib.acc
  print(f"roofline: {systems.describe(acc)}")
  print(
      f"overheads: decode step floor {ov.decode_step_s * 1e6:.1f} us, efficiency "
      f"{ov.decode_efficiency:.3f}; update floor {ov.update_step_s * 1e3:.2f} ms, efficiency "
      f"{ov.train_efficiency:.3f}; round fixed cost {ov.round_trip_s * 1e6:.1f} us (one round trip {raw['round_trip_s'] * 1e6:.1f} us); host "
      f"{ov.host_per_rollout_s * 1e6:.2f} us per rollout",
      flush=True,
  )
  for kind in ("decode", "train"):
    at = getattr(ov, f"{kind}_efficiency_at")
    print(f"{kind} efficiency by batch: " + ", ".join(f"{int(b)}: {e:.3f}" for b, e in at))

  rows = []
  for n in ns:
    gen = statistics.median(p[0] for p in parts[n])
    upd = statistics.median(p[1] for p in parts[n])
    total = statistics.median(sum(p) for p in parts[n])
    pred = systems.round_time(dims, acc, n, Tp, Tc, overheads=ov, updates=1)
    bare = systems.round_time(dims, acc, n, Tp, Tc)
    rows.append(
        dict(
            n=n,
            measured_s=total,
            gen_s=gen,
            update_s=upd,
            predicted_s=pred.total_s,
            pred_gen_s=pred.gen_s + pred.host_s,
            pred_update_s=pred.train_s,
            ratio=total / pred.total_s,
            roofline_ratio=total / bare.total_s,
            faults=usage[n][0],
            sys_s=usage[n][1],
        )
    )

  print()
  print(
      f"{'N':>6} {'measured r/s':>13} {'predicted r/s':>14} {'ratio':>7} "
      f"{'gen ratio':>10} {'upd ratio':>10} {'roofline only':>14} {'faults':>10} {'sys ms':>7}"
  )
  for r in rows:
    print(
        f"{r['n']:>6} {r['n'] / r['measured_s']:>13,.0f} {r['n'] / r['predicted_s']:>14,.0f} "
        f"{r['ratio']:>7.3f} {r['gen_s'] / r['pred_gen_s']:>10.3f} "
        f"{r['update_s'] / r['pred_update_s']:>10.3f} {r['roofline_ratio']:>14.2f}"
        f" {r['faults']:>10,.0f} {r['sys_s'] * 1e3:>7.0f}"
    )
  print(
      "ratio = predicted / measured rollouts/s; gen, upd ratio = measured / predicted seconds;"
      " faults, sys ms: page faults and system time per round (mean)"
  )
  worst = max((r["ratio"] for r in rows), key=lambda x: abs(math.log(x)))
  inside = sum(0.75 <= r["ratio"] <= 1.25 for r in rows)
  if args.out:
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
      json.dump(dict(overheads=ov.as_dict(), calibration=raw, rows=rows), f, indent=1)
  print(f"RESULT planner_worst_ratio={worst:.3f} within_25pct={inside}/{len(rows)}")


if __name__ == "__main__":
  main()
