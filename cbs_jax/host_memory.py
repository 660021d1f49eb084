"""Keep freed host memory in the process, so XLA's CPU buffers are not
faulted in afresh on every call (docs/planner.md, "Host memory").

XLA's CPU runtime allocates its temporaries with the C allocator on every
call and frees them at its end. glibc's malloc serves a block above its
mmap threshold with a fresh ``mmap`` and hands it back on ``free``, and
returns the free top of the heap to the system once it exceeds its trim
threshold; the mmap threshold itself moves with the blocks freed. In a
process that runs programs of different sizes (the sampler and the update;
a large batch and then a small one, as a sweep's probes or the adaptive
controller do), a program's temporaries can land on fresh pages on every
call: each page is faulted in and zeroed by the kernel before XLA touches
it. Measured on the 2-core CPU of this project: after one update at
16,384 rollouts in the same process, the quickstart update at 256
took 0.26 s with 13,589 page faults per call, and 0.028 s with none once
both thresholds were fixed at 1 GiB (``experiments/bench_planner.py``'s
N = 256 outlier).

These thresholds bind glibc's main arena only. A thread's own arena grows
in heaps of at most 64 MiB, so the larger temporaries XLA's worker threads
allocate are mapped afresh on every call whatever is set here; what helps
there (``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: 1.5x faster quickstart
rounds at N = 4,096 and 16,384) is read when the process starts: a
sweep's workers get it (``hugepage_environ``), a single run is told
(``hugepage_hint``) (``experiments/bench_malloc.py``; docs/planner.md,
"Host memory").

``keep_freed_memory`` fixes both thresholds (which also stops their
adaptation), so blocks up to ``threshold`` bytes come from the heap and the
heap is not trimmed: the process keeps its peak footprint instead of
handing pages back and faulting them in again. ``cbs_jax`` calls it on
import (glibc only; elsewhere it does nothing); set the environment
variable ``CBS_JAX_KEEP_FREED_MEMORY=0`` before the import to keep the C
library's defaults, e.g. to compare (``experiments/bench_planner.py``
reports both).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

ENV = "CBS_JAX_KEEP_FREED_MEMORY"
# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
DEFAULT_THRESHOLD = 1 << 30  # bytes; mallopt takes a C int, so at most 2**31 - 1

_applied: int | None = None  # the threshold set in this process, if any


def applied() -> int | None:
  """The threshold ``keep_freed_memory`` set in this process (None: none)."""
  return _applied


def keep_freed_memory(threshold: int = DEFAULT_THRESHOLD) -> bool:
  """Fix glibc's mmap and trim thresholds at ``threshold`` bytes. Returns
  whether both were set: False off glibc (macOS, musl), or where the
  C library refuses the value. Raises ValueError for a threshold that is
  not a positive C int."""
  global _applied
  if not isinstance(threshold, int) or not 0 < threshold < 2**31:
    raise ValueError(f"threshold must be an int in (0, 2**31), got {threshold!r}")
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
  except OSError:
    return False
  ok = bool(libc.mallopt(_M_MMAP_THRESHOLD, threshold))
  ok = bool(libc.mallopt(_M_TRIM_THRESHOLD, threshold)) and ok
  if ok:
    _applied = threshold
  return ok


HUGEPAGE_TUNABLE = "glibc.malloc.hugetlb=1"
THP_ENABLED = "/sys/kernel/mm/transparent_hugepage/enabled"
HINT_ROLLOUTS = 2048  # rounds this large fault their temporaries in (bench_malloc)


def _hugepages_apply(environ, thp_enabled: str) -> bool:
  """Whether a process started with ``environ`` plus ``HUGEPAGE_TUNABLE``
  would get huge pages it does not get already: glibc on Linux, the
  tunable not yet there, transparent huge pages on in the kernel."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  if "glibc.malloc.hugetlb" in environ.get("GLIBC_TUNABLES", ""):
    return False
  try:
    with open(thp_enabled) as f:
      text = f.read()
  except OSError:
    return False
  return "[" in text and text[text.find("[") + 1 : text.find("]")] in ("always", "madvise")


def hugepage_environ(environ=None, thp_enabled: str | None = None) -> dict:
  """A copy of ``environ`` (default ``os.environ``) for a process this one
  starts (a sweep's workers): ``HUGEPAGE_TUNABLE`` added to
  ``GLIBC_TUNABLES`` where it applies (``_hugepages_apply``) and
  ``CBS_JAX_KEEP_FREED_MEMORY`` is not "0" (that keeps the C library's
  defaults). The workers' rounds at 4,096 and 16,384 rollouts ran 1.50x and
  1.55x faster with it, 0.97x at 256 (``bench_malloc.py --worker``)."""
  env = dict(os.environ if environ is None else environ)
  if env.get(ENV, "1").strip() == "0" or not _hugepages_apply(env, thp_enabled or THP_ENABLED):
    return env
  env["GLIBC_TUNABLES"] = ":".join(filter(None, [env.get("GLIBC_TUNABLES", ""), HUGEPAGE_TUNABLE]))
  return env


def hugepage_hint(
    rollouts: int, backend: str, environ=None, thp_enabled: str = THP_ENABLED
) -> str | None:
  """A line telling a CPU run of ``rollouts`` per round to start with glibc's
  huge pages (``GLIBC_TUNABLES``, read at process start; docs/planner.md,
  "Host memory"), or None where it would not help or cannot apply: another
  backend, fewer than ``HINT_ROLLOUTS`` rollouts, not glibc on Linux, the
  tunable already set, or transparent huge pages off in the kernel
  (``thp_enabled``: the sysfs file whose bracketed word is the mode)."""
  environ = os.environ if environ is None else environ
  if backend != "cpu" or rollouts < HINT_ROLLOUTS or not _hugepages_apply(environ, thp_enabled):
    return None
  return (
      f"note: {rollouts} rollouts per round on the CPU: starting the process with "
      f"GLIBC_TUNABLES={HUGEPAGE_TUNABLE} made such rounds ~1.5x faster in "
      'experiments/bench_malloc.py (fewer page faults; docs/planner.md, "Host memory")'
  )


def configure_from_env() -> bool:
  """``keep_freed_memory()`` unless ``CBS_JAX_KEEP_FREED_MEMORY`` is "0"
  (any other value, or none, applies it). Called by ``cbs_jax``'s import."""
  value = os.environ.get(ENV, "1").strip()
  if value not in ("0", "1", ""):
    raise ValueError(f"{ENV} must be 0 or 1, got {value!r}")
  return value != "0" and keep_freed_memory()
