"""Noise anatomy: what sets the intra:inter-prompt gradient-noise ratio.

    python experiments/noise_anatomy.py          # runs every variant below

Variants (``get_config(variant)``), each an SFT base (30% label noise) and a
GRPO run of ROUNDS rounds at N = 256 (P = 16, K = 16) from it, measured at
the base and at the end:

  mixed      the default task: 1-3 digit + and -, difficulties mixed
  homog      one difficulty: 2-digit operands only
  steps      mixed digits, long completions: the worked, place-value-by-
             place-value solution format (~4x the tokens; sampled eval)
  countdown  countdown with 3 numbers up to 20 (exact expected eval on 128
             prompts: each has hundreds of accepted strings)
  large      mixed, a ~0.8M-parameter model (d_model 128, 4 layers) instead
             of ~0.1M
  quick      a tiny "mixed" for the test suite
"""

from configs import default

VARIANTS = ("mixed", "homog", "steps", "countdown", "large", "quick")
ROUNDS = 600


def get_config(variant="mixed"):
  if variant not in VARIANTS:
    raise ValueError(f"unknown noise_anatomy variant {variant!r}; known: {VARIANTS}")
  c = default.get_config("smoke" if variant == "quick" else None)
  c.sft.base_dir = "../sft_base"  # each variant its own base, beside its run
  c.noise.split_every = 1  # the tracker, for the figure over training
  c.train.num_rounds = ROUNDS
  c.train.eval_every = 50
  c.train.checkpoint_every = 100
  c.train.progress = False
  if variant == "homog":
    c.task.kwargs.min_digits = c.task.kwargs.max_digits = 2
  elif variant == "steps":
    with c.task.kwargs.unlocked():
      c.task.kwargs.solution_format = "steps"
    c.train.eval_expected = False  # free-form worked text: sampled pass rate
  elif variant == "countdown":
    c.task.name = "countdown"
    with c.task.unlocked():
      c.task.kwargs = type(c.task.kwargs)(dict(num_numbers=3, max_number=20, ops="+-*/"))
    c.train.eval_prompts = 128
    c.train.eval_sampled = False
  elif variant == "large":
    c.model.d_model, c.model.num_layers, c.model.num_heads = 128, 4, 4
    c.model.num_kv_heads, c.model.d_ff = 2, 512
    c.sft.lr = 1e-3
  elif variant == "quick":
    c.task.kwargs.max_digits = 1
    c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
    c.sft.steps, c.sft.lr, c.sft.batch_size = 200, 1e-2, 64
    c.batch.num_prompts, c.batch.rollouts_per_prompt = 4, 4
    c.train.num_rounds, c.train.eval_every, c.train.checkpoint_every = 6, 3, 3
    c.train.eval_prompts = 32
  return c
