"""GRPO on arithmetic from the SFT base (the default run, with longer training).

    python -m cbs_jax.main --config=configs/arithmetic_grpo.py --workdir=runs/grpo

Batch-size studies override P and K on the command line, e.g.
``--config.batch.num_prompts=64``; the learning rate follows the sqrt rule
from ``optim.ref_batch`` (256 rollouts).
"""

from configs import default


def get_config(arg=None):
  c = default.get_config(arg)
  c.rl.algo = "grpo"
  c.rl.advantage = "grpo"
  c.rl.loss = "ppo"  # PPO-clip surrogate on group advantages
  c.noise.exact_every = 50  # exact per-rollout noise every 50 rounds
  return c
