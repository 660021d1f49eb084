"""Fits with intervals: weighted least squares, nested-model tests, bootstrap.

The studies' numbers come from fits: S(N) = S_min (1 + B_crit / N) in
``batch_law.py``, noise against kappa in ``drift.py``. Each needs an interval
and, where two models compete, a test between them. This module holds the
general pieces (numpy and scipy.stats only):

* ``wls``: weighted least squares y ~ X beta with weights 1 / se^2,
  coefficient covariance, chi^2, AIC.
* ``compare_nested``: the F-test for the extra terms of a nested model
  (the per-point SEs fix the weights' relative sizes; their overall scale is
  estimated from the residuals, so SEs that are right only up to a factor
  still give a valid test) and the AIC difference.
* ``lack_of_fit``: a line against one mean per group of replicates.
* ``percentile_ci``: a percentile interval of bootstrap replicates that
  counts non-finite replicates (a degenerate refit) as +inf, so they widen
  the interval instead of vanishing from it.
* ``ratio_of_means``: sum(num) / sum(den) over paired replicates with its
  delete-one jackknife SE: a within-replicate ratio averaged over replicates
  (mean of num_i / den_i) is biased upward by about CV(den)^2 (Jensen),
  which for noisy denominators swamps the effect being measured.
* ``paired_ratio``: the median of per-pair ratios with a bootstrap
  interval, for timings of two paths taken side by side in each repeat;
  ``goal_verdict`` reads such an interval against a goal ("met", "not met"
  or "unresolved").
* ``fieller_interval``: Fieller's interval for a ratio of two jointly normal
  estimates (skewed where r +- z se(r) is symmetric and too short on the
  side away from zero when the denominator is barely resolved).
* ``t_quantile_like``: the Student-t quantile of the same coverage as a
  normal quantile z, for intervals whose variances are estimated.
* ``fmt``: ``value +- se`` / ``[lo, hi]`` formatting used in tables;
  ``Estimate``: a table cell that prints as ``fmt`` does and is written to
  CSV as numeric columns (``report.Results.table``).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from scipy import stats as sps


@dataclasses.dataclass
class WLSFit:
  coef: np.ndarray  # [p]
  cov: np.ndarray  # [p, p] coefficient covariance, scaled by chi2/dof
  chi2: float  # sum of squared weighted residuals
  dof: int  # n - p
  aic: float  # chi2 + 2 p (Gaussian errors with the given SEs)

  @property
  def se(self) -> np.ndarray:
    return np.sqrt(np.maximum(np.diag(self.cov), 0.0))

  @property
  def reduced_chi2(self) -> float:
    return self.chi2 / self.dof if self.dof > 0 else math.nan


def wls(X, y, se=None) -> WLSFit:
  """Weighted least squares of y on the columns of X with weights 1 / se^2
  (unweighted when ``se`` is None). The coefficient covariance is scaled
  by the reduced chi^2 when there are spare degrees of freedom, so it is
  right when the SEs are right only up to a common factor."""
  X = np.asarray(X, np.float64)
  y = np.asarray(y, np.float64)
  n, p = X.shape
  if y.shape != (n,):
    raise ValueError(f"y has shape {y.shape}, X has {n} rows")
  w = np.ones(n) if se is None else 1.0 / np.square(np.asarray(se, np.float64))
  if not np.all(np.isfinite(w)) or np.any(w <= 0):
    raise ValueError("per-point standard errors must be finite and > 0")
  sw = np.sqrt(w)
  A, b = X * sw[:, None], y * sw
  coef, *_ = np.linalg.lstsq(A, b, rcond=None)
  resid = b - A @ coef
  chi2 = float(resid @ resid)
  dof = n - p
  try:
    cov = np.linalg.inv(A.T @ A)
  except np.linalg.LinAlgError:
    cov = np.full((p, p), np.nan)
  if dof > 0:
    cov = cov * max(chi2 / dof, 1e-300)
  return WLSFit(coef=coef, cov=cov, chi2=chi2, dof=dof, aic=chi2 + 2 * p)


def compare_nested(small: WLSFit, big: WLSFit) -> dict:
  """F-test that the extra terms of ``big`` (which nests ``small``) are
  zero, and the AIC difference. Returns ``dict(F, p_value, delta_aic)``
  (delta_aic = big - small: negative favours ``big``)."""
  q = small.dof - big.dof
  if q <= 0 or big.dof <= 0:
    return dict(F=math.nan, p_value=math.nan, delta_aic=big.aic - small.aic)
  F = ((small.chi2 - big.chi2) / q) / max(big.chi2 / big.dof, 1e-300)
  return dict(
      F=float(F), p_value=float(sps.f.sf(F, q, big.dof)), delta_aic=float(big.aic - small.aic)
  )


def lack_of_fit(x, y, groups) -> dict:
  """Lack-of-fit F-test of the line y = a + b x against one mean per group
  of replicates (the pure error): the F-test of the line nested in the
  group-means model, F = [SS_lack / (m - 2)] / [SS_pure / (n - m)] over m
  groups and n points. Returns dict(F, p_value, dof_lack, dof_pure,
  verdict) with verdict "misfits" when p < 0.05, else "fits"; ValueError
  with fewer than three groups or no replicate."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  labels, inverse = np.unique(np.asarray(groups), return_inverse=True)
  m, n = labels.size, x.size
  if m < 3 or n - m < 1:
    raise ValueError(f"lack_of_fit needs >= 3 groups and a replicate, got {m} groups, {n} points")
  line = wls(np.stack([np.ones_like(x), x], axis=1), y)
  means = wls(np.eye(m)[inverse], y)
  t = compare_nested(line, means)
  return dict(
      F=t["F"],
      p_value=t["p_value"],
      dof_lack=m - 2,
      dof_pure=n - m,
      verdict="misfits" if t["p_value"] < 0.05 else "fits",
  )


R2_DECIMALS = 12


def r_squared(ss_res: float, ss_tot: float) -> float:
  """1 - ss_res / ss_tot, rounded to ``R2_DECIMALS`` decimals (NaN where
  ss_tot is not positive). An R² lives on the unit scale, and where a model
  fits no better than the mean (the constant model's R² is exactly 0) the
  difference cancels to a few units of 1e-16 whose value and sign depend on
  the processor's summation order; rounded, the same data give the same R²
  (and the same "R²=0.00" label, never "-0.00") on every machine."""
  if not ss_tot > 0:
    return math.nan
  return round(1.0 - float(ss_res) / float(ss_tot), R2_DECIMALS) + 0.0  # -0.0 -> 0.0


def percentile_ci(replicates, level: float = 0.9) -> tuple[float, float]:
  """Percentile interval of bootstrap ``replicates``; non-finite ones count
  as +inf (a refit that broke down says "could be anything large")."""
  r = np.asarray(replicates, np.float64)
  if r.size == 0:
    return math.nan, math.nan
  r = np.where(np.isfinite(r), r, np.inf)
  # outward rounding of the order statistics (no inf - inf interpolation)
  lo = np.quantile(r, (1 - level) / 2, method="lower")
  hi = np.quantile(r, (1 + level) / 2, method="higher")
  return float(lo), float(hi)


def ratio_of_means(num, den) -> tuple[float, float]:
  """(sum(num) / sum(den), delete-one jackknife SE) over paired replicates.

  Raises ValueError for unpaired input or fewer than two replicates; the SE
  is nan when a leave-one-out denominator is zero."""
  a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
  if a.shape != b.shape:
    raise ValueError(f"ratio_of_means: num has {a.size} values, den {b.size}")
  n = a.size
  if n < 2:
    raise ValueError(f"ratio_of_means: {n} replicates; the jackknife needs >= 2")
  with np.errstate(divide="ignore", invalid="ignore"):
    ratio = a.sum() / b.sum()
    loo = (a.sum() - a) / (b.sum() - b)
  se = np.sqrt((n - 1) / n * np.sum((loo - loo.mean()) ** 2))
  return float(ratio), float(se)


def _ratio_of_means(num, den, axis=-1):
  return np.mean(num, axis=axis) / np.mean(den, axis=axis)


def ratio_of_means_interval(num, den, level: float = 0.9, n_boot: int = 4000, seed: int = 0):
  """Ratio of the mean of ``num`` to the mean of ``den`` (per-seed values),
  with a percentile bootstrap interval (``scipy.stats.bootstrap``, unpaired:
  seeds resampled within each arm); None when a seed of either arm did not
  reach the target."""
  if not num or not den or any(v is None for v in num + den):
    return None, None, None
  a, b = np.asarray(num, np.float64), np.asarray(den, np.float64)
  if not b.min() > 0:  # the reference was at the target before its first update
    return None, None, None
  lo, hi = _bootstrap((a, b), _ratio_of_means, level, n_boot, seed, paired=False)
  return float(a.mean() / b.mean()), lo, hi


def _bootstrap(data, statistic, level, n_boot, seed, **kw) -> tuple[float, float]:
  """Percentile bootstrap interval of a vectorized ``statistic`` of ``data``."""
  ci = sps.bootstrap(
      data,
      statistic,
      n_resamples=n_boot,
      vectorized=True,
      confidence_level=level,
      method="percentile",
      random_state=np.random.default_rng(seed),
      **kw,
  ).confidence_interval
  return float(ci.low), float(ci.high)


MIN_PAIRS = 5  # paired_ratio: fewer pairs give no interval


def paired_ratio(num, den, level: float = 0.9, n_boot: int = 4000, seed: int = 0):
  """``(median, lo, hi)`` of the per-pair ratios num_i / den_i, with a
  percentile bootstrap interval of the median (pairs resampled,
  ``scipy.stats.bootstrap``).

  For timings of two paths taken side by side in each repeat: the pair
  shares the machine's state at that moment (clock, other processes), which
  the ratio cancels, and the median ignores the calls another process
  delayed (timings are heavy-tailed), where ``ratio_of_means`` would not.
  With fewer than ``MIN_PAIRS`` pairs the interval is [0, inf] (a bootstrap
  of a median from a handful of pairs is far too narrow), so a goal read off
  it is "unresolved". Raises ValueError for unpaired input, no pairs or a
  non-positive denominator."""
  a, b = np.asarray(num, np.float64).ravel(), np.asarray(den, np.float64).ravel()
  if a.shape != b.shape:
    raise ValueError(f"paired_ratio: num has {a.size} values, den {b.size}")
  if a.size == 0:
    raise ValueError("paired_ratio: no pairs")
  if not b.min() > 0:
    raise ValueError(f"paired_ratio: den holds {b.min()}, expected positive times")
  r = a / b
  if r.size < MIN_PAIRS:
    return float(np.median(r)), 0.0, math.inf
  return (float(np.median(r)),) + _bootstrap((r,), np.median, level, n_boot, seed)


def goal_verdict(lo: float, hi: float, goal: float, at_most: bool = True) -> str:
  """A goal read off an interval ``[lo, hi]``: "met" when the whole
  interval is on the goal's side (``<= goal`` with ``at_most``, else
  ``>= goal``), "not met" when the whole interval is on the other side,
  "unresolved" when it straddles the goal (the table of such verdicts:
  docs/statistics.md)."""
  if not lo <= hi:
    raise ValueError(f"goal_verdict: lo {lo} > hi {hi}")
  inside, outside = (hi <= goal, lo > goal) if at_most else (lo >= goal, hi < goal)
  return "met" if inside else "not met" if outside else "unresolved"


def fieller_interval(
    num: float, den: float, var_num: float, var_den: float, cov: float, z: float
) -> tuple[float, float]:
  """Fieller's interval for the ratio num / den of two jointly normal estimates.

  The set of ratios r that a z-SE test of num - r den = 0 does not reject:
  (num - r den)^2 <= z^2 (var_num - 2 r cov + r^2 var_den), i.e.
  a r^2 - 2 b r + c <= 0 with a = den^2 - z^2 var_den, b = num den - z^2 cov,
  c = num^2 - z^2 var_num. When the denominator is resolved (a > 0, i.e.
  |den| > z sqrt(var_den)) the set is the interval between the two roots,
  returned as ``(lo, hi)``; it contains num / den and is skewed away from
  zero (a ratio of noisy means has a long tail on that side). Otherwise the
  set is unbounded (the whole line, or the line less an interval) and
  ``(-inf, inf)`` is returned. A covariance with |cov| > sqrt(var_num
  var_den) (not a valid one) can make the discriminant negative; it is
  clipped at 0, collapsing the interval to b / a.
  """
  z2 = z * z
  a, b, c = den * den - z2 * var_den, num * den - z2 * cov, num * num - z2 * var_num
  if not a > 0:
    return -math.inf, math.inf
  half = math.sqrt(max(b * b - a * c, 0.0))
  return (b - half) / a, (b + half) / a


def fieller_lower_bound(
    num: float, den: float, var_num: float, var_den: float, cov: float, z: float
) -> float:
  """The least ratio r >= 0 in Fieller's set (``fieller_interval``) when the
  true denominator is known to be >= 0 (a squared norm): a one-sided bound
  that exists even where the denominator is not resolved. With a = den^2 -
  z^2 var_den <= 0 the set is the line less an interval around a negative
  ratio (or the whole line); when the numerator is resolved (c = num^2 - z^2
  var_num > 0, so r = 0 is rejected) its part on r >= 0 is [r+, inf), r+
  the positive root of a r^2 - 2 b r + c. Returns 0 where r = 0 is not
  rejected, and the interval's lower end (clipped at 0) where a > 0."""
  z2 = z * z
  a, b, c = den * den - z2 * var_den, num * den - z2 * cov, num * num - z2 * var_num
  if a > 0:
    return max(fieller_interval(num, den, var_num, var_den, cov, z)[0], 0.0)
  if not c > 0:
    return 0.0
  if a == 0:  # linear: -2 b r + c <= 0
    return c / (2 * b) if b > 0 else math.inf
  return (b - math.sqrt(b * b - a * c)) / a  # a < 0 < c: the roots have opposite signs


def t_quantile_like(z: float, dof: float) -> float:
  """The Student-t quantile with ``dof`` degrees of freedom at the coverage of
  the normal quantile ``z``: F_t^-1(Phi(z); dof) (z = 2 -> t_{0.977, dof}).

  An interval +- z SE with an SE estimated from dof degrees of freedom
  covers less than the normal's 2 Phi(z) - 1; +- ``t_quantile_like(z, dof)``
  SE restores it (exactly, for a normal sample's mean and its sample SD).
  ``dof`` need not be an integer (e.g. Kish's effective sample size less
  one). dof < 1 (or nan): inf (too few to estimate a spread); dof = inf: z.
  """
  if not dof >= 1:
    return math.inf
  if math.isinf(dof):
    return float(z)
  return float(sps.t.ppf(sps.norm.cdf(z), dof))


@dataclasses.dataclass(frozen=True)
class Estimate:
  """A value with its interval [lo, hi] or its standard error ``se``, as a
  table cell: ``str()`` is ``fmt``'s text (markdown), ``columns(name)``
  the numeric CSV columns ``name``, ``name_lo``, ``name_hi`` (or
  ``name_se``), so that a CSV holds numbers, never "6.37 ± 0.383"."""

  value: float | None
  lo: float | None = None
  hi: float | None = None
  se: float | None = None
  digits: int = 3

  def __str__(self) -> str:
    return fmt(self.value, self.lo, self.hi, self.se, self.digits)

  def columns(self, name: str) -> dict:
    out = {name: self.value}
    if self.lo is not None or self.hi is not None:
      out |= {f"{name}_lo": self.lo, f"{name}_hi": self.hi}
    if self.se is not None:
      out[f"{name}_se"] = self.se
    return out


def fmt(value, lo=None, hi=None, se=None, digits: int = 3) -> str:
  """``value [lo, hi]`` or ``value +- se`` with ``digits`` significant digits."""
  g = (
      lambda x: "–"
      if x is None
      else ("inf" if x == math.inf else ("nan" if not math.isfinite(x) else f"{x:.{digits}g}"))
  )
  if lo is not None:
    return f"{g(value)} [{g(lo)}, {g(hi)}]"
  if se is not None:
    return f"{g(value)} ± {g(se)}"
  return g(value)


def holm(p_values, alpha: float = 0.05) -> dict:
  """Holm's step-down correction of the family ``p_values`` (NaN: a test
  not made, never rejected and not counted): the family-wise error rate
  (any true null rejected) stays <= ``alpha`` under any dependence between
  the tests. Returns ``dict(adjusted, reject, m)``: the Holm-adjusted
  p-values (min(1, max over the step-down of (m - i) p_(i))), in the
  input's order, and which are rejected at ``alpha``."""
  p = np.asarray(p_values, np.float64).ravel()
  made = np.flatnonzero(np.isfinite(p))
  m = made.size
  adjusted = np.full(p.shape, np.nan)
  if m:
    order = made[np.argsort(p[made], kind="stable")]
    steps = (m - np.arange(m)) * p[order]
    adjusted[order] = np.minimum(np.maximum.accumulate(steps), 1.0)
  reject = np.where(np.isfinite(adjusted), adjusted <= alpha, False)
  return dict(adjusted=adjusted.tolist(), reject=reject.tolist(), m=int(m))


def plateau(x, y, last: float = 0.2, level: float = 0.9) -> dict:
  """Has the curve ``y(x)`` stopped moving? The least-squares slope of y on
  x over the last ``last`` fraction of the points, with its ``level``
  t-interval: "plateaued" when the interval contains 0, "rising" /
  "falling" when it lies above / below 0, "too few points" with fewer than
  4 points in the window (the interval needs 2 residual degrees of
  freedom). Returns ``dict(verdict, slope, lo, hi, n, x_from)``."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  x, y = x[ok], y[ok]
  if not 0 < last <= 1:
    raise ValueError(f"plateau: last={last!r} must be in (0, 1]")
  if x.size:
    order = np.argsort(x, kind="stable")
    x, y = x[order], y[order]
  n = int(math.ceil(last * x.size))
  xs, ys = x[x.size - n :], y[y.size - n :]
  out = dict(n=n, x_from=float(xs[0]) if n else math.nan)
  if n < 4 or np.ptp(xs) == 0:
    return dict(out, verdict="too few points", slope=math.nan, lo=math.nan, hi=math.nan)
  X = np.stack([np.ones_like(xs), xs], axis=1)
  fit = wls(X, ys)
  slope, se = float(fit.coef[1]), float(fit.se[1])
  t = float(sps.t.ppf(0.5 + level / 2, fit.dof))
  lo, hi = slope - t * se, slope + t * se
  verdict = "plateaued" if lo <= 0 <= hi else ("rising" if lo > 0 else "falling")
  return dict(out, verdict=verdict, slope=slope, lo=lo, hi=hi)
