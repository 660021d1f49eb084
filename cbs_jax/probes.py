"""Hardware timing probes: this machine's matmul FLOP/s and memory bandwidth, measured.

``cbs_jax.systems`` predicts throughput from two numbers per chip (peak
FLOP/s, memory bandwidth); for the spec-sheet chips it reads them from a
table, and this module measures them on the machine at hand:

* ``MatmulProbe`` / ``BandwidthProbe`` time one call each (a square matmul,
  a full read of a large array), for benchmarks that interleave them with
  the work they measure (medians over a shared machine's load).
* ``calibrate_cpu`` measures this machine's float32 matmul FLOP/s and memory
  read bandwidth with jax (one run, a few seconds) and returns them as a
  ``systems.Accelerator`` (``measured_accelerator``), so that a prediction
  for the current CPU is a measured number, not a spec sheet.
* ``settle()`` waits until this process's background threads are idle, so
  that a timed call does not share the cores with the clean-up of the
  program before it (docs/planner.md, "Host memory").
* ``accelerator(name)`` resolves every name a command line accepts:
  "cpu" (any case) is this machine, calibrated once per process; every
  other name is ``systems.get_accelerator``'s table.
"""

from __future__ import annotations

import functools
import os
import time

import jax
import jax.numpy as jnp

from cbs_jax import systems


class MatmulProbe:
  """Times one ``n``-square matmul in ``dtype`` (2 n^3 FLOP) on ``device``
  (default: jax's first device). ``probe()`` -> seconds of one call (the
  first call compiles and is not timed); ``flops(seconds)`` -> FLOP/s."""

  def __init__(self, n: int = 2048, dtype: str = "float32", device=None):
    self.n = n
    dev = device or jax.devices()[0]
    a = jax.device_put(jax.random.normal(jax.random.key(0), (n, n), jnp.float32), dev)
    self._a = a.astype(dtype)
    self._f = jax.jit(lambda x: x @ x)
    self._f(self._a).block_until_ready()

  def probe(self) -> float:
    t = time.perf_counter()
    self._f(self._a).block_until_ready()
    return time.perf_counter() - t

  def flops(self, seconds: float) -> float:
    return 2.0 * self.n**3 / seconds


class BandwidthProbe:
  """Times one full read of a float32 array of ``mib`` MiB (a sum over it:
  every byte read once, as decoding reads weights and KV cache; far larger
  than the CPU caches). ``probe()`` -> seconds; ``bandwidth(s)`` -> bytes/s."""

  def __init__(self, mib: int = 256, device=None):
    self.nbytes = mib * 2**20
    dev = device or jax.devices()[0]
    self._x = jax.device_put(jnp.ones((self.nbytes // 4,), jnp.float32), dev)
    # rows summed separately: every core streams its share (one flat
    # reduction can run on a single thread and measure a core, not the chip)
    self._f = jax.jit(lambda x: x.reshape(64, -1).sum(1))
    self._f(self._x).block_until_ready()

  def probe(self) -> float:
    t = time.perf_counter()
    self._f(self._x).block_until_ready()
    return time.perf_counter() - t

  def bandwidth(self, seconds: float) -> float:
    return self.nbytes / seconds


def settle(max_s: float = 5.0, window_s: float = 0.02, busy: float = 0.1) -> float:
  """Wait until this process's other threads are idle; returns the seconds waited.

  The caller sleeps in windows of ``window_s`` and reads the process's CPU
  time (every thread's, ``time.process_time``); once a window adds at most
  ``busy * window_s`` (the process ran at most ``busy`` of one core while
  its caller slept), nothing else of ours is running and it returns; after
  ``max_s`` it returns anyway. What it waits for on the CPU: XLA hands a
  program's largest temporary (above glibc's mmap threshold: 3.3 GiB for
  the quickstart update at 16,384 rollouts) back to the kernel on a thread
  of its own after the call has returned, ~0.3 s of system time on one
  core; a program timed in that window shares the two cores with it
  (docs/planner.md, "Host memory")."""
  for name, v in (("max_s", max_s), ("window_s", window_s), ("busy", busy)):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
      raise ValueError(f"settle: {name} must be a positive number, got {v!r}")
  start = time.perf_counter()
  while True:
    cpu = time.process_time()
    time.sleep(window_s)
    waited = time.perf_counter() - start
    if time.process_time() - cpu <= busy * window_s or waited >= max_s:
      return waited


def _physical_memory() -> float:
  try:
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
  except (ValueError, OSError, AttributeError):
    return 8.0 * systems.GIB


def measured_accelerator(
    flops: float, bandwidth: float, name: str = "cpu", dtype: str = "float32", source: str = ""
) -> systems.Accelerator:
  """An ``Accelerator`` from measured FLOP/s and bytes/s (memory: this host's RAM)."""
  return systems.Accelerator(
      name,
      float(flops),
      float(bandwidth),
      _physical_memory(),
      dtype=dtype,
      source=source or "measured on this machine",
  )


def calibrate_cpu(
    matmul_n: int = 2048, bandwidth_mib: int = 256, reps: int = 3
) -> systems.Accelerator:
  """Measure this machine's roofline with jax, in one run.

  FLOP/s: best of ``reps`` timings of a float32 ``matmul_n``-square matmul
  (2 n^3 FLOP). Bandwidth: best of ``reps`` timings of a full read of a
  float32 array of ``bandwidth_mib`` MiB (``BandwidthProbe``). Memory:
  physical RAM. The default sizes take ~1-2 s on 2 cores. Other processes
  sharing the cores lower both numbers; the best timing is the least
  disturbed one.
  """
  dev = jax.devices("cpu")[0]
  mm, bw = MatmulProbe(matmul_n, "float32", dev), BandwidthProbe(bandwidth_mib, dev)
  flops = mm.flops(min(mm.probe() for _ in range(reps)))
  band = bw.bandwidth(min(bw.probe() for _ in range(reps)))
  return measured_accelerator(
      flops,
      band,
      source=f"calibrate_cpu(): {matmul_n}^2 f32 matmul, "
      f"{bandwidth_mib} MiB f32 read, on this machine",
  )


@functools.lru_cache(maxsize=1)
def _calibrated_cpu() -> systems.Accelerator:
  return calibrate_cpu()


def accelerator(name: str | systems.Accelerator) -> systems.Accelerator:
  """The accelerator a command line names: "cpu" (case-insensitive) is this
  machine, measured by ``calibrate_cpu`` once per process; any other name
  (or an ``Accelerator``) is ``systems.get_accelerator``'s, whose error
  lists every known name."""
  if not isinstance(name, systems.Accelerator) and systems.accelerator_key(name) == "cpu":
    return _calibrated_cpu()
  return systems.get_accelerator(name)
