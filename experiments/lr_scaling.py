"""Learning-rate rules across the batch grid: which rule makes the rollout-
indexed learning curves collapse, and over which N the sqrt rule holds.

    python experiments/lr_scaling.py                   # (~1 h, 2 workers)
    python experiments/lr_scaling.py --quick           # tiny smoke version
    python experiments/lr_scaling.py --replot          # tables and figures from the committed files

Runs ``configs/batch_law.py:lr_constant`` and ``:lr_linear`` (lr = lr0 and
lr = lr0 N / 256) at N = 64, 256, 1,024, 4,096, 16,384, 3 seeds, through
``cbs_jax.sweep`` (resumable); the sqrt rule's runs are the on-policy
study's (read back from ``--on_root``, never rerun). A run whose held-out
pass rate falls below 0.30 is stopped (a diverged rule; counted as never
reaching the target).

Collapse is measured two ways: E(N) (rollouts to target, with t-intervals
over seeds) relative to the smallest N -- a rule under which runs follow one
rollout-indexed curve keeps E(N) / E(64) near 1 -- and the curve distance:
the mean absolute difference of the seed-mean rollout-indexed curves from
the N = 256 curve (the tuned reference) over their common rollout range.
"Holds" at N means E(N) / E(64) <= 1.25 (the samples penalty at N = B_crit
is 2x: 1.25 sits well inside the perfect-scaling regime).

Writes experiments/results/lr_scaling/: table (.md, .csv), per-run
learning curves of every rule (``_curves.csv``), to-target per run
(``_runs.csv``), learning curves per rule, manifest.json. ``--replot``
rebuilds every table and figure from those files alone.
"""

from __future__ import annotations

import functools
import os
import time

import numpy as np
from absl import logging

from cbs_jax import lr_rules
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from configs import batch_law

NAME = "lr_scaling"
RULES = lr_rules.LR_RULES
HOLDS = 1.25


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "sweep root of the constant/linear runs",
      on_root_help="the on-policy study's sweep root, the sqrt runs",
      replot=True,
  )
  ap.add_argument(
      "--rules",
      default=",".join(RULES),
      help="rules to compare, comma-separated (the sqrt runs are read back)",
  )
  args = study_runner.parse(ap, argv)
  args.rules = [r for r in args.rules.split(",") if r]
  bad = [r for r in args.rules if r not in RULES]
  if bad or not args.rules:
    ap.error(f"--rules: unknown {bad}; known: {list(RULES)}")
  return args


def curve_distance(curves, ref) -> float | None:
  """Mean |mean curve - reference curve| over their common rollout range."""
  if not len(curves["x"]) or not len(ref["x"]):
    return None
  lo, hi = max(curves["x"][0], ref["x"][0]), min(curves["x"][-1], ref["x"][-1])
  if hi <= lo:
    return None
  grid = np.geomspace(lo, hi, 40)
  return float(
      np.mean(
          np.abs(
              np.interp(grid, curves["x"], curves["mean"]) - np.interp(grid, ref["x"], ref["mean"])
          )
      )
  )


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  quick = args.quick
  tgt = batch_law.targets("quick" if quick else "on")
  main_t = float(tgt[len(tgt) // 2])
  configs, sweeps = {}, {}
  rules = [r for r in RULES if r in args.rules]
  for rule in rules:
    if quick:  # the sqrt runs are the quick on-policy sweep's (run here if missing)
      c = batch_law.get_config("quick")
      if rule != "sqrt":  # its own runs, from the on-policy sweep's base
        c = study_runner.on_policy_base(c, args.on_root)
      c.optim.lr_rule = rule
      where = args.on_root if rule == "sqrt" else os.path.join(args.root, rule)
      run = functools.partial(
          study_runner.run_study, c, batch_law.sweep("quick"), where, workers=args.workers
      )
    elif rule == "sqrt":
      c = batch_law.get_config("on")
      over = [
          o
          for o in batch_law.sweep("on")
          if o["batch.num_prompts"] * batch_law.K in batch_law.LR_NS
      ]
      run = functools.partial(study_runner.read_finished, over, args.on_root)
    else:
      c = study_runner.on_policy_base(batch_law.get_config(f"lr_{rule}"), args.on_root)
      run = functools.partial(
          study_runner.run_study,
          c,
          batch_law.sweep(f"lr_{rule}"),
          os.path.join(args.root, rule),
          workers=args.workers,
      )
    configs[rule], sweeps[rule] = c, run
  records = study_runner.records(
      args, out, tgt, lambda: {r: study.collect(sweeps[r](), tgt, configs[r]) for r in rules}
  )

  table, curves_fig = [], []
  for rule in rules:
    recs = records[rule]
    ns = sorted({r["N"] for r in recs})
    ref_n = 16 if quick else 256
    mc = {N: study.mean_curve([r["curve"] for r in recs if r["N"] == N]) for N in ns}
    e0 = study.seed_interval([r["to_target"][main_t]["rollouts"] for r in recs if r["N"] == ns[0]])[
        "mean"
    ]
    for N in ns:
      rs = [r for r in recs if r["N"] == N]
      e = study.seed_interval([r["to_target"][main_t]["rollouts"] for r in rs])
      collapsed = sum(bool(r["summary"].get("stopped_collapsed")) for r in rs)
      ratio = e["mean"] / e0 if e["mean"] and e0 else None
      oc = configs[rule].optim
      table.append(
          dict(
              rule=rule,
              N=N,
              lr=oc.lr * lr_rules.lr_scale(rule, N, oc.ref_batch),
              E=stats.Estimate(e["mean"], e["lo"], e["hi"]),
              E_ratio=ratio,
              holds=None if ratio is None else ("yes" if ratio <= HOLDS else "no"),
              distance=curve_distance(mc[N], mc.get(ref_n, mc[ns[0]])),
              reached=f"{sum(r['to_target'][main_t]['rollouts'] is not None for r in rs)}"
              f"/{len(rs)}",
              collapsed=collapsed,
          )
      )
    for N in ns:
      if len(mc[N]["x"]):
        curves_fig.append(
            dict(
                label=f"{rule} N={N}",
                rollouts=mc[N]["x"],
                steps=mc[N]["x"] / N,
                value=mc[N]["mean"],
            )
        )
  cols = ["rule", "N", "lr", "E", "E_ratio", "holds", "distance", "reached", "collapsed"]
  notes = [
      f"E: rollouts to expected pass {main_t} (mean [90% t-interval] over seeds); "
      "E_ratio: E(N) / E(smallest N); holds: E_ratio <= 1.25; distance: mean "
      "|pass(curve) - pass(N=256 curve)| over the common rollout range (seed means); "
      f"collapsed: runs stopped below pass {batch_law.COLLAPSED}.",
      f"Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      table, cols, title=f"Learning-rate rules across N (target {main_t})", notes="\n\n".join(notes)
  )
  study_report.write_runs_csv(
      out.path("_runs.csv"),
      [dict(r, name=f"{k}/{r['name']}") for k, v in records.items() for r in v],
      tgt,
  )
  for rule in rules:
    fig = plots.learning_curves(
        [c for c in curves_fig if c["label"].startswith(rule + " ")],
        target=main_t,
        title=f"lr rule: {rule}",
        step_label="generation rounds",
        logx=True,
    )
    plots.save(fig, out.path(f"_{rule}.png"))
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=[args.root, args.on_root],
      config={k: v.to_dict() for k, v in configs.items()},
      wall_seconds=time.time() - t0,
      targets=list(tgt),
  )


if __name__ == "__main__":
  main()
