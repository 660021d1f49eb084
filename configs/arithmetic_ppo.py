"""PPO with a value head and GAE on arithmetic, same budget as the default GRPO run.

    python -m cbs_jax.main --config=configs/arithmetic_ppo.py --workdir=runs/ppo

The model gets a scalar value head on the shared trunk (so the SFT base is
built in this workdir: its shape differs from the GRPO runs'); advantages are
GAE(gamma, lambda) over completion tokens, whitened over the batch.
"""

from configs import default


def get_config(arg=None):
  c = default.get_config(arg)
  c.rl.algo = "ppo"
  c.rl.advantage = "gae"  # GAE over completion tokens, whitened over the batch
  c.model.value_head = True
  c.rl.gamma = 1.0
  c.rl.lam = 0.95
  c.rl.vf_coef = 0.5
  return c
