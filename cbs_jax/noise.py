r"""Gradient-noise estimators: the statistics behind B_intra, B_inter, B_noise.

This module holds the *estimators* only. The model side (per-rollout
gradients, their squared norms, group means, the four split microbatch
gradients) is computed elsewhere (``gradstats``, ``ghost``) and handed here
as small sufficient statistics (:class:`GroupMoments`, :class:`SplitMoments`).
Every function here is a pure ``jax.numpy`` function (jittable, vmappable;
the integers ``P``, ``K`` and the split sizes are static pytree metadata).
The estimators return dicts of arrays: ``dict(trace_intra, trace_inter,
g2)`` (:data:`ESTIMATE_KEYS`) or, from the two-batch path,
``dict(trace_total, g2)``. The host-side summaries of those dicts (noise scales, flags, pooling
with jackknife SEs) are ``noise_stats``; the live EMA tracker with its
interval is ``noise_tracker``.

Notation (docs/noise.md)
--------------------
A batch is a grid of P prompts x K rollouts, N = P K. ``g_{p,k}`` is the
per-rollout gradient, scaled so that the batch gradient is ``mean_{p,k}
g_{p,k}``. Prompts are drawn i.i.d. from the task distribution;
``mu_p = E[g_{p,k} | p]``, ``G = E_p mu_p``.

What the estimators assume, and what holds
------------------------------------------
docs/noise.md first writes the decomposition for rollouts that are i.i.d. given the
prompt. With group-normalised advantages (GRPO) the K rollouts of one prompt
are *exchangeable but not independent*: each rollout's advantage depends on
its siblings' rewards. Exchangeability is all the variance identities below
need. Given the prompt, let

    C_p = Cov(g_{p,k} | p)                  (same for every k),
    D_p = Cov(g_{p,k}, g_{p,k'} | p), k != k' (same for every pair),

and *define*

    Sigma_intra(K) = E_p[C_p - D_p]
    Sigma_inter(K) = Cov_p(mu_p) + E_p[D_p].

With independent rollouts D_p = 0 and these are exactly docs/noise.md's
Sigma_intra and Sigma_inter. In general:

* ``E[1/(K-1) sum_k |g_{p,k} - gbar_p|^2 | p] = tr(C_p - D_p)``;
* ``Cov(gbar_p) = Sigma_inter(K) + Sigma_intra(K)/K``;
* ``Cov(batch gradient) = Sigma_inter(K)/P + Sigma_intra(K)/(P K)``, exactly.

So at the batch's own K every estimator here is unbiased for
``tr Sigma_intra(K)``, ``tr Sigma_inter(K)`` and ``|G|^2``, and
``B_noise(K) = B_intra + K B_inter`` is the exact noise scale of a batch at
that K. What does *not* follow: C_p, D_p and mu_p depend on K when the
advantage baseline/scale is computed from the K rewards (for a group-mean
baseline D_p = a_p a_p^T / K^2 >= 0 and the baseline's own noise adds to
Sigma_intra: ``group_baseline``, docs/noise.md "K under a group-mean
baseline"), so extrapolating ``B_intra + K' B_inter`` to a
different K' assumes Sigma_intra(K) and Sigma_inter(K) do not change with K.
Any figure that extrapolates across K depends on that assumption.

Further assumptions, all standard: prompts i.i.d. (a finite prompt pool
sampled without replacement would need a finite-population correction of
trB); the partition of a batch into split parts is fixed before the data are
seen (contiguous blocks of a randomly ordered batch are fine; halves of a
batch sorted by reward are not); parameters fixed within a batch.

Exact per-rollout path (docs/noise.md, "Exact per-rollout estimators")
--------------------------------------------------------
    s2_p = 1/(K-1) (sum_k |g_{p,k}|^2 - K |gbar_p|^2),   trI = mean_p s2_p
    S2   = 1/(P-1) (sum_p |gbar_p|^2 - P |gbar|^2)
    trB  = S2 - trI/K,     G2 = |gbar|^2 - S2/P
Unbiasedness: E s2_p = tr Sigma_intra(K); E S2 = tr Cov(gbar_p) =
trB + trI/K; E|gbar|^2 = |G|^2 + tr Cov(gbar_p)/P.

Split-microbatch path, generalised to m prompt parts x n rollout parts
----------------------------------------------------------------------
Prompts are split into m parts of exactly P/m prompts; each prompt's K
rollouts into n parts of exactly K/n rollouts (docs/noise.md's case is
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

The stored moments are mean *pairwise* quantities, which reduce to docs/noise.md's
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

Ratios
------
Noise scales are ratios of these estimates; the ratio of unbiased estimates
is not unbiased, and a single batch's G2 can be negative. Forming the ratios
is left to ``noise_stats`` (one batch, or M pooled) and ``noise_tracker``
(ratio of EMAs).

Numerics
--------
Inputs are upcast to at least float32 (bf16 gradients are fine). The exact
path subtracts sums of squares (the streaming form in docs/noise.md); its
relative rounding error in S2 is about eps |gbar_p|^2/S2, which is small
unless prompt means agree to many digits. The split path centres before
squaring and forms ``cross`` from direct dot products.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import struct

Array = Any

# The keys of every estimate dict with the components (exact and split paths).
ESTIMATE_KEYS = ("trace_intra", "trace_inter", "g2")


# ----------------------------------------------------------------------------
# Validation helpers.
# ----------------------------------------------------------------------------
def _check_K(K) -> None:
  if int(K) != K or K < 2:
    raise ValueError(
        f"K={K}: intra-prompt variance undefined for K=1 " "(need K >= 2 rollouts per prompt)"
    )


def _check_P(P) -> None:
  if int(P) != P or P < 2:
    raise ValueError(f"P={P}: inter-prompt variance undefined for P=1 " "(need P >= 2 prompts)")


def check_batch_shape(P, K) -> None:
  """ValueError naming P (P < 2) or K (K < 2): the components need both."""
  _check_P(P)
  _check_K(K)


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


def moments_from_group_means(sum_sqnorm_P: Array, gbar_P: Any, K: int) -> GroupMoments:
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
      mean_sqnorm_P=mean_sq,
      batch_mean_sqnorm=batch_sq,
      K=int(K),
  )


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
      raise ValueError(f"leaf leads with {leaf.shape[:2]}, expected (P, K)=({P}, {K})")
    x = jnp.reshape(leaf, (P, K, -1)).astype(_acc_dtype(leaf))
    sum_sq = sum_sq + jnp.sum(x * x, axis=(1, 2))
    gbar_leaves.append(jnp.mean(x, axis=1))
  return moments_from_group_means(sum_sq, gbar_leaves, K)


def exact_estimates(m: GroupMoments) -> dict[str, Array]:
  """Unbiased trI, trB, G2 from one batch (docs/noise.md, "Exact per-rollout estimators").

  Returns ``dict(trace_intra, trace_inter, g2)`` of arrays shaped like
  ``m.batch_mean_sqnorm``. Raises ValueError for K=1 or P=1 (at trace time).
  """
  K, P = m.K, m.P
  _check_K(K)
  _check_P(P)
  s2_P = (m.sum_sqnorm_P - K * m.mean_sqnorm_P) / (K - 1)
  tr_intra = jnp.mean(s2_P, axis=-1)
  S2 = (jnp.sum(m.mean_sqnorm_P, axis=-1) - P * m.batch_mean_sqnorm) / (P - 1)
  return dict(trace_intra=tr_intra, trace_inter=S2 - tr_intra / K, g2=m.batch_mean_sqnorm - S2 / P)


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
  onehot = jax.nn.one_hot(groups, G, dtype=jnp.float32)  # [P, G]
  count = jnp.sum(onehot, axis=0)  # [G]
  s2_P = (m.sum_sqnorm_P - K * m.mean_sqnorm_P) / (K - 1)
  sq_d = onehot.T @ m.mean_sqnorm_P  # sum_{p in d} |gbar_p|^2
  s2_d = onehot.T @ s2_P  # sum_{p in d} s2_p
  cross_d = jnp.sum(gram, axis=-1) / P  # S_d . gbar
  gbar2 = jnp.sum(gram) / (P * P)  # |gbar|^2
  scatter = sq_d - 2 * cross_d + count * gbar2
  contrib = scatter / (P - 1) - s2_d / (P * K)
  total = jnp.sum(contrib)
  return dict(contribution=contrib, count=count, share=contrib / jnp.where(total == 0, 1.0, total))


# ----------------------------------------------------------------------------
# Split-microbatch path.
# ----------------------------------------------------------------------------
@struct.dataclass
class SplitMoments:
  """Sufficient statistics of the m x n split-microbatch path of ONE batch.

  For the default m = n = 2 (docs/noise.md, "Split-microbatch estimator"):
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
        f"have equal size P/{m}"
    )
  if K % n:
    raise ValueError(
        f"K={K} is not divisible into {n} rollout parts: each prompt's "
        f"rollouts must split into equal parts of size K/{n}"
    )


def cell_sum(xs) -> Array:
  """Sum of a short list of equal-shaped arrays as one chain of adds, which
  XLA fuses into one elementwise pass; ``jnp.sum(jnp.stack(xs), axis=0)``,
  a reduction over a leading axis of 2-4, its CPU backend runs several times
  slower (docs/noise.md, "Split-microbatch estimator")."""
  out = xs[0]
  for x in xs[1:]:
    out = out + x
  return out


def split_moments_from_quarters(q_ab: Any, P: int, K: int) -> SplitMoments:
  """SplitMoments from the m x n cell-mean gradients of one batch.

  Args:
    q_ab: array or pytree whose every leaf has leading axes ``(m, n)``
      (``(2, 2)`` for docs/noise.md's quarters): ``q_ab[a, b]`` is the mean
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
  within = 0.0  # sum_a sum_b |q_ab - r_a|^2
  between = 0.0  # sum_a |r_a - rbar|^2
  off = 0.0  # sum_{a != a'} r_a . r_a'
  for leaf in leaves:
    if leaf.shape[:2] != (m, n):
      raise ValueError(f"q_ab leaf leads with {leaf.shape[:2]}, expected ({m}, {n})")
    x = jnp.reshape(leaf, (m, n, -1)).astype(_acc_dtype(leaf))
    # the (small, static) cell axes summed slice by slice: one elementwise
    # pass per moment, where a reduction over the leading axes and an
    # [m, D] x [D, m] product cost XLA's CPU backend several passes
    r = [cell_sum([x[a, b] for b in range(n)]) / n for a in range(m)]
    rbar = cell_sum(r) / m
    within = within + jnp.sum(
        cell_sum([jnp.square(x[a, b] - r[a]) for a in range(m) for b in range(n)])
    )
    between = between + jnp.sum(cell_sum([jnp.square(ra - rbar) for ra in r]))
    off = off + 2.0 * jnp.sum(cell_sum([r[a] * r[c] for a in range(m) for c in range(a + 1, m)]))
  return SplitMoments(
      d_intra=2.0 * within / (m * (n - 1)),
      d_inter=2.0 * between / (m - 1),
      cross=off / (m * (m - 1)),
      P=int(P),
      K=int(K),
      prompt_parts=int(m),
      rollout_parts=int(n),
  )


def split_estimates(s: SplitMoments) -> dict[str, Array]:
  """Unbiased trI, trB, G2 from the split path (derivation in module doc).

  m = n = 2: trI = N/8 d_intra, trB = P/4 d_inter - trI/K, G2 = cross.
  """
  P, K, m, n = s.P, s.K, s.prompt_parts, s.rollout_parts
  _check_split(P, K, m, n)
  N = P * K
  tr_intra = N / (2.0 * m * n) * s.d_intra
  return dict(
      trace_intra=tr_intra, trace_inter=P / (2.0 * m) * s.d_inter - tr_intra / K, g2=s.cross
  )


# ----------------------------------------------------------------------------
# Two-batch path.
# ----------------------------------------------------------------------------
def two_batch_estimates(sqnorm_small: Array, b_small, sqnorm_big: Array, b_big) -> dict[str, Array]:
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
          f"b_small={b_small}, b_big={b_big}: need two different positive " "batch sizes"
      )
  b_s = jnp.asarray(b_small, jnp.float32)
  b_b = jnp.asarray(b_big, jnp.float32)
  g2 = (b_b * sqnorm_big - b_s * sqnorm_small) / (b_b - b_s)
  trace = (sqnorm_small - sqnorm_big) / (1.0 / b_s - 1.0 / b_b)
  return dict(trace_total=trace, g2=g2)
