"""Adaptive batch size against fixed N: GRPO on arithmetic from the on-policy
study's settings, with the batch chosen live from the noise tracker.

    python experiments/adaptive_batch.py      # runs get_config(<signal>) for each signal

Arguments (``get_config(arg)``): the controller's signal
  b_noise        the raw-gradient tracker's B_noise (N = signal, no calibration)
  b_noise_adam   B_noise in Adam's preconditioned metric
  b_crit         B_crit / B_noise x the raw tracker: the B_crit implied by an
                 on-policy fit (see cbs_jax/controller.py for why a running
                 fit is not possible within one run, and the limits)
  quick, quick_<signal>   a tiny version for the test suite (minutes)

Everything else is ``configs/batch_law.py:on`` (``:quick``): the shared SFT
base "../sft_base", the exact expected pass rate on the held-out split, no
sampled eval, lr = LR0 sqrt(N / 256) at the chosen N, stop at the highest
target. The run starts at the config default N = 256 (P = 16) and the
controller may move it between N = 128 and 8,192 (P = 8 ... 512: at most
seven shapes compile). Evaluation runs every round; the experiment keeps
only the evaluations on the on-policy study's grid (about every 2,048
rollouts), so adaptive and fixed runs are judged on the same grid.
"""

import functools
import json
import os

from cbs_jax import batch_law as batch_law_lib
from cbs_jax import controller
from configs import batch_law

SIGNALS = controller.SIGNALS
VARIANTS = SIGNALS + ("quick",) + tuple(f"quick_{s}" for s in SIGNALS)
MIN_PROMPTS, MAX_PROMPTS = 8, 512  # N = 128 ... 8,192 at K = 16
START_PROMPTS = 16  # N = 256: the config default (configs/default.py)
EVERY = 5  # rounds between decisions
MAX_ROUNDS = 3000  # a cap; runs stop at the highest target
# B_crit / B_noise at K = 16, read from the committed on-policy study
# (B_CRIT_FITS under the repository root, ``batch_law.calibration_from_fits``
# at the main target 0.54): B_crit = 4,698 [4,122, 5,380] rollouts over
# B_noise = 4,855 +- 972 (inverse-variance mean of 4,550 +- 1,058 at the SFT
# base and 6,505 +- 2,462 after 192 rounds), ratio 0.968 [0.61, 1.85].
# experiments/adaptive_batch.py reads the ratio from its --fits file itself
# when that fit is resolved; this file's ratio is its fallback.
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
B_CRIT_FITS = "experiments/results/batch_law_on_policy/batch_law_on_policy_fits.json"
B_CRIT_TARGET = batch_law.TARGETS[len(batch_law.TARGETS) // 2]  # the main target, 0.54
EVAL_GRID = 2048  # rollouts between the evaluations that count
QUICK_EVAL_GRID = 32


@functools.cache
def b_crit_calibration(root: str = REPO_ROOT) -> dict:
  """``batch_law.calibration_from_fits`` of the on-policy study's fits
  (``root``/B_CRIT_FITS) at B_CRIT_TARGET; FileNotFoundError naming the
  file when it is missing (an installed copy of configs/ without the
  repository's experiments/results)."""
  path = os.path.join(root, B_CRIT_FITS)
  if not os.path.exists(path):
    raise FileNotFoundError(
        f"configs/adaptive_batch.py reads B_crit / B_noise from the on-policy study's fits "
        f"{path}, which is missing: run experiments/batch_law_on_policy.py, or use the "
        "configs of a checkout that holds experiments/results"
    )
  with open(path) as f:
    return batch_law_lib.calibration_from_fits(json.load(f), B_CRIT_TARGET)


def get_config(arg="b_noise"):
  if arg not in VARIANTS:
    raise ValueError(f"unknown adaptive_batch variant {arg!r}; known: {VARIANTS}")
  quick = arg.startswith("quick")
  signal = arg[len("quick_") :] if arg.startswith("quick_") else ("b_noise" if quick else arg)
  c = batch_law.get_config("quick" if quick else "on")
  c.noise.split_every = 1  # the tracker the controller reads, every round
  c.batch.schedule = "adaptive"
  c.batch.adaptive_signal = signal
  c.batch.adaptive_factor = 1.0  # N = the signal (b_crit: the calibrated B_crit)
  c.batch.adaptive_b_crit_ratio = b_crit_calibration()["ratio"]  # ~0.968
  c.batch.adaptive_hysteresis = 1.25
  c.batch.adaptive_z = 2.0
  c.train.eval_every = 1  # the experiment keeps the evals on its grid
  if quick:  # the quick sweep's N = 8 ... 32 (K = 4): P = 2 ... 8, start at P = 4;
    # a looser controller (1-SE interval, no hysteresis widening, short memory)
    # so that 12 rounds of 16 rollouts exercise its moves: a smoke test only
    c.batch.num_prompts = 4
    c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = 2, 8
    c.batch.adaptive_every = 2
    c.batch.adaptive_z, c.batch.adaptive_hysteresis = 1.0, 1.0
    c.noise.ema_decay = 0.7
    c.train.num_rounds = batch_law.QUICK_ROUNDS
  else:
    c.batch.num_prompts = START_PROMPTS
    c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = MIN_PROMPTS, MAX_PROMPTS
    c.batch.adaptive_every = EVERY
    c.noise.ema_decay = 0.99  # memory ~100 rounds: G2 needs ~25k pooled rollouts
    c.train.num_rounds = MAX_ROUNDS
  return c


def eval_grid(arg="b_noise") -> int:
  """Rollouts between the evaluations a to-target is read from."""
  return QUICK_EVAL_GRID if arg.startswith("quick") else EVAL_GRID
