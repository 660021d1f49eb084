"""How much room the SFT base leaves RL: sampled vs greedy pass@1, with and
without label noise in the SFT targets.

    python experiments/sft_headroom.py
    python experiments/sft_headroom.py --quick     # tiny smoke version

Uses the default config's SFT settings: the base with 30% label noise
(``runs/default/sft_base``, built if missing) and the same budget without
noise (``runs/sft_clean``). Prints pass@1 on the held-out set at temperature
1 (what RL is evaluated on) and greedy (top-k 1), overall and by difficulty,
and writes experiments/results/sft_headroom/sft_headroom.md (+ manifest.json).

``--quick`` uses ``configs/default.py:smoke`` (30 SFT steps of 32 problems,
32 held-out prompts) with both bases under ``<out>/runs``; ``--out``
defaults to a fresh temp folder.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import jax
import numpy as np
from absl import logging

from cbs_jax import report
from cbs_jax import rollouts
from cbs_jax import run_setup
from cbs_jax import scoring
from cbs_jax import train
from configs import default

# --quick: defaults of a tiny comparison (explicit flags still win)
QUICK = dict(root=None, out=None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
  pass


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
  ap.add_argument(
      "--root",
      default="runs",
      help="Parent of the workdirs default/ (30%% label noise) and sft_clean/ "
      "(--quick: <out>/runs).",
  )
  ap.add_argument(
      "--out", default="experiments/results", help="Output folder (--quick: a fresh temp folder)."
  )
  ap.add_argument(
      "--quick",
      action="store_true",
      help="Tiny smoke version (well under a minute): smoke config's SFT "
      "(30 steps, 32 eval prompts), everything under --out.",
  )
  args = ap.parse_args(argv)
  if args.quick:
    ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="sft_headroom_quick_")
    args.root = args.root or os.path.join(args.out, "runs")
  return args


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  lines = ["| SFT targets | decoding | pass@1 | by digits (1 / 2 / 3) |", "|---|---|---|---|"]
  for label, noise, name in (("30% label noise", 0.3, "default"), ("clean", 0.0, "sft_clean")):
    c = default.get_config("smoke" if args.quick else None)
    c.sft.label_noise = noise
    c.train.progress = False
    setup = run_setup.prepare(c)
    graphdef, params, _ = train.sft_base(c, os.path.join(args.root, name), setup)
    diff = np.array([p.difficulty for p in setup.eval_problems])
    for dec, top_k in (("sampled (T=1)", 0), ("greedy", 1)):
      r = rollouts.rollout(
          graphdef,
          params,
          setup.task,
          setup.tok,
          setup.eval_problems,
          1,
          jax.random.key(c.train.eval_seed),
          setup.layout,
          scoring.SamplingSpec(1.0, top_k, 1.0, setup.sampling.suppress_ids),
      )
      r = r["rewards"][:, 0]
      by = " / ".join(f"{r[diff == d].mean():.3f}" for d in np.unique(diff))
      lines.append(f"| {label} | {dec} | {r.mean():.3f} | {by} |")
  text = "\n".join(lines) + "\n"
  out = report.Results("sft_headroom", root=args.out)
  with open(out.path(".md"), "w") as f:
    f.write(text)
  out.manifest(config=default.get_config("smoke" if args.quick else None))
  print(text)


if __name__ == "__main__":
  main()
