"""How much room the SFT base leaves RL: sampled vs greedy pass@1, with and
without label noise in the SFT targets.

    python experiments/sft_headroom.py

Uses the default config's SFT settings: the base with 30% label noise
(``runs/default/sft_base``, built if missing) and the same budget without
noise (``runs/sft_clean``). Prints pass@1 on the held-out set at temperature
1 (what RL is evaluated on) and greedy (top-k 1), overall and by difficulty,
and writes experiments/results/sft_headroom.md.
"""
from __future__ import annotations

import os
import sys

from absl import app
from absl import logging

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from cbs_jax import rollouts  # noqa: E402
from cbs_jax import train  # noqa: E402
from configs import default  # noqa: E402


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  lines = ["| SFT targets | decoding | pass@1 | by digits (1 / 2 / 3) |", "|---|---|---|---|"]
  for label, noise, workdir in (("30% label noise", 0.3, "runs/default"),
                                ("clean", 0.0, "runs/sft_clean")):
    c = default.get_config()
    c.sft.label_noise = noise
    c.train.progress = False
    setup = train.prepare(c)
    graphdef, params, _ = train._sft_base(c, workdir, setup)
    diff = np.array([p.difficulty for p in setup.eval_problems])
    for dec, top_k in (("sampled (T=1)", 0), ("greedy", 1)):
      r = rollouts.rollout(graphdef, params, setup.task, setup.tok, setup.eval_problems, 1,
                           jax.random.key(c.train.eval_seed), setup.layout, 1.0, top_k)
      r = r["rewards"][:, 0]
      by = " / ".join(f"{r[diff == d].mean():.3f}" for d in np.unique(diff))
      lines.append(f"| {label} | {dec} | {r.mean():.3f} | {by} |")
  text = "\n".join(lines) + "\n"
  os.makedirs("experiments/results", exist_ok=True)
  with open("experiments/results/sft_headroom.md", "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  app.run(main)
