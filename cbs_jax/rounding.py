"""The digits a committed number keeps: ``stable`` rounds every float of a
table, record or figure to ``STABLE_DIGITS`` significant digits.

Why: the same analysis on another processor or BLAS differs in the last
bits of a fit (seen: 1e-15 relative); a file written at 10 digits is the
same bytes there, so ``--replot`` can be checked byte for byte. ``report``
(tables, records) and ``plots`` (figure data) both write through it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

STABLE_DIGITS = 10  # significant digits of a float in a committed table or record


def stable(obj: Any, digits: int = STABLE_DIGITS) -> Any:
  """``obj`` with every float (numpy's too) rounded to ``digits`` significant
  digits, through dicts, lists and tuples. NaN, inf, ints, bools and strings
  pass unchanged."""
  if isinstance(obj, dict):
    return {k: stable(v, digits) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return type(obj)(stable(v, digits) for v in obj)
  if isinstance(obj, (bool, np.bool_, int, np.integer)):
    return obj
  if isinstance(obj, (float, np.floating)):
    x = float(obj)
    return float(f"{x:.{digits}g}") if math.isfinite(x) else x
  return obj
