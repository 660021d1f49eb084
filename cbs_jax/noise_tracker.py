r"""The live noise tracker: EMAs of the noise estimates with an interval.

Over training each round's estimate dict (``noise``: trI, trB, G2 of one
batch, unbiased but noisy, with G2 often negative) is folded into
:class:`NoiseEMA`, which smooths numerators and denominators separately and
reports noise scales as ratios of the EMAs (as McCandlish et al. 2018 do),
never EMAs of per-batch ratios. ``NoiseEMA.interval`` gives B_noise with a
standard error and Fieller's interval (``stats.fieller_interval``) from the
weighted scatter of the rounds, widened to the Student-t quantile of the
same coverage (``stats.t_quantile_like``) since that scatter is estimated
from a handful of effective rounds. It is what the adaptive batch size
(``batch``) reads. The summaries it returns are ``noise_stats.NoiseStats``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

from cbs_jax import noise
from cbs_jax import noise_stats
from cbs_jax import stats

_NAN = float("nan")
_MOMENT_KEYS = ("t", "g", "tt", "gg", "tg", "w2")


class NoiseEMA:
  """Bias-corrected EMAs of trI, trB, G2, smoothed separately.

  Noise scales are ratios of the smoothed numerator and denominator (ratio
  of EMAs, as McCandlish et al. 2018), never EMAs of per-batch ratios.

  Implementation: weighted sums ``S_t = decay S_{t-1} + x_t`` and
  ``W_t = decay W_{t-1} + 1``; the estimate S_t/W_t equals the usual
  bias-corrected EMA ema_t/(1 - decay^t) (ema_t = decay ema + (1-decay) x)
  and is exactly x_1 after the first update. Updates with a non-finite value
  are skipped (flagged). trI and trB are K-independent under the
  assumption stated in ``noise``'s module docstring, so P and K may change
  between updates; b_noise uses the K passed to the latest call.
  """

  def __init__(self, decay: float = 0.9):
    if not 0.0 <= decay < 1.0:
      raise ValueError(f"decay={decay} must lie in [0, 1)")
    self.decay = float(decay)
    self.count = 0
    self.weight = 0.0
    self.sums = {k: 0.0 for k in noise.ESTIMATE_KEYS}
    self.moments = {k: 0.0 for k in _MOMENT_KEYS}  # for the interval (``interval``)

  def value(self) -> dict[str, float]:
    """Current bias-corrected estimates (nan before the first update)."""
    if self.weight == 0.0:
      return {k: _NAN for k in noise.ESTIMATE_KEYS}
    return {k: self.sums[k] / self.weight for k in noise.ESTIMATE_KEYS}

  def update(self, estimates: Mapping[str, Any], P: int, K: int) -> noise_stats.NoiseStats:
    x = noise_stats.estimate_floats(estimates, P, K)
    if "trace_intra" not in x:
      raise KeyError("NoiseEMA needs trace_intra, trace_inter, g2")
    flags = []
    if all(math.isfinite(v) for v in x.values()):
      for k in noise.ESTIMATE_KEYS:
        self.sums[k] = self.decay * self.sums[k] + x[k]
      self.weight = self.decay * self.weight + 1.0
      self.count += 1
      t, g = x["trace_intra"] + K * x["trace_inter"], x["g2"]
      d, d2, m = self.decay, self.decay**2, self.moments
      for k, v in (("t", t), ("g", g)):
        m[k] = d * m[k] + v
      for k, v in (("tt", t * t), ("gg", g * g), ("tg", t * g)):
        m[k] = d * m[k] + v
      m["w2"] = d2 * m["w2"] + 1.0
    else:
      flags.append("non-finite estimate skipped")
    return self.stats(P, K, _flags=flags)

  def stats(self, P: int, K: int, _flags=()) -> noise_stats.NoiseStats:
    return noise_stats.noise_stats(self.value(), P, K, flags=_flags, n_batches=self.count)

  def interval(self, z: float = 2.0) -> dict[str, float]:
    """B_noise at the K of the updates, with a standard error and an interval.

    Each update t contributes a per-round numerator T_t = trI + K trB and
    denominator G_t = |G|^2 estimate; the tracker's B_noise is the ratio of
    their EMAs (weights w_t = decay^age). The per-round values are treated
    as independent draws around slowly moving means: the weighted variances
    and covariance of (T, G), times sum(w^2)/sum(w)^2 (the EMA's effective
    1/n), give the variances v_T, v_G and covariance c of the two EMAs.

    ``se`` is the delta-method SE of the ratio r = T/G. The interval
    ``[lo, hi]`` is Fieller's (``stats.fieller_interval``): the r with
    (T - r G)^2 <= z^2 (v_T - 2 r c + r^2 v_G), i.e. the ratios a z-SE test
    of T - r G = 0 does not reject.
    Unlike r +- z se it is skewed upward when G is barely resolved (a ratio
    of noisy means has a long right tail), so a G EMA that happens to be low
    does not produce a confidently high B_noise. It is bounded exactly when
    G > z sqrt(v_G); otherwise ``resolved`` is False, ``lo`` 0 and ``hi``
    inf (also with fewer than 3 updates, or a checkpoint from before the
    moments were kept). ``lo`` is clipped at 0 (T is a trace).

    The variances are themselves estimated from n_eff = sum(w)^2/sum(w^2)
    rounds (Kish's effective sample size), so ``z`` (a normal quantile) is
    widened to the Student-t quantile of the same coverage with n_eff - 1
    degrees of freedom (``stats.t_quantile_like``): with a handful of rounds
    three draws that happen to agree do not make a confident interval.

    When N changes between rounds (the adaptive controller), rounds still
    carry equal EMA weights and the scatter mixes their variances: the SE
    is then an approximation, exact at constant N.
    ``floor`` is the one-sided bound B_noise >= floor at the same level
    (``stats.fieller_lower_bound``: |G|^2 >= 0), which exists once the
    numerator is resolved even while |G|^2 is not (``lo`` is 0 there); where
    the interval is bounded it equals ``lo``.
    Returns ``dict(b_noise, se, lo, hi, resolved, n_eff, z, floor)`` (``z``:
    the widened quantile used).
    """
    m, W = self.moments, self.weight
    if self.count < 3 or W <= 0 or m["w2"] <= 0:
      return dict(
          b_noise=_NAN,
          se=_NAN,
          lo=0.0,
          hi=math.inf,
          resolved=False,
          n_eff=0.0,
          z=math.inf,
          floor=0.0,
      )
    mt, mg = m["t"] / W, m["g"] / W
    n_eff = W * W / m["w2"]
    corr = n_eff / max(n_eff - 1.0, 1e-12)  # unbiased weighted (co)variances
    z = stats.t_quantile_like(z, n_eff - 1.0)  # the variances are estimated: Student-t width
    vt = max(m["tt"] / W - mt * mt, 0.0) * corr / n_eff
    vg = max(m["gg"] / W - mg * mg, 0.0) * corr / n_eff
    ctg = (m["tg"] / W - mt * mg) * corr / n_eff
    ctg = max(-math.sqrt(vt * vg), min(ctg, math.sqrt(vt * vg)))  # a valid covariance
    se_g = math.sqrt(vg)
    # a one-sided bound B >= floor (|G|^2 >= 0), also where G is not resolved
    floor = stats.fieller_lower_bound(mt, mg, vt, vg, ctg, z)
    if not mg > z * se_g:
      return dict(
          b_noise=mt / mg if mg > 0 else _NAN,
          se=_NAN,
          lo=0.0,
          hi=math.inf,
          resolved=False,
          n_eff=n_eff,
          z=z,
          floor=floor,
      )
    r = mt / mg
    var_r = (vt - 2 * r * ctg + r * r * vg) / (mg * mg)
    se = math.sqrt(max(var_r, 0.0))
    lo, hi = stats.fieller_interval(mt, mg, vt, vg, ctg, z)  # bounded: G resolved
    return dict(
        b_noise=r,
        se=se,
        lo=max(min(lo, r), 0.0),
        hi=max(hi, r),
        resolved=True,
        n_eff=n_eff,
        z=z,
        floor=max(min(lo, r), 0.0),
    )

  def state_dict(self) -> dict[str, float]:
    return dict(
        decay=self.decay,
        count=float(self.count),
        weight=self.weight,
        **self.sums,
        **{f"m_{k}": v for k, v in self.moments.items()},
    )

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.decay = float(state["decay"])
    self.count = int(state["count"])
    self.weight = float(state["weight"])
    self.sums = {k: float(state[k]) for k in noise.ESTIMATE_KEYS}
    self.moments = {k: float(state.get(f"m_{k}", 0.0)) for k in _MOMENT_KEYS}
