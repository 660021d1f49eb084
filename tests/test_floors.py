"""The planner's latency floors (``systems.Overheads``) and their calibration
(``cbs_jax.floors``): the round model adds exactly the floors it is given
(checked against the bare roofline's parts, summed by hand), a synthetic
calibration recovers the floors and efficiencies that generated it, and the
probes run on this machine."""

import json
import time

import numpy as np
import pytest

from cbs_jax import floors
from cbs_jax import model
from cbs_jax import systems
from configs import default as default_cfg
from tests import experiment_scripts

DIMS = systems.ModelDims.from_config(model.preset_config("1m"))
CPU = systems.Accelerator("test", 2e11, 2e10, 1e11, dtype="float32")


def test_round_time_adds_each_floor_to_the_bare_roofline():
  ov = systems.Overheads(
      decode_step_s=3e-5,
      update_step_s=2e-3,
      round_trip_s=1e-4,
      host_per_rollout_s=4e-6,
      decode_efficiency=0.25,
      train_efficiency=0.4,
  )
  n, tp, tc, updates = 512, 9, 5, 3
  bare = systems.round_time(DIMS, CPU, n, tp, tc, epochs=2)
  got = systems.round_time(DIMS, CPU, n, tp, tc, epochs=2, overheads=ov, updates=updates)
  # a generation call is 1 prefill + (tc - 1) decode steps = tc steps
  assert got.gen_s == pytest.approx(tc * 3e-5 + bare.gen_s / 0.25, rel=1e-12)
  assert got.train_s == pytest.approx(updates * 2e-3 + bare.train_s / 0.4, rel=1e-12)
  assert got.host_s == pytest.approx(1e-4 + n * 4e-6, rel=1e-12)
  assert got.total_s == pytest.approx(got.gen_s + got.train_s + got.host_s, rel=1e-12)
  # no overheads: the roofline unchanged, and no host term
  assert systems.round_time(DIMS, CPU, n, tp, tc, overheads=systems.NO_OVERHEADS).total_s == (
      systems.round_time(DIMS, CPU, n, tp, tc).total_s
  )
  assert bare.host_s == 0.0


@pytest.mark.parametrize(
    "field,value",
    [
        ("decode_step_s", -1e-6),
        ("round_trip_s", float("nan")),
        ("train_efficiency", 0.0),
        ("decode_efficiency", float("inf")),
    ],
)
def test_bad_overheads_name_the_field(field, value):
  with pytest.raises(ValueError, match=f"Overheads.{field}"):
    systems.Overheads(**{field: value})
  with pytest.raises(ValueError, match="updates"):
    systems.round_time(DIMS, CPU, 64, 9, 5, updates=0)


@pytest.mark.parametrize("floor,eff", [(2.5e-5, 0.3), (0.0, 0.8), (1e-3, 0.05)])
def test_a_synthetic_calibration_recovers_the_floors_it_was_given(floor, eff):
  """Times made by the model from known floors at the calibration's batch
  sizes, with and without 3% multiplicative noise, are fitted back."""
  tc = 5
  batches = (16, 256, 4096)
  roofs = [systems.round_time(DIMS, CPU, b, 9, tc).gen_s for b in batches]
  exact = [floors.Point(tc, r, tc * floor + r / eff) for r in roofs]
  f, e = floors.fit_floor(exact)
  assert f == pytest.approx(floor, rel=1e-9, abs=1e-15) and e == pytest.approx(eff, rel=1e-9)
  rng = np.random.default_rng(0)
  fs, es = [], []
  for _ in range(200):
    noisy = [floors.Point(p.count, p.roofline_s, p.seconds * rng.normal(1, 0.03)) for p in exact]
    fi, ei = floors.fit_floor(noisy)
    fs.append(fi)
    es.append(ei)
  assert np.median(es) == pytest.approx(eff, rel=0.03)
  # the floor is resolved when it is a visible share of the smallest batch's time
  if floor and tc * floor > 0.2 * exact[0].seconds:
    assert np.median(fs) == pytest.approx(floor, rel=0.15)
  # the predicted round from the recovered numbers is within the noise
  ov = systems.Overheads(decode_step_s=np.median(fs), decode_efficiency=np.median(es))
  for b, p in zip(batches, exact):
    assert systems.round_time(DIMS, CPU, b, 9, tc, overheads=ov).gen_s == pytest.approx(
        p.seconds, rel=0.05
    )


def test_efficiency_by_batch_is_log_linear_between_probes_and_flat_beyond():
  """``Overheads.efficiency``: the measured values at their batches, the
  log-linear interpolation between (closed form at the geometric mid
  point), the end values beyond; and ``round_time`` uses it for the decode
  step at the round's batch and the update at N."""
  ov = systems.Overheads(
      decode_efficiency=0.5,
      train_efficiency=0.5,
      decode_efficiency_at=((4096, 0.2), (16, 0.4)),  # any order
      train_efficiency_at=[[64, 0.6], [16384, 0.3]],  # lists, as JSON gives them
  )
  assert ov.decode_efficiency_at == ((16.0, 0.4), (4096.0, 0.2))
  assert ov.efficiency("decode", 16) == pytest.approx(0.4)
  assert ov.efficiency("decode", 256) == pytest.approx(0.3)  # log2: 4 of 8 steps to 4096
  assert ov.efficiency("decode", 8) == 0.4 and ov.efficiency("decode", 1e6) == 0.2
  assert ov.efficiency("train", 1024) == pytest.approx(0.45)  # 1024 = sqrt(64 * 16384)
  assert systems.Overheads(train_efficiency=0.7).efficiency("train", 512) == 0.7
  n, tp, tc = 1024, 9, 5
  bare = systems.round_time(DIMS, CPU, n, tp, tc)
  got = systems.round_time(DIMS, CPU, n, tp, tc, overheads=ov)
  eff_b = ov.efficiency("decode", n / bare.waves)
  assert got.gen_s == pytest.approx(bare.gen_s / eff_b, rel=1e-12)
  assert got.train_s == pytest.approx(bare.train_s / 0.45, rel=1e-9)
  for bad in (((0, 0.5),), ((64, -1.0),), ((64, 0.5), (64, 0.4))):
    with pytest.raises(ValueError, match="Overheads.train_efficiency_at"):
      systems.Overheads(train_efficiency_at=bad)


def test_per_probe_efficiencies_recover_an_efficiency_that_falls_with_the_batch():
  """Times from a known floor and an efficiency that halves from the
  smallest probe to the largest (the cache-resident small batches): the
  single fitted efficiency misses the ends by up to ~1.4x, the per-probe
  ones (``point_efficiency`` after the fitted floor) recover each, and the
  round predicted from them matches every probe's time within 3%."""
  tc, floor = 5, 2e-5
  batches = (16, 256, 4096, 16384)
  true_eff = dict(zip(batches, (0.4, 0.35, 0.25, 0.2)))
  roofs = {b: systems.round_time(DIMS, CPU, b, 9, tc).gen_s for b in batches}
  pts = {b: floors.Point(tc, roofs[b], tc * floor + roofs[b] / true_eff[b]) for b in batches}
  f, e = floors.fit_floor(list(pts.values()))
  single = systems.Overheads(decode_step_s=f, decode_efficiency=e)
  at = tuple((b, floors.point_efficiency(pts[b], f, e)) for b in batches)
  per = systems.Overheads(decode_step_s=f, decode_efficiency=e, decode_efficiency_at=at)
  worst_single = max(
      abs(np.log(systems.round_time(DIMS, CPU, b, 9, tc, overheads=single).gen_s / p.seconds))
      for b, p in pts.items()
  )
  assert worst_single > np.log(1.1)
  for b, p in pts.items():
    assert systems.round_time(DIMS, CPU, b, 9, tc, overheads=per).gen_s == pytest.approx(
        p.seconds, rel=0.03
    )
  # a point that is all floor falls back to the fitted efficiency
  assert floors.point_efficiency(floors.Point(5, 1e-9, 1e-4), 2e-5, 0.3) == 0.3


def test_fit_floor_rejects_what_it_cannot_fit():
  with pytest.raises(ValueError, match=">= 2 points"):
    floors.fit_floor([floors.Point(1, 1.0, 2.0)])
  with pytest.raises(ValueError, match="all equal"):
    floors.fit_floor([floors.Point(1, 1.0, 2.0), floors.Point(2, 2.0, 3.0)])
  with pytest.raises(ValueError, match="> 0"):
    floors.fit_floor([floors.Point(1, 1.0, 0.0), floors.Point(1, 2.0, 3.0)])


@pytest.mark.slow
def test_calibrate_measures_this_machine():
  c = default_cfg.get_config("smoke")
  # batches 16x apart, so that the roofline term stands well above timing
  # noise on a loaded 2-core machine (at 8 vs 32 a single slow call at 8
  # left no slope to fit)
  ov, raw = floors.calibrate(c, decode_batches=(4, 256), update_batches=(8, 128), reps=3)
  assert ov.decode_efficiency > 0 and ov.train_efficiency > 0
  assert ov.round_trip_s > 0 and ov.host_per_rollout_s > 0
  assert ov.round_trip_s == raw["round_fixed_s"] >= raw["round_trip_s"] > 0
  assert [p["batch"] for p in raw["decode"]] == [4, 256]
  # the measured times grow with the batch, and the fit reproduces them to a factor of 2
  for kind, floor, eff in (
      ("decode", ov.decode_step_s, ov.decode_efficiency),
      ("update", ov.update_step_s, ov.train_efficiency),
  ):
    pts = raw[kind]
    assert pts[1]["seconds"] > pts[0]["seconds"] * 0.5
    for p in pts:
      model_s = p["count"] * floor + p["roofline_s"] / eff
      assert 0.5 < model_s / p["seconds"] < 2.0
  with pytest.raises(ValueError, match="multiples of K"):
    floors.calibrate(c, update_batches=(6, 32))


@pytest.mark.slow
def test_bench_planner_quick_prints_its_result(capsys, tmp_path):
  """Its RESULT line, and a table whose every row holds a median of the
  interleaved repeats: a measured round no shorter than its generation and
  update parts' medians allow, the ratio it reports, and the kernel's page
  faults and system time per round."""
  out = tmp_path / "planner.json"
  experiment_scripts.load("bench_planner").main(["--quick", f"--out={out}"])
  lines = capsys.readouterr().out.strip().splitlines()
  assert lines[-1].startswith("RESULT planner_worst_ratio=") and "within_25pct=" in lines[-1]
  assert sum(l.startswith("  repeat ") for l in lines) == 3  # --quick: 3 repeats
  rows = json.loads(out.read_text())["rows"]
  assert [r["n"] for r in rows] == [64, 256]
  for r in rows:
    assert r["measured_s"] > 0 and r["gen_s"] > 0 and r["update_s"] > 0
    assert r["ratio"] == pytest.approx(r["measured_s"] / r["predicted_s"])
    assert r["faults"] >= 0 and r["sys_s"] >= 0


def test_documented_floors_for_named_gpus_and_none_for_tpus():
  qwen = model.preset_config("qwen2.5-0.5b")
  ov = systems.documented_overheads(qwen, "h100_sxm")
  launches = systems.KERNELS_PER_LAYER * 24 + systems.KERNELS_FIXED
  assert ov.decode_step_s == pytest.approx(launches * 5e-6)
  assert ov.update_step_s == pytest.approx(3 * launches * 5e-6)
  assert systems.documented_overheads(qwen, "tpu_v5e") is None


def test_the_planner_no_longer_predicts_microsecond_rounds_for_a_tiny_model():
  """A 0.1M model on 8 H100s: the bare roofline gives rounds of
  microseconds; with the documented floors every round costs at least its
  Tc generation steps' and one update's launches."""
  from cbs_jax import plan  # pylint: disable=import-outside-toplevel

  tiny = model.default_config()
  args = (dict(b_crit=300.0), "h100_sxm", 8, tiny, 9, 5)
  bare = plan.recommend(*args, overheads=None)
  floored = plan.recommend(*args)  # documented by default
  ov = systems.documented_overheads(tiny, "h100_sxm")
  assert min(r["round_s"] for r in bare["rows"]) < 1e-5
  for r in floored["rows"]:
    assert r["round_s"] >= 5 * ov.decode_step_s + ov.update_step_s
  assert floored["overheads"]["source"].startswith("documented")
  # with floors the throughput keeps rising with N for longer: the optimum is not smaller
  assert floored["best"]["n"] >= bare["best"]["n"]
  with pytest.raises(ValueError, match="overheads='guess'"):
    plan.recommend(*args, overheads="guess")


def test_each_probe_is_timed_on_its_second_call_in_a_row(monkeypatch):
  # once() calls a probe, then times its next call: the steady state of a
  # run's rounds, where a program follows itself (floors.Probes.once)
  calls, log = {"a": 0, "b": 0}, []

  def probe(name, first_s, then_s):
    def fn():
      calls[name] += 1
      log.append(name)
      time.sleep(first_s if calls[name] % 2 else then_s)
      return np.zeros(())

    return fn

  p = object.__new__(floors.Probes)
  p.fns = {"a": probe("a", 0.2, 0.0), "b": probe("b", 0.0, 0.05)}
  # and only once the process is quiet (probes.settle), before the first call
  monkeypatch.setattr(floors.probes, "settle", lambda: log.append("settle") or 0.0)
  t = p.once()
  assert log == ["settle", "a", "a", "settle", "b", "b"]
  assert t["a"] < 0.1  # the slow first call is not the one timed
  assert 0.05 <= t["b"] < 0.2


def test_round_fixed_cost_is_the_single_prompt_round_less_its_sampler_and_host_work():
  p = object.__new__(floors.Probes)
  p.round_batch, p.host_rollouts = 16, 4096
  med = {"round@16": 5e-3, "sampler@16": 2e-3, "host": 4096 * 2e-6, "round_trip": 3e-5}
  assert p.round_fixed_s(med) == pytest.approx(5e-3 - 2e-3 - 16 * 2e-6)
  # never below one round trip (a round that cost no more than its sampler)
  assert p.round_fixed_s(dict(med, **{"round@16": 2.01e-3})) == 3e-5
