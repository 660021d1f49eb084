"""The time-optimal batch size (``cbs_jax.time_optimal``) and the adaptive
controller aiming at it (``controller.AdaptiveBatch(objective="time")``),
checked against closed forms and synthetic throughput curves."""

import math

import numpy as np
import pytest

from cbs_jax import controller
from cbs_jax import noise_tracker
from cbs_jax import plan
from cbs_jax import systems
from cbs_jax import time_optimal

K = 16
BUCKETS = (4, 512)  # prompts: N = 64 ... 8,192


def test_best_n_is_the_closed_form_optimum_of_a_floor_and_rate():
  """t(N) = t0 + N / r: T(N) ~ (1 + B/N)(t0 + N/r) has its minimum at
  N* = sqrt(B t0 r); over powers of two the best one is a neighbour of N*
  and the better of the two neighbours."""
  ns = [2**j for j in range(4, 17)]
  for b, t0, r in [(5000.0, 0.01, 3500.0), (300.0, 0.5, 1e5), (2e4, 1e-3, 200.0)]:
    rt = lambda n: t0 + n / r
    star = math.sqrt(b * t0 * r)
    below = max([n for n in ns if n <= star], default=ns[0])
    above = min([n for n in ns if n >= star], default=ns[-1])
    want = min((below, above), key=lambda n: ((1 + b / n) * rt(n), n))
    assert time_optimal.best_n(ns, b, rt) == want


def test_best_n_does_not_decrease_with_b():
  rng = np.random.default_rng(0)
  ns = [2**j for j in range(4, 15)]
  for _ in range(50):
    secs = np.sort(rng.uniform(0.01, 1.0, len(ns)))  # any increasing round times
    rt = dict(zip(ns, secs)).__getitem__
    picks = [time_optimal.best_n(ns, b, rt) for b in np.geomspace(1, 1e6, 40)]
    assert picks == sorted(picks)


def test_relative_time_and_best_n_reject_bad_input():
  with pytest.raises(ValueError, match="n=0"):
    time_optimal.relative_time(0, 1.0, 1.0)
  with pytest.raises(ValueError, match="B=-1"):
    time_optimal.relative_time(4, -1.0, 1.0)
  with pytest.raises(ValueError, match="at least one"):
    time_optimal.best_n([], 1.0, lambda n: 1.0)


def test_the_planner_uses_the_same_rule():
  """plan.recommend's best row is time_optimal.best_n of its own round times."""
  res = plan.recommend(
      dict(b_noise=3000.0, K=16), "h100_sxm", 1, systems.ModelDims(64, 128, 4, 4, 4, 512), 8, 48
  )
  rows = res["rows"]
  rt = {r["n"]: r["round_s"] for r in rows}
  assert res["best"]["n"] == time_optimal.best_n(list(rt), 3000.0, rt.__getitem__)
  for r in rows:
    assert r["time_rel"] == pytest.approx(
        time_optimal.relative_time(r["n"], 3000.0, r["round_s"])
        / min(time_optimal.relative_time(n, 3000.0, t) for n, t in rt.items())
    )


# ------------------------------------------------------------- RoundTimes


def test_round_times_recover_the_floor_and_rate_they_were_given():
  t0, r = 0.12, 2500.0
  rt = time_optimal.RoundTimes(window=3)
  for n in (64, 256, 1024):
    for _ in range(3):
      rt.record(n, t0 + n / r)
  fit_t0, fit_c = time_optimal._fit_floor_rate(*zip(*rt.measured().items()))
  assert fit_t0 == pytest.approx(t0, rel=1e-9) and fit_c == pytest.approx(1 / r, rel=1e-9)
  assert rt(16384) == pytest.approx(t0 + 16384 / r, rel=1e-9)


def test_round_times_use_the_median_of_the_latest_window():
  rt = time_optimal.RoundTimes(window=3)
  for s in (9.0, 1.0, 2.0, 3.0, float("nan"), -1.0):  # the first falls out; bad clocks skipped
    rt.record(128, s)
  assert rt(128) == 2.0


def test_round_times_without_two_points_use_the_prior_or_flat_throughput():
  with pytest.raises(ValueError, match="no measurement"):
    time_optimal.RoundTimes()(64)
  flat = time_optimal.RoundTimes()
  flat.record(256, 1.0)
  assert flat(1024) == pytest.approx(4.0)  # t proportional to N
  prior = time_optimal.RoundTimes(prior=lambda n: 0.5 + n / 1000)
  assert prior(1000) == pytest.approx(1.5)
  prior.record(1000, 3.0)  # measured 2x the prior: the prior is rescaled
  assert prior(2000) == pytest.approx(2 * 2.5)


def test_round_times_fit_keeps_floor_and_rate_non_negative():
  rt = time_optimal.RoundTimes()
  rt.record(64, 1.0)
  rt.record(4096, 0.5)  # faster at a larger N: no negative rate, a flat floor
  assert rt(1024) == pytest.approx(0.75)


# ------------------------------------------------ the controller, synthetic


def _feed(ema, b, rng, noise_frac=0.3):
  u = lambda: 1 + noise_frac * rng.uniform(-1, 1)
  ema.update(dict(trace_intra=b * 2 / 3 * u(), trace_inter=b / 3 / K * u(), g2=u()), 16, K)


def _run(round_s, b_of_t, rounds=200, every=5, seed=0, start=16, decay=0.95):
  """Drive a time-objective controller with tracker intervals around
  B(t) and round times measured from ``round_s`` (as the trainer records
  them: one per round at the current N). Returns the prompts per round."""
  rt = time_optimal.RoundTimes()
  ctl = controller.AdaptiveBatch(
      K, *BUCKETS, every=every, prompts=start, objective="time", round_times=rt
  )
  rt.record(start * K, round_s(start * K))  # the calibration's two points
  rt.record(2 * start * K, round_s(2 * start * K))
  ema, rng, sizes = noise_tracker.NoiseEMA(decay), np.random.default_rng(seed), []
  for t in range(rounds):
    P = ctl.update(t, ema.interval(2.0))
    sizes.append(P)
    rt.record(P * K, round_s(P * K) * (1 + 0.05 * rng.standard_normal()))
    _feed(ema, b_of_t(t), rng)
  return sizes, ctl


def test_flat_throughput_settles_on_a_small_n():
  """Throughput flat (round time proportional to N, as on this CPU above
  N = 128): the time-optimal N is the smallest bucket; with a 5% noisy
  clock the fitted floor is not exactly 0, so the run settles at or next to
  it, below where it was configured to start (16 prompts) -- from round 0,
  where the least worst-case slowdown is already the smallest N."""
  for seed in range(3):
    sizes, _ = _run(lambda n: n / 3500, lambda t: 5000.0, seed=seed)
    assert max(sizes[0], sizes[-1]) <= 2 * BUCKETS[0] < 16, sizes


def test_rising_throughput_settles_on_a_large_n():
  """Round time nearly independent of N (an accelerator below its
  compute bound): the time-optimal N is the largest bucket."""
  sizes, _ = _run(lambda n: 0.5 + n / 1e7, lambda t: 5000.0)
  assert sizes[-1] == BUCKETS[1]


@pytest.mark.parametrize("every", [1, 5, 10])
@pytest.mark.parametrize("seed", range(3))
def test_noisy_flat_b_changes_n_at_most_once_in_200_rounds(every, seed):
  """A floor and rate that put the optimum in the middle (N* = sqrt(B t0 r)
  = 1,183 rollouts at B = 2,000): with B flat but each round's estimate
  +-30% noisy, N moves once at most after the start (round 0's choice,
  made before any evidence, ``test_start_...``)."""
  sizes, ctl = _run(lambda n: 0.2 + n / 3500, lambda t: 2000.0, every=every, seed=seed)
  moves = sum(a != b for a, b in zip(sizes, sizes[1:]))
  assert moves <= 1, sizes
  assert ctl.changes == moves + (sizes[0] != 16)


def test_time_controller_holds_until_resolved_and_without_round_times():
  ctl = controller.AdaptiveBatch(
      K, *BUCKETS, every=1, prompts=16, objective="time", round_times=time_optimal.RoundTimes()
  )
  resolved = dict(value=5000.0, lo=4000.0, hi=6000.0, resolved=True)
  assert ctl.update(1, resolved) == 16 and math.isnan(ctl.target)  # nothing measured yet
  ctl.round_times.record(256, 0.5)
  ctl.round_times.record(512, 0.5)
  assert ctl.update(2, dict(resolved, resolved=False)) == 16  # unresolved: hold
  assert ctl.update(3, resolved) == BUCKETS[1]  # constant round time: as large as allowed


def test_time_controller_state_round_trips_with_its_round_times():
  sizes, ctl = _run(lambda n: 0.2 + n / 3500, lambda t: 2000.0, rounds=40)
  fresh = controller.AdaptiveBatch(
      K, *BUCKETS, every=5, prompts=16, objective="time", round_times=time_optimal.RoundTimes()
  )
  fresh.load_state_dict(ctl.state_dict())
  assert fresh.prompts == ctl.prompts and fresh.changes == ctl.changes
  assert fresh.round_times.measured() == ctl.round_times.measured()
  signal = dict(value=9000.0, lo=8000.0, hi=10000.0, resolved=True)
  assert fresh.update(45, dict(signal)) == ctl.update(45, dict(signal))


def test_time_objective_needs_round_times_and_a_known_objective():
  with pytest.raises(ValueError, match="round_times"):
    controller.AdaptiveBatch(K, *BUCKETS, prompts=16, objective="time")
  with pytest.raises(ValueError, match="objective='wall'"):
    controller.AdaptiveBatch(K, *BUCKETS, prompts=16, objective="wall")


def test_an_accelerator_model_moves_the_choice_as_the_rule_predicts():
  """The same controller and signal with two throughput models: on a CPU-like
  flat curve it goes small, on an accelerator's roofline (decode bound by
  memory until large N) it goes larger -- to best_n under that model."""
  dims = systems.ModelDims(64, 128, 4, 4, 4, 512)
  acc = systems.get_accelerator("h100_sxm")
  roof = lambda n: systems.round_time(dims, acc, int(n), 8, 48).total_s
  b = dict(value=5000.0, lo=4500.0, hi=5500.0, resolved=True)
  picks = {}
  for name, rt in (("flat", lambda n: n / 3000.0), ("h100", roof)):
    ctl = controller.AdaptiveBatch(
        K, *BUCKETS, every=1, prompts=16, objective="time", round_times=rt
    )
    picks[name] = ctl.update(1, b)
    ns = [p * K for p in ctl.buckets]
    assert picks[name] * K == time_optimal.best_n(ns, 5000.0, rt) or picks[name] == 16
  assert picks["flat"] == BUCKETS[0] and picks["h100"] > picks["flat"]


def test_calibration_waits_for_a_resolved_signal_at_a_decision_round():
  """train.needs_calibration: only a time-objective controller with a
  measured clock, at a decision round, with its signal resolved and fewer
  than two batch sizes timed (a calibration compiles a bucket: never spent
  in a run whose signal does not resolve)."""
  import types  # pylint: disable=import-outside-toplevel

  from cbs_jax import config as config_lib  # pylint: disable=import-outside-toplevel
  from cbs_jax import train  # pylint: disable=import-outside-toplevel

  c = config_lib.base_config()
  c.batch.schedule, c.batch.adaptive_every = "adaptive", 5
  c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts = 4, 64
  state = types.SimpleNamespace(
      noise=noise_tracker.NoiseEMA(0.5),
      noise_adam=noise_tracker.NoiseEMA(0.5),
      controller=train.make_controller(c),
  )
  state.controller.round_times.record_first(256, 4.1)  # a 4 s compile
  state.controller.round_times.record(256, 0.1)
  assert not train.needs_calibration(c, state, 5)  # not resolved yet
  rng = np.random.default_rng(0)
  for _ in range(20):
    _feed(state.noise, 3000.0, rng, noise_frac=0.05)
  assert train.controller_signal(c, state)["resolved"]
  assert not train.needs_calibration(c, state, 6)  # not a decision round
  assert not train.needs_calibration(c, state, 10)  # 0.1 s trained: half of it < 4 s
  state.controller.round_times.total = 8.1
  assert train.needs_calibration(c, state, 10)  # half of 8.1 s > 4 s
  c.batch.adaptive_calibrate = False
  assert not train.needs_calibration(c, state, 10)
  c.batch.adaptive_calibrate = True
  state.controller.round_times.record(512, 0.15)
  assert not train.needs_calibration(c, state, 10)  # two points already


def test_repays_compares_the_saving_over_the_horizon_with_the_cost():
  assert time_optimal.repays(1.0, 0.5, horizon_s=10.0, cost_s=4.0)  # saves 5 s > 4 s
  assert not time_optimal.repays(1.0, 0.5, horizon_s=6.0, cost_s=4.0)  # saves 3 s
  assert not time_optimal.repays(1.0, 1.2, horizon_s=1e9, cost_s=0.0)  # slower


def test_a_move_to_an_uncompiled_bucket_waits_until_it_repays_its_compile():
  """Round times that favour the largest bucket, a 5 s compile measured
  from the first round: with 1 s of training spent the move is held
  (counted), with 100 s it is made; a bucket already run costs nothing."""
  rt = time_optimal.RoundTimes()
  rt.record_first(256, 5.5)
  for _ in range(5):
    rt.record(256, 0.5)
  rt.record(512, 0.5)
  assert rt.compile_cost() == pytest.approx(5.0) and rt.total == pytest.approx(3.0)
  ctl = controller.AdaptiveBatch(K, *BUCKETS, every=1, prompts=16, objective="time", round_times=rt)
  b = dict(value=5000.0, lo=4500.0, hi=5500.0, resolved=True)
  assert ctl.update(1, dict(b)) == 16 and ctl.held_for_cost == 1
  rt.total = 100.0
  assert ctl.update(2, dict(b)) == BUCKETS[1] and ctl.changes == 1
  again = controller.AdaptiveBatch(
      K, *BUCKETS, every=1, prompts=16, objective="time", round_times=rt
  )
  rt.total, rt.records[BUCKETS[1] * K] = 0.0, [0.5]
  assert again.update(1, dict(b)) == BUCKETS[1]  # measured already: no compile to repay
  state = time_optimal.RoundTimes()
  state.load_state_dict(rt.state_dict())
  assert state.compile_cost() == rt.compile_cost() and state.total == rt.total


def test_an_unresolved_signal_with_a_lower_bound_moves_up_when_every_b_agrees():
  """Round times nearly flat in N (launch-bound): every B above a few tens
  of rollouts puts the optimum at the largest bucket, so a floor B >= 500
  is enough to move there at the first decision round, before |G|^2 is
  resolved. Without a floor, or where the round time is proportional to N
  (the optimum at B -> inf is not above the current bucket), it holds."""
  flat = lambda n: 1e-3 + n * 1e-8
  unresolved = dict(value=math.nan, lo=0.0, hi=math.inf, resolved=False)
  ctl = controller.AdaptiveBatch(
      K, *BUCKETS, every=5, prompts=16, objective="time", round_times=flat
  )
  assert ctl.update(3, dict(unresolved, floor=500.0)) == 16  # not a decision round
  assert ctl.update(5, dict(unresolved, floor=0.0)) == 16
  assert ctl.update(10, dict(unresolved, floor=500.0)) == BUCKETS[1]
  assert ctl.target == BUCKETS[1] and ctl.changes == 1
  prop = controller.AdaptiveBatch(
      K, *BUCKETS, every=5, prompts=16, objective="time", round_times=lambda n: n * 1e-6
  )
  assert prop.update(5, dict(unresolved, floor=5000.0)) == 16
  # a floor so low that the optimum there lies below the current bucket: hold
  mid = controller.AdaptiveBatch(
      K, *BUCKETS, every=5, prompts=16, objective="time", round_times=lambda n: 0.2 + n / 3500
  )
  assert mid.update(5, dict(unresolved, floor=32.0)) == 16


def test_the_tracker_bounds_b_noise_from_below_before_it_resolves():
  """Per-round |G|^2 estimates scattered around 0.05 with SD 1 (not
  resolved) and a clearly positive trace: the interval is unbounded, its
  floor positive and equal to the Fieller bound of the EMAs' moments; once
  |G|^2 is resolved the floor is the interval's lower end."""
  rng = np.random.default_rng(0)
  ema = noise_tracker.NoiseEMA(0.95)
  for _ in range(20):
    ema.update(
        dict(
            trace_intra=50.0 * (1 + 0.1 * rng.standard_normal()),
            trace_inter=0.0,
            g2=0.05 + rng.standard_normal(),
        ),
        16,
        K,
    )
  iv = ema.interval(2.0)
  assert not iv["resolved"] and iv["lo"] == 0.0 and iv["hi"] == math.inf
  assert 0 < iv["floor"] < math.inf
  sig = controller.signal_interval("b_crit", iv, b_crit_ratio=2.0)
  assert sig["floor"] == pytest.approx(2.0 * iv["floor"])
  for _ in range(200):
    ema.update(
        dict(trace_intra=50.0, trace_inter=0.0, g2=1.0 + 0.05 * rng.standard_normal()), 16, K
    )
  iv = ema.interval(2.0)
  assert iv["resolved"] and iv["floor"] == iv["lo"] > 0


@pytest.mark.parametrize("seed", range(5))
def test_minimax_n_matches_a_brute_force_over_a_dense_grid_of_b(seed):
  """The least worst-case slowdown over B >= b_lo, against the same ratio
  evaluated naively on 20,000 log-spaced B up to 1e9 (where every line has
  its asymptotic slope): the same N, and its regret no smaller than any
  grid value's."""
  rng = np.random.default_rng(seed)
  ns = [64 * 2**i for i in range(8)]
  t0, r, bend = rng.uniform(0.01, 1.0), rng.uniform(100, 1e5), rng.uniform(0, 2e-9)
  round_s = lambda n: t0 + n / r + bend * n**2  # floor, throughput, a superlinear tail
  b_lo = float(rng.choice([0.0, 100.0, 3000.0]))
  grid = np.concatenate([[b_lo], b_lo + np.logspace(-3, 9, 20000)])
  rel = np.array([[(1 + b / n) * round_s(n) for b in grid] for n in ns])
  regret = (rel / rel.min(axis=0)).max(axis=1)
  want = ns[int(np.argmin(regret))]
  assert time_optimal.minimax_n(ns, b_lo, round_s) == want
  worst = time_optimal.worst_slowdowns(ns, b_lo, round_s)
  assert list(worst) == ns
  # the exact maxima bound the grid's from above and are reached to 1e-4
  np.testing.assert_array_less(regret * (1 - 1e-12), [worst[n] for n in ns])
  np.testing.assert_allclose([worst[n] for n in ns], regret, rtol=1e-4)


def test_start_goes_large_when_round_time_is_flat_and_small_when_it_is_proportional():
  """Round 0, nothing known of B: a launch-bound round (time nearly flat
  in N) starts at the largest bucket, a throughput-bound one (time
  proportional to N) at the smallest; a resolved signal later acts as
  before."""
  for round_s, want in (
      (lambda n: 1e-3 * (1 + n / 1e5), BUCKETS[1]),
      (lambda n: n / 3500, BUCKETS[0]),
  ):
    ctl = controller.AdaptiveBatch(
        K, *BUCKETS, every=5, prompts=16, objective="time", round_times=round_s
    )
    unresolved = dict(value=math.nan, lo=math.nan, hi=math.nan, resolved=False)
    assert ctl.update(0, unresolved) == want
    assert ctl.update(1, unresolved) == want  # no evidence: no further move
