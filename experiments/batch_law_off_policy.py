"""The off-policy batch-size law: each generation round's N rollouts reused
for 4 and for 8 updates, against the on-policy law on the same grid.

    python experiments/batch_law_off_policy.py                 # (~1.5 h, 2 workers)
    python experiments/batch_law_off_policy.py --quick         # tiny smoke version
    python experiments/batch_law_off_policy.py --replot        # tables and figures from the committed files

Runs ``configs/batch_law.py:off4`` and ``:off8`` through ``cbs_jax.sweep``
(resumable) under ``--root``: the on-policy grid (N = 64 ... 16,384 rollouts
per generation round, K = 16, 3 seeds, the same lr0 and sqrt rule on the
rollouts of one update, N / m), each round split into m = 4 or 8 prompt
minibatches, one epoch: m optimizer updates per round, all but the first
off-policy (importance ratios against the stored behaviour log-probs, PPO
clip 0.2). Steps-to-target are counted in generation rounds (the unit of
the published off-policy claim: how many times one must generate) and in
optimizer steps; rollouts-to-target E = N x rounds. S(N) in rounds is
fitted per target as on-policy, and the ratio B_crit(off) / B_crit(on)
is given with a bootstrap interval (independent bootstrap replicates of
the two fits, paired at random). The on-policy sweep is read from
``--on_root`` (run experiments/batch_law_on_policy.py first; its finished
runs are read back, not rerun).

Writes experiments/results/batch_law_off_policy/: table (.md, .csv),
per-run learning curves of every arm, on-policy included (``_curves.csv``),
to-target per run (``_runs.csv``), S(N) / Pareto / learning-curve figures
for m = 4 and 8, fits JSON and manifest.json. ``--replot`` rebuilds every
table and figure from those files alone.
"""

from __future__ import annotations

import os
import time

from absl import logging

from cbs_jax import batch_law as batch_law_lib
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from configs import batch_law

NAME = "batch_law_off_policy"


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "sweep root of the off-policy runs",
      on_root_help="sweep root of the on-policy study",
      root="runs/batch_law_off",
      replot=True,
  )
  ap.add_argument("--reuse", default="4,8", help="updates per round (m) to run")
  return study_runner.parse(ap, argv)


def quick_overrides(m):
  return [
      dict(o, **{"batch.num_minibatches": m})
      for o in batch_law.sweep("quick")
      if o["batch.num_prompts"] >= m
  ]


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  ms = [int(m) for m in args.reuse.split(",")]
  arg_on = "quick" if args.quick else "on"
  tgt = batch_law.targets(arg_on)
  c_on = batch_law.get_config(arg_on)
  configs = {"on": c_on}
  overrides = {}
  for m in ms:
    name = f"off{m}"
    if args.quick:
      c, over = batch_law.get_config("quick"), quick_overrides(m)
    else:
      c, over = batch_law.get_config(name), batch_law.sweep(name)
    configs[name], overrides[name] = study_runner.on_policy_base(c, args.on_root), over

  def make():
    if args.quick:  # its own tiny on-policy sweep
      on_rows = study_runner.run_study(
          c_on, batch_law.sweep(arg_on), args.on_root, workers=args.workers
      )
    else:  # read back, never rerun: experiments/batch_law_on_policy.py runs it
      on_rows = study_runner.read_finished(batch_law.sweep(arg_on), args.on_root)
    groups = {"on": study.collect(on_rows, tgt, c_on)}
    for name, over in overrides.items():
      c = configs[name]
      rows = study_runner.run_study(c, over, os.path.join(args.root, name), workers=args.workers)
      groups[name] = study.collect(rows, tgt, c)
    return groups

  records = study_runner.records(args, out, tgt, make)
  fits = {"on": study.fit_targets(records["on"], tgt)}
  for name in overrides:
    fits[name] = study.fit_targets(records[name], tgt, x="rounds")
    fits[f"{name}_steps"] = study.fit_targets(records[name], tgt, x="steps")

  # ------------------------------------------------------------ tables
  show, cols = [], None
  for name, recs in records.items():
    rows, cols = study_report.summary_table(
        study.per_batch_rows(recs, tgt), tgt, extra=("updates/round",)
    )
    for r, raw in zip(rows, study.per_batch_rows(recs, tgt)):
      r["updates/round"] = raw["updates_per_round"]
    show += rows
  ratio_lines = [
      "| target | m | B_crit(off) / B_crit(on) (rounds) | 90% interval |",
      "|---|---|---|---|",
  ]
  for name in records:
    if name == "on":
      continue
    for t in tgt:
      t = float(t)
      a, b = fits[name][t], fits["on"][t]
      if "error" in a or "error" in b:
        ratio_lines.append(f"| {t} | {name[3:]} | – | unresolved (a fit is missing) |")
        continue
      lo, hi = batch_law_lib.bootstrap_ratio_interval(a["boot_B_crit"], b["boot_B_crit"])
      both = a["resolved"] and b["resolved"]
      ratio_lines.append(
          f"| {t} | {name[3:]} | {a['B_crit'] / b['B_crit']:.3g} | "
          f"[{stats.fmt(lo)}, {stats.fmt(hi)}]"
          f"{'' if both else ' (a fit is unresolved)'} |"
      )
  notes = []
  for name in fits:
    unit = "optimizer steps" if name.endswith("_steps") else "rounds"
    notes += [
        f"## {name}: S(N) = S_min (1 + B_crit / N) in {unit}",
        "",
        *study_report.fit_lines(fits[name], unit),
        "",
    ]
  notes += [
      "## Off-policy over on-policy critical batch size (S in generation rounds)",
      "",
      *ratio_lines,
      "",
      "Published: on-policy ~311 rollouts, off-policy ~5,400-5,900 (~18x).",
      "Intervals: S and E, 90% t-intervals over seeds; fits and the ratio, 90% "
      f"bootstrap percentile intervals. Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      show,
      cols,
      title="Off-policy batch-size law: each round reused for m updates "
      "(rounds-to-target S, rollouts-to-target E)",
      notes="\n".join(notes),
  )
  study_report.write_runs_csv(
      out.path("_runs.csv"), [r for rs in records.values() for r in rs], tgt
  )
  study_report.save_fits(out.path("_fits.json"), fits)
  main_t = float(tgt[len(tgt) // 2])
  for name in records:
    if name != "on":
      study_report.law_figures(
          out,
          records[name],
          fits[name][main_t],
          main_t,
          f"off-policy, {name[3:]} updates per round",
          prefix=f"_{name}",
      )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=[args.root, args.on_root],
      config={k: v.to_dict() for k, v in configs.items()},
      wall_seconds=time.time() - t0,
      targets=list(tgt),
      reuse=ms,
  )


if __name__ == "__main__":
  main()
