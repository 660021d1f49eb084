"""The learning-rate envelope's arms (``experiments/lr_envelope.py --arm``):
what each schedules from the envelope's records, and the side-by-side fit,
on synthetic records with a known best rate and a known B_crit."""

import argparse
import csv
import math
import os

import numpy as np
import pytest

from tests import experiment_scripts

L = experiment_scripts.load("lr_envelope")
T = 0.54
NS = [128, 512, 2048, 8192, 16384]


def lr_star(N, shift=0):
  """The synthetic best rate: 3e-4 at N = 128, x2 per x4 in N, times 2^shift."""
  return 3e-4 * 2.0 ** (round(math.log(N / 128, 4)) + shift)


def rec(N, lr, seed, b_crit, best_lr, s_min=5.0, noise=0.0, rng=None):
  """A run record whose rounds to T follow the law at the best rate and
  grow by 30% per x2 step away from it."""
  off = abs(math.log2(lr / best_lr))
  s = s_min * (1 + b_crit / N) * (1 + 0.3 * off)
  if rng is not None:
    s *= 1 + noise * rng.normal()
  return {
      "N": N,
      "lr": L._lr(lr),
      "seed": seed,
      "capped": False,
      f"rounds@{T}": s,
      f"rollouts@{T}": s * N,
  }


def envelope_records(b_crit=2000.0, seeds=3, rng=None, noise=0.0):
  """The on-policy envelope: every N scanned at its best and both neighbours."""
  return [
      rec(N, lr_star(N) * 2.0**d, s, b_crit, lr_star(N), noise=noise, rng=rng)
      for N in NS
      for d in (-1, 0, 1)
      for s in range(seeds)
  ]


def test_warmup_arm_asks_for_every_seed_at_each_envelope_best_and_skips_what_is_recorded():
  on = envelope_records()
  want = L.wanted_arm("warmup5", [], on, NS, (T,))
  assert sorted(want) == sorted((N, L._lr(lr_star(N)), s) for N in NS for s in range(3))
  done = [rec(N, lr, s, 2000.0, lr) for N, lr, s in want[:4]]
  assert L.wanted_arm("warmup5", done, on, NS, (T,)) == want[4:]
  # an N whose envelope is not bracketed is left out
  edge = [r for r in on if not (r["N"] == 512 and r["lr"] < L._lr(lr_star(512)))]
  assert all(N != 512 for N, _, _ in L.wanted_arm("warmup5", [], edge, NS, (T,)))


def test_off_arm_scans_three_batch_sizes_then_shifts_the_rest():
  on = envelope_records()
  scanned = L.scan_ns(NS)
  assert scanned == list(L.OFF_SCAN_NS)
  first = L.wanted_arm("off4", [], on, NS, (T,))
  assert sorted(first) == sorted(
      (N, L._lr(lr_star(N) * 2.0**d), 0) for N in scanned for d in (-1, 0, 1)
  )
  # the off-policy optimum sits one x2 step below the on-policy one: at
  # every scanned N the scan's low edge holds the best, so it scans lower
  off = [rec(N, lr, s, 6000.0, lr_star(N, -1)) for N, lr, s in first]
  step = L.wanted_arm("off4", off, on, NS, (T,))
  assert sorted(step) == sorted((N, L._lr(lr_star(N) / 4), 0) for N in scanned)
  assert L.off_shift(off, L.on_best_rates(on, T), scanned, T) is None  # not bracketed yet
  off += [rec(N, lr, s, 6000.0, lr_star(N, -1)) for N, lr, s in step]
  assert L.off_shift(off, L.on_best_rates(on, T), scanned, T) == -1
  last = set(L.wanted_arm("off4", off, on, NS, (T,)))
  rest = {(N, L._lr(lr_star(N, -1)), s) for N in NS if N not in scanned for s in range(3)}
  seeds = {(N, L._lr(lr_star(N, -1) * 2.0**d), s) for N in scanned for d in (-1, 0) for s in (1, 2)}
  assert rest <= last and seeds <= last
  assert all(s > 0 or N not in scanned for N, _, s in last)  # no seed-0 rerun at a scanned N


def _args(tmp_path, ns):
  return argparse.Namespace(
      out=str(tmp_path), root=str(tmp_path / "runs"), ns=ns, quick=False, cap=3.0, replot=False
  )


def _read(path):
  with open(path) as f:
    return list(csv.DictReader(f))


def test_off_arm_ratio_recovers_a_known_b_crit_ratio_over_matched_batch_sizes(tmp_path):
  """B_crit 2,000 on-policy and 6,000 off-policy (10% seed scatter): the fits
  recover both and the ratio's interval holds 3. The on-policy fit uses
  only the arm's N (an extra N = 64 point in the envelope is left out)."""
  rng = np.random.default_rng(0)
  on = envelope_records(2000.0, rng=rng, noise=0.1)
  on += [rec(64, 3e-4 * 2.0**d, s, 1e5, 3e-4) for d in (-1, 0, 1) for s in range(3)]
  scanned = L.scan_ns(NS)
  off = [
      rec(N, lr_star(N, -1) * 2.0**d, s, 6000.0, lr_star(N, -1), noise=0.1, rng=rng)
      for N in scanned
      for d in (-1, 0, 1)
      for s in range(3)
  ]
  off += [
      rec(N, lr_star(N, -1), s, 6000.0, lr_star(N, -1), noise=0.1, rng=rng)
      for N in NS
      if N not in scanned
      for s in range(3)
  ]
  L.analyse_arm(_args(tmp_path, NS), "off4", off, on, (T,), 0.0)
  (row,) = _read(tmp_path / "lr_envelope_off4" / "lr_envelope_off4.csv")
  assert float(row["on_B"]) == pytest.approx(2000, rel=0.3)
  assert float(row["off4_B"]) == pytest.approx(6000, rel=0.3)
  assert float(row["ratio_lo"]) < 3 < float(row["ratio_hi"])
  assert row["points"] == "15 / 15"
  md = (tmp_path / "lr_envelope_off4" / "lr_envelope_off4.md").read_text()
  assert "x2^-1" in md and "Per batch size" in md
  per_n = _read(tmp_path / "lr_envelope_off4" / "lr_envelope_off4_per_n.csv")
  assert {int(r["N"]) for r in per_n} == set(NS)
  assert os.path.exists(tmp_path / "lr_envelope_off4" / "manifest.json")


def test_warmup_arm_counts_targets_reached_inside_the_warmup(tmp_path):
  """A warmup that only delays the large N (3 extra rounds where S < 10)
  shows as a larger B_crit, and the runs that reached T within the first
  WARMUP_STEPS rounds are counted."""
  on = envelope_records(2000.0)
  arm = []
  for N in NS:
    for s in range(3):
      r = rec(N, lr_star(N), s, 2000.0, lr_star(N))
      if r[f"rounds@{T}"] < 10:
        r[f"rounds@{T}"] = 4.0 + 0.1 * s
        r[f"rollouts@{T}"] = r[f"rounds@{T}"] * N
      arm.append(r)
  L.analyse_arm(_args(tmp_path, NS), "warmup5", arm, on, (T,), 0.0)
  (row,) = _read(tmp_path / "lr_envelope_warmup5" / "lr_envelope_warmup5.csv")
  small_s = sum(1 for r in arm if r[f"rounds@{T}"] <= L.WARMUP_STEPS)
  assert small_s > 0 and row["reached_in_warmup"] == f"{small_s}/15"
  assert float(row["warmup5_B"]) > float(row["on_B"])


def test_decision_on_the_envelope_is_e_over_throughput_and_the_doubling_rule(tmp_path):
  """T(N) = E*(N) / rollouts per second, and 2N pays exactly where the
  throughput gain exceeds the E* penalty (checked by hand on three N)."""
  from cbs_jax import stats  # pylint: disable=import-outside-toplevel

  path = tmp_path / "throughput.json"
  path.write_text('{"N": [64, 128, 256], "rollouts_per_s": [2000.0, 4000.0, 4200.0]}')
  e = {64: 1.0e4, 128: 1.2e4, 256: 1.5e4}
  table = [
      dict(target=T, N=n, E_star=v, E=stats.Estimate(v, 0.9 * v, 1.1 * v)) for n, v in e.items()
  ]
  table.append(dict(target=0.5, N=64, E_star=1.0, E=stats.Estimate(1.0, 1.0, 1.0)))  # other target
  rows, _ = L.decision_rows(table, str(path), T)
  assert [r["N"] for r in rows] == [64, 128, 256]
  assert rows[0]["T"].value == pytest.approx(5.0) and rows[0]["T"].hi == pytest.approx(5.5)
  assert rows[0]["gain"] == pytest.approx(2.0) and rows[0]["penalty"] == pytest.approx(1.2)
  assert rows[0]["doubling_pays"] and not rows[1]["doubling_pays"]  # 1.05 < 1.25
  assert "gain" not in rows[2]
  assert L.decision_rows(table, str(tmp_path / "none.json"), T) is None


def test_range_rows_refit_each_sub_range_and_show_a_drifting_knee():
  """``range_rows``: the six sub-ranges of N with the right ends. On the law
  itself (3% seed scatter) every sub-range recovers B_crit = 2,000; on a
  misfitting law whose knee grows with N (b(N) = 1,000 (N / 512)^0.4) the
  fit without the small end lies above the full fit, without the large end
  below it."""
  ns = [64, 128, 256, 512, 1024, 2048, 4096]
  rng = np.random.default_rng(1)

  def runs(b):
    return [
        {"N": n, "seed": s, f"rounds@{T}": 5.0 * (1 + b(n) / n) * (1 + 0.03 * rng.normal())}
        for n in ns
        for s in range(3)
    ]

  rows = L.range_rows(runs(lambda n: 2000.0), T)
  assert [r["range"] for r in rows] == [label for label, _, _ in L.RANGES]
  assert [(r["N_min"], r["N_max"], r["points"]) for r in rows] == [
      (64, 4096, 7),
      (128, 4096, 6),
      (64, 2048, 6),
      (128, 2048, 5),
      (256, 4096, 5),
      (64, 1024, 5),
  ]
  for r in rows:
    assert r["B_crit"].value == pytest.approx(2000, rel=0.15), r
  by = {
      r["range"]: r["B_crit"].value for r in L.range_rows(runs(lambda n: 1e3 * (n / 512) ** 0.4), T)
  }
  assert by["drop the two smallest"] > by["drop the smallest"] > by["all N"]
  assert by["drop the two largest"] < by["drop the largest"] < by["all N"]


def test_a_capped_run_keeps_the_targets_it_reached_before_its_cap():
  """Stopped by its cap after crossing 0.50 but not 0.54: at 0.50 it is a
  run that reached (its value counts), at 0.54 a capped run (not reached)."""
  r = {"N": 256, "lr": 3e-4, "seed": 0, "capped": True, "rollouts@0.5": 8e3, "rollouts@0.54": None}
  (low,) = L.as_envelope_records([r], 0.5)
  (high,) = L.as_envelope_records([r], 0.54)
  assert (low["value"], low["capped"]) == (8e3, False)
  assert (high["value"], high["capped"]) == (None, True)
  done = dict(r, capped=False, **{"rollouts@0.54": 1e4})
  assert L.as_envelope_records([done], 0.54)[0]["capped"] is False


def test_an_arm_against_an_envelope_that_brackets_nothing_says_so(tmp_path):
  """Nothing to run and nothing recorded is an error naming the envelope,
  not a silent exit with no files."""
  edge = [
      r for r in envelope_records() if r["lr"] >= L._lr(lr_star(r["N"]))
  ]  # best at the low edge
  L.save_records(L.records_path(str(tmp_path)), edge)
  with pytest.raises(SystemExit, match="brackets the best rate at no N"):
    L.main(["--arm=warmup5", f"--out={tmp_path}", "--ns=" + ",".join(map(str, NS))])


@pytest.mark.parametrize("quick", [False, True])
def test_a_run_that_has_not_yet_learned_is_not_stopped_as_collapsed(quick):
  """The collapse floor lies below the study's SFT base (0.440 full size:
  the README's quickstart table; 0.140 for the quick base, the round-0
  evaluation of every --quick run) and below every target."""
  c = L.study_config(quick)
  base = 0.14 if quick else 0.44
  assert 0 < c.train.stop_below_pass_rate < base - 0.02
  assert c.train.stop_below_pass_rate < min(L.batch_law.targets("quick" if quick else "on"))
