r"""Host-side summaries of the noise estimates: noise scales, flags, pooling.

``noise`` turns a batch's gradients into unbiased estimate dicts
(``dict(trace_intra, trace_inter, g2)`` or, two-batch, ``dict(trace_total,
g2)``), arrays on device. This module reads those dicts on the host, as
Python floats, and reports what they mean as a :class:`NoiseStats`: the noise
scales b_intra = trI / G2, b_inter = trB / G2, b_noise = (trI + K trB) / G2,
their standard errors, and a flag where they cannot be formed.

Noise scales are ratios of estimates; the ratio of unbiased estimates is not
unbiased, and a single batch's G2 can be negative (then the scales are nan
and the flag says so). :func:`noise_stats` summarises one estimate dict;
:func:`pooled_estimates` averages M batches at fixed parameters and gives
delete-one jackknife standard errors for every quantity, reporting noise
scales only where G2 > 2 se(G2). The live tracker over training (ratio of
EMAs) is ``noise_tracker``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

from cbs_jax import noise
from cbs_jax import stats

_NAN = float("nan")


@dataclasses.dataclass(frozen=True)
class NoiseStats:
  """Noise estimates of one batch, an EMA, or a pool of batches.

  Attributes:
    g2: estimate of |G|^2.
    trace_intra, trace_inter: tr Sigma_intra(K), tr Sigma_inter(K) (nan when
      only the two-batch path was used).
    b_intra: trace_intra/g2, in rollouts.
    b_inter: trace_inter/g2, in prompts.
    b_noise: b_intra + K b_inter = tr Sigma_eff(K)/|G|^2, in rollouts, the
      noise scale of a batch at this K.
    b_simple: McCandlish's B_simple = tr(Sigma)/|G|^2 with Sigma the
      effective per-rollout covariance at this K, Sigma_eff(K). It is the
      same quantity as b_noise (equal by construction when the components
      are known); from the two-batch path it is trace_total/g2, and b_noise
      is set to it as well while b_intra, b_inter stay nan.
    trace_total: tr Sigma_eff(K) = trace_intra + K trace_inter.
    K, P: the batch shape the K-dependent fields refer to.
    g2_positive: False when g2 <= 0 (single batch / EMA), g2 not
      significantly positive (pooled: g2 <= 2 se), non-finite, or a zero
      gradient; then every b_* (and its se) is nan and ``flag`` says why.
    flag: "" or the reason(s), "; "-joined.
    *_se: standard errors (nan when not computed).
    ratio: trace_intra/trace_inter, the per-rollout intra:inter variance
      ratio (nan when trace_inter <= 0); ratio_se its se.
    n_batches: batches behind the estimate (pooled M; 1 otherwise; EMA: the
      number of updates).
    b_noise_floor: pooled only (nan otherwise): the one-sided bound
      B_noise >= b_noise_floor at ``FLOOR_Z`` standard errors (Fieller's set
      with |G|^2 >= 0, ``stats.fieller_lower_bound``). It exists where G2 is
      not resolved and b_noise is nan (0 where the traces are not resolved
      either), and is the Fieller interval's lower end where it is.
  """

  g2: float
  trace_intra: float
  trace_inter: float
  b_intra: float
  b_inter: float
  b_noise: float
  b_simple: float
  K: int
  P: int
  g2_positive: bool
  flag: str
  trace_total: float = _NAN
  g2_se: float = _NAN
  trace_intra_se: float = _NAN
  trace_inter_se: float = _NAN
  trace_total_se: float = _NAN
  b_intra_se: float = _NAN
  b_inter_se: float = _NAN
  b_noise_se: float = _NAN
  b_simple_se: float = _NAN
  ratio: float = _NAN
  ratio_se: float = _NAN
  n_batches: int = 1
  b_noise_floor: float = _NAN


def _derived(v: Mapping[str, np.ndarray], K: int) -> dict[str, np.ndarray]:
  """All reported quantities from (pooled) trI, trB, G2 or trace_total, G2.

  Raw ratios, no masking (used for jackknife replicates too).
  """
  with np.errstate(divide="ignore", invalid="ignore"):
    g2 = np.asarray(v["g2"], np.float64)
    if "trace_intra" in v:
      ti = np.asarray(v["trace_intra"], np.float64)
      tb = np.asarray(v["trace_inter"], np.float64)
      tt = ti + K * tb
      out = dict(
          g2=g2,
          trace_intra=ti,
          trace_inter=tb,
          trace_total=tt,
          b_intra=ti / g2,
          b_inter=tb / g2,
          b_noise=tt / g2,
          b_simple=tt / g2,
          ratio=ti / tb,
      )
    else:
      tt = np.asarray(v["trace_total"], np.float64)
      nan = np.full_like(g2, np.nan)
      out = dict(
          g2=g2,
          trace_intra=nan,
          trace_inter=nan,
          trace_total=tt,
          b_intra=nan,
          b_inter=nan,
          b_noise=tt / g2,
          b_simple=tt / g2,
          ratio=nan,
      )
  return out


_B_FIELDS = ("b_intra", "b_inter", "b_noise", "b_simple")


def _to_float(x) -> float:
  return float(np.asarray(x, np.float64))


def estimate_floats(estimates: Mapping[str, Any], P, K) -> dict[str, float]:
  """An estimate dict's fields as Python floats, its keys and (P, K) checked.

  ``dict(trace_intra, trace_inter, g2)`` (P, K >= 2, else ValueError naming
  them) or ``dict(trace_total, g2)`` (P, K >= 1); KeyError otherwise.
  """
  if "trace_intra" in estimates or "trace_inter" in estimates:
    missing = [k for k in noise.ESTIMATE_KEYS if k not in estimates]
    if missing:
      raise KeyError(f"estimates lack {missing}")
    noise.check_batch_shape(P, K)
    return {k: _to_float(estimates[k]) for k in noise.ESTIMATE_KEYS}
  if "trace_total" in estimates and "g2" in estimates:
    if P < 1 or K < 1:
      raise ValueError(f"P={P}, K={K} must be positive")
    return {k: _to_float(estimates[k]) for k in ("trace_total", "g2")}
  raise KeyError("estimates need (trace_intra, trace_inter, g2) or " "(trace_total, g2)")


def _build(
    point: Mapping[str, float],
    P: int,
    K: int,
    *,
    se: Mapping[str, float],
    significant: bool | None,
    flags: list[str],
    n_batches: int,
) -> NoiseStats:
  """Assemble NoiseStats; ``significant`` None means single-estimate rule."""
  d = {k: float(v) for k, v in _derived(point, K).items()}
  g2 = d["g2"]
  tkeys = (
      ("trace_intra", "trace_inter", "trace_total") if "trace_intra" in point else ("trace_total",)
  )
  traces = [d[k] for k in tkeys]
  flags = list(flags)
  if not all(math.isfinite(x) for x in [g2] + traces):
    flags.append("non-finite estimates")
    ok = False
  elif g2 == 0.0 and all(t == 0.0 for t in traces):
    flags.append("zero gradient")
    ok = False
  elif significant is None:
    ok = g2 > 0.0
    if not ok:
      flags.append("g2<=0: gradient signal not resolved")
  else:
    ok = bool(significant)
    if not ok:
      flags.append(f"g2 not significantly positive (g2={g2:.4g}, " f"se={se.get('g2', _NAN):.4g})")
  fields = dict(d)
  ses = {
      f"{k}_se": float(se.get(k, _NAN))
      for k in ("g2", "trace_intra", "trace_inter", "trace_total", "ratio") + _B_FIELDS
  }
  if not ok:
    for k in _B_FIELDS:
      fields[k] = _NAN
      ses[f"{k}_se"] = _NAN
  if not (math.isfinite(d["trace_inter"]) and d["trace_inter"] > 0.0 and math.isfinite(d["ratio"])):
    fields["ratio"] = _NAN
    ses["ratio_se"] = _NAN
  return NoiseStats(
      K=int(K),
      P=int(P),
      g2_positive=ok,
      flag="; ".join(flags),
      n_batches=int(n_batches),
      **fields,
      **ses,
  )


def noise_stats(
    estimates: Mapping[str, Any],
    P: int,
    K: int,
    se: Mapping[str, Any] | None = None,
    *,
    flags=(),
    n_batches: int = 1,
) -> NoiseStats:
  """NoiseStats from one estimate dict (exact, split, EMA or two-batch).

  Args:
    estimates: ``dict(trace_intra, trace_inter, g2)`` or, from
      ``noise.two_batch_estimates``, ``dict(trace_total, g2)``.
    P, K: batch shape. With the components, K=1 and P=1 raise ValueError.
    se: optional standard errors keyed by field name, with or without the
      ``_se`` suffix (``{"g2": 0.1}`` or ``{"g2_se": 0.1}``).
    flags: reasons already known to the caller (e.g. the EMA tracker's
      skipped update), put first in ``flag``.
    n_batches: batches behind the estimate (the EMA's number of updates).
  g2 <= 0 gives ``g2_positive=False``, nan noise scales and a flag; an
  all-zero gradient gives finite (zero) g2/trace fields and flag
  "zero gradient".
  """
  point = estimate_floats(estimates, P, K)
  se_d = {}
  for k, v in (se or {}).items():
    se_d[k[:-3] if k.endswith("_se") else k] = _to_float(v)
  return _build(point, P, K, se=se_d, significant=None, flags=list(flags), n_batches=n_batches)


# ----------------------------------------------------------------------------
# Pooling with jackknife standard errors.
# ----------------------------------------------------------------------------
def _as_estimates(item: Any, P, K) -> dict[str, Any]:
  if isinstance(item, noise.GroupMoments):
    if item.K != K or item.P != P:
      raise ValueError(f"GroupMoments has (P, K)=({item.P}, {item.K}), " f"expected ({P}, {K})")
    return noise.exact_estimates(item)
  if isinstance(item, noise.SplitMoments):
    if item.K != K or item.P != P:
      raise ValueError(f"SplitMoments has (P, K)=({item.P}, {item.K}), " f"expected ({P}, {K})")
    return noise.split_estimates(item)
  if isinstance(item, Mapping):
    return item
  raise TypeError(f"cannot read estimates from {type(item).__name__}")


FLOOR_Z = 2.0  # pooled noise scales are reported where G2 > FLOOR_Z se(G2)


def pooled_estimates(batches: Any, P: int, K: int) -> NoiseStats:
  """Pool M batches taken at fixed parameters; jackknife SEs for everything.

  Args:
    batches: a sequence of per-batch estimate dicts, GroupMoments or
      SplitMoments (they may be mixed); or one of those stacked with a
      leading batch axis of length M (e.g. the output of a vmap).
    P, K: the batches' shape (checked against moments).

  The pooled trI, trB, G2 (or trace_total, G2) are the means of the unbiased
  per-batch estimates (so they stay unbiased). Every reported quantity f —
  the means and the ratios b_intra, b_inter, b_noise, b_simple,
  trI/trB — gets the delete-one jackknife SE over batches,
  se^2 = (M-1)/M sum_i (f_(i) - f_(.))^2, where f_(i) is f formed from the
  pooled numerator and denominator of the M-1 batches other than i (for the
  means this is exactly the sample std / sqrt(M)). Point estimates of ratios
  are ratios of pooled means (not jackknife bias-corrected). Noise scales are
  reported only where G2 > 2 se(G2); otherwise ``g2_positive=False``, b_* nan
  and flag "g2 not significantly positive (g2=..., se=...)"; the one-sided
  bound ``b_noise_floor`` (B_noise >= floor at the same 2 SE) is reported
  either way.
  M < 2 raises ValueError.
  """
  if isinstance(batches, (noise.GroupMoments, noise.SplitMoments, Mapping)):
    stacked = _as_estimates(batches, P, K)
    cols = {k: np.asarray(v, np.float64).reshape(-1) for k, v in stacked.items()}
  else:
    ests = [_as_estimates(b, P, K) for b in batches]
    if not ests:
      raise ValueError("M=0 batches: pooling needs M >= 2")
    keys = set(ests[0])
    for e in ests[1:]:
      keys &= set(e)
    cols = {k: np.array([_to_float(e[k]) for e in ests]) for k in keys}
  if "trace_intra" in cols or "trace_inter" in cols:
    noise.check_batch_shape(P, K)
    keys = noise.ESTIMATE_KEYS
  elif "trace_total" in cols:
    keys = ("trace_total", "g2")
  else:
    raise KeyError("estimates need (trace_intra, trace_inter, g2) or " "(trace_total, g2)")
  M = len(cols["g2"])
  if M < 2:
    raise ValueError(f"M={M} batches: pooling needs M >= 2 for a jackknife")
  X = {k: cols[k] for k in keys}
  mean = {k: float(np.mean(X[k])) for k in keys}
  loo = {k: (np.sum(X[k]) - X[k]) / (M - 1) for k in keys}
  reps = _derived(loo, K)
  se = {}
  with np.errstate(invalid="ignore"):
    for name, th in reps.items():
      se[name] = float(np.sqrt((M - 1) / M * np.sum((th - th.mean()) ** 2)))
  g2, g2_se = mean["g2"], se["g2"]
  significant = bool(math.isfinite(g2) and math.isfinite(g2_se) and g2 > FLOOR_Z * g2_se)
  out = _build(mean, P, K, se=se, significant=significant, flags=[], n_batches=M)
  # jackknife (co)variances of the pooled trace_total and G2: the same
  # replicates as the SEs above, so var = se^2
  tt, gg = reps["trace_total"], reps["g2"]
  jk = lambda a, b: float((M - 1) / M * np.sum((a - a.mean()) * (b - b.mean())))
  floor = _NAN
  if math.isfinite(out.trace_total) and math.isfinite(g2) and np.all(np.isfinite(tt + gg)):
    floor = stats.fieller_lower_bound(
        out.trace_total, g2, jk(tt, tt), jk(gg, gg), jk(tt, gg), FLOOR_Z
    )
  return dataclasses.replace(out, b_noise_floor=floor)
