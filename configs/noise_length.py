"""Intra:inter against completion length, bases matched in pass rate.

    python experiments/noise_length.py      # every base below, then the fits

One task family: 2-digit '+' and '-' (one difficulty), the same problems
written at growing detail (``get_config(level)``):

  0          the answer alone ("46", ~3 tokens)
  1, 2, 4, 8 worked solutions, each place value of b added in that many
             steps (``step_split``; ~20 / 37 / 70 / 137 tokens)
  quick      a tiny level-1 for the test suite

Every base is an SFT run without label noise, ended at its first held-out
evaluation at or above the arm's pass rate (``sft.stop_at_pass_rate``), so
bases of every length start RL from the same pass rate; the sampled
held-out pass rate is the eval at every level (worked text is free-form).
"""

from configs import default

LEVELS = (0, 1, 2, 4, 8)  # steps per place value; 0 = the answer alone
TARGET = 0.3  # the length arm's matched held-out pass rate (the longest level's reach)
PASS_TARGETS = (0.3, 0.5, 0.7)  # the pass arm, at PASS_LEVEL
PASS_LEVEL = 1
MATCH = 0.05  # a base is matched when its held-out pass is within this of its target (inclusive)
SEEDS = (0, 1, 2, 3)  # independent bases per point (init and data order)
QUICK_TARGET = 0.01
MAX_LEN = 256  # the KV cache of every level (rotary positions: same parameters)


def get_config(arg="1"):
  quick = arg == "quick"
  if not quick and (not arg.isdigit() or int(arg) not in LEVELS):
    raise ValueError(f"unknown noise_length level {arg!r}; known: {LEVELS} or 'quick'")
  level = 1 if quick else int(arg)
  c = default.get_config("smoke" if quick else None)
  c.task.kwargs.min_digits = c.task.kwargs.max_digits = 2
  c.task.kwargs.ops = "+-"
  if level:
    with c.task.kwargs.unlocked():
      c.task.kwargs.solution_format = "steps"
      c.task.kwargs.step_split = level
  c.train.eval_expected = False  # one eval at every level: the sampled pass rate
  c.train.eval_sampled = True
  c.train.progress = False
  c.model.max_len = MAX_LEN
  c.sft.label_noise = 0.0  # the early stop, not corrupted labels, leaves the headroom
  c.sft.stop_at_pass_rate = TARGET
  # the base stops at its first eval at or above the target: at every 50 steps a
  # fast level overshot by > MATCH in 7 of 28 bases (L2 reaches 0.3 in ~500 steps)
  c.sft.eval_every = 25
  c.sft.batch_size = 32
  c.sft.steps = 4000  # an upper bound: a base that never reaches its target is reported
  if quick:
    c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
    c.model.max_len = 64
    c.sft.lr, c.sft.batch_size, c.sft.steps, c.sft.eval_every = 1e-2, 64, 150, 25
    c.sft.stop_at_pass_rate = QUICK_TARGET
    c.train.eval_prompts = 64
  return c
