"""Off-policy reuse: one generation round of N = 1024 rollouts reused for
8 updates (4 prompt-minibatches x 2 epochs) with importance ratios against
the stored behaviour log-probs; drift and per-update trace_intra recorded.

    python -m cbs_jax.main --config=configs/offpolicy.py:clip0.2 --workdir=runs/off_clip0.2

Variants (the argument): clip0.2 (PPO clip 0.2), clip10 (10.0: effectively
unclipped), asym (0.2 / 0.28), cispo (clipped IS weight, stop-gradient),
dualclip (PPO 0.2 with dual clip c = 3). The SFT base is the default run's
(``runs/default/sft_base``); it is built there if missing.
"""

from configs import default

VARIANTS = ("clip0.2", "clip10", "asym", "cispo", "dualclip")


def get_config(arg="clip0.2"):
  c = default.get_config()
  c.sft.base_dir = "../default/sft_base"  # shared with the default run
  c.batch.num_prompts = 64  # P: N = 64 * 16 = 1024 rollouts per round
  c.batch.rollouts_per_prompt = 16
  c.batch.num_minibatches = 4  # 256 rollouts per update
  c.batch.num_epochs = 2  # 8 updates per generation round
  c.optim.lr = 5e-4  # at 256 rollouts per update (ref_batch)
  c.train.num_rounds = 60
  c.train.eval_every = 20
  c.noise.split_every = 1  # split estimate on each round's first update
  c.noise.drift_every = 1  # per-update exact trace_intra on the old rollouts
  c.noise.chunk_prompts = 4
  if arg == "clip0.2":
    c.rl.clip_eps_low = c.rl.clip_eps_high = 0.2
  elif arg == "clip10":
    c.rl.clip_eps_low, c.rl.clip_eps_high = 0.99, 10.0  # ratio floor 0.01: effectively none
  elif arg == "asym":
    c.rl.clip_eps_low, c.rl.clip_eps_high = 0.2, 0.28
  elif arg == "cispo":
    c.rl.loss = "cispo"
    c.rl.clip_eps_low, c.rl.clip_eps_high = 0.99, 0.28  # MiniMax-M1 style: upper bound only
  elif arg == "dualclip":
    c.rl.clip_c = 3.0
  else:
    raise ValueError(f"unknown variant {arg!r}; known: {VARIANTS}")
  return c
