"""Gradient noise of the default run: precise measurements early and late,
and the split-estimator tracker over training.

    python -m cbs_jax.main --config=configs/default.py --workdir=runs/default
    python experiments/noise_over_training.py --workdir=runs/default
    python experiments/noise_over_training.py --quick      # tiny smoke version

Measures the SFT base (round 0, "early") and the latest RL checkpoint
("late") with ``cbs_jax.measure`` (M pooled P x K batches, jackknife SEs),
then writes under experiments/results/noise_over_training/: the table
(.md, .csv), every number (.json), the tracker's B_noise with its interval
over training beside the precise points (.png) and manifest.json.

``--quick`` first trains ``configs/default.py:smoke`` (30 SFT steps, 4 RL
rounds) in ``<out>/runs/default`` (unless that workdir already holds a
finished run), then measures it with P = 4, K = 4, M = 2; ``--out``
defaults to a fresh temp folder.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

import numpy as np
from absl import logging

from cbs_jax import measure
from cbs_jax import metrics as metrics_lib
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import train
from configs import default

KEYS = ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio")

# --quick: defaults of a tiny measurement (explicit flags still win)
QUICK = dict(workdir=None, prompts=4, rollouts=4, batches=2, out=None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  pass


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
  ap.add_argument(
      "--workdir",
      default="runs/default",
      help="Finished default run (--quick: <out>/runs/default, trained if unfinished).",
  )
  ap.add_argument("--prompts", type=int, default=64, help="P per measurement batch.")
  ap.add_argument("--rollouts", type=int, default=16, help="K per measurement batch.")
  ap.add_argument("--batches", type=int, default=24, help="Batches pooled per measurement.")
  ap.add_argument(
      "--out", default="experiments/results", help="Output folder (--quick: a fresh temp folder)."
  )
  ap.add_argument(
      "--quick",
      action="store_true",
      help="Tiny smoke version (well under a minute): train the smoke config, "
      "measure with P=4, K=4, M=2, everything under --out.",
  )
  args = ap.parse_args(argv)
  if args.quick:
    ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="noise_over_training_quick_")
    args.workdir = args.workdir or os.path.join(args.out, "runs", "default")
  return args


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  out = report.Results("noise_over_training", root=args.out)
  if args.quick:
    config = default.get_config("smoke")
    if not os.path.exists(os.path.join(args.workdir, "summary.json")):
      train.train_and_evaluate(config, args.workdir)  # resumes an interrupted one
  else:
    config = default.get_config()
  setup = run_setup.prepare(config)
  results = {}
  for label, rnd in (("early", 0), ("late", None)):
    graphdef, params, r, opt = measure.load_policy(
        config, args.workdir, setup, rnd, with_opt_state=True
    )
    res = measure.measure(
        config, graphdef, params, setup, args.prompts, args.rollouts, args.batches, opt_state=opt
    )
    print(f"--- {label} (round {r})")
    print(measure.format_table(res))
    results[label] = dict(round=r, **measure.to_json(res))
  rows = metrics_lib.read_jsonl(os.path.join(args.workdir, "metrics.jsonl"))
  track = [r for r in rows if "noise_ema/b_noise" in r]
  results["tracker"] = {
      k: [r.get(f"noise_ema/{k}") for r in track]
      for k in ("b_intra", "b_inter", "b_noise", "b_noise_lo", "b_noise_hi")
  }
  results["tracker"]["round"] = [r["round"] for r in track]
  with open(out.path(".json"), "w") as f:
    json.dump(results, f, indent=1, default=float)

  K = args.rollouts
  table = []
  for label in ("early", "late"):
    e = results[label]["exact"]
    a = results[label].get("adam")
    table.append(
        dict(
            stage=label,
            round=results[label]["round"],
            reward=results[label]["reward_mean"],
            **{k: stats.Estimate(e[k], se=e[k + "_se"]) for k in KEYS},
            b_noise_adam=stats.Estimate(a["b_noise"], se=a["b_noise_se"]) if a else None,
            flag=e["flag"] or "",
        )
    )
  out.table(
      table,
      ["stage", "round", "reward", *KEYS, "b_noise_adam", "flag"],
      title=f"Gradient noise of the default run, pooled P = {args.prompts} x K = {K} "
      f"batches (± jackknife SE)",
      notes=f"b_noise is at K = {K}; b_noise_adam in Adam's preconditioned metric "
      "(none at the SFT base: no Adam state yet). Tracker: the run's EMA "
      "(decay config.noise.ema_decay) of per-round split estimates.",
  )
  t = results["tracker"]
  nan = lambda xs: [np.nan if x is None else x for x in xs]
  series = {
      "tracker B_noise": nan(t["b_noise"]),
      "tracker B_intra": nan(t["b_intra"]),
      "tracker K·B_inter": [np.nan if x is None else K * x for x in t["b_inter"]],
  }
  bands = (
      {"tracker B_noise": (nan(t["b_noise_lo"]), nan(t["b_noise_hi"]))}
      if any(x is not None for x in t["b_noise_lo"])
      else None
  )
  pts = {
      f"precise B_noise ({lab})": [results[lab]["exact"]["b_noise"]] for lab in ("early", "late")
  }
  xs = {k: t["round"] for k in series} | {
      f"precise B_noise ({lab})": [results[lab]["round"]] for lab in ("early", "late")
  }
  plots.save(
      plots.noise_over_training(xs, series | pts, bands=bands, title="noise scale over training"),
      out.path(".png"),
  )
  out.manifest(config=config)
  print("wrote", out.dir)


if __name__ == "__main__":
  main()
