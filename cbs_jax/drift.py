"""Policy-drift statistics between the behaviour policy and the current one.

When one generation round is reused for several updates, the policy being
trained (``current``) drifts away from the one that sampled the tokens
(``behaviour``).  ``drift_stats`` summarises that drift on the sampled
completion tokens: KL estimates (kappa), importance-ratio range, clip
fractions and effective sample sizes.  All statistics are token-means over
the mask unless said otherwise; the function is jittable and returns scalar
arrays.

Where the drift is measured (the trainer's choice). An update's own
minibatch is biased: once the policy has been fitted to a minibatch (from
the second epoch on), its log-probs on exactly those tokens have moved more
than on fresh ones, so kappa jumps at the epoch boundary. With
``config.drift.probe_prompts = Q`` the trainer samples Q extra prompts x K
rollouts per round from the behaviour policy that no update ever uses
(``train.probe_batch``) and measures, before every update, the statistics
below on them plus ``kappa_exact``: the exact full-vocabulary
KL(behaviour || current) per token (``exact_kl`` of the two processed
log-prob rows at each probe position; the character vocabularies here make
that cheap). Those are logged as ``heldout_*``; the in-minibatch ones keep
their plain names, for comparison.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from cbs_jax import stats

DRIFT_KEYS = (
    "kappa_k1",
    "kappa_k3",
    "ratio_mean",
    "ratio_max",
    "ratio_min",
    "clip_frac_low",
    "clip_frac_high",
    "ess",
    "seq_ess",
)


def _ess_from_log_weights(logw, valid):
  """Normalised ESS ``(sum w)^2 / (n sum w^2)`` from log-weights, in log space.

  ``exp(2 lse(logw) - lse(2 logw) - log n)`` over valid entries, after
  shifting by the max: no overflow and no precision loss for large sequence
  log-ratios.  Returns 1.0 when there is no valid entry.
  """
  n = jnp.sum(valid.astype(jnp.float32))
  # ESS is scale-invariant: shift by the max valid log-weight first so the
  # log-sum-exps are O(log n) numbers (float32 keeps full relative precision
  # even for sequence log-ratios in the hundreds).
  top = jnp.max(jnp.where(valid, logw, -jnp.inf))
  logw = jnp.where(valid, logw - jnp.where(jnp.isfinite(top), top, 0.0), 0.0)
  lse1 = logsumexp(jnp.where(valid, logw, -jnp.inf))
  lse2 = logsumexp(jnp.where(valid, 2.0 * logw, -jnp.inf))
  ess = jnp.exp(2.0 * lse1 - lse2 - jnp.log(jnp.maximum(n, 1.0)))
  return jnp.where(n > 0, ess, 1.0)


def drift_stats(
    logp_behaviour_BxT,
    logp_current_BxT,
    mask_BxT,
    clip_eps_low: float = 0.2,
    clip_eps_high: float = 0.2,
    adv_BxT=None,
    dual_c: float = 0.0,
) -> dict:
  """Drift statistics on the rollout tokens (token-mean over ``mask``).

  With ``k1 = logp_b - logp_cur`` and ``r = exp(-k1) = pi_cur / pi_b`` on
  valid tokens (samples drawn from the behaviour policy):

    kappa_k1    mean(k1): unbiased estimate of KL(behaviour || current) per
                token (can come out negative on a finite sample).
    kappa_k3    mean(exp(-k1) - 1 + k1): unbiased too, each term >= 0.
    ratio_mean / ratio_max / ratio_min   of r over valid tokens.
    clip_frac_low / clip_frac_high   fraction of ALL valid tokens with
                r < 1 - clip_eps_low / r > 1 + clip_eps_high.  If ``adv_BxT``
                is given, a token counts only where PPO's clip is active for
                its advantage sign (low side for A < 0, high side for A > 0,
                A = 0 never); the denominator stays all valid tokens.
    clip_frac_dual  only with ``dual_c`` > 1 (PPO's dual clip) and
                ``adv_BxT``: fraction of ALL valid tokens with A < 0 and
                r > dual_c, where the dual clip replaces the objective by
                dual_c A (``rl.ppo_clip_loss``); such tokens also lie beyond
                1 + clip_eps_high, where the plain clip leaves A < 0 unclipped,
                so these are the tokens the dual clip alone touches.
    ess         (sum r)^2 / (n sum r^2) over the n valid tokens, in (0, 1];
                1.0 on-policy.
    seq_ess     the same over per-sequence weights
                w_i = exp(sum_t m (logp_cur - logp_b)), over sequences with at
                least one valid token.

  An all-zero mask gives 0 for every statistic except ess = seq_ess = 1 (no
  NaN).  Computed in float32 (or the inputs' wider float dtype).
  """
  lb = jnp.asarray(logp_behaviour_BxT)
  lc = jnp.asarray(logp_current_BxT)
  dtype = jnp.promote_types(jnp.promote_types(lb.dtype, lc.dtype), jnp.float32)
  lb, lc = lb.astype(dtype), lc.astype(dtype)
  mask = jnp.asarray(mask_BxT).astype(dtype)
  valid = mask > 0
  n = jnp.sum(mask)
  n_safe = jnp.maximum(n, 1.0)
  has_any = n > 0

  k1 = jnp.where(valid, lb - lc, 0.0)
  ratio = jnp.exp(-k1)  # 1 on padding
  k3 = jnp.expm1(-k1) + k1  # 0 on padding
  mean = lambda x: jnp.sum(x * mask) / n_safe

  low = ratio < 1.0 - clip_eps_low
  high = ratio > 1.0 + clip_eps_high
  if adv_BxT is not None:
    adv = jnp.asarray(adv_BxT)
    low = low & (adv < 0)
    high = high & (adv > 0)
  low = (low & valid).astype(dtype)
  high = (high & valid).astype(dtype)

  zero = jnp.zeros((), dtype)
  ratio_max = jnp.where(has_any, jnp.max(jnp.where(valid, ratio, -jnp.inf)), zero)
  ratio_min = jnp.where(has_any, jnp.min(jnp.where(valid, ratio, jnp.inf)), zero)

  log_ratio = -k1
  seq_log_w = jnp.sum(log_ratio * mask, axis=1)
  seq_valid = jnp.sum(mask, axis=1) > 0

  out = {
      "kappa_k1": mean(k1),
      "kappa_k3": mean(k3),
      "ratio_mean": mean(ratio),
      "ratio_max": ratio_max,
      "ratio_min": ratio_min,
      "clip_frac_low": jnp.sum(low) / n_safe,
      "clip_frac_high": jnp.sum(high) / n_safe,
      "ess": _ess_from_log_weights(log_ratio, valid).astype(dtype),
      "seq_ess": _ess_from_log_weights(seq_log_w, seq_valid).astype(dtype),
  }
  if dual_c and dual_c > 1.0 and adv_BxT is not None:
    dual = (ratio > dual_c) & (jnp.asarray(adv_BxT) < 0) & valid
    out["clip_frac_dual"] = jnp.sum(dual.astype(dtype)) / n_safe
  return out


def exact_kl(p_logits, q_logits) -> jax.Array:
  """Exact KL(p || q) of categorical distributions over the last axis.

  ``sum_v p_v (log p_v - log q_v)`` with log-softmax of the logits (float32);
  entries with p_v = 0 contribute 0.  Returns an array of the leading shape.
  """
  logp = jax.nn.log_softmax(jnp.asarray(p_logits, jnp.float32), axis=-1)
  logq = jax.nn.log_softmax(jnp.asarray(q_logits, jnp.float32), axis=-1)
  p = jnp.exp(logp)
  return jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)


def fit_trend(kappa, y, se=None, alpha: float = 0.05) -> dict:
  """Weighted trend of a noise quantity y against drift kappa: constant,
  linear (a0 + a1 kappa) and quadratic (a0 + a1 kappa + a2 kappa^2) models
  fitted by weighted least squares (weights 1 / se^2 from per-point
  standard errors, e.g. pooled jackknife SEs; unweighted when None),
  compared as nested models.

  The verdict climbs one degree at a time while the next term is
  significant (F-test at ``alpha``; ``stats.compare_nested``): "flat" (no
  significant slope), "linear" (slope significant, curvature not) or
  "quadratic" (the quadratic term significant over the linear model).
  A quadratic is claimed only when it beats the linear model. Returns the
  coefficients of each model with their SEs, the F-test p-values,
  AIC differences and ``r2`` (weighted) of each, and the verdict.
  """
  x = np.asarray(kappa, np.float64)
  y = np.asarray(y, np.float64)
  ok = np.isfinite(x) & np.isfinite(y)
  e = None
  if se is not None:
    e = np.asarray(se, np.float64)
    ok &= np.isfinite(e) & (e > 0)
    e = e[ok]
  x, y = x[ok], y[ok]
  if x.size < 4 or np.unique(x).size < 3:
    raise ValueError(
        f"a linear-vs-quadratic comparison needs >= 4 finite points at >= 3 "
        f"distinct kappa, got {x.size} points at {np.unique(x).size}"
    )
  X = np.stack([np.ones_like(x), x, x * x], axis=1)
  fits = [stats.wls(X[:, : d + 1], y, e) for d in range(3)]
  lin = stats.compare_nested(fits[0], fits[1])
  quad = stats.compare_nested(fits[1], fits[2])
  verdict = "flat"
  if lin["p_value"] < alpha:
    verdict = "linear"
  if quad["p_value"] < alpha:
    verdict = "quadratic"
  w = np.ones_like(y) if e is None else 1.0 / e**2
  ss_tot = float(np.sum(w * (y - np.average(y, weights=w)) ** 2))
  r2 = lambda f: stats.r_squared(f.chi2, ss_tot)
  out = dict(
      n=int(x.size),
      weighted=e is not None,
      verdict=verdict,
      p_linear=lin["p_value"],
      p_quadratic=quad["p_value"],
      daic_linear=lin["delta_aic"],
      daic_quadratic=quad["delta_aic"],
  )
  for name, f in zip(("const", "linear", "quadratic"), fits):
    out[name] = dict(coef=f.coef.tolist(), se=f.se.tolist(), r2=r2(f), reduced_chi2=f.reduced_chi2)
  return out


def choose_models(fits: dict, alpha: float = 0.05) -> dict:
  """The verdicts of several ``fit_trend`` results judged as one family:
  every F-test made (each fit's linear-over-constant and
  quadratic-over-linear test) is Holm-corrected across the whole family
  (``stats.holm``), so the chance that any truly flat quantity is called
  "linear" or "quadratic" stays <= ``alpha`` however many quantities are
  fitted. ``fits``: name -> ``fit_trend`` dict (others, e.g. an error
  record, pass through). Returns name -> the fit with ``verdict``
  re-derived from the adjusted p-values, ``p_linear_adj``,
  ``p_quadratic_adj``, ``tests_in_family`` and the uncorrected verdict
  as ``verdict_uncorrected``."""
  names = [k for k, f in fits.items() if "p_linear" in f]
  ps = [fits[k][q] for k in names for q in ("p_linear", "p_quadratic")]
  h = stats.holm(ps, alpha)
  out = dict(fits)
  for i, k in enumerate(names):
    p_lin, p_quad = h["adjusted"][2 * i], h["adjusted"][2 * i + 1]
    verdict = "flat"
    if h["reject"][2 * i]:
      verdict = "linear"
    if h["reject"][2 * i + 1]:
      verdict = "quadratic"
    out[k] = dict(
        fits[k],
        verdict=verdict,
        verdict_uncorrected=fits[k]["verdict"],
        p_linear_adj=p_lin,
        p_quadratic_adj=p_quad,
        tests_in_family=h["m"],
    )
  return out
