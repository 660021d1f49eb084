"""Gradient noise of the default run: precise measurements early and late,
and the split-estimator tracker over training.

    python -m cbs_jax.main --config=configs/default.py --workdir=runs/default
    python experiments/noise_over_training.py --workdir=runs/default

Measures the SFT base (round 0, "early") and the latest RL checkpoint
("late") with ``cbs_jax.measure`` (M pooled P x K batches, jackknife SEs),
then writes under experiments/results/:
  noise_over_training.json   every number below
  noise_over_training.md     the table
  noise_over_training.png    tracker curve + precise points
"""
from __future__ import annotations

import json
import os
import sys

from absl import app
from absl import flags
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import matplotlib  # noqa: E402
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from cbs_jax import measure  # noqa: E402
from cbs_jax import metrics as metrics_lib  # noqa: E402
from cbs_jax import train  # noqa: E402
from configs import default  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", "runs/default", "Finished default run.")
_P = flags.DEFINE_integer("prompts", 64, "P per measurement batch.")
_K = flags.DEFINE_integer("rollouts", 16, "K per measurement batch.")
_M = flags.DEFINE_integer("batches", 24, "Batches pooled per measurement.")
_OUT = flags.DEFINE_string("out", "experiments/results", "Output folder.")

KEYS = ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  config = default.get_config()
  setup = train.prepare(config)
  results = {}
  for label, rnd in (("early", 0), ("late", None)):
    graphdef, params, r = measure.load_policy(config, _WORKDIR.value, setup, rnd)
    res = measure.measure(config, graphdef, params, setup, _P.value, _K.value, _M.value)
    print(f"--- {label} (round {r})")
    print(measure.format_table(res))
    results[label] = dict(round=r, **measure.to_json(res))
  rows = metrics_lib.read_jsonl(os.path.join(_WORKDIR.value, "metrics.jsonl"))
  track = [r for r in rows if r.get("noise_ema/b_intra") is not None]
  results["tracker"] = {k: [r.get(f"noise_ema/{k}") for r in track]
                        for k in ("b_intra", "b_inter", "b_noise")}
  results["tracker"]["round"] = [r["round"] for r in track]
  evals = [(r["round"], r["eval_pass_rate"]) for r in rows if "eval_pass_rate" in r]
  os.makedirs(_OUT.value, exist_ok=True)
  with open(os.path.join(_OUT.value, "noise_over_training.json"), "w") as f:
    json.dump(results, f, indent=1, default=float)

  K = _K.value
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
  with open(os.path.join(_OUT.value, "noise_over_training.md"), "w") as f:
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
  fig.savefig(os.path.join(_OUT.value, "noise_over_training.png"), dpi=110)
  print("wrote", _OUT.value)


if __name__ == "__main__":
  app.run(main)
