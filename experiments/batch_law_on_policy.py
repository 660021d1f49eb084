"""The on-policy batch-size law: steps- and rollouts-to-target against N, the
fitted critical batch size with its bootstrap interval, and the measured
gradient-noise scale at the same K.

    python experiments/batch_law_on_policy.py                  # the study (~1 h, 2 workers)
    python experiments/batch_law_on_policy.py --tune           # the lr scan at N = 256 first
    python experiments/batch_law_on_policy.py --quick          # tiny smoke version (minutes)
    python experiments/batch_law_on_policy.py --replot         # tables and figures from the committed files

Runs ``configs/batch_law.py:on`` through ``cbs_jax.sweep`` (resumable: an
interrupted study continues and redoes no finished run) under ``--root``:
N = 64 ... 16,384 rollouts per round (K = 16), 3 seeds, one update per
round, lr = lr0 sqrt(N / 256), each run stopped at the highest target of
held-out exact expected pass rate. For each target: S(N) in generation
rounds and E(N) = N S(N) in rollouts with t-intervals over seeds, and
S = S_min (1 + B_crit / N) fitted with seeds as replicates and a bootstrap
interval (``cbs_jax.batch_law.fit_critical_batch``; "unresolved" when the
interval leaves the swept range). Beside it, B_noise at K = 16 measured by
``cbs_jax.measure`` (pooled batches at fixed parameters, jackknife SEs) at
the SFT base and at the end of the N = 256 run.

``--tune`` scans lr0 at N = 256 (one seed) and picks the smallest lr whose
rollouts to the middle target are within 15% of the fewest (one seed does
not resolve smaller differences, and the sqrt rule multiplies lr0 by up to
8x at the largest N); ``configs/batch_law.py``'s LR0 is that value.

Writes experiments/results/batch_law_on_policy/: the table (.md, .csv), the
per-run learning curves (``_curves.csv``; ``_tune_curves.csv`` with --tune),
to-target per run (``_runs.csv``), the fits and B_noise (``_fits.json``), the
S-E Pareto and S(N) figures, learning curves by rollouts and by rounds,
``tune.md`` (with --tune) and manifest.json. ``--replot`` rebuilds every
table and figure from those files alone.
"""

from __future__ import annotations

import json
import os
import time

from absl import logging

from cbs_jax import measure
from cbs_jax import paths
from cbs_jax import report
from cbs_jax import rounding
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from configs import batch_law

NAME = "batch_law_on_policy"
TUNE_LRS = (1.5e-4, 3e-4, 6e-4, 1.2e-3)
NEAR = 1.15


def parse_args(argv=None):
  # the other studies read this sweep back: its root is their --on_root default
  ap = study_runner.parser(
      __doc__,
      NAME,
      "sweep root (one workdir per run)",
      root="runs/batch_law_on",
      quick_root="runs_on",
      replot=True,
  )
  ap.add_argument(
      "--noise_batches",
      type=int,
      default=16,
      help="batches pooled per B_noise measurement (0 = skip)",
  )
  ap.add_argument("--tune", action="store_true", help="run the lr0 scan at N = 256 first")
  args = study_runner.parse(ap, argv)
  if args.quick:
    args.noise_batches = min(args.noise_batches, 2)
  return args


def tune(args, out):
  """lr0 scan at N = 256, one seed: rollouts to the middle target."""
  arg = "quick" if args.quick else "on"
  c = batch_law.get_config(arg)
  tgt = batch_law.targets(arg)
  mid = float(tgt[len(tgt) // 2])
  N = 16 if args.quick else 256
  over = [
      {
          "batch.num_prompts": N // c.batch.rollouts_per_prompt,
          "optim.lr": lr,
          "train.eval_every": batch_law.eval_every(N) if not args.quick else 2,
          "train.num_rounds": 24 if args.quick else 1200,
      }
      for lr in TUNE_LRS
  ]
  recs = study_runner.records(
      args,
      out,
      tgt,
      lambda: {
          "tune": study.collect(
              study_runner.run_study(
                  c, over, os.path.join(args.root, "tune"), workers=args.workers
              ),
              tgt,
              c,
          )
      },
      "_tune_curves.csv",
  )["tune"]
  table = [
      dict(lr=r["lr"], **{f"rollouts@{t}": r["to_target"][float(t)]["rollouts"] for t in tgt})
      for r in recs
  ]
  reached = [r for r in recs if r["to_target"][mid]["rollouts"] is not None]
  best = min(reached, key=lambda r: r["to_target"][mid]["rollouts"]) if reached else None
  # one seed cannot tell apart lrs within ~15%: take the smallest of those
  # (the sqrt rule multiplies it by up to 8x at the largest N)
  near = [
      r
      for r in reached
      if best and r["to_target"][mid]["rollouts"] <= NEAR * best["to_target"][mid]["rollouts"]
  ]
  chosen = min(r["lr"] for r in near) if near else None
  md = report.markdown_table(table, ["lr"] + [f"rollouts@{t}" for t in tgt])
  md = (
      f"# lr0 scan at N = {N} (one seed)\n\n{md}\n\nfewest rollouts to {mid}: lr0 = "
      f"{best and best['lr']}; within {NEAR:.2f}x of it: {sorted(r['lr'] for r in near)}; "
      f"chosen (the smallest of those): lr0 = {chosen}\n"
  )
  paths.write_atomic(os.path.join(out.dir, "tune.md"), md)
  print(md)
  return chosen


def measure_noise(c, workdir, setup, P, K, M, label):
  """B_noise etc. at the checkpoint in ``workdir`` (round 0: the SFT base)."""
  graphdef, params, rnd, opt = measure.load_policy(c, workdir, setup, with_opt_state=True)
  res = measure.measure(c, graphdef, params, setup, P, K, M, progress=False, opt_state=opt)
  e = res["exact"]
  row = dict(
      stage=label,
      round=rnd,
      P=P,
      K=K,
      batches=M,
      reward=res["reward_mean"],
      b_noise=e.b_noise,
      b_noise_se=e.b_noise_se,
      b_intra=e.b_intra,
      b_inter=e.b_inter,
      ratio=e.ratio,
      ratio_se=e.ratio_se,
      flag=e.flag or "",
  )
  if "adam" in res:
    row["b_noise_adam"], row["b_noise_adam_se"] = res["adam"].b_noise, res["adam"].b_noise_se
  return row


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  if args.tune:
    tune(args, out)
  arg = "quick" if args.quick else "on"
  c = batch_law.get_config(arg)
  tgt = batch_law.targets(arg)
  recs = study_runner.records(
      args,
      out,
      tgt,
      lambda: {
          "on": study.collect(
              study_runner.run_study(c, batch_law.sweep(arg), args.root, workers=args.workers),
              tgt,
              c,
          )
      },
  )["on"]
  fits = study.fit_targets(recs, tgt, x="rounds")
  table = study.per_batch_rows(recs, tgt)

  noise_rows = []
  if args.replot:  # the committed measurements
    noise_rows = json.loads(paths.read_text(out.path("_fits.json"))).get("noise", [])
  elif args.noise_batches:
    setup = run_setup.prepare(c)
    ref = min(recs, key=lambda r: (abs(r["N"] - 256), r["seed"]))
    P = 4 if args.quick else 64
    K = c.batch.rollouts_per_prompt
    noise_rows.append(
        measure_noise(
            c, os.path.join(args.root, "_base_probe"), setup, P, K, args.noise_batches, "SFT base"
        )
    )
    noise_rows.append(
        measure_noise(
            c,
            os.path.join(args.root, ref["name"]),
            setup,
            P,
            K,
            args.noise_batches,
            f"end of N={ref['N']} seed {ref['seed']}",
        )
    )

    noise_rows = rounding.stable(noise_rows)  # as _fits.json commits them

  # ------------------------------------------------------------ the table
  show, cols = study_report.summary_table(table, tgt)
  notes = [
      "## S(N) = S_min (1 + B_crit / N), seeds as replicates (90% bootstrap intervals)",
      "",
      *study_report.fit_lines(fits),
      "",
  ]
  if noise_rows:
    notes += [
        "## Gradient-noise scale at the same K (pooled, ± jackknife SE)",
        "",
        report.markdown_table(
            [
                dict(
                    r,
                    b_noise=stats.Estimate(r["b_noise"], se=r["b_noise_se"]),
                    b_noise_adam=stats.Estimate(r.get("b_noise_adam"), se=r.get("b_noise_adam_se")),
                    ratio=stats.Estimate(r["ratio"], se=r["ratio_se"]),
                )
                for r in noise_rows
            ],
            ["stage", "round", "P", "K", "batches", "b_noise", "b_noise_adam", "ratio", "flag"],
        ),
        "",
    ]
  notes += [
      "Intervals: S and E, 90% t-intervals over seeds; fits, 90% residual-bootstrap "
      f"percentile intervals. Command: `{out.command(args.replot)}`."
  ]
  out.table(
      show,
      cols,
      title="On-policy batch-size law (GRPO, arithmetic, K = " f"{c.batch.rollouts_per_prompt})",
      notes="\n".join(notes),
  )
  study_report.write_runs_csv(out.path("_runs.csv"), recs, tgt)
  study_report.save_fits(out.path("_fits.json"), {"on": fits}, noise=noise_rows)
  main_t = float(tgt[len(tgt) // 2])
  bn = [r["b_noise"] for r in noise_rows if r["b_noise"] == r["b_noise"]] or None
  study_report.law_figures(out, recs, fits[main_t], main_t, "on-policy", b_noise=bn)
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=args.root,
      config=c,
      wall_seconds=time.time() - t0,
      sweep=batch_law.sweep(arg),
      targets=list(tgt),
  )


if __name__ == "__main__":
  main()
