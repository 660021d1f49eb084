"""How the noise traces depend on the group size K under a group-mean baseline.

docs/noise.md, "K under a group-mean baseline", derives this for advantages
centred on the group's mean reward (Dr. GRPO's; RLOO's are the same times
K / (K - 1); GRPO's also divide by the group's reward std, which this
leaves out). With u = r - E[r | p] and s the score vector of a rollout
(E[s | p] = 0), alpha = (K - 1) / K, the per-prompt moments

    a_p = E[u s | p]            (the prompt's gradient at K = infinity)
    q = E_p E[u^2 |s|^2 | p]    f = E_p (Var(r | p) E[|s|^2 | p])
    h = E_p |a_p|^2             v = E_p |a_p - G_inf|^2,  G_inf = E_p a_p

give, exactly,

    tr Sigma_intra(K) = alpha^2 q + (K - 1) / K^2 f - (alpha^2 + 1 / K^2) h
    tr Sigma_inter(K) = alpha^2 v + h / K^2
    G(K) = alpha G_inf.

So the intra-prompt noise carries the baseline's own noise f / (K - 1) (per
unit of |G|^2), and the inter-prompt term gains h / (K - 1)^2 from the
positive covariance a_p a_p^T / K^2 between siblings; both vanish as K grows.
``traces`` evaluates these; ``fit_moments`` fits (q, f, h, v) to traces
measured at several K by weighted least squares and reports the lack of fit
(chi^2 on the spare degrees of freedom), which is the test of the formula
on measured numbers.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats as sps

MOMENTS = ("q", "f", "h", "v")


def coefficients(K: float) -> tuple[np.ndarray, np.ndarray]:
  """Rows of the linear maps (q, f, h, v) -> tr Sigma_intra(K), tr Sigma_inter(K)."""
  if not K >= 2:
    raise ValueError(f"K={K!r}: a group baseline needs K >= 2")
  a2 = ((K - 1) / K) ** 2
  intra = np.array([a2, (K - 1) / K**2, -(a2 + 1 / K**2), 0.0])
  inter = np.array([0.0, 0.0, 1 / K**2, a2])
  return intra, inter


def traces(q: float, f: float, h: float, v: float, K: float) -> dict:
  """tr Sigma_intra(K), tr Sigma_inter(K) and |G(K)|^2 / |G_inf|^2."""
  m = np.array([q, f, h, v], float)
  intra, inter = coefficients(K)
  return dict(
      trace_intra=float(intra @ m), trace_inter=float(inter @ m), g2_ratio=((K - 1) / K) ** 2
  )


def fit_moments(
    Ks: Sequence[float],
    trace_intra: Sequence[float],
    trace_inter: Sequence[float],
    se_intra: Sequence[float],
    se_inter: Sequence[float],
) -> dict:
  """Weighted least squares of the measured traces at each K on the
  formula's four moments. Returns the moments with SEs, the predicted
  traces, chi^2, its degrees of freedom (2 x len(Ks) - 4) and the
  lack-of-fit p-value (P(chi^2_dof > chi^2): small = the formula misfits
  these measurements beyond their SEs); ``p_value`` is NaN with no spare
  degree of freedom."""
  Ks = [float(k) for k in Ks]
  rows, y, se = [], [], []
  for K, ti, tb, ei, eb in zip(Ks, trace_intra, trace_inter, se_intra, se_inter):
    intra, inter = coefficients(K)
    rows += [intra, inter]
    y += [ti, tb]
    se += [ei, eb]
  X, y, se = np.array(rows), np.array(y, float), np.array(se, float)
  if len(Ks) < 2 or not np.all(np.isfinite(se) & (se > 0)):
    raise ValueError("fit_moments needs >= 2 group sizes and finite positive SEs")
  A, b = X / se[:, None], y / se
  coef, *_ = np.linalg.lstsq(A, b, rcond=None)
  resid = b - A @ coef
  chi2 = float(resid @ resid)
  dof = X.shape[0] - np.linalg.matrix_rank(A)
  cov = np.linalg.pinv(A.T @ A)
  pred = X @ coef
  return dict(
      moments=dict(zip(MOMENTS, coef.tolist())),
      se=dict(zip(MOMENTS, np.sqrt(np.maximum(np.diag(cov), 0)).tolist())),
      predicted_intra=pred[0::2].tolist(),
      predicted_inter=pred[1::2].tolist(),
      chi2=chi2,
      dof=int(dof),
      p_value=float(sps.chi2.sf(chi2, dof)) if dof > 0 else math.nan,
  )
