"""Throughput against batch size, and the time-to-target decision rule.

    python experiments/throughput_decision.py          # benchmark + decision (~15 min, idle machine)
    python experiments/throughput_decision.py --quick  # tiny smoke version
    python experiments/throughput_decision.py --replot # tables and figures from the committed files

Published claim: a larger batch lowers time-to-target only when its
generation-throughput gain exceeds its samples-to-target penalty. Two parts:

1. A dedicated benchmark, one process on an otherwise idle machine (all
   cores): at each N of the on-policy grid (K = 16, the study's model and
   SFT base), the median wall time of generating a round
   (``train.round_batch``: sample, verify, advantages) and of its update
   (``train.update_round``: one jitted call), after a warm-up round.
   rollouts/s = N / (t_generate + t_update). Beside it, the roofline of the
   same round on this CPU (``cbs_jax.systems.round_time`` with the matmul
   FLOP/s and memory bandwidth measured in the same run): measured over
   roofline says how far from the hardware limit each N runs.
2. The decision: predicted time-to-target T(N) = E(N) / throughput(N), with
   E(N) the on-policy study's rollouts-to-target (mean and t-interval over
   seeds, read back from ``--on_root``), and at each step N -> 2N the rule
   "larger pays iff throughput(2N)/throughput(N) > E(2N)/E(N)". With
   ``--measure`` the seed-0 run of each N is repeated here, one at a time,
   and its training time to the target (the generation + update seconds it
   logged up to the crossing round, the first round's compile set apart,
   ``study.time_to_target``) is the measured T(N) the prediction is checked
   against; compile and evaluation seconds are reported beside it.

Writes experiments/results/throughput_decision/: throughput.json (the
per-N rates, read by experiments/adaptive_batch.py), the on-policy runs'
learning curves (``_curves.csv``), the --measure runs' times to the target
(``_measured.json``), the tables (.md, .csv), a figure of throughput and
T(N) against N, manifest.json. ``--replot`` rebuilds the tables and
figures from those files alone.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import logging

from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import probes
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_runner
from cbs_jax import systems
from cbs_jax import train
from configs import batch_law

NAME = "throughput_decision"


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "workdirs of the benchmark and of --measure",
      on_root_help="the on-policy study's sweep root (E(N), the SFT base)",
      workers=False,
      replot=True,
  )
  ap.add_argument("--repeats", type=int, default=5, help="timed rounds per N (median)")
  ap.add_argument(
      "--measure",
      action="store_true",
      help="also rerun seed 0 of every N and time it to the target",
  )
  args = study_runner.parse(ap, argv)
  if args.quick:
    args.repeats = 2
  return args


def benchmark(c, root, ns, repeats):
  """Median generate / update seconds per round at each N (one process)."""
  setup = run_setup.prepare(c)
  trainer, state = train.start_run(c, os.path.join(root, "bench"), setup)
  K = c.batch.rollouts_per_prompt
  out = []
  for N in ns:
    P = N // K
    tg, tu = [], []
    for i in range(repeats + 1):  # the first round compiles
      t0 = time.perf_counter()
      batch, _, _ = train.round_batch(c, trainer.graphdef, state.params, None, setup, 10_000 + i, P)
      t1 = time.perf_counter()
      train.update_round(trainer, state, batch, 10_000 + i, P)
      t2 = time.perf_counter()
      if i:
        tg.append(t1 - t0)
        tu.append(t2 - t1)
    g, u = float(np.median(tg)), float(np.median(tu))
    out.append(dict(N=N, gen_seconds=g, update_seconds=u, rollouts_per_s=N / (g + u)))
    print(f"N={N}: generate {g:.4f} s, update {u:.4f} s, {N / (g + u):.0f} rollouts/s", flush=True)
  trainer.writer.close()
  trainer.ckpt.close()
  return out, setup


def measured_columns(m, rate):
  """The --measure columns of one N's row from ``study.time_to_target``."""
  if not m:
    return dict(T_measured=None, run_vs_bench=None, T_overhead=None)
  return dict(
      T_measured=m["train"],
      run_vs_bench=m["rollouts"] / m["train"] / rate,
      T_overhead=m["compile"] + m["eval"],
  )


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  arg = "quick" if args.quick else "on"
  c = batch_law.get_config(arg)
  tgt = batch_law.targets(arg)
  main_t = float(tgt[len(tgt) // 2])
  sweep_over = batch_law.sweep(arg)

  def on_policy():
    if args.quick:
      return study_runner.run_study(c, sweep_over, args.on_root, workers=1)
    return study_runner.read_finished(sweep_over, args.on_root)

  recs = study_runner.records(args, out, tgt, lambda: {"on": study.collect(on_policy(), tgt, c)})[
      "on"
  ]
  ns = sorted({r["N"] for r in recs})
  K = c.batch.rollouts_per_prompt
  rates_path = paths.join(out.dir, "throughput.json")
  measured_path = out.path("_measured.json")

  if not args.replot:
    # -------------------------------------------------------- 1. benchmark
    bc = c.copy_and_resolve_references()
    with bc.unlocked():
      bc.sft.base_dir = os.path.abspath(os.path.join(args.on_root, "sft_base"))
      bc.train.eval_every = 0
    thr, setup = benchmark(bc, args.root, ns, args.repeats)
    acc = probes.calibrate_cpu()
    Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
    for t in thr:
      t["roofline_rollouts_per_s"] = systems.rollouts_per_s(setup.model, acc, t["N"], Tp, Tc)
      t["vs_roofline"] = t["rollouts_per_s"] / t["roofline_rollouts_per_s"]
    report.write_json(
        rates_path,
        dict(
            N=[t["N"] for t in thr],
            rollouts_per_s=[t["rollouts_per_s"] for t in thr],
            rows=thr,
            machine=systems.describe(acc),
            K=K,
            repeats=args.repeats,
        ),
    )
    measured = {}
    if args.measure:  # seed 0 of every N rerun here, one at a time, and timed
      for N in ns:
        o = next(o for o in sweep_over if o["batch.num_prompts"] * K == N and o["seed"] == 0)
        row = study_runner.run_study(
            c, [o], os.path.join(args.root, "measure"), workers=1, progress=False
        )[0]
        measured[str(N)] = study.time_to_target(row["workdir"], main_t)
      report.write_json(measured_path, measured)
  # ------------------------------------------------------------ 2. decision
  doc = json.loads(paths.read_text(rates_path))  # as committed: the replot reads only these
  thr, machine, repeats = doc["rows"], doc["machine"], doc.get("repeats", args.repeats)
  measured = {}
  if paths.exists(measured_path) and (args.replot or args.measure):
    measured = {int(n): m for n, m in json.loads(paths.read_text(measured_path)).items()}
  if [t["N"] for t in thr] != ns:
    raise ValueError(f"{rates_path} holds N = {[t['N'] for t in thr]}, the runs N = {ns}")
  E = {
      N: study.seed_interval([r["to_target"][main_t]["rollouts"] for r in recs if r["N"] == N])
      for N in ns
  }
  rate = {t["N"]: t["rollouts_per_s"] for t in thr}
  rows = []
  for i, N in enumerate(ns):
    e = E[N]
    T = None if e["mean"] is None else e["mean"] / rate[N]
    d = dict(
        N=N,
        rollouts_per_s=rate[N],
        gen_s=thr[i]["gen_seconds"],
        update_s=thr[i]["update_seconds"],
        vs_roofline=thr[i]["vs_roofline"],
        E=stats.Estimate(e["mean"], e["lo"], e["hi"]),
        T_pred=stats.Estimate(
            T,
            None if e["lo"] is None else e["lo"] / rate[N],
            None if e["hi"] is None else e["hi"] / rate[N],
        ),
        **measured_columns(measured.get(N), rate[N]),
    )
    if i:
      P = ns[i - 1]
      gain, penalty = rate[N] / rate[P], (
          e["mean"] / E[P]["mean"] if e["mean"] and E[P]["mean"] else None
      )
      d["throughput_gain"] = gain
      d["samples_penalty"] = penalty
      d["rule: 2N pays"] = None if penalty is None else ("yes" if gain > penalty else "no")
      if measured.get(P) and measured.get(N):
        d["measured: 2N faster"] = "yes" if measured[N]["train"] < measured[P]["train"] else "no"
    rows.append(d)
  cols = [
      "N",
      "rollouts_per_s",
      "gen_s",
      "update_s",
      "vs_roofline",
      "E",
      "T_pred",
      "T_measured",
      "run_vs_bench",
      "T_overhead",
      "throughput_gain",
      "samples_penalty",
      "rule: 2N pays",
      "measured: 2N faster",
  ]
  notes = [
      f"Benchmark: one process, {repeats} timed rounds per N (median), K = {K}; "
      f"machine: {machine}. vs_roofline: measured rollouts/s over the "
      "roofline bound of the same round (systems.round_time). E: on-policy rollouts "
      f"to {main_t} (mean [90% t-interval] over seeds); T_pred = E / rollouts_per_s "
      "(seconds); T_measured (--measure): seed 0 rerun here, its logged generation + "
      "update seconds to the target with the first round counted at the median round "
      "(study.time_to_target); run_vs_bench: that run's rollouts/s to the target over "
      "the benchmark's; T_overhead: its compile (first round's excess) + evaluation "
      "seconds, not in the prediction. Rule: N -> 2N pays iff the throughput gain exceeds the samples "
      "penalty E(2N) / E(N).",
      f"Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      rows, cols, title="Throughput and the time-to-target decision", notes="\n\n".join(notes)
  )
  series = {
      "rollouts/s (measured)": [rate[N] for N in ns],
      "rollouts/s (roofline)": [t["roofline_rollouts_per_s"] for t in thr],
  }
  plots.save(
      plots.noise_over_training(
          ns,
          series,
          xlabel="batch size N (rollouts)",
          ylabel="throughput (rollouts/s)",
          logx=True,
          title="throughput against N",
      ),
      out.path(".png"),
  )
  tp = {"T predicted (s)": [None if E[N]["mean"] is None else E[N]["mean"] / rate[N] for N in ns]}
  if measured:
    tp["T measured, seed 0 (s)"] = [(measured.get(N) or {}).get("train") for N in ns]
    tp["T measured + compile + eval (s)"] = [(measured.get(N) or {}).get("total") for N in ns]
  band = (
      [E[N]["lo"] and E[N]["lo"] / rate[N] for N in ns],
      [E[N]["hi"] and E[N]["hi"] / rate[N] for N in ns],
  )
  plots.save(
      plots.noise_over_training(
          ns,
          tp,
          bands={"T predicted (s)": band},
          xlabel="batch size N (rollouts)",
          ylabel=f"time to {main_t} (s)",
          logx=True,
          title="time to target against N (predicted: " "seed mean, 90% interval)",
      ),
      out.path("_time.png"),
  )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(runs_root=args.root, config=c, wall_seconds=time.time() - t0, targets=list(tgt))


if __name__ == "__main__":
  main()
