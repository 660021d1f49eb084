"""The time-optimal batch size: the N that reaches a target soonest.

By the batch-size law (docs/batch_law.md, "The law") a run at N rollouts per
round needs S(N) = S_min (1 + B / N) rounds to a target, so its time is

    T(N) = S_min (1 + B / N) round_time(N).

S_min cancels from the choice: ``relative_time`` is (1 + B / N) round_time(N)
(seconds per S_min) and ``best_n`` its argmin over a set of N. The same rule
serves the planner (``cbs_jax.plan``, round_time from a roofline) and the
adaptive controller (``cbs_jax.controller``, round_time measured on the
machine the run is on, ``RoundTimes``, or an accelerator's roofline for a
modelled run). B is B_crit (or B_noise as its estimate). The argmin does not
decrease as B grows (log(N + B) has decreasing differences in N as B grows),
so an interval [B_lo, B_hi] maps to an interval of optimal N.

A new batch size also costs a compile (``RoundTimes.compile_cost``, measured
from the first rounds), so a move to an N not yet run pays only when the
time it saves would repay that within the training time spent so far
(``RoundTimes.total``): ``repays``. The time already spent is the horizon
because the time still to go is unknown and a run tends to last at least as
long again as it has lasted when it first has a resolved signal.

``RoundTimes`` is the measured throughput model: seconds per round recorded
per N (the median of the latest ``window`` rounds at that N), and for an N
not yet measured a fit t(N) = t0 + N / r (a per-round latency floor t0 and a
throughput r) through the measured N, or, with fewer than two measured N, a
prior model (``prior``: a roofline) rescaled to agree with the measured one,
or with no prior, t proportional to N (flat throughput: the conservative
guess, it never predicts that a larger N pays before one was measured).
"""

from __future__ import annotations

import math
from typing import Callable, Mapping, Sequence

import numpy as np


def relative_time(n: float, b: float, round_s: float) -> float:
  """(1 + b / n) round_s: seconds to a target per S_min rounds."""
  if not n > 0:
    raise ValueError(f"batch size n={n!r} must be > 0")
  if not b >= 0:
    raise ValueError(f"B={b!r} must be >= 0")
  return (1.0 + b / n) * round_s


def best_n(ns: Sequence[int], b: float, round_time: Callable[[int], float]) -> int:
  """The N of ``ns`` with the least ``relative_time`` (ties: the smaller N);
  as ``b`` -> inf, the least seconds per rollout ``round_time(n) / n``."""
  if not len(ns):
    raise ValueError("best_n needs at least one batch size")
  if math.isinf(b):
    t = [round_time(n) / n for n in ns]
  else:
    t = [relative_time(n, b, round_time(n)) for n in ns]
  return int(ns[int(np.argmin(t))])


def worst_slowdowns(
    ns: Sequence[int], b_lo: float, round_time: Callable[[int], float]
) -> dict[int, float]:
  """For each N of ``ns``, the largest factor by which its time to a target
  exceeds the best N's at any B >= ``b_lo``: max over B >= b_lo of
  relative_time(N, B) / min_M relative_time(M, B). Each N's
  ``relative_time`` is linear in B and the best of them a concave
  piecewise-linear function, so the ratio is monotone between the crossings
  of any two lines; its maximum over [b_lo, inf] is at b_lo, at a crossing
  or as B -> inf (seconds per rollout), which are all evaluated."""
  if not len(ns):
    raise ValueError("worst_slowdowns needs at least one batch size")
  if not b_lo >= 0:
    raise ValueError(f"b_lo={b_lo!r} must be >= 0")
  t = {n: float(round_time(n)) for n in ns}
  bs = {float(b_lo)}
  for i in ns:
    for j in ns:
      slope = t[i] / i - t[j] / j
      if i < j and slope != 0:
        b = (t[j] - t[i]) / slope  # where the two lines cross
        if math.isfinite(b) and b > b_lo:
          bs.add(b)
  per_rollout = min(t[n] / n for n in ns)
  best = {b: min(relative_time(n, b, t[n]) for n in ns) for b in bs}
  return {
      n: max([relative_time(n, b, t[n]) / best[b] for b in bs] + [t[n] / n / per_rollout])
      for n in ns
  }


def minimax_n(ns: Sequence[int], b_lo: float, round_time: Callable[[int], float]) -> int:
  """The N of ``ns`` whose time to a target is the least multiple of the
  best N's time at the worst B >= ``b_lo`` (``worst_slowdowns``; ties: the
  smaller N): the choice when only a lower bound on B is known. Where round
  time barely grows with N (launch-bound accelerators) this is a large N: a
  small one would be many times slower at a large B and the large one only
  slightly slower at a small B."""
  if not len(ns):
    raise ValueError("minimax_n needs at least one batch size")
  worst = worst_slowdowns(ns, b_lo, round_time)
  return min(ns, key=lambda n: (worst[n], n))


def repays(t_cur: float, t_new: float, horizon_s: float, cost_s: float) -> bool:
  """Whether moving from relative time ``t_cur`` to ``t_new`` (per unit of
  progress) saves more than ``cost_s`` seconds over ``horizon_s`` seconds
  of training: horizon (1 - t_new / t_cur) > cost."""
  return t_new < t_cur and horizon_s * (1.0 - t_new / t_cur) > cost_s


def _fit_floor_rate(ns: Sequence[float], ts: Sequence[float]) -> tuple[float, float]:
  """Least-squares t = t0 + c N with t0, c >= 0 (the better one-parameter
  fit when the free fit leaves the constraint). Returns (t0, c)."""
  n, t = np.asarray(ns, float), np.asarray(ts, float)
  A = np.stack([np.ones_like(n), n], axis=1)
  (t0, c), *_ = np.linalg.lstsq(A, t, rcond=None)
  if t0 >= 0 and c >= 0:
    return float(t0), float(c)
  c_only = float(max(np.dot(n, t) / np.dot(n, n), 0.0))
  t0_only = float(max(np.mean(t), 0.0))
  sse = lambda a, b: float(np.sum((a + b * n - t) ** 2))
  return (0.0, c_only) if sse(0.0, c_only) <= sse(t0_only, 0.0) else (t0_only, 0.0)


class RoundTimes:
  """Measured seconds per round by batch size, with a prediction elsewhere.

  ``record(n, seconds)`` after each timed round (leave out rounds that
  compiled); ``predict(n)`` gives the median of the latest ``window``
  records at n, else the model described in the module docstring.
  ``state_dict`` / ``load_state_dict`` carry the records across a
  checkpoint, so a resumed run predicts what the uninterrupted one would.
  """

  def __init__(self, window: int = 5, prior: Callable[[int], float] | None = None):
    if not (isinstance(window, int) and window >= 1):
      raise ValueError(f"window={window!r} must be an integer >= 1")
    self.window = window
    self.prior = prior
    self.records: dict[int, list[float]] = {}
    self.total = 0.0  # seconds of all recorded (steady, not compiling) rounds
    self.first: dict[int, float] = {}  # seconds of the first round at each N (it compiled)

  def record(self, n: int, seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds > 0):
      return  # a clock glitch says nothing about throughput
    rec = self.records.setdefault(int(n), [])
    rec.append(float(seconds))
    del rec[: -self.window]
    self.total += float(seconds)

  def record_first(self, n: int, seconds: float) -> None:
    """The seconds of the first round at ``n`` in a process (it compiled)."""
    if math.isfinite(seconds) and seconds > 0:
      self.first[int(n)] = float(seconds)

  def compile_cost(self) -> float:
    """Seconds a new batch size costs beyond its round: the median excess
    of the first rounds over the measured ones at the same N (0 before any
    such pair)."""
    m = self.measured()
    excess = [t - m[n] for n, t in self.first.items() if n in m]
    return float(max(np.median(excess), 0.0)) if excess else 0.0

  def measured(self) -> dict[int, float]:
    """The median seconds per round of each measured N."""
    return {n: float(np.median(v)) for n, v in sorted(self.records.items()) if v}

  def predict(self, n: int) -> float:
    m = self.measured()
    if n in m:
      return m[n]
    if len(m) >= 2:
      t0, c = _fit_floor_rate(list(m), list(m.values()))
      return t0 + c * n
    if not m:
      if self.prior is None:
        raise ValueError("RoundTimes has no measurement and no prior model")
      return float(self.prior(n))
    ((n1, t1),) = m.items()
    if self.prior is not None:
      return float(self.prior(n)) * t1 / float(self.prior(n1))
    return t1 * n / n1

  __call__ = predict

  def state_dict(self) -> dict:
    return dict(
        window=self.window,
        records={str(n): list(v) for n, v in self.records.items()},
        total=self.total,
        first={str(n): t for n, t in self.first.items()},
    )

  def load_state_dict(self, state: Mapping) -> None:
    self.window = int(state.get("window", self.window))
    self.records = {int(n): [float(x) for x in v] for n, v in state.get("records", {}).items()}
    self.total = float(state.get("total", 0.0))
    self.first = {int(n): float(t) for n, t in state.get("first", {}).items()}
