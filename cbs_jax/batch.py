"""Batch-size rules: how the learning rate follows the batch size.

``lr_scale(rule, n, ref)`` is the factor applied to the learning rate tuned
at ``ref`` rollouts per update when an update uses ``n`` rollouts:
``constant`` (1), ``sqrt`` (sqrt(n/ref), the rule for Adam this study
uses) or ``linear`` (n/ref, the SGD rule).
"""
from __future__ import annotations

import math

import numpy as np

from cbs_jax import stats

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


def _fit_ab(n, s, w):
  f = stats.wls(np.stack([np.ones_like(n), 1.0 / n], axis=1), s, 1.0 / np.sqrt(w))
  return f.coef


def _b_crit(a, b):
  return b / a if a > 0 else math.inf


def fit_critical_batch(batch_sizes, steps, seeds=None, *, level: float = 0.9,
                       n_boot: int = 2000, seed: int = 0, min_points: int = 3) -> dict:
  """Fit S(N) = S_min (1 + B_crit / N) (McCandlish et al. 2018) to steps-to-
  target, seeds as replicates, with bootstrap intervals.

  ``batch_sizes[i]``, ``steps[i]`` (None or nan: the target was not
  reached), ``seeds[i]`` (replicate id; None = one replicate per point)
  describe one run each. The model is linear in (a, b) = (S_min, S_min
  B_crit): S = a + b / N, fitted by weighted least squares with weights
  1 / mean_N(S)^2 (seed-to-seed scatter of steps-to-target grows with S, so
  errors are taken as relative). Batch sizes where some seed never reached
  the target are left out of the fit and listed in ``censored``.

  Intervals: a residual bootstrap -- the relative residuals of all runs,
  pooled and inflated by sqrt(n / (n - 2)), are resampled onto the fitted
  curve and the fit repeated ``n_boot`` times -- with ``level`` percentile
  intervals for S_min, B_crit and E_min = S_min B_crit (a refit with
  S_min <= 0 counts as B_crit = inf). In 200 synthetic sweeps (9 batch
  sizes x 3 seeds, 10% scatter) the 90% interval of B_crit covered the truth
  in 85-95% of them (``tests/test_fits.py``); with 3 seeds a per-batch-size
  resampling of seeds covers only ~82%, hence the pooled residuals.

  ``resolved`` is True only when the B_crit interval lies inside the swept
  range [min N, max N] of the fitted points and the point fit is not
  degenerate (S_min > 0, B_crit > 0): a knee outside the sweep was not
  observed. Returns a dict with the estimates, their intervals
  (``*_lo``/``*_hi``), ``r2``, ``resolved`` and the bootstrap replicates
  ``boot_B_crit`` (for ratios of two fits: ``ratio_interval``).

  Raises ValueError naming the shortfall with fewer than ``min_points``
  distinct batch sizes that reached the target, or (when ``seeds`` is
  given) fewer than ``min_points`` seeds at some batch size.
  """
  n_all = np.asarray(batch_sizes, np.float64)
  s_all = np.array([np.nan if v is None else float(v) for v in steps], np.float64)
  if n_all.shape != s_all.shape:
    raise ValueError(f"{n_all.size} batch sizes but {s_all.size} steps")
  if seeds is not None:
    seeds = list(seeds)
    for N in np.unique(n_all):
      k = len({sd for sd, n in zip(seeds, n_all) if n == N})
      if k < min_points:
        raise ValueError(f"batch size N={N:g} has {k} seed(s): a fit with seeds as "
                         f"replicates needs at least {min_points} per batch size")
  censored = sorted({float(N) for N, v in zip(n_all, s_all) if not np.isfinite(v)})
  keep = ~np.isin(n_all, censored)
  n, s = n_all[keep], s_all[keep]
  distinct = np.unique(n)
  if distinct.size < min_points:
    raise ValueError(f"need steps-to-target at >= {min_points} distinct batch sizes that "
                     f"reached the target, got {distinct.tolist()} "
                     f"(not reached at: {censored})")
  mean_at = {N: float(np.mean(s[n == N])) for N in distinct}
  w = np.array([1.0 / mean_at[N] ** 2 for N in n])
  a, b = _fit_ab(n, s, w)
  fitted = a + b / n
  ss_tot = float(np.sum(w * (s - np.average(s, weights=w)) ** 2))
  r2 = 1.0 - float(np.sum(w * (s - fitted) ** 2)) / ss_tot if ss_tot > 0 else math.nan
  rng = np.random.default_rng(seed)
  rel = (s - fitted) / fitted * math.sqrt(n.size / max(n.size - 2, 1))
  boot = np.empty((n_boot, 2))
  for i in range(n_boot):
    boot[i] = _fit_ab(n, fitted * (1.0 + rng.choice(rel, size=rel.size)), w)
  b_boot = np.array([_b_crit(x, y) for x, y in boot])
  e_boot = np.where(boot[:, 0] > 0, boot[:, 1], math.inf)  # E_min = S_min B_crit = b
  B = _b_crit(a, b)
  lo, hi = stats.percentile_ci(b_boot, level)
  s_lo, s_hi = stats.percentile_ci(boot[:, 0], level)
  e_lo, e_hi = stats.percentile_ci(e_boot, level)
  degenerate = not (a > 0 and b > 0)
  resolved = (not degenerate) and lo >= distinct.min() and hi <= distinct.max()
  why = ("degenerate fit (S_min <= 0 or B_crit <= 0)" if degenerate else
         f"B_crit interval [{lo:.4g}, {hi:.4g}] leaves the swept range "
         f"[{distinct.min():g}, {distinct.max():g}]" if not resolved else "")
  return dict(S_min=float(a), B_crit=float(B), E_min=float(b) if a > 0 else math.nan,
              S_min_lo=s_lo, S_min_hi=s_hi, B_crit_lo=lo, B_crit_hi=hi,
              E_min_lo=e_lo, E_min_hi=e_hi, level=level, r2=r2,
              resolved=bool(resolved), verdict="resolved" if resolved else "unresolved",
              why=why, n_min=float(distinct.min()), n_max=float(distinct.max()),
              censored=censored, points=int(n.size), boot_B_crit=b_boot)


def ratio_interval(boot_num, boot_den, level: float = 0.9) -> tuple[float, float]:
  """Percentile interval of the ratio of two independent bootstrap
  distributions (e.g. B_crit off-policy / on-policy), pairing replicates
  at random."""
  a = np.asarray(boot_num, np.float64)
  b = np.asarray(boot_den, np.float64)
  m = min(a.size, b.size)
  with np.errstate(divide="ignore", invalid="ignore"):
    r = a[:m] / b[:m]
  return stats.percentile_ci(np.where(b[:m] > 0, r, math.inf), level)


# ------------------------------------------------------------- adaptive batch
#
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
# critical batch size is defined by S(N) = S_min (1 + B_crit / N), steps to a
# target as a function of N. One run sits at one N at a time and reaches a
# target once, so a single run cannot fit S(N) -- the fit needs a sweep of
# runs (``fit_critical_batch``). What a run can measure live is B_noise. The
# b_crit signal therefore carries the ratio B_crit / B_noise measured once by
# an on-policy study (its fitted B_crit at a target over B_noise measured by
# ``cbs_jax.measure`` at the same K; ``calibration_from_fits``) and applies
# it to the live tracker. Limits: (1) the ratio is assumed constant over
# training and across N -- B_noise was measured at the SFT base and at the
# end of one run, and the fit pools runs at every N; (2) it belongs to the
# study's task, model, K and target and must be re-measured for another (on
# the arithmetic study it is ~1: B_crit 4,700 vs B_noise 4,860 at expected
# pass 0.54, configs/adaptive_batch.py); (3) its own uncertainty (bootstrap
# interval of B_crit, SE of B_noise) is systematic: it does not shrink
# within a run and says nothing about whether the signal *moved*, so the
# controller's hysteresis uses the tracker's interval scaled by the point
# ratio, and the ratio's interval is reported beside the results (the N the
# controller aims at is uncertain by that factor); (4) it needs that study
# first -- b_crit is "without a sweep" only for the runs that reuse it.

SIGNALS = ("b_noise", "b_noise_adam", "b_crit")


def signal_interval(kind: str, raw: dict, adam: dict | None = None,
                    b_crit_ratio: float = 0.0) -> dict:
  """The controller's signal (rollouts) and its interval from the trackers'
  intervals (``noise_tracker.NoiseEMA.interval``: dicts with b_noise, se, lo, hi,
  resolved): ``raw`` for b_noise and b_crit (times ``b_crit_ratio``),
  ``adam`` for b_noise_adam. Returns ``dict(value, se, lo, hi, resolved)``."""
  if kind not in SIGNALS:
    raise ValueError(f"adaptive_signal={kind!r} is not one of {list(SIGNALS)}")
  src, scale = raw, 1.0
  if kind == "b_noise_adam":
    if adam is None:
      raise ValueError("adaptive_signal='b_noise_adam' needs the tracker in Adam's metric")
    src = adam
  elif kind == "b_crit":
    if not (isinstance(b_crit_ratio, (int, float)) and math.isfinite(b_crit_ratio)
            and b_crit_ratio > 0):
      raise ValueError(f"adaptive_signal='b_crit' needs adaptive_b_crit_ratio > 0 (B_crit / "
                       f"B_noise from an on-policy study), got {b_crit_ratio!r}")
    scale = float(b_crit_ratio)
  mul = lambda v: v * scale if v is not None and math.isfinite(v) else v
  return dict(value=mul(float(src["b_noise"])), se=mul(float(src["se"])),
              lo=mul(float(src["lo"])), hi=mul(float(src["hi"])),
              resolved=bool(src["resolved"]))


def calibration_from_fits(doc: dict, target: float, study: str = "on",
                          z: float = 2.0) -> dict:
  """B_crit / B_noise from an on-policy study's ``_fits.json`` (``study.
  save_fits``: ``{study: {target: fit}, "noise": [measured rows]}``).

  B_noise is the inverse-variance weighted mean of the ``noise`` rows'
  finite ``b_noise`` (± ``b_noise_se``, raw gradients, the study's K).
  Returns ``dict(ratio, lo, hi, b_crit, b_crit_lo, b_crit_hi, b_noise,
  b_noise_se, target, resolved)``: ``[lo, hi]`` combines the fit's B_crit
  interval with B_noise ± z SE (conservatively, bound against bound);
  ``resolved`` is the fit's verdict. ValueError naming what is missing."""
  if study not in doc:
    raise ValueError(f"no fits of study {study!r} (have {sorted(doc)})")
  fits = doc[study]
  fit = fits.get(str(float(target)), fits.get(str(target)))
  if fit is None:
    raise ValueError(f"study {study!r} has no fit at target {target} (have {sorted(fits)})")
  if "error" in fit:
    raise ValueError(f"study {study!r} at target {target}: no fit ({fit['error']})")
  rows = [r for r in doc.get("noise", [])
          if r.get("b_noise") is not None and math.isfinite(r["b_noise"])
          and r.get("b_noise_se") is not None and r["b_noise_se"] > 0]
  if not rows:
    raise ValueError("the fits file holds no measured B_noise (its 'noise' rows)")
  w = np.array([1.0 / r["b_noise_se"] ** 2 for r in rows])
  b = float(np.sum(w * np.array([r["b_noise"] for r in rows])) / np.sum(w))
  se = float(1.0 / math.sqrt(np.sum(w)))
  B, B_lo, B_hi = float(fit["B_crit"]), float(fit["B_crit_lo"]), float(fit["B_crit_hi"])
  low_b = b - z * se
  return dict(ratio=B / b, lo=B_lo / (b + z * se), hi=B_hi / low_b if low_b > 0 else math.inf,
              b_crit=B, b_crit_lo=B_lo, b_crit_hi=B_hi, b_noise=b, b_noise_se=se,
              target=float(target), resolved=bool(fit.get("resolved", False)))


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
  N = the signal). The learning rate follows ``optim.lr_rule`` from the
  chosen rollouts per update (the trainer's job, ``train.update_round``).
  ``state_dict`` / ``load_state_dict`` carry the choice across a checkpoint
  restore (with the tracker's own state, a resumed run makes the same
  choices).
  """

  def __init__(self, K: int, min_prompts: int, max_prompts: int, factor: float = 1.0,
               every: int = 10, prompts: int | None = None, hysteresis: float = 1.25):
    if not (isinstance(K, int) and K >= 1):
      raise ValueError(f"K={K!r} (rollouts per prompt) must be a positive integer")
    if min_prompts <= 0 or max_prompts < min_prompts:
      raise ValueError(f"need 0 < min_prompts <= max_prompts, got {min_prompts}, {max_prompts}")
    if not (math.isfinite(factor) and factor > 0):
      raise ValueError(f"factor={factor!r} must be finite and > 0")
    if not (isinstance(every, int) and every >= 1):
      raise ValueError(f"every={every!r} (rounds between decisions) must be an integer >= 1")
    if not hysteresis >= 1.0:
      raise ValueError(f"hysteresis={hysteresis} must be >= 1")
    self.K, self.factor, self.every, self.hysteresis = K, factor, every, hysteresis
    self.buckets = [min_prompts * 2 ** j for j in range(64)
                    if min_prompts * 2 ** j <= max_prompts]
    start = self.buckets[0] if prompts is None else prompts
    if start not in self.buckets:
      raise ValueError(f"starting prompts={start} is not a bucket {self.buckets} "
                       f"(min_prompts * 2^j <= max_prompts)")
    self.prompts = start
    self.changes = 0
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
    f = self.factor / self.K
    self.target = f * value if signal["resolved"] else math.nan
    if not self.decides(rnd) or not signal["resolved"]:
      return self.prompts
    cur, h = self.prompts, self.hysteresis * math.sqrt(2.0)
    if f * signal["lo"] > cur * h or f * signal["hi"] < cur / h:
      new = self._nearest(f * value)
      if new != cur:
        self.prompts, self.changes = new, self.changes + 1
    return self.prompts

  def state_dict(self) -> dict:
    return dict(prompts=self.prompts, changes=self.changes, buckets=list(self.buckets))

  def load_state_dict(self, state: dict) -> None:
    saved = state.get("buckets")
    if saved is not None and [int(b) for b in saved] != self.buckets:
      raise ValueError(f"the checkpoint's adaptive buckets {list(saved)} differ from this "
                       f"config's {self.buckets} (config.batch.adaptive_min_prompts / "
                       "adaptive_max_prompts changed since the run started)")
    p = int(state["prompts"])
    if p not in self.buckets:
      raise ValueError(f"the checkpoint's adaptive prompts={p} is not a bucket {self.buckets}")
    self.prompts = p
    self.changes = int(state.get("changes", 0))
