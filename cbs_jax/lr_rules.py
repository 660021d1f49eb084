"""Learning-rate rules: how the learning rate follows the batch size.

``lr_scale(rule, n, ref)`` is the factor applied to the learning rate tuned
at ``ref`` rollouts per update when an update uses ``n`` rollouts:
``constant`` (1), ``sqrt`` (sqrt(n/ref), the rule for Adam this study
uses) or ``linear`` (n/ref, the SGD rule). ``warmup`` is the linear warmup
factor applied on top of it.
"""

from __future__ import annotations

import math

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
