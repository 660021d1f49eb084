"""op_profile: op kinds from trace names, the time split among concurrent ops
(against a fine grid counted by hand), and a real traced call."""

import gzip
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from cbs_jax import op_profile
from tests import experiment_scripts


@pytest.mark.parametrize(
    "name, want",
    [
        ("dot.1240", "dot"),
        ("ynn_fusion.121", "ynn_fusion"),
        ("bitcast_dynamic-update-slice_fusion.15", "bitcast_dynamic-update-slice_fusion"),
        ("fusion.3.1", "fusion"),
        ("custom-call.7", "custom-call"),
        ("copy", "copy"),
        ("while.391", None),
        ("conditional.2", None),
        ("call.5", None),
        ("end: ynn_fusion", None),
        ("$api.py:2479 block_until_ready", None),
        ("ThunkExecutor::Execute", None),
        ("SlinkyThreadPool::Await", None),
        ("PjitFunction(jit(sampler))", None),
    ],
)
def test_kind_of_a_trace_name(name, want):
  assert op_profile.kind(name) == want


def _on_grid(events, step=1e-3):
  """The same split, by hand: at each grid point's midpoint, count the
  intervals covering it and give each 1/count of the step."""
  lo = min(s for s, _, _ in events)
  hi = max(e for _, e, _ in events)
  out = {}
  for t in np.arange(lo, hi, step) + step / 2:
    cover = [k for s, e, k in events if s <= t < e]
    for k in cover:
      out[k] = out.get(k, 0.0) + step / len(cover)
  return out


def test_attribute_shares_overlapping_time_equally():
  # a on two threads at once, b beside it, a gap with nothing, c alone
  events = [(0.0, 0.4, "a"), (0.1, 0.3, "a"), (0.2, 0.6, "b"), (0.8, 1.0, "c")]
  got = op_profile.attribute(events)
  # by hand: [0,.1) a; [.1,.2) a,a; [.2,.3) a,a,b; [.3,.4) a,b; [.4,.6) b; [.8,1) c
  assert got["a"] == pytest.approx(0.1 + 0.1 + 0.2 / 3 + 0.05)
  assert got["b"] == pytest.approx(0.1 / 3 + 0.05 + 0.2)
  assert got["c"] == pytest.approx(0.2)
  assert sum(got.values()) == pytest.approx(0.8)  # the time some op ran


def test_attribute_matches_a_fine_grid_on_random_intervals():
  rng = np.random.default_rng(0)
  starts = rng.integers(0, 200, 40) / 100
  events = [
      (float(s), float(s + rng.integers(1, 60) / 100), str(k))
      for s, k in zip(starts, rng.integers(0, 4, 40))
  ]
  got, want = op_profile.attribute(events), _on_grid(events)
  assert set(got) == set(want)
  for k in want:
    assert got[k] == pytest.approx(want[k], abs=1e-6)


def _write_trace(path, processes, events, threads=None):
  meta = [
      dict(ph="M", pid=pid, name="process_name", args=dict(name=name))
      for pid, name in processes.items()
  ]
  meta += [
      dict(ph="M", pid=pid, tid=tid, name="thread_name", args=dict(name=name))
      for (pid, tid), name in (threads or {}).items()
  ]
  with gzip.open(path, "wt") as f:
    json.dump(dict(traceEvents=meta + events), f)


def test_trace_events_keep_the_device_kernels_where_there_are_any(tmp_path):
  ev = lambda pid, name, ts, dur: dict(ph="X", pid=pid, tid=1, name=name, ts=ts, dur=dur)
  host = [ev(1, "cuLaunchKernel", 0, 5), ev(1, "$api.py block_until_ready", 0, 900)]
  kernels = [ev(7, "fusion.3", 10, 100), ev(7, "end: fusion", 110, 0), ev(7, "dot.2", 200, 50)]
  path = str(tmp_path / "gpu.json.gz")
  _write_trace(path, {1: "/host:CPU", 7: "/device:GPU:0"}, host + kernels)
  got = op_profile.trace_events(path)
  assert [k for _, _, k in got] == ["fusion", "dot"]
  assert [t for s, e, _ in got for t in (s, e)] == pytest.approx([10e-6, 110e-6, 200e-6, 250e-6])
  # a CPU trace: the host threads run the ops, and count
  # (a thread running Python, tid 2 here, records "$" frames: it waits on
  # the ops, and its annotations do not count)
  path = str(tmp_path / "cpu.json.gz")
  py = lambda name: dict(ev(1, name, 0, 40), tid=2)
  _write_trace(
      path,
      {1: "/host:CPU"},
      [
          ev(1, "dot.9", 0, 20),
          ev(1, "while.1", 0, 30),
          py("$api.py:2479 device_get"),
          py("np.asarray(jax.Array)"),
      ],
  )
  ((s, e, k),) = op_profile.trace_events(path)
  assert (s, k) == (0.0, "dot") and e == pytest.approx(20e-6)


def test_profile_of_a_real_call():
  a = jnp.ones((512, 512))
  f = jax.jit(lambda a: jnp.sin(a @ a) @ a)
  jax.block_until_ready(f(a))
  prof = op_profile.profile(lambda: f(a), calls=2)
  assert prof["kinds"], "no op traced"
  assert all(v > 0 for v in prof["kinds"].values())
  assert list(prof["kinds"].values()) == sorted(prof["kinds"].values(), reverse=True)
  assert prof["busy_s"] == pytest.approx(sum(prof["kinds"].values()))
  # the ops ran inside the timed calls: their time is most of the wall time, not more
  assert 0.2 * prof["wall_s"] < prof["busy_s"] < 1.05 * prof["wall_s"]
  table = op_profile.format_table(prof, top=1)
  assert "(idle: no op running)" in table and next(iter(prof["kinds"])) in table


@pytest.mark.slow
def test_bench_sampler_quick_profile_says_where_the_time_goes(capsys):
  # with an XLA option too: a second compile of the sampler, timed beside the default
  option = "xla_cpu_experimental_ynn_fusion_type="
  try:
    experiment_scripts.load("bench_sampler").main(["--quick", "--profile", "--xla_option", option])
  except jax.errors.JaxRuntimeError as e:  # a jaxlib before YNNPACK (jax >= 0.6 allowed)
    if "No such compile option" not in str(e):
      raise
    pytest.skip(f"this jaxlib has no {option[:-1]}")
  out = capsys.readouterr().out
  opts = "{'xla_cpu_experimental_ynn_fusion_type': ''}"
  assert f"also compiled with XLA options {opts}" in out
  for B in (16, 64):  # the same tokens as the default compile, timed in the same runs
    line = next(l for l in out.splitlines() if l.startswith(f"compiled with {opts}: batch {B}:"))
    assert line.endswith("same tokens 1.0000")
  assert "where the time goes at batch 64" in out
  table = out.split("where the time goes")[1].splitlines()[1:]
  shares = [float(l.split()[-1].rstrip("%")) for l in table if l.strip().endswith("%")]
  assert len(shares) >= 2 and sum(shares) <= 105  # kinds + idle: the wall time, once
  last = out.strip().splitlines()[-1]
  assert last.startswith("RESULT tokens_per_s=") and " option_speedup_b64=" in last


def test_bench_sampler_names_a_malformed_xla_option(capsys):
  with pytest.raises(SystemExit):
    experiment_scripts.load("bench_sampler").main(["--quick", "--xla_option", "no_value"])
  assert "--xla_option 'no_value': expected NAME=VALUE" in capsys.readouterr().err


def test_trace_events_of_a_device_with_an_xla_ops_line_read_that_line_only(tmp_path):
  """A device's "XLA Ops" line names the ops; its stream lines repeat the
  same time as kernels and "XLA Modules" as whole programs: counted once."""
  ev = lambda tid, name, ts, dur: dict(ph="X", pid=7, tid=tid, name=name, ts=ts, dur=dur)
  path = str(tmp_path / "tpu.json.gz")
  _write_trace(
      path,
      {1: "/host:CPU", 7: "/device:TPU:0"},
      [
          ev(1, "jit_step(12)", 0, 300),  # XLA Modules
          ev(2, "fusion.3", 10, 100),  # XLA Ops
          ev(2, "convolution.4", 150, 50),
          ev(3, "loop_fusion_kernel", 10, 100),  # a stream's kernels
      ],
      threads={(7, 1): "XLA Modules", (7, 2): "XLA Ops", (7, 3): "Stream #14(Compute)"},
  )
  assert [k for _, _, k in op_profile.trace_events(path)] == ["fusion", "convolution"]
  # without an "XLA Ops" line: every line of the device but "XLA Modules"
  path = str(tmp_path / "gpu.json.gz")
  _write_trace(
      path,
      {7: "/device:GPU:0"},
      [ev(1, "jit_step(12)", 0, 300), ev(3, "loop_fusion_kernel", 10, 100)],
      threads={(7, 1): "XLA Modules", (7, 3): "Stream #14(Compute)"},
  )
  assert [k for _, _, k in op_profile.trace_events(path)] == ["loop_fusion_kernel"]
