"""Gradient noise of the default run: precise measurements early and late,
and the split-estimator tracker over training.

    python -m cbs_jax.main --config=configs/default.py --workdir=runs/default
    python experiments/noise_over_training.py --workdir=runs/default
    python experiments/noise_over_training.py --quick      # tiny smoke version

Measures the SFT base (round 0, "early") and the latest RL checkpoint
("late") with ``cbs_jax.measure`` (M pooled P x K batches, jackknife SEs),
then writes under experiments/results/:
  noise_over_training.json   every number below
  noise_over_training.md     the table
  noise_over_training.png    tracker curve + precise points

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

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from absl import logging

from cbs_jax import measure
from cbs_jax import metrics as metrics_lib
from cbs_jax import train
from configs import default

KEYS = ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio")

# --quick: defaults of a tiny measurement (explicit flags still win)
QUICK = dict(workdir=None, prompts=4, rollouts=4, batches=2, out=None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
  pass


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
  ap.add_argument("--workdir", default="runs/default",
                  help="Finished default run (--quick: <out>/runs/default, trained if unfinished).")
  ap.add_argument("--prompts", type=int, default=64, help="P per measurement batch.")
  ap.add_argument("--rollouts", type=int, default=16, help="K per measurement batch.")
  ap.add_argument("--batches", type=int, default=24, help="Batches pooled per measurement.")
  ap.add_argument("--out", default="experiments/results",
                  help="Output folder (--quick: a fresh temp folder).")
  ap.add_argument("--quick", action="store_true",
                  help="Tiny smoke version (well under a minute): train the smoke config, "
                       "measure with P=4, K=4, M=2, everything under --out.")
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
  if args.quick:
    config = default.get_config("smoke")
    if not os.path.exists(os.path.join(args.workdir, "summary.json")):
      train.train_and_evaluate(config, args.workdir)  # resumes an interrupted one
  else:
    config = default.get_config()
  setup = train.prepare(config)
  results = {}
  for label, rnd in (("early", 0), ("late", None)):
    graphdef, params, r = measure.load_policy(config, args.workdir, setup, rnd)
    res = measure.measure(config, graphdef, params, setup, args.prompts, args.rollouts,
                          args.batches)
    print(f"--- {label} (round {r})")
    print(measure.format_table(res))
    results[label] = dict(round=r, **measure.to_json(res))
  rows = metrics_lib.read_jsonl(os.path.join(args.workdir, "metrics.jsonl"))
  track = [r for r in rows if r.get("noise_ema/b_intra") is not None]
  results["tracker"] = {k: [r.get(f"noise_ema/{k}") for r in track]
                        for k in ("b_intra", "b_inter", "b_noise")}
  results["tracker"]["round"] = [r["round"] for r in track]
  evals = [(r["round"], r["eval_pass_rate"]) for r in rows if "eval_pass_rate" in r]
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "noise_over_training.json"), "w") as f:
    json.dump(results, f, indent=1, default=float)

  K = args.rollouts
  lines = ["| stage | round | reward | G2 | tr Sigma_intra | tr Sigma_inter | intra:inter | "
           "B_intra (rollouts) | B_inter (prompts) | B_noise at K=%d |" % K,
           "|---|---|---|---|---|---|---|---|---|---|"]
  for label in ("early", "late"):
    e = results[label]["exact"]
    f = lambda k: f"{e[k]:.4g} ± {e[k + '_se']:.2g}"
    lines.append(f"| {label} | {results[label]['round']} | {results[label]['reward_mean']:.3f} | "
                 f"{f('g2')} | {f('trace_intra')} | {f('trace_inter')} | {f('ratio')} | "
                 f"{f('b_intra')} | {f('b_inter')} | {f('b_noise')} |")
    if e["flag"]:
      lines.append(f"| | | flag: {e['flag']} | | | | | | | |")
  with open(os.path.join(args.out, "noise_over_training.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))

  fig, ax = plt.subplots(1, 2, figsize=(11, 4))
  t = results["tracker"]
  for k, lab in (("b_intra", "B_intra (rollouts)"), ("b_noise", f"B_noise at K={K} (rollouts)")):
    ax[0].plot(t["round"], t[k], label=f"tracker {lab}")
  ax[0].plot(t["round"], K * np.asarray(t["b_inter"], float), label=f"tracker K*B_inter (rollouts)")
  for label, m in (("early", "o"), ("late", "s")):
    e = results[label]["exact"]
    x = results[label]["round"]
    for k, scale, c in (("b_intra", 1, "C0"), ("b_noise", 1, "C1"), ("b_inter", K, "C2")):
      ax[0].errorbar([x], [scale * e[k]], yerr=[scale * e[k + "_se"]], fmt=m, color=c,
                     capsize=3)
  ax[0].set_yscale("log")
  ax[0].set_xlabel("round")
  ax[0].set_title("noise scales: EMA tracker (lines), precise pooled (markers ± SE)")
  ax[0].legend(fontsize=7)
  ax[1].plot([r for r, _ in evals], [p for _, p in evals], "o-")
  ax[1].set_xlabel("round")
  ax[1].set_ylabel("eval pass@1")
  ax[1].set_title("held-out pass rate")
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "noise_over_training.png"), dpi=110)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
