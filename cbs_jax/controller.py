"""The adaptive batch-size controller: prompts per round from a noise signal.

``AdaptiveBatch`` moves the prompts per round over power-of-two
``buckets`` from the interval of a signal (``SIGNALS``, read by
``signal_interval`` from the noise trackers), acting only on resolved
changes. It aims at one of two ``OBJECTIVES``: ``steps`` (N = the signal:
the step-efficient batch, B_crit) or ``time`` (the N that reaches a target
soonest, ``time_optimal.best_n`` with the round times of a
``time_optimal.RoundTimes``). ``buckets`` is also what ``config.validate``
checks the starting batch against.
"""

from __future__ import annotations

import math

from cbs_jax import time_optimal

# The controller (``AdaptiveBatch``) reads one of three signals, each a
# number of rollouts with an interval (``signal_interval``):
#
#   b_noise       the split-microbatch tracker's B_noise at the run's K
#                 (``noise_tracker.NoiseEMA.interval``), raw gradients.
#   b_noise_adam  the same tracker in Adam's preconditioned metric (the noise
#                 scale of the update Adam actually takes).
#   b_crit        the B_crit implied by a fit: b_crit_ratio x the raw tracker.
#
# Why b_crit is a calibrated multiple of B_noise and not a running fit: the
# critical batch size is defined by S(N) = S_min (1 + B_crit / N), steps to
# a target as a function of N. One run sits at one N at a time and reaches a
# target once, so a single run cannot fit S(N) -- the fit needs a sweep of
# runs (``batch_law.fit_critical_batch``). What a run can measure live is
# B_noise. The b_crit signal therefore carries the ratio B_crit / B_noise
# measured once by an on-policy study (its fitted B_crit at a target over
# B_noise measured by ``cbs_jax.measure`` at the same K;
# ``batch_law.calibration_from_fits``) and applies it to the live tracker.
# Limits: (1) the ratio is assumed constant over training and across N --
# B_noise was measured at the SFT base and at the end of one run, and the
# fit pools runs at every N; (2) it belongs to the study's task, model, K
# and target and must be re-measured for another (on the arithmetic study it
# is ~1: B_crit 4,700 vs B_noise 4,860 at expected pass 0.54,
# configs/adaptive_batch.py); (3) its own uncertainty (bootstrap interval of
# B_crit, SE of B_noise) is systematic: it does not shrink within a run and
# says nothing about whether the signal *moved*, so the controller's
# hysteresis uses the tracker's interval scaled by the point ratio, and the
# ratio's interval is reported beside the results (the N the controller aims
# at is uncertain by that factor); (4) it needs that study first -- b_crit
# is "without a sweep" only for the runs that reuse it.

SIGNALS = ("b_noise", "b_noise_adam", "b_crit")
OBJECTIVES = ("steps", "time")


def signal_interval(
    kind: str, raw: dict, adam: dict | None = None, b_crit_ratio: float = 0.0
) -> dict:
  """The controller's signal (rollouts) and its interval from the trackers'
  intervals (``noise_tracker.NoiseEMA.interval``: dicts with b_noise, se, lo, hi,
  resolved): ``raw`` for b_noise and b_crit (times ``b_crit_ratio``),
  ``adam`` for b_noise_adam. Returns ``dict(value, se, lo, hi, resolved,
  floor)`` (``floor``: the one-sided lower bound, 0 when the tracker has
  none)."""
  if kind not in SIGNALS:
    raise ValueError(f"adaptive_signal={kind!r} is not one of {list(SIGNALS)}")
  src, scale = raw, 1.0
  if kind == "b_noise_adam":
    if adam is None:
      raise ValueError("adaptive_signal='b_noise_adam' needs the tracker in Adam's metric")
    src = adam
  elif kind == "b_crit":
    if not (
        isinstance(b_crit_ratio, (int, float)) and math.isfinite(b_crit_ratio) and b_crit_ratio > 0
    ):
      raise ValueError(
          f"adaptive_signal='b_crit' needs adaptive_b_crit_ratio > 0 (B_crit / "
          f"B_noise from an on-policy study), got {b_crit_ratio!r}"
      )
    scale = float(b_crit_ratio)
  mul = lambda v: v * scale if v is not None and math.isfinite(v) else v
  return dict(
      value=mul(float(src["b_noise"])),
      se=mul(float(src["se"])),
      lo=mul(float(src["lo"])),
      hi=mul(float(src["hi"])),
      resolved=bool(src["resolved"]),
      floor=mul(float(src.get("floor", 0.0))),
  )


def buckets(min_prompts: int, max_prompts: int) -> list[int]:
  """The adaptive prompts per round: ``min_prompts * 2^j <= max_prompts``
  (j = 0, 1, ...). ValueError unless 0 < min_prompts <= max_prompts."""
  if min_prompts <= 0 or max_prompts < min_prompts:
    raise ValueError(f"need 0 < min_prompts <= max_prompts, got {min_prompts}, {max_prompts}")
  return [min_prompts * 2**j for j in range(64) if min_prompts * 2**j <= max_prompts]


class AdaptiveBatch:
  """Noise-driven batch-size controller that acts only on resolved changes.

  Every ``every`` rounds (never at round 0) it reads a signal interval
  (``signal_interval``: rollouts at the run's K) and maps it to prompts per
  round, ``target = factor * signal / K``. Buckets are ``min_prompts * 2^j``
  up to ``max_prompts`` (at most log2(max/min) + 1 shapes ever compile);
  bucket b stands for targets in (b / sqrt2, b * sqrt2]. Hysteresis: the
  batch moves only when the WHOLE interval ``factor * [lo, hi] / K`` lies
  outside the current bucket's range widened by ``hysteresis`` (a factor
  >= 1), i.e. lo > cur * sqrt2 * h or hi < cur / sqrt2 / h; it then moves
  to the bucket nearest (in log) to the point estimate, clipped to the
  bounds. An unresolved signal (|G|^2 not significantly positive) keeps the
  batch, so does a flat signal whose interval reaches into the current
  bucket's widened range -- a noisy but flat signal cannot make N
  oscillate: after a move to the bucket nearest a value v, moving back
  needs an interval wholly on the other side of v / (sqrt2 h)^(+-1).
  ``factor`` is the calibration from the signal to the batch one wants (1:
  N = the signal).

  With ``objective="time"`` the batch wanted is not the signal itself but
  the bucket with the least predicted time to a target,
  ``time_optimal.best_n`` over the buckets' N = P K with B = factor x
  signal and the seconds per round of ``round_times`` (a
  ``time_optimal.RoundTimes``, or any callable N -> seconds). The same
  hysteresis in that form: the batch moves only when the optimum at
  B = lo / h and at B = hi h (the interval widened by ``hysteresis``) lie on
  the same side of the current bucket, to the optimum at the point value.
  The optimum does not decrease in B, so a flat signal whose interval
  contains its own value cannot make N oscillate either. Before the signal
  resolves, its one-sided bound B >= floor (the tracker's ``floor``) can
  move N up, never down: when the optimum at B = floor / h and as B -> inf
  both lie above the current bucket, every B the evidence allows wants a
  larger batch, and it moves to the optimum at the bound
  (``_update_on_floor``; a launch-bound accelerator, whose round time is
  nearly flat in N, leaves a small N this way within a decision or two). With measured
  round times, a move to a batch size not yet run must also repay its
  compile within the training time spent so far
  (``time_optimal.repays``); ``held_for_cost`` counts the decisions it
  blocked. The learning rate follows ``optim.lr_rule`` from the
  chosen rollouts per update (the trainer's job, ``train.update_round``).
  ``state_dict`` / ``load_state_dict`` carry the choice across a checkpoint
  restore (with the tracker's own state, a resumed run makes the same
  choices).
  """

  def __init__(
      self,
      K: int,
      min_prompts: int,
      max_prompts: int,
      factor: float = 1.0,
      every: int = 10,
      prompts: int | None = None,
      hysteresis: float = 1.25,
      objective: str = "steps",
      round_times=None,
  ):
    if not (isinstance(K, int) and K >= 1):
      raise ValueError(f"K={K!r} (rollouts per prompt) must be a positive integer")
    self.buckets = buckets(min_prompts, max_prompts)  # ValueError naming bad bounds
    if not (math.isfinite(factor) and factor > 0):
      raise ValueError(f"factor={factor!r} must be finite and > 0")
    if not (isinstance(every, int) and every >= 1):
      raise ValueError(f"every={every!r} (rounds between decisions) must be an integer >= 1")
    if not hysteresis >= 1.0:
      raise ValueError(f"hysteresis={hysteresis} must be >= 1")
    if objective not in OBJECTIVES:
      raise ValueError(f"objective={objective!r} is not one of {list(OBJECTIVES)}")
    if objective == "time" and round_times is None:
      raise ValueError("objective='time' needs round_times (seconds per round by N)")
    self.K, self.factor, self.every, self.hysteresis = K, factor, every, hysteresis
    self.objective, self.round_times = objective, round_times
    start = self.buckets[0] if prompts is None else prompts
    if start not in self.buckets:
      raise ValueError(
          f"starting prompts={start} is not a bucket {self.buckets} "
          f"(min_prompts * 2^j <= max_prompts)"
      )
    self.prompts = start
    self.changes = 0
    self.held_for_cost = 0  # decisions that kept N because a move would not repay its compile
    self.target = math.nan  # prompts the last signal asked for (before bucketing)

  def _nearest(self, p: float) -> int:
    """The bucket nearest to ``p`` in log scale (ties go up), within bounds."""
    if not p > 0:
      return self.buckets[0]
    return min(self.buckets, key=lambda b: (abs(math.log(b / p)), -b))

  def decides(self, rnd: int) -> bool:
    """Whether round ``rnd`` (0-based) is a decision round."""
    return rnd > 0 and rnd % self.every == 0

  def update(self, rnd: int, signal) -> int:
    """Prompts for round ``rnd`` (0-based) from the signal's interval
    ``dict(value, lo, hi, resolved)`` (``b_noise`` is read where ``value`` is
    absent, so a ``NoiseEMA.interval`` works as is; a bare float counts as
    an interval of zero width, resolved when finite and positive)."""
    if isinstance(signal, (int, float)):
      ok = math.isfinite(signal) and signal > 0
      signal = dict(value=signal, lo=signal, hi=signal, resolved=ok)
    value = signal["value"] if "value" in signal else signal["b_noise"]
    if self.objective == "time":
      return self._update_time(rnd, signal, value)
    f = self.factor / self.K
    self.target = f * value if signal["resolved"] else math.nan
    if not self.decides(rnd) or not signal["resolved"]:
      return self.prompts
    cur, h = self.prompts, self.hysteresis * math.sqrt(2.0)
    if f * signal["lo"] > cur * h or f * signal["hi"] < cur / h:
      self._move(self._nearest(f * value))
    return self.prompts

  def best_prompts(self, b: float) -> int:
    """The bucket with the least predicted time to a target at B = ``b``
    rollouts (``time_optimal.best_n`` over the buckets' N = P K)."""
    ns = [p * self.K for p in self.buckets]
    return time_optimal.best_n(ns, b, self.round_times) // self.K

  def _update_time(self, rnd: int, signal: dict, value: float) -> int:
    self.target = math.nan
    if rnd == 0 and not signal["resolved"]:
      return self._start(signal.get("floor", 0.0))
    if not signal["resolved"]:
      return self._update_on_floor(rnd, signal.get("floor", 0.0))
    f, h = self.factor, self.hysteresis
    try:
      self.target = float(self.best_prompts(f * value))
    except ValueError:  # no round time measured yet and no model: hold
      return self.prompts
    if not self.decides(rnd):
      return self.prompts
    cur = self.prompts
    lo, hi = self.best_prompts(f * signal["lo"] / h), self.best_prompts(f * signal["hi"] * h)
    if (lo > cur and hi > cur) or (lo < cur and hi < cur):
      new = int(self.target)
      rt = self.round_times
      if isinstance(rt, time_optimal.RoundTimes) and new * self.K not in rt.measured():
        t = lambda p: time_optimal.relative_time(p * self.K, f * value, rt(p * self.K))
        if not time_optimal.repays(t(cur), t(new), rt.total, rt.compile_cost()):
          self.held_for_cost += 1
          return self.prompts
      self._move(new)
    return self.prompts

  def _start(self, floor: float) -> int:
    """Round 0, before any evidence on B beyond B >= ``floor`` (0 for a
    fresh run): the bucket with the least worst-case slowdown over every B
    the evidence allows (``time_optimal.minimax_n``) -- nothing has been
    compiled yet, so the move costs nothing. On a launch-bound accelerator
    (round time nearly flat in N) that is a large batch from the start
    instead of rounds at a small one while the signal resolves."""
    floor = floor if math.isfinite(floor) and floor > 0 else 0.0
    ns = [p * self.K for p in self.buckets]
    try:
      new = time_optimal.minimax_n(ns, self.factor * floor, self.round_times) // self.K
    except ValueError:  # no round time measured yet and no model: keep the start
      return self.prompts
    self.target = float(new)
    self._move(new)
    return self.prompts

  def _update_on_floor(self, rnd: int, floor: float) -> int:
    """An unresolved signal that still bounds B from below (``floor``: B
    >= floor): the optimum does not decrease in B, so when it lies above
    the current bucket both at B = floor / hysteresis and as B -> inf,
    every B the evidence allows agrees that a larger batch is faster; move
    to the optimum at the bound (the least such batch). This is what lets a
    run whose round time is nearly flat in N (launch-bound accelerators)
    leave a small N before |G|^2 is resolved."""
    f, h = self.factor, self.hysteresis
    if not (self.decides(rnd) and floor > 0 and math.isfinite(floor)):
      return self.prompts
    try:
      lo = self.best_prompts(f * floor / h)
      top = self.best_prompts(math.inf)
    except ValueError:  # no round time measured yet and no model: hold
      return self.prompts
    cur = self.prompts
    if lo > cur and top > cur:
      rt = self.round_times
      if isinstance(rt, time_optimal.RoundTimes) and lo * self.K not in rt.measured():
        t = lambda p: time_optimal.relative_time(p * self.K, f * floor / h, rt(p * self.K))
        if not time_optimal.repays(t(cur), t(lo), rt.total, rt.compile_cost()):
          self.held_for_cost += 1
          return self.prompts
      self.target = float(lo)
      self._move(lo)
    return self.prompts

  def _move(self, new: int) -> None:
    if new != self.prompts:
      self.prompts, self.changes = new, self.changes + 1

  def state_dict(self) -> dict:
    out = dict(
        prompts=self.prompts,
        changes=self.changes,
        held_for_cost=self.held_for_cost,
        buckets=list(self.buckets),
    )
    if isinstance(self.round_times, time_optimal.RoundTimes):
      out["round_times"] = self.round_times.state_dict()
    return out

  def load_state_dict(self, state: dict) -> None:
    saved = state.get("buckets")
    if saved is not None and [int(b) for b in saved] != self.buckets:
      raise ValueError(
          f"the checkpoint's adaptive buckets {list(saved)} differ from this "
          f"config's {self.buckets} (config.batch.adaptive_min_prompts / "
          "adaptive_max_prompts changed since the run started)"
      )
    p = int(state["prompts"])
    if p not in self.buckets:
      raise ValueError(f"the checkpoint's adaptive prompts={p} is not a bucket {self.buckets}")
    self.prompts = p
    self.changes = int(state.get("changes", 0))
    self.held_for_cost = int(state.get("held_for_cost", 0))
    if isinstance(self.round_times, time_optimal.RoundTimes) and "round_times" in state:
      self.round_times.load_state_dict(state["round_times"])
