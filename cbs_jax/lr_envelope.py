"""The learning-rate envelope: every batch size at its own best learning rate.

A batch-size law read off runs at one learning rate for all N mixes two
effects: E(N) rising past B_crit, and the learning rate drifting away from
its optimum as N changes. The envelope removes the second (docs/batch_law.md,
"The learning-rate envelope"):

* ``envelope``: per N, the mean rollouts (or rounds) to a target at each
  scanned learning rate, the best one, E*(N) = the least mean, and whether
  the best is **bracketed** (a scanned rate on each side of it; a best at
  the edge of the scan is flagged and must not be reported as the
  optimum). E*(N)'s interval comes from a bootstrap that redraws the mean
  of every (N, lr) cell (``_cell_draws``) and takes the argmin again, so it
  carries the uncertainty of *which* rate is best.
* ``next_rates``: the rates a scan still needs at an N (one more x2 step
  past an edge).
* ``lr_exponent``: lr*(N) ~ N^alpha fitted over the bracketed N, with a
  bootstrap interval from the same resampled argmins.
* (the law's own lack-of-fit test is ``batch_law.lack_of_fit``.)
* ``run_cap``: the rollout budget of a run, a multiple of the best E found
  so far at its N; a run stopped there is "capped" and enters every
  summary as not reached.

A run record is ``dict(N, lr, seed, value, capped)``: ``value`` the steps or
rollouts to the target (None: not reached), ``capped`` True when the run was
stopped by its cap (its value is then ignored).
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

import numpy as np
import scipy.stats

from cbs_jax import stats


def _reached(r: Mapping) -> float:
  v = r.get("value")
  if r.get("capped") or v is None or not math.isfinite(float(v)):
    return math.inf
  return float(v)


def _cells(records: Iterable[Mapping]) -> dict:
  """{N: {lr: array of per-seed values (inf: not reached or capped)}}."""
  cells: dict = {}
  for r in records:
    cells.setdefault(int(r["N"]), {}).setdefault(float(r["lr"]), []).append(_reached(r))
  return {N: {lr: np.asarray(v, float) for lr, v in sorted(d.items())} for N, d in cells.items()}


def _best(means: np.ndarray) -> int:
  """Index of the least mean (ties: the smaller learning rate)."""
  return int(np.argmin(means))


def _cell_draws(v: np.ndarray, rng, n_boot: int, level: float) -> np.ndarray:
  """``n_boot`` bootstrap draws of a cell's mean. A cell whose seeds all
  reached: normal about the mean with the SE widened so that the draws'
  ``level`` interval is the cell's Student-t interval (x t_{n-1} / z; 1.78
  for 3 seeds at 90%). Resampling 3 seeds has 10 distinct outcomes and
  shrinks the variance by 2/3: its 90% interval covered ~70% of synthetic
  grids (``tests/test_lr_envelope.py``); t draws themselves have tails so
  heavy (t(1) for 2 seeds) that the least of a few cells reached 2% of E*.
  A cell with an unreached seed (inf) or one seed: the seeds resampled, so
  a draw is inf as often as a resample holds an unreached seed."""
  n = v.size
  if n >= 2 and np.isfinite(v).all():
    q = (1 + level) / 2
    widen = scipy.stats.t.ppf(q, n - 1) / scipy.stats.norm.ppf(q)
    return v.mean() + widen * v.std(ddof=1) / math.sqrt(n) * rng.standard_normal(n_boot)
  return rng.choice(v, size=(n_boot, n)).mean(axis=1)


def envelope(
    records: Iterable[Mapping], level: float = 0.9, n_boot: int = 2000, seed: int = 0
) -> list[dict]:
  """The envelope per N (sorted). Each row: N, lrs, means (inf where a
  seed did not reach), seeds (per lr), best_lr, best (E*), lo, hi (its
  percentile bootstrap interval; inf hi when resampled argmins do not
  reach), bracketed, edge ("low" | "high" | None), lr_boot (the bootstrap
  argmins), boot_means (n_boot x len(lrs): each replicate's cell means, for
  ratios of a cell to E* that share its resampling: ``rate_ratio``), status
  (a sentence)."""
  rng = np.random.default_rng(seed)
  rows = []
  for N, by_lr in sorted(_cells(records).items()):
    lrs = np.array(list(by_lr))
    vals = list(by_lr.values())
    means = np.array([v.mean() for v in vals])
    i = _best(means)
    boot_means = np.stack([_cell_draws(v, rng, n_boot, level) for v in vals], axis=1)
    j = np.argmin(boot_means, axis=1)  # ties: the smaller rate, as ``_best``
    boot_best, boot_lr = boot_means[np.arange(n_boot), j], lrs[j]
    lo, hi = stats.percentile_ci(boot_best, level)
    bracketed = bool(math.isfinite(means[i]) and 0 < i < len(lrs) - 1)
    edge = None
    if not math.isfinite(means[i]):
      status = "no learning rate reached the target with every seed"
    elif bracketed:
      status = f"best lr {lrs[i]:g} bracketed by {lrs[i - 1]:g} and {lrs[i + 1]:g}"
    else:
      edge = "low" if i == 0 else "high"
      status = (
          f"best lr {lrs[i]:g} at the {edge} edge of the scan {lrs.tolist()}: not "
          f"bracketed, scan {'lower' if edge == 'low' else 'higher'}"
      )
    rows.append(
        dict(
            N=N,
            lrs=lrs.tolist(),
            means=means.tolist(),
            seeds=[int(v.size) for v in vals],
            best_lr=float(lrs[i]),
            best=float(means[i]),
            lo=lo,
            hi=hi,
            bracketed=bracketed,
            edge=edge,
            lr_boot=boot_lr,
            boot_means=boot_means,
            status=status,
        )
    )
  return rows


def rate_ratio(row: Mapping, lr: float, level: float = 0.9) -> dict:
  """E at learning rate ``lr`` over E* at the same N (an ``envelope`` row):
  the ratio of means, with a percentile interval from the row's bootstrap
  (each replicate: the cell's resampled mean over that replicate's least
  mean, the argmin retaken). inf where a seed (or a replicate) did not
  reach. Raises ValueError when ``lr`` was not scanned at that N."""
  k = next((i for i, v in enumerate(row["lrs"]) if math.isclose(v, lr, rel_tol=1e-9)), None)
  if k is None:
    raise ValueError(f"lr {lr:g} was not scanned at N = {row['N']} (scanned: {row['lrs']})")
  b = row["boot_means"]
  with np.errstate(invalid="ignore"):  # inf / inf (neither reached): nan, read as inf
    lo, hi = stats.percentile_ci(b[:, k] / b.min(axis=1), level)
  return dict(ratio=row["means"][k] / row["best"], lo=lo, hi=hi)


def next_rates(row: Mapping, factor: float = 2.0) -> list[float]:
  """Learning rates the scan at ``row['N']`` still needs: one ``factor``
  step past the edge where the best sits; none once it is bracketed (or
  when nothing reached: the caller decides)."""
  if row["bracketed"] or not math.isfinite(row["best"]):
    return []
  lrs = row["lrs"]
  return [lrs[0] / factor] if row["best_lr"] == lrs[0] else [lrs[-1] * factor]


def seeds_needed(row: Mapping, min_seeds: int = 3) -> dict[float, int]:
  """{lr: more seeds} so that the best two rates have ``min_seeds`` each."""
  order = np.argsort(row["means"], kind="stable")[:2]
  return {row["lrs"][k]: min_seeds - row["seeds"][k] for k in order if row["seeds"][k] < min_seeds}


def lr_exponent(rows: Sequence[Mapping], level: float = 0.9) -> dict:
  """lr*(N) ~ N^alpha: least squares of log lr* on log N over the
  bracketed rows, and the percentile interval of alpha over the bootstrap
  argmins (``lr_boot``, replicate by replicate). ValueError with fewer than
  two bracketed N."""
  use = [r for r in rows if r["bracketed"]]
  if len(use) < 2:
    raise ValueError(
        f"lr_exponent needs the best lr bracketed at >= 2 batch sizes, got "
        f"{[r['N'] for r in use]}"
    )
  x = np.log([r["N"] for r in use])
  slope = lambda y: float(np.polyfit(x, np.log(y), 1)[0])
  alpha = slope([r["best_lr"] for r in use])
  boot = np.stack([np.asarray(r["lr_boot"], float) for r in use], axis=1)  # [B, n]
  reps = np.array([slope(b) for b in boot])
  lo, hi = stats.percentile_ci(reps, level)
  return dict(alpha=alpha, lo=lo, hi=hi, ns=[r["N"] for r in use], level=level)


def run_cap(best_so_far: float | None, factor: float, budget: float) -> float:
  """A run's budget: ``factor`` x the best value found so far at its N,
  never above ``budget`` (the study's cap); ``budget`` before any run
  reached."""
  if not factor >= 1:
    raise ValueError(f"cap factor={factor!r} must be >= 1")
  if best_so_far is None or not math.isfinite(best_so_far):
    return float(budget)
  return float(min(budget, factor * best_so_far))
