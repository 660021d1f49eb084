"""CPU quickstart: builds the SFT base if the workdir lacks it, then GRPO on
arithmetic (1-3 digit + and -), tracking the gradient-noise scale every round.

    python -m cbs_jax.main --config=configs/default.py --workdir=runs/default

``get_config("smoke")`` is a run of well under a minute for tests.
Every field is documented in cbs_jax/config.py (base_config).
"""

from cbs_jax import config as config_lib


def get_config(arg=None):
  c = config_lib.base_config()
  c.sft.steps = 3000  # SFT budget (~2 min on 2 cores)
  c.sft.batch_size = 128
  c.sft.label_noise = 0.3  # base pass@1 ~0.4 sampled, ~0.75 greedy: room for RL
  c.sft.eval_every = 1000
  c.batch.num_prompts = 16  # P
  c.batch.rollouts_per_prompt = 16  # K -> N = 256 rollouts per round
  c.optim.lr = 3e-4  # at ref_batch = 256 rollouts (sqrt rule)
  c.train.num_rounds = 1000
  c.train.eval_every = 100
  c.noise.split_every = 1  # nearly free split-microbatch tracker, every round
  if arg == "smoke":
    c.sft.steps = 30
    c.sft.batch_size = 32
    c.sft.eval_every = 0
    c.batch.num_prompts = 4
    c.batch.rollouts_per_prompt = 4
    c.train.num_rounds = 4
    c.train.eval_every = 2
    c.train.eval_prompts = 32
    c.train.checkpoint_every = 2
    c.train.progress = False
  elif arg:
    raise ValueError(f"unknown config argument {arg!r}; known: 'smoke'")
  return c
