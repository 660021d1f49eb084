"""The learning-rate envelope (``cbs_jax.lr_envelope``) on synthetic grids
with a known optimum, the lack-of-fit test at its nominal rate, and capped
runs."""

import math

import numpy as np
import pytest

from cbs_jax import batch_law
from cbs_jax import lr_envelope

NS = [64, 256, 1024, 4096]
ALPHA = 0.5


def true_lr(N):
  return 3e-4 * (N / 256) ** ALPHA


def true_e(N, lr):
  """E(N, lr): the law's E(N) times a bowl in log2(lr / lr*)."""
  e0 = 2e4 * (1 + N / 3000)
  return e0 * (1 + 0.15 * np.log2(lr / true_lr(N)) ** 2)


def grid(ns, offsets=(-2, -1, 0, 1, 2), seeds=3, noise=0.03, rng=None):
  rng = rng or np.random.default_rng(0)
  recs = []
  for N in ns:
    for k in offsets:
      lr = true_lr(N) * 2.0**k
      for s in range(seeds):
        recs.append(dict(N=N, lr=lr, seed=s, value=true_e(N, lr) * (1 + noise * rng.normal())))
  return recs


def test_envelope_finds_the_known_optimum_and_brackets_it():
  rows = lr_envelope.envelope(grid(NS), n_boot=500)
  assert [r["N"] for r in rows] == NS
  for r in rows:
    assert r["best_lr"] == pytest.approx(true_lr(r["N"]))
    assert r["bracketed"] and r["edge"] is None and "bracketed" in r["status"]
    assert r["lo"] <= true_e(r["N"], true_lr(r["N"])) * 1.03 and r["hi"] >= r["best"] * 0.97
    assert lr_envelope.next_rates(r) == []


def test_an_optimum_at_the_scan_edge_is_flagged_not_reported():
  low = grid([1024], offsets=(-4, -3, -2))  # every scanned rate below the optimum
  (r,) = lr_envelope.envelope(low, n_boot=200)
  assert not r["bracketed"] and r["edge"] == "high" and "not bracketed" in r["status"]
  assert lr_envelope.next_rates(r) == [pytest.approx(true_lr(1024) / 2)]
  high = grid([64], offsets=(1, 2))
  (r,) = lr_envelope.envelope(high, n_boot=200)
  assert r["edge"] == "low" and lr_envelope.next_rates(r) == [pytest.approx(true_lr(64))]


def test_the_interval_carries_which_rate_is_best():
  """Two rates almost tied: the bootstrap argmin moves between them, and the
  interval of E* is wider than either cell's own spread would say... and
  covers both means."""
  rng = np.random.default_rng(1)
  recs = []
  for lr, mu in ((1e-4, 1.3), (2e-4, 1.00), (4e-4, 1.01), (8e-4, 1.4)):
    recs += [dict(N=256, lr=lr, seed=s, value=mu * (1 + 0.05 * rng.normal())) for s in range(3)]
  (r,) = lr_envelope.envelope(recs, n_boot=2000)
  picked = set(np.round(r["lr_boot"], 8))
  assert {2e-4, 4e-4} <= picked
  assert r["lo"] < 1.0 < r["hi"]


def test_lr_exponent_recovers_alpha_with_an_interval():
  rows = lr_envelope.envelope(grid(NS, noise=0.02), n_boot=500)
  a = lr_envelope.lr_exponent(rows)
  assert a["alpha"] == pytest.approx(ALPHA, abs=1e-9)
  assert a["lo"] - 1e-9 <= ALPHA <= a["hi"] + 1e-9
  with pytest.raises(ValueError, match="bracketed"):
    lr_envelope.lr_exponent(rows[:1])


def test_capped_runs_never_count_as_reached():
  recs = grid([256], seeds=3, noise=0.0)
  best = next(r for r in recs if r["lr"] == pytest.approx(true_lr(256)))
  best["capped"] = True  # stopped by its cap: its value must not count
  (row,) = lr_envelope.envelope(recs, n_boot=100)
  k = row["lrs"].index(pytest.approx(true_lr(256)))
  assert math.isinf(row["means"][k]) and row["best_lr"] != pytest.approx(true_lr(256))
  unreached = [dict(r, value=None) for r in grid([256], seeds=2)]
  (row,) = lr_envelope.envelope(unreached, n_boot=50)
  assert math.isinf(row["best"]) and not row["bracketed"] and "no learning rate" in row["status"]


def test_seeds_needed_for_the_best_two():
  recs = grid([256], seeds=1)
  (row,) = lr_envelope.envelope(recs, n_boot=50)
  need = lr_envelope.seeds_needed(row)
  assert len(need) == 2 and set(need.values()) == {2}
  assert pytest.approx(true_lr(256)) in list(need)


def test_run_cap():
  assert lr_envelope.run_cap(None, 3.0, 1e6) == 1e6
  assert lr_envelope.run_cap(2e4, 3.0, 1e6) == 6e4
  assert lr_envelope.run_cap(5e5, 3.0, 1e6) == 1e6
  with pytest.raises(ValueError, match="factor"):
    lr_envelope.run_cap(1.0, 0.5, 10.0)


def _law_sweep(rng, law, ns=(64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384), seeds=3, rel=0.1):
  n = np.repeat(ns, seeds).astype(float)
  return n, law(n) * (1 + rel * rng.normal(size=n.size))


def test_lack_of_fit_holds_its_rate_on_the_law_and_rejects_a_misfit():
  """300 synthetic sweeps each: on S = S_min (1 + B / N) with 10% relative
  scatter the test rejects at about its nominal 5%; on a law with a
  steeper knee (S ~ 1 + (B / N)^1.6) nearly always."""
  rng = np.random.default_rng(0)
  law = lambda n: 30 * (1 + 3000 / n)
  bent = lambda n: 30 * (1 + (3000 / n) ** 1.6)
  reject = lambda f: np.mean(
      [batch_law.lack_of_fit(*_law_sweep(rng, f))["p_value"] < 0.05 for _ in range(300)]
  )
  assert 0.02 <= reject(law) <= 0.09
  assert reject(bent) >= 0.9
  out = batch_law.lack_of_fit(*_law_sweep(rng, bent))
  assert out["dof_lack"] == 7 and out["dof_pure"] == 18
  fit = batch_law.fit_critical_batch(*_law_sweep(rng, bent), seeds=np.tile(range(3), 9))
  assert fit["verdict"] == "misfits" and fit["lack_of_fit"]["p_value"] < 0.05
  assert "case bootstrap" in fit["interval"]
  with pytest.raises(ValueError, match="replicates"):
    batch_law.lack_of_fit([64, 128, 256], [1.0, 2.0, 3.0])


def test_rate_ratio_is_the_cell_over_the_best_with_a_shared_bootstrap():
  """A rate two x2 steps off the optimum costs 1 + 0.15 * 4 = 1.6x E* (the
  bowl of ``true_e``): the point ratio is the ratio of cell means, its
  interval holds 1.6 in at least ~the nominal 90% of 100 noisy grids (a
  ratio of two t(2) draws errs wide: ~97%), and it is 1 for the best rate
  itself. E*'s own interval holds E(N, lr*) in ~90% of the grids too (a
  mean + SE t(2) draw per cell; resampling three seeds gave ~70%). A cell
  where a seed never reached is
  inf; a rate that was not scanned is an error naming it."""
  hits = hits_e = 0
  for k in range(100):
    (row,) = lr_envelope.envelope(grid([1024], rng=np.random.default_rng(k)), n_boot=500)
    q = lr_envelope.rate_ratio(row, true_lr(1024) * 4)
    (cell,) = [
        m for lr, m in zip(row["lrs"], row["means"]) if lr == pytest.approx(true_lr(1024) * 4)
    ]
    assert q["ratio"] == pytest.approx(cell / row["best"])
    hits += q["lo"] <= 1.6 <= q["hi"]
    hits_e += row["lo"] <= true_e(1024, true_lr(1024)) <= row["hi"]
  assert hits >= 85 and 80 <= hits_e <= 97, (hits, hits_e)
  assert lr_envelope.rate_ratio(row, row["best_lr"])["ratio"] == 1.0
  recs = grid([1024]) + [dict(N=1024, lr=1e-1, seed=0, value=None)]
  (row,) = lr_envelope.envelope(recs, n_boot=100)
  assert lr_envelope.rate_ratio(row, 1e-1) == dict(ratio=math.inf, lo=math.inf, hi=math.inf)
  with pytest.raises(ValueError, match="lr 0.5 was not scanned at N = 1024"):
    lr_envelope.rate_ratio(row, 0.5)
