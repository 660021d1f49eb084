r"""Gradient-noise estimators: the statistics behind B_intra, B_inter, B_noise.

This module holds the *estimators* only. The model side (per-rollout
gradients, their squared norms, group means, the four split microbatch
gradients) is computed elsewhere and handed here as small sufficient
statistics (:class:`GroupMoments`, :class:`SplitMoments`) or as estimate
dicts. Everything that takes arrays is a pure ``jax.numpy`` function
(jittable, vmappable; the integers ``P``, ``K`` and the split sizes are static
pytree metadata); everything that returns :class:`NoiseStats` is host-side
Python on floats.

Notation (DESIGN.md)
--------------------
A batch is a grid of P prompts x K rollouts, N = P K. ``g_{p,k}`` is the
per-rollout gradient, scaled so that the batch gradient is ``mean_{p,k}
g_{p,k}``. Prompts are drawn i.i.d. from the task distribution;
``mu_p = E[g_{p,k} | p]``, ``G = E_p mu_p``.

What the estimators assume, and what holds
------------------------------------------
DESIGN.md writes the decomposition for rollouts that are i.i.d. given the
prompt. With group-normalised advantages (GRPO) the K rollouts of one prompt
are *exchangeable but not independent*: each rollout's advantage depends on
its siblings' rewards. Exchangeability is all the variance identities below
need. Given the prompt, let

    C_p = Cov(g_{p,k} | p)                  (same for every k),
    D_p = Cov(g_{p,k}, g_{p,k'} | p), k != k' (same for every pair),

and *define*

    Sigma_intra(K) = E_p[C_p - D_p]
    Sigma_inter(K) = Cov_p(mu_p) + E_p[D_p].

With independent rollouts D_p = 0 and these are exactly DESIGN.md's
Sigma_intra and Sigma_inter. In general:

* ``E[1/(K-1) sum_k |g_{p,k} - gbar_p|^2 | p] = tr(C_p - D_p)``;
* ``Cov(gbar_p) = Sigma_inter(K) + Sigma_intra(K)/K``;
* ``Cov(batch gradient) = Sigma_inter(K)/P + Sigma_intra(K)/(P K)``, exactly.

So at the batch's own K every estimator here is unbiased for
``tr Sigma_intra(K)``, ``tr Sigma_inter(K)`` and ``|G|^2``, and
``B_noise(K) = B_intra + K B_inter`` is the exact noise scale of a batch at
that K. What does *not* follow: C_p, D_p and mu_p depend on K when the
advantage baseline/scale is computed from the K rewards (D_p is typically
negative: a shared baseline moves O(1/K) of the intra-prompt variance into a
negative inter-prompt term), so extrapolating ``B_intra + K' B_inter`` to a
different K' assumes Sigma_intra(K) and Sigma_inter(K) do not change with K.
Any figure that extrapolates across K depends on that assumption.

Further assumptions, all standard: prompts i.i.d. (a finite prompt pool
sampled without replacement would need a finite-population correction of
trB); the partition of a batch into split parts is fixed before the data are
seen (contiguous blocks of a randomly ordered batch are fine; halves of a
batch sorted by reward are not); parameters fixed within a batch.

Exact per-rollout path (DESIGN.md "Unbiased estimators")
--------------------------------------------------------
    s2_p = 1/(K-1) (sum_k |g_{p,k}|^2 - K |gbar_p|^2),   trI = mean_p s2_p
    S2   = 1/(P-1) (sum_p |gbar_p|^2 - P |gbar|^2)
    trB  = S2 - trI/K,     G2 = |gbar|^2 - S2/P
Unbiasedness: E s2_p = tr Sigma_intra(K); E S2 = tr Cov(gbar_p) =
trB + trI/K; E|gbar|^2 = |G|^2 + tr Cov(gbar_p)/P.

Split-microbatch path, generalised to m prompt parts x n rollout parts
----------------------------------------------------------------------
Prompts are split into m parts of exactly P/m prompts; each prompt's K
rollouts into n parts of exactly K/n rollouts (DESIGN.md's case is
m = n = 2: prompt halves of P/2, rollout halves of K/2). ``q_ab`` is the mean
per-rollout gradient of cell (a, b) (P K/(m n) rollouts), so the training
gradient is the mean of the m n cells; ``r_a = mean_b q_ab``. Derivation:

* Within a prompt, the n rollout-part means h_{p,b} are exchangeable with
  Cov(h_{p,b}) - Cov(h_{p,b}, h_{p,b'}) = (C_p - D_p) n/K. q_ab averages
  h_{p,b} over the P/m prompts of part a (i.i.d.), so the unbiased sample
  variance over b, V_a = 1/(n-1) sum_b |q_ab - r_a|^2, has
  E V_a = (m/P)(n/K) tr Sigma_intra = (m n/N) trI.
* r_a is the mean of gbar_p over the P/m prompts of part a, so the r_a are
  i.i.d. with Cov(r_a) = (m/P)(Sigma_inter + Sigma_intra/K), and
  V_r = 1/(m-1) sum_a |r_a - rbar|^2 has E V_r = (m/P)(trB + trI/K).
* For a != a', r_a and r_a' are independent with mean G: E r_a.r_a' = |G|^2.

The stored moments are mean *pairwise* quantities, which reduce to DESIGN.md's
for m = n = 2 (the mean pairwise squared distance is twice the unbiased
sample variance):

    d_intra = mean_a mean_{b<b'} |q_ab - q_ab'|^2   (= mean_a 2 V_a)
    d_inter = mean_{a<a'} |r_a - r_a'|^2             (= 2 V_r)
    cross   = mean_{a!=a'} r_a . r_a'

    trI = N/(2 m n) d_intra          (m=n=2: N/8 mean_a |q_a1 - q_a2|^2)
    trB = P/(2 m) d_inter - trI/K    (m=2:   P/4 |r_1 - r_2|^2 - trI/K)
    G2  = cross                      (m=2:   r_1 . r_2)

More parts give m(n-1) and m-1 degrees of freedom for the two traces (more
precise), at the cost of m n microbatches per update.

Classic two-batch estimator (McCandlish et al. 2018, Appendix A)
-----------------------------------------------------------------
``E|G_B|^2 = |G|^2 + tr(Sigma)/B``. With grouped sampling and both batches at
the *same* K (B counted in rollouts, B = P K), the batch covariance is
Sigma_inter/P + Sigma_intra/(P K) = Sigma_eff(K)/B with

    Sigma_eff(K) = Sigma_intra(K) + K Sigma_inter(K),

so the two-batch ``trace_total`` is unbiased for tr Sigma_eff(K) =
trI + K trB, and trace_total/G2 is McCandlish's B_simple *at that K*, which
equals B_noise(K). Unbiasedness is by linearity of expectation, so it holds
whether the small batch is a sub-batch of the big one or independent. If the
two batches have different K the quantity is a mixture and not meaningful.

Ratios, EMAs and pooling
------------------------
Noise scales are ratios of estimates; the ratio of unbiased estimates is not
unbiased, and a single batch's G2 can be negative. :class:`NoiseEMA` smooths
numerators and denominators separately (ratio of EMAs, as McCandlish et al.
do); :func:`pooled_estimates` averages M batches at fixed parameters and gives
delete-one jackknife standard errors for every quantity, reporting noise
scales only where G2 > 2 se(G2).

Numerics
--------
Inputs are upcast to at least float32 (bf16 gradients are fine). The exact
path subtracts sums of squares (the streaming form in DESIGN.md); its
relative rounding error in S2 is about eps |gbar_p|^2/S2, which is small
unless prompt means agree to many digits. The split path centres before
squaring and forms ``cross`` from direct dot products.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

Array = Any

_KEYS3 = ("trace_intra", "trace_inter", "g2")


# ----------------------------------------------------------------------------
# Validation helpers.
# ----------------------------------------------------------------------------
def _check_K(K) -> None:
  if int(K) != K or K < 2:
    raise ValueError(
        f"K={K}: intra-prompt variance undefined for K=1 "
        "(need K >= 2 rollouts per prompt)")


def _check_P(P) -> None:
  if int(P) != P or P < 2:
    raise ValueError(
        f"P={P}: inter-prompt variance undefined for P=1 "
        "(need P >= 2 prompts)")


def _acc_dtype(x) -> Any:
  return jnp.promote_types(jnp.result_type(x), jnp.float32)


# ----------------------------------------------------------------------------
# Exact per-rollout path.
# ----------------------------------------------------------------------------
@struct.dataclass
class GroupMoments:
  """Exact per-rollout sufficient statistics of ONE P x K batch.

  Attributes:
    sum_sqnorm_P: ``[..., P]`` sum_k |g_{p,k}|^2.
    mean_sqnorm_P: ``[..., P]`` |gbar_p|^2 with gbar_p = mean_k g_{p,k}.
    batch_mean_sqnorm: ``[...]`` |gbar|^2 with gbar = mean_p gbar_p.
    K: rollouts per prompt (static).
  Leading ``...`` axes (e.g. from vmap over batches) broadcast through
  :func:`exact_estimates`.
  """
  sum_sqnorm_P: Array
  mean_sqnorm_P: Array
  batch_mean_sqnorm: Array
  K: int = struct.field(pytree_node=False)

  @property
  def P(self) -> int:
    return int(self.sum_sqnorm_P.shape[-1])


def moments_from_group_means(sum_sqnorm_P: Array, gbar_P: Any,
                             K: int) -> GroupMoments:
  """GroupMoments from streamed pieces: per-prompt sum of squared norms and
  the group-mean gradients (array or pytree whose leaves lead with ``[P]``).

  This is the form a streaming implementation produces (reduce over chunks
  of rollouts, never holding N x |theta|).
  """
  leaves = jax.tree_util.tree_leaves(gbar_P)
  if not leaves:
    raise ValueError("gbar_P has no leaves")
  P = sum_sqnorm_P.shape[-1]
  mean_sq = 0.0
  batch_sq = 0.0
  for leaf in leaves:
    if leaf.shape[0] != P:
      raise ValueError(f"gbar_P leaf leads with {leaf.shape[0]}, expected P={P}")
    x = jnp.reshape(leaf, (P, -1)).astype(_acc_dtype(leaf))
    mean_sq = mean_sq + jnp.sum(x * x, axis=-1)
    gbar = jnp.mean(x, axis=0)
    batch_sq = batch_sq + jnp.sum(gbar * gbar)
  return GroupMoments(
      sum_sqnorm_P=jnp.asarray(sum_sqnorm_P, dtype=jnp.result_type(mean_sq)),
      mean_sqnorm_P=mean_sq, batch_mean_sqnorm=batch_sq, K=int(K))


def moments_from_grads(g_PxKxD: Any) -> GroupMoments:
  """Reference helper: GroupMoments from explicit per-rollout gradients.

  Args:
    g_PxKxD: array ``[P, K, D]`` (or ``[P, K, ...]``), or a pytree whose
      leaves all lead with ``[P, K]`` (norms are summed over leaves).
  """
  leaves = jax.tree_util.tree_leaves(g_PxKxD)
  if not leaves:
    raise ValueError("g_PxKxD has no leaves")
  P, K = leaves[0].shape[:2]
  sum_sq = 0.0
  gbar_leaves = []
  for leaf in leaves:
    if leaf.shape[:2] != (P, K):
      raise ValueError(
          f"leaf leads with {leaf.shape[:2]}, expected (P, K)=({P}, {K})")
    x = jnp.reshape(leaf, (P, K, -1)).astype(_acc_dtype(leaf))
    sum_sq = sum_sq + jnp.sum(x * x, axis=(1, 2))
    gbar_leaves.append(jnp.mean(x, axis=1))
  return moments_from_group_means(sum_sq, gbar_leaves, K)


def exact_estimates(m: GroupMoments) -> dict[str, Array]:
  """Unbiased trI, trB, G2 from one batch (DESIGN.md, exact path).

  Returns ``dict(trace_intra, trace_inter, g2)`` of arrays shaped like
  ``m.batch_mean_sqnorm``. Raises ValueError for K=1 or P=1 (at trace time).
  """
  K, P = m.K, m.P
  _check_K(K)
  _check_P(P)
  s2_P = (m.sum_sqnorm_P - K * m.mean_sqnorm_P) / (K - 1)
  tr_intra = jnp.mean(s2_P, axis=-1)
  S2 = (jnp.sum(m.mean_sqnorm_P, axis=-1) - P * m.batch_mean_sqnorm) / (P - 1)
  return dict(trace_intra=tr_intra,
              trace_inter=S2 - tr_intra / K,
              g2=m.batch_mean_sqnorm - S2 / P)


def inter_by_group(m: GroupMoments, prompt_groups, gram) -> dict[str, Array]:
  """Each prompt group's (e.g. difficulty's) share of tr Sigma_inter.

  With G groups of n_d prompts, group sums S_d = sum_{p in d} gbar_p (their
  Gram matrix ``gram`` [G, G] = S_d . S_e, from ``gradstats.group_moments``
  with ``prompt_groups``), gbar = sum_d S_d / P and s2_p the within-prompt
  variances of ``exact_estimates``, group d contributes

    c_d = 1/(P-1) sum_{p in d} |gbar_p - gbar|^2  -  (n_d / P) trI_d / K,

  trI_d = mean_{p in d} s2_p, where
  sum_{p in d} |gbar_p - gbar|^2 = sum_{p in d} |gbar_p|^2 - 2 S_d . gbar
  + n_d |gbar|^2. The c_d sum to ``exact_estimates``'s trace_inter exactly
  (the same S2 - trI / K, split by group); each is the group's part of the
  between-prompt scatter, net of the within-prompt noise it carries.
  Returns ``dict(contribution [G], count [G], share [G])`` (share: c_d /
  trace_inter). Summed-over-leaf moments and gram expected.
  """
  K, P = m.K, m.P
  _check_K(K)
  _check_P(P)
  groups = jnp.asarray(prompt_groups, jnp.int32)
  G = gram.shape[-1]
  onehot = jax.nn.one_hot(groups, G, dtype=jnp.float32)          # [P, G]
  count = jnp.sum(onehot, axis=0)                                  # [G]
  s2_P = (m.sum_sqnorm_P - K * m.mean_sqnorm_P) / (K - 1)
  sq_d = onehot.T @ m.mean_sqnorm_P                                # sum_{p in d} |gbar_p|^2
  s2_d = onehot.T @ s2_P                                           # sum_{p in d} s2_p
  cross_d = jnp.sum(gram, axis=-1) / P                             # S_d . gbar
  gbar2 = jnp.sum(gram) / (P * P)                                  # |gbar|^2
  scatter = sq_d - 2 * cross_d + count * gbar2
  contrib = scatter / (P - 1) - s2_d / (P * K)
  total = jnp.sum(contrib)
  return dict(contribution=contrib, count=count,
              share=contrib / jnp.where(total == 0, 1.0, total))


# ----------------------------------------------------------------------------
# Split-microbatch path.
# ----------------------------------------------------------------------------
@struct.dataclass
class SplitMoments:
  """Sufficient statistics of the m x n split-microbatch path of ONE batch.

  For the default m = n = 2 (DESIGN.md):
    d_intra = mean_a |q_a1 - q_a2|^2,  d_inter = |r_1 - r_2|^2,
    cross = r_1 . r_2,  r_a = (q_a1 + q_a2)/2.
  In general they are the mean pairwise quantities of the module docstring.
  ``P``, ``K``, ``prompt_parts`` (m) and ``rollout_parts`` (n) are static.
  """
  d_intra: Array
  d_inter: Array
  cross: Array
  P: int = struct.field(pytree_node=False)
  K: int = struct.field(pytree_node=False)
  prompt_parts: int = struct.field(pytree_node=False, default=2)
  rollout_parts: int = struct.field(pytree_node=False, default=2)


def _check_split(P, K, m, n) -> None:
  _check_P(P)
  _check_K(K)
  if m < 2:
    raise ValueError(f"prompt_parts={m}: need >= 2 prompt parts")
  if n < 2:
    raise ValueError(f"rollout_parts={n}: need >= 2 rollout parts")
  if P % m:
    raise ValueError(
        f"P={P} is not divisible into {m} prompt parts: the prompt parts must "
        f"have equal size P/{m}")
  if K % n:
    raise ValueError(
        f"K={K} is not divisible into {n} rollout parts: each prompt's "
        f"rollouts must split into equal parts of size K/{n}")


def split_moments_from_quarters(q_ab: Any, P: int, K: int) -> SplitMoments:
  """SplitMoments from the m x n cell-mean gradients of one batch.

  Args:
    q_ab: array or pytree whose every leaf has leading axes ``(m, n)``
      (``(2, 2)`` for DESIGN.md's quarters): ``q_ab[a, b]`` is the mean
      per-rollout gradient over prompt part ``a`` (P/m prompts) and rollout
      part ``b`` (K/n rollouts of each of those prompts). Squared norms and
      dot products are summed over leaves, so any leaf layout gives the same
      result as one flat array.
    P, K: the batch's prompts and rollouts per prompt (static). P must be
      divisible by m and K by n (equal-size parts; for the 2 x 2 split,
      prompt halves of P/2 and rollout halves of K/2); otherwise ValueError
      naming P or K.
  """
  leaves = jax.tree_util.tree_leaves(q_ab)
  if not leaves:
    raise ValueError("q_ab has no leaves")
  if leaves[0].ndim < 2:
    raise ValueError("q_ab leaves need leading (prompt_parts, rollout_parts) axes")
  m, n = leaves[0].shape[:2]
  _check_split(P, K, m, n)
  within = 0.0    # sum_a sum_b |q_ab - r_a|^2
  between = 0.0   # sum_a |r_a - rbar|^2
  off = 0.0       # sum_{a != a'} r_a . r_a'
  mask = 1.0 - jnp.eye(m)
  for leaf in leaves:
    if leaf.shape[:2] != (m, n):
      raise ValueError(
          f"q_ab leaf leads with {leaf.shape[:2]}, expected ({m}, {n})")
    x = jnp.reshape(leaf, (m, n, -1)).astype(_acc_dtype(leaf))
    r = jnp.mean(x, axis=1)
    within = within + jnp.sum(jnp.square(x - r[:, None, :]))
    between = between + jnp.sum(jnp.square(r - jnp.mean(r, axis=0)))
    off = off + jnp.sum((r @ r.T) * mask)
  return SplitMoments(
      d_intra=2.0 * within / (m * (n - 1)),
      d_inter=2.0 * between / (m - 1),
      cross=off / (m * (m - 1)),
      P=int(P), K=int(K), prompt_parts=int(m), rollout_parts=int(n))


def split_estimates(s: SplitMoments) -> dict[str, Array]:
  """Unbiased trI, trB, G2 from the split path (derivation in module doc).

  m = n = 2: trI = N/8 d_intra, trB = P/4 d_inter - trI/K, G2 = cross.
  """
  P, K, m, n = s.P, s.K, s.prompt_parts, s.rollout_parts
  _check_split(P, K, m, n)
  N = P * K
  tr_intra = N / (2.0 * m * n) * s.d_intra
  return dict(trace_intra=tr_intra,
              trace_inter=P / (2.0 * m) * s.d_inter - tr_intra / K,
              g2=s.cross)


# ----------------------------------------------------------------------------
# Two-batch path.
# ----------------------------------------------------------------------------
def two_batch_estimates(sqnorm_small: Array, b_small, sqnorm_big: Array,
                        b_big) -> dict[str, Array]:
  """McCandlish et al. (2018, App. A) unbiased |G|^2 and tr(Sigma).

  Args:
    sqnorm_small, sqnorm_big: |G_B|^2 of the mean gradient of a small and a
      big batch (same parameters, same K).
    b_small, b_big: their sizes in rollouts (B = P K), b_small != b_big.

  Returns ``dict(trace_total, g2)`` with
    g2 = (b_big |G_big|^2 - b_small |G_small|^2)/(b_big - b_small),
    trace_total = (|G_small|^2 - |G_big|^2)/(1/b_small - 1/b_big).
  With grouped sampling ``trace_total`` is unbiased for
  tr Sigma_eff(K) = tr Sigma_intra + K tr Sigma_inter at the batches' common K
  (module docstring), whether or not the small batch is nested in the big.
  """
  if isinstance(b_small, (int, float)) and isinstance(b_big, (int, float)):
    if b_small <= 0 or b_big <= 0 or b_small == b_big:
      raise ValueError(
          f"b_small={b_small}, b_big={b_big}: need two different positive "
          "batch sizes")
  b_s = jnp.asarray(b_small, jnp.float32)
  b_b = jnp.asarray(b_big, jnp.float32)
  g2 = (b_b * sqnorm_big - b_s * sqnorm_small) / (b_b - b_s)
  trace = (sqnorm_small - sqnorm_big) / (1.0 / b_s - 1.0 / b_b)
  return dict(trace_total=trace, g2=g2)


# ----------------------------------------------------------------------------
# Results.
# ----------------------------------------------------------------------------
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
      out = dict(g2=g2, trace_intra=ti, trace_inter=tb, trace_total=tt,
                 b_intra=ti / g2, b_inter=tb / g2, b_noise=tt / g2,
                 b_simple=tt / g2, ratio=ti / tb)
    else:
      tt = np.asarray(v["trace_total"], np.float64)
      nan = np.full_like(g2, np.nan)
      out = dict(g2=g2, trace_intra=nan, trace_inter=nan, trace_total=tt,
                 b_intra=nan, b_inter=nan, b_noise=tt / g2, b_simple=tt / g2,
                 ratio=nan)
  return out


_B_FIELDS = ("b_intra", "b_inter", "b_noise", "b_simple")


def _to_float(x) -> float:
  return float(np.asarray(x, np.float64))


def _normalise(estimates: Mapping[str, Any], P, K) -> dict[str, float]:
  if "trace_intra" in estimates or "trace_inter" in estimates:
    missing = [k for k in _KEYS3 if k not in estimates]
    if missing:
      raise KeyError(f"estimates lack {missing}")
    _check_P(P)
    _check_K(K)
    return {k: _to_float(estimates[k]) for k in _KEYS3}
  if "trace_total" in estimates and "g2" in estimates:
    if P < 1 or K < 1:
      raise ValueError(f"P={P}, K={K} must be positive")
    return {k: _to_float(estimates[k]) for k in ("trace_total", "g2")}
  raise KeyError("estimates need (trace_intra, trace_inter, g2) or "
                 "(trace_total, g2)")


def _build(point: Mapping[str, float], P: int, K: int, *, se: Mapping[str, float],
           significant: bool | None, flags: list[str],
           n_batches: int) -> NoiseStats:
  """Assemble NoiseStats; ``significant`` None means single-estimate rule."""
  d = {k: float(v) for k, v in _derived(point, K).items()}
  g2 = d["g2"]
  tkeys = (("trace_intra", "trace_inter", "trace_total")
           if "trace_intra" in point else ("trace_total",))
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
      flags.append(f"g2 not significantly positive (g2={g2:.4g}, "
                   f"se={se.get('g2', _NAN):.4g})")
  fields = dict(d)
  ses = {f"{k}_se": float(se.get(k, _NAN)) for k in
         ("g2", "trace_intra", "trace_inter", "trace_total", "ratio")
         + _B_FIELDS}
  if not ok:
    for k in _B_FIELDS:
      fields[k] = _NAN
      ses[f"{k}_se"] = _NAN
  if not (math.isfinite(d["trace_inter"]) and d["trace_inter"] > 0.0
          and math.isfinite(d["ratio"])):
    fields["ratio"] = _NAN
    ses["ratio_se"] = _NAN
  return NoiseStats(K=int(K), P=int(P), g2_positive=ok, flag="; ".join(flags),
                    n_batches=int(n_batches), **fields, **ses)


def noise_stats(estimates: Mapping[str, Any], P: int, K: int,
                se: Mapping[str, Any] | None = None) -> NoiseStats:
  """NoiseStats from one estimate dict (exact, split, EMA or two-batch).

  Args:
    estimates: ``dict(trace_intra, trace_inter, g2)`` or, from
      :func:`two_batch_estimates`, ``dict(trace_total, g2)``.
    P, K: batch shape. With the components, K=1 and P=1 raise ValueError.
    se: optional standard errors keyed by field name, with or without the
      ``_se`` suffix (``{"g2": 0.1}`` or ``{"g2_se": 0.1}``).
  g2 <= 0 gives ``g2_positive=False``, nan noise scales and a flag; an
  all-zero gradient gives finite (zero) g2/trace fields and flag
  "zero gradient".
  """
  point = _normalise(estimates, P, K)
  se_d = {}
  for k, v in (se or {}).items():
    se_d[k[:-3] if k.endswith("_se") else k] = _to_float(v)
  return _build(point, P, K, se=se_d, significant=None, flags=[], n_batches=1)


# ----------------------------------------------------------------------------
# EMA tracker.
# ----------------------------------------------------------------------------
_MOMENT_KEYS = ("t", "g", "tt", "gg", "tg", "w2")


def t_quantile_like(z: float, dof: float) -> float:
  """The Student-t quantile with ``dof`` degrees of freedom at the coverage
  of the normal quantile ``z`` (e.g. z = 2 -> t_{0.977, dof}); no scipy.

  dof >= 2: the Cornish-Fisher expansion of Hill (1970, CACM 13:617) in
  1/dof to 4th order (within 1% of the exact quantile for z <= 2; at z = 3
  10% narrow at dof = 2, 2.5% at dof = 3); 1 <= dof < 2: linear in 1/dof
  between the closed forms at dof = 1 (tan(pi (p - 1/2))) and dof = 2
  ((2p - 1) / sqrt(2 p (1 - p))), never narrower than exact; dof < 1: inf. ``tests/test_adaptive.py`` checks it against scipy."""
  if not dof >= 1:
    return math.inf
  if math.isinf(dof):
    return float(z)
  if dof < 2:
    p = 0.5 * math.erfc(-z / math.sqrt(2.0))
    t1 = math.tan(math.pi * (p - 0.5))
    t2 = (2 * p - 1) / math.sqrt(2 * p * (1 - p))
    return float(t1 + (t2 - t1) * (1 - 1 / dof) * 2)
  z2 = z * z
  g1 = (z2 + 1) * z / 4
  g2 = ((5 * z2 + 16) * z2 + 3) * z / 96
  g3 = (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384
  g4 = ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160
  n = float(dof)
  return float(z + g1 / n + g2 / n ** 2 + g3 / n ** 3 + g4 / n ** 4)


class NoiseEMA:
  """Bias-corrected EMAs of trI, trB, G2, smoothed separately.

  Noise scales are ratios of the smoothed numerator and denominator (ratio
  of EMAs, as McCandlish et al. 2018), never EMAs of per-batch ratios.

  Implementation: weighted sums ``S_t = decay S_{t-1} + x_t`` and
  ``W_t = decay W_{t-1} + 1``; the estimate S_t/W_t equals the usual
  bias-corrected EMA ema_t/(1 - decay^t) (ema_t = decay ema + (1-decay) x)
  and is exactly x_1 after the first update. Updates with a non-finite value
  are skipped (flagged). trI and trB are K-independent under the
  assumption stated in the module docstring, so P and K may change between
  updates; b_noise uses the K passed to the latest call.
  """

  def __init__(self, decay: float = 0.9):
    if not 0.0 <= decay < 1.0:
      raise ValueError(f"decay={decay} must lie in [0, 1)")
    self.decay = float(decay)
    self.count = 0
    self.weight = 0.0
    self.sums = {k: 0.0 for k in _KEYS3}
    self.moments = {k: 0.0 for k in _MOMENT_KEYS}  # for the interval (``interval``)

  def value(self) -> dict[str, float]:
    """Current bias-corrected estimates (nan before the first update)."""
    if self.weight == 0.0:
      return {k: _NAN for k in _KEYS3}
    return {k: self.sums[k] / self.weight for k in _KEYS3}

  def update(self, estimates: Mapping[str, Any], P: int, K: int) -> NoiseStats:
    x = _normalise(estimates, P, K)
    if "trace_intra" not in x:
      raise KeyError("NoiseEMA needs trace_intra, trace_inter, g2")
    flags = []
    if all(math.isfinite(v) for v in x.values()):
      for k in _KEYS3:
        self.sums[k] = self.decay * self.sums[k] + x[k]
      self.weight = self.decay * self.weight + 1.0
      self.count += 1
      t, g = x["trace_intra"] + K * x["trace_inter"], x["g2"]
      d, d2, m = self.decay, self.decay ** 2, self.moments
      for k, v in (("t", t), ("g", g)):
        m[k] = d * m[k] + v
      for k, v in (("tt", t * t), ("gg", g * g), ("tg", t * g)):
        m[k] = d * m[k] + v
      m["w2"] = d2 * m["w2"] + 1.0
    else:
      flags.append("non-finite estimate skipped")
    return self.stats(P, K, _flags=flags)

  def stats(self, P: int, K: int, _flags=()) -> NoiseStats:
    _check_P(P)
    _check_K(K)
    return _build(self.value(), P, K, se={}, significant=None,
                  flags=list(_flags), n_batches=self.count)

  def interval(self, z: float = 2.0) -> dict[str, float]:
    """B_noise at the K of the updates, with a standard error and an interval.

    Each update t contributes a per-round numerator T_t = trI + K trB and
    denominator G_t = |G|^2 estimate; the tracker's B_noise is the ratio of
    their EMAs (weights w_t = decay^age). The per-round values are treated
    as independent draws around slowly moving means: the weighted variances
    and covariance of (T, G), times sum(w^2)/sum(w)^2 (the EMA's effective
    1/n), give the variances v_T, v_G and covariance c of the two EMAs.

    ``se`` is the delta-method SE of the ratio r = T/G. The interval
    ``[lo, hi]`` is Fieller's: the r with (T - r G)^2 <= z^2 (v_T - 2 r c +
    r^2 v_G), i.e. the ratios a z-SE test of T - r G = 0 does not reject.
    Unlike r +- z se it is skewed upward when G is barely resolved (a ratio
    of noisy means has a long right tail), so a G EMA that happens to be low
    does not produce a confidently high B_noise. It is bounded exactly when
    G > z sqrt(v_G); otherwise ``resolved`` is False, ``lo`` 0 and ``hi``
    inf (also with fewer than 3 updates, or a checkpoint from before the
    moments were kept). ``lo`` is clipped at 0 (T is a trace).

    The variances are themselves estimated from n_eff = sum(w)^2/sum(w^2)
    rounds (Kish's effective sample size), so ``z`` (a normal quantile) is
    widened to the Student-t quantile of the same coverage with n_eff - 1
    degrees of freedom (``t_quantile_like``): with a handful of rounds three
    draws that happen to agree do not make a confident interval.

    When N changes between rounds (the adaptive controller), rounds still
    carry equal EMA weights and the scatter mixes their variances: the SE
    is then an approximation, exact at constant N.
    Returns ``dict(b_noise, se, lo, hi, resolved, n_eff, z)`` (``z``: the
    widened quantile used).
    """
    m, W = self.moments, self.weight
    if self.count < 3 or W <= 0 or m["w2"] <= 0:
      return dict(b_noise=_NAN, se=_NAN, lo=0.0, hi=math.inf, resolved=False, n_eff=0.0,
                  z=math.inf)
    mt, mg = m["t"] / W, m["g"] / W
    n_eff = W * W / m["w2"]
    corr = n_eff / max(n_eff - 1.0, 1e-12)  # unbiased weighted (co)variances
    z = t_quantile_like(z, n_eff - 1.0)  # the variances are estimated: Student-t width
    vt = max(m["tt"] / W - mt * mt, 0.0) * corr / n_eff
    vg = max(m["gg"] / W - mg * mg, 0.0) * corr / n_eff
    ctg = (m["tg"] / W - mt * mg) * corr / n_eff
    ctg = max(-math.sqrt(vt * vg), min(ctg, math.sqrt(vt * vg)))  # a valid covariance
    se_g = math.sqrt(vg)
    if not mg > z * se_g:
      return dict(b_noise=mt / mg if mg > 0 else _NAN, se=_NAN, lo=0.0, hi=math.inf,
                  resolved=False, n_eff=n_eff, z=z)
    r = mt / mg
    var_r = (vt - 2 * r * ctg + r * r * vg) / (mg * mg)
    se = math.sqrt(max(var_r, 0.0))
    # Fieller: a r^2 - 2 b r + c <= 0 with a > 0 (G resolved); r itself satisfies it
    z2 = z * z
    a, b, c = mg * mg - z2 * vg, mt * mg - z2 * ctg, mt * mt - z2 * vt
    half = math.sqrt(max(b * b - a * c, 0.0))
    lo, hi = (b - half) / a, (b + half) / a
    return dict(b_noise=r, se=se, lo=max(min(lo, r), 0.0), hi=max(hi, r), resolved=True,
                n_eff=n_eff, z=z)

  def state_dict(self) -> dict[str, float]:
    return dict(decay=self.decay, count=float(self.count),
                weight=self.weight, **self.sums,
                **{f"m_{k}": v for k, v in self.moments.items()})

  def load_state_dict(self, state: Mapping[str, Any]) -> None:
    self.decay = float(state["decay"])
    self.count = int(state["count"])
    self.weight = float(state["weight"])
    self.sums = {k: float(state[k]) for k in _KEYS3}
    self.moments = {k: float(state.get(f"m_{k}", 0.0)) for k in _MOMENT_KEYS}


# ----------------------------------------------------------------------------
# Pooling with jackknife standard errors.
# ----------------------------------------------------------------------------
def _as_estimates(item: Any, P, K) -> dict[str, Any]:
  if isinstance(item, GroupMoments):
    if item.K != K or item.P != P:
      raise ValueError(f"GroupMoments has (P, K)=({item.P}, {item.K}), "
                       f"expected ({P}, {K})")
    return exact_estimates(item)
  if isinstance(item, SplitMoments):
    if item.K != K or item.P != P:
      raise ValueError(f"SplitMoments has (P, K)=({item.P}, {item.K}), "
                       f"expected ({P}, {K})")
    return split_estimates(item)
  if isinstance(item, Mapping):
    return item
  raise TypeError(f"cannot read estimates from {type(item).__name__}")


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
  and flag "g2 not significantly positive (g2=..., se=...)".
  M < 2 raises ValueError.
  """
  if isinstance(batches, (GroupMoments, SplitMoments, Mapping)):
    stacked = _as_estimates(batches, P, K)
    cols = {k: np.asarray(v, np.float64).reshape(-1)
            for k, v in stacked.items()}
  else:
    ests = [_as_estimates(b, P, K) for b in batches]
    if not ests:
      raise ValueError("M=0 batches: pooling needs M >= 2")
    keys = set(ests[0])
    for e in ests[1:]:
      keys &= set(e)
    cols = {k: np.array([_to_float(e[k]) for e in ests]) for k in keys}
  if "trace_intra" in cols or "trace_inter" in cols:
    _check_P(P)
    _check_K(K)
    keys = _KEYS3
  elif "trace_total" in cols:
    keys = ("trace_total", "g2")
  else:
    raise KeyError("estimates need (trace_intra, trace_inter, g2) or "
                   "(trace_total, g2)")
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
  significant = bool(math.isfinite(g2) and math.isfinite(g2_se)
                     and g2 > 2.0 * g2_se)
  return _build(mean, P, K, se=se, significant=significant, flags=[],
                n_batches=M)
