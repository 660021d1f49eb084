"""Supervised warm start on arithmetic: the base policy RL configs start from.

    python -m cbs_jax.main --config=configs/sft_arithmetic.py --workdir=runs/sft

Next-token training on solutions (30% with one character corrupted, so the
base is right on average but puts real mass on wrong answers); held-out
sampled pass@1 lands around 0.4 (greedy ~0.75), inside the 0.2-0.6 band that
leaves RL room and gives groups mixed rewards. ~1-2 minutes on 2 CPU cores.
"""

from configs import default


def get_config(arg=None):
  c = default.get_config(arg)
  c.mode = "sft"
  return c
