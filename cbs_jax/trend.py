"""A straight-line trend over replicated points, with intervals that carry
replicate-to-replicate variation and model error, and where the line would
reach a value.

The noise-length study (``experiments/noise_length.py``) measures the
per-rollout intra:inter ratio at a few completion lengths, with several
independent SFT bases at each length. Each base is one point; the bases at
one length are replicates. ``fit`` fits y = a + b x to the m group means
(with equal replicates the same line as least squares over every point)
and takes its standard errors from the scatter of those means about the
line, with m - 2 degrees of freedom:

* that scatter holds both the replicate-to-replicate variation (a group
  mean of r bases varies as sigma^2 / r) and any departure of the truth
  from a line, so the interval carries model error where the line misfits,
  at the price of few degrees of freedom (Student-t quantiles);
* the lack-of-fit F-test of the line against one mean per group (the
  replicates are the pure error) is reported beside it
  (``stats.lack_of_fit``);
* ``x_star``: where the line reaches y*, (y* - a) / b, with Fieller's
  interval for that ratio (``stats.fieller_interval``): unbounded whenever
  the slope is not resolved from zero, instead of a spurious number.

A within-group bootstrap was the first choice and is not used: with two
replicates per group its 90% slope interval covered the truth in 61% of
synthetic studies (tests/test_trend.py shows the t-interval's coverage).
Callers choose the scales: log ratio against log length is a power law.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats as sps

from cbs_jax import stats


def fit(x, y, groups, y_star: float | None = None, level: float = 0.9) -> dict:
  """The line y = a + b x over the points (x_i, y_i), ``groups`` labelling
  replicates (module docstring). Returns dict(a, b, b_se, b_lo, b_hi, n,
  groups, dof, lack_of_fit) and, with ``y_star``, x_star with Fieller's
  x_star_lo / x_star_hi. ValueError naming the problem with fewer than
  three groups, one x per group violated, or a non-finite point."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  g = np.asarray(groups)
  if not (x.shape == y.shape == g.shape) or x.ndim != 1:
    raise ValueError(f"x, y, groups must be 1-d of one length, got {x.shape} {y.shape} {g.shape}")
  if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y))):
    raise ValueError("trend.fit: every x and y must be finite (leave unmeasured points out)")
  labels = list(dict.fromkeys(g.tolist()))
  xm = np.array([x[g == k].mean() for k in labels])
  ym = np.array([y[g == k].mean() for k in labels])
  if len(labels) < 3 or np.unique(xm).size < 3:
    raise ValueError(f"trend.fit needs >= 3 groups at distinct x, got {len(labels)}: {labels}")
  w = np.array([np.sum(g == k) for k in labels], np.float64)  # replicates per mean
  line = stats.wls(np.stack([np.ones_like(xm), xm], axis=1), ym, 1.0 / np.sqrt(w))
  (a, b), cov, dof = line.coef, line.cov, line.dof
  t = float(sps.t.ppf((1 + level) / 2, dof))
  b_se = math.sqrt(cov[1, 1])
  try:
    lof = stats.lack_of_fit(x, y, g)
  except ValueError as e:  # no replicates: no test
    lof = dict(F=math.nan, p_value=math.nan, verdict=f"not tested ({e})")
  out = dict(
      a=float(a),
      b=float(b),
      b_se=b_se,
      b_lo=float(b - t * b_se),
      b_hi=float(b + t * b_se),
      n=int(x.size),
      groups=len(labels),
      dof=int(dof),
      lack_of_fit=lof,
  )
  if y_star is not None:
    lo, hi = stats.fieller_interval(y_star - a, b, cov[0, 0], cov[1, 1], -cov[0, 1], t)
    out.update(x_star=float((y_star - a) / b) if b else math.inf, x_star_lo=lo, x_star_hi=hi)
  return out
