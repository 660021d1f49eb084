"""The batch-size law studies: GRPO on arithmetic at N = 64 ... 16,384 rollouts
per generation round, seeds as replicates, run to a held-out target.

    python experiments/batch_law_on_policy.py          # uses get_config("on") + sweep("on")

Arguments (``get_config(arg)`` / ``sweep(arg)``):
  on        on-policy: one update per round, lr = lr0 sqrt(N / 256)
  off4      off-policy: each round's N rollouts split into 4 minibatches,
            4 updates per round (importance ratios vs the behaviour policy)
  off8      the same with 8 updates per round
  lr_constant, lr_linear   on-policy with the constant / linear lr rule
  shape     on-policy at N = 1,024 and 4,096 with K = 2, 4, 64 (K = 16: the "on" runs)
  quick     a tiny version of "on" for the test suite (minutes)

Every run starts from one shared SFT base (``<sweep root>/sft_base``, the
default run's recipe), evaluates the exact expected pass rate on the
held-out split every ``eval_every(N)`` rounds and stops at the highest
target or at its rollout budget. A pod run changes the model, the task and
the mesh here and keeps the rest.
"""

import math

from configs import default

K = 16
NS = tuple(2**i for i in range(6, 15))  # 64 ... 16,384 rollouts per round
SEEDS = (0, 1, 2)
TARGETS = (0.50, 0.54, 0.58)  # exact expected pass (base ~0.44)
LR0 = 3e-4  # at ref_batch = 256 rollouts per update
MAX_ROLLOUTS = 2_000_000  # per run: the budget cap
MAX_ROUNDS = 6000
SHAPE_NS = (1024, 4096)
SHAPE_KS = (2, 4, 64)  # K = 16: the on-policy runs
LR_NS = (64, 256, 1024, 4096, 16384)  # lr rules: every other N of the grid
COLLAPSED = 0.30  # lr rules: stop a run that falls below
QUICK_ROUNDS = 12
QUICK_SEEDS = (0, 1)  # the test suite's smoke sweeps: two seeds give every interval
VARIANTS = ("on", "off4", "off8", "lr_constant", "lr_linear", "shape", "quick")


def get_config(arg="on"):
  if arg not in VARIANTS:
    raise ValueError(f"unknown batch_law variant {arg!r}; known: {VARIANTS}")
  c = default.get_config("smoke" if arg == "quick" else None)
  c.sft.base_dir = "../sft_base"  # shared by every run of the sweep root
  c.batch.rollouts_per_prompt = 4 if arg == "quick" else K
  c.noise.split_every = 0  # B_noise is measured separately (measure.py)
  c.optim.lr = LR0
  c.optim.lr_rule = {"lr_constant": "constant", "lr_linear": "linear"}.get(arg, "sqrt")
  c.optim.ref_batch = 256
  c.train.eval_sampled = False  # the exact expected pass rate is the metric
  c.train.stop_at_pass_rate = max(targets(arg))
  c.train.checkpoint_every = 100
  c.train.progress = False
  if arg in ("off4", "off8"):
    c.batch.num_minibatches = int(arg[3:])
  if arg.startswith("lr_"):  # a diverging rule must not burn the rollout budget
    c.train.stop_below_pass_rate = collapsed(arg)
  if arg == "quick":  # a 1-digit task and a one-layer model: a base that learns in seconds
    c.task.kwargs.max_digits = 1
    c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
    c.sft.steps, c.sft.lr, c.sft.batch_size = 400, 1e-2, 64
    c.optim.lr, c.optim.ref_batch = 3e-3, 16
    c.train.eval_prompts = 64
  return c


def targets(arg="on"):
  return (0.155, 0.165) if arg == "quick" else TARGETS


def collapsed(arg="on") -> float:
  """The pass rate below which a run counts as diverged and stops: below
  the SFT base (~0.44 full size, ~0.14 for the quick base), so a run that
  merely has not yet learned is never stopped."""
  return 0.10 if arg == "quick" else COLLAPSED


def eval_every(N: int) -> int:
  """Rounds between evaluations: about every 2,048 rollouts, at least every round."""
  return max(1, 2048 // N)


def sweep(arg="on"):
  """The runs of study ``arg``: a list of override dicts for cbs_jax.sweep."""
  if arg == "quick":
    return [
        {"batch.num_prompts": n, "seed": s, "train.eval_every": 2, "train.num_rounds": QUICK_ROUNDS}
        for n in (2, 4, 8)
        for s in QUICK_SEEDS
    ]
  if arg == "shape":
    grid = [(N, k) for N in SHAPE_NS for k in SHAPE_KS]
  elif arg.startswith("lr_"):
    grid = [(N, K) for N in LR_NS]
  else:
    m = {"off4": 4, "off8": 8}.get(arg, 1)
    grid = [(N, K) for N in NS if N // K >= m]  # at least one prompt per minibatch
  runs = []
  for N, k in grid:
    for s in SEEDS:
      runs.append(
          {
              "batch.num_prompts": N // k,
              "batch.rollouts_per_prompt": k,
              "seed": s,
              "train.eval_every": eval_every(N),
              "train.num_rounds": min(MAX_ROUNDS, math.ceil(MAX_ROLLOUTS / N)),
          }
      )
  return runs
