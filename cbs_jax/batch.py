"""Batch-size rules: how the learning rate follows the batch size.

``lr_scale(rule, n, ref)`` is the factor applied to the learning rate tuned
at ``ref`` rollouts per update when an update uses ``n`` rollouts:
``constant`` (1), ``sqrt`` (sqrt(n/ref), the rule for Adam this study
uses) or ``linear`` (n/ref, the SGD rule).
"""
from __future__ import annotations

import math

import numpy as np

LR_RULES = ("constant", "sqrt", "linear")


def lr_scale(rule: str, n: int, ref: int) -> float:
  if n <= 0 or ref <= 0:
    raise ValueError(f"batch sizes must be positive, got n={n}, ref={ref}")
  if rule == "constant":
    return 1.0
  if rule == "sqrt":
    return math.sqrt(n / ref)
  if rule == "linear":
    return n / ref
  raise ValueError(f"lr_rule={rule!r} not in {list(LR_RULES)}")


def warmup(step: int, warmup_steps: int) -> float:
  """Linear warmup factor for optimizer step ``step`` (0-based)."""
  return 1.0 if warmup_steps <= 0 else min(1.0, (step + 1) / warmup_steps)


def steps_to_target(steps, values, target: float) -> float | None:
  """First step at which ``values`` reaches ``target``, linearly interpolated
  between the two evaluations around the crossing; None if never reached."""
  prev = None
  for s, v in zip(steps, values):
    if v is None:
      continue
    if v >= target:
      if prev is None or prev[1] >= target:
        return float(s)
      (s0, v0) = prev
      return float(s0 + (target - v0) * (s - s0) / (v - v0))
    prev = (s, v)
  return None


def fit_critical_batch(batch_sizes, steps) -> dict:
  """Fit S(N) = S_min (1 + B_crit / N) (McCandlish et al. 2018) by least squares
  on S = a + b/N; returns S_min = a, B_crit = b/a, E_min = S_min * B_crit and
  R^2. Equivalent to (S/S_min - 1)(E/E_min - 1) = 1 with E = N S."""
  n = np.asarray(batch_sizes, np.float64)
  s = np.asarray(steps, np.float64)
  if n.size < 2 or np.unique(n).size < 2:
    raise ValueError(f"need steps at >= 2 distinct batch sizes, got {n.tolist()}")
  A = np.stack([np.ones_like(n), 1.0 / n], axis=1)
  (a, b), *_ = np.linalg.lstsq(A, s, rcond=None)
  resid = s - A @ np.array([a, b])
  ss_tot = float(np.sum((s - s.mean()) ** 2))
  r2 = 1.0 - float(np.sum(resid ** 2)) / ss_tot if ss_tot > 0 else float("nan")
  b_crit = b / a if a > 0 else float("nan")
  return dict(S_min=float(a), B_crit=float(b_crit), E_min=float(a * b_crit), r2=r2)


class AdaptiveBatch:
  """Noise-driven batch-size controller.

  Every ``every`` rounds it reads the tracker's B_noise (rollouts, at the
  run's K) and sets the number of prompts for the next rounds to
  ``factor * B_noise / K``, rounded UP to a bucket ``min_prompts * 2^j`` and
  clipped to ``[min_prompts, max_prompts]``. Buckets bound recompiles to
  log2(max/min) + 1 shapes. While B_noise is unresolved (nan: |G|^2 not
  positive in the tracker) the batch size is kept. The learning rate follows
  the run's ``optim.lr_rule`` from the new rollouts per update.
  """

  def __init__(self, K: int, min_prompts: int, max_prompts: int, factor: float = 1.0,
               every: int = 10, prompts: int | None = None):
    if min_prompts <= 0 or max_prompts < min_prompts:
      raise ValueError(f"need 0 < min_prompts <= max_prompts, got {min_prompts}, {max_prompts}")
    self.K, self.factor, self.every = K, factor, every
    self.buckets = [min_prompts * 2 ** j for j in range(64)
                    if min_prompts * 2 ** j <= max_prompts]
    self.prompts = self._bucket(prompts or min_prompts)

  def _bucket(self, p: float) -> int:
    for b in self.buckets:
      if b >= p:
        return b
    return self.buckets[-1]

  def update(self, rnd: int, b_noise: float) -> int:
    """Prompts for round ``rnd`` (0-based) given the latest tracker B_noise."""
    if rnd > 0 and rnd % self.every == 0 and math.isfinite(b_noise) and b_noise > 0:
      self.prompts = self._bucket(self.factor * b_noise / self.K)
    return self.prompts
