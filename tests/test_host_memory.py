"""cbs_jax.host_memory: freed host memory stays in the process.

The check is the kernel's own count of page faults (``getrusage``'s
``ru_minflt``), not a timing: a 128 MB block allocated and freed ten times
faults in 32,768 fresh 4 KiB pages per allocation under glibc's defaults and
none once the thresholds are fixed. Each case runs in its own process,
because the setting is process-wide and is made on import.
"""

import os
import platform
import subprocess
import sys

import pytest

from cbs_jax import host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

_PROBE = """
import resource
import numpy as np
import cbs_jax
from cbs_jax import host_memory
faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(3):
  a = np.ones(1 << 24); del a
f0 = faults()
for _ in range(10):
  a = np.ones(1 << 24); del a
print(host_memory.applied(), faults() - f0)
"""


def _faults(env_value: str | None) -> tuple[str, int]:
  env = dict(os.environ, NUMPY_MADVISE_HUGEPAGE="0")  # 4 KiB pages: one fault per page
  env.pop(host_memory.ENV, None)
  if env_value is not None:
    env[host_memory.ENV] = env_value
  out = subprocess.run(
      [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
  )
  applied, faults = out.stdout.split()
  return applied, int(faults)


@pytest.mark.skipif(not GLIBC, reason="mallopt's thresholds are glibc's")
def test_freed_blocks_are_reused_without_page_faults():
  applied, kept = _faults(None)  # cbs_jax's import applies it
  assert applied == str(host_memory.DEFAULT_THRESHOLD)
  off, default = _faults("0")
  assert off == "None"
  pages = 10 * (1 << 24) * 8 // 4096  # ten 128 MB blocks of 4 KiB pages
  assert default >= 0.9 * pages  # glibc's defaults: every block faulted in afresh
  assert kept < 0.01 * pages  # kept: the same pages again


def test_bad_settings_are_named():
  with pytest.raises(ValueError, match="threshold"):
    host_memory.keep_freed_memory(0)
  with pytest.raises(ValueError, match="threshold"):
    host_memory.keep_freed_memory(2**31)
  env = dict(os.environ, **{host_memory.ENV: "yes"})
  out = subprocess.run(
      [sys.executable, "-c", "import cbs_jax"], env=env, capture_output=True, text=True
  )
  assert out.returncode != 0 and host_memory.ENV in out.stderr


def test_applied_in_this_process():
  # the suite imports cbs_jax under whatever the environment says
  on = GLIBC and os.environ.get(host_memory.ENV, "1") != "0"
  assert host_memory.applied() == (host_memory.DEFAULT_THRESHOLD if on else None)


@pytest.mark.skipif(not GLIBC, reason="the hint is for glibc's tunable")
def test_the_hugepage_hint_shows_only_where_it_applies(tmp_path):
  thp = tmp_path / "enabled"
  thp.write_text("always [madvise] never\n")
  hint = lambda n=4096, backend="cpu", env=None, f=thp: host_memory.hugepage_hint(
      n, backend, {} if env is None else env, str(f)
  )
  assert host_memory.HUGEPAGE_TUNABLE in hint() and "4096 rollouts" in hint()
  assert hint(n=host_memory.HINT_ROLLOUTS) is not None
  assert hint(n=host_memory.HINT_ROLLOUTS - 16) is None  # small rounds do not fault
  assert hint(backend="gpu") is None
  assert hint(env={"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}) is None  # already set
  assert hint(env={"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=1"}) is not None
  thp.write_text("always madvise [never]\n")
  assert hint() is None  # the kernel gives no huge pages
  thp.write_text("[always] madvise never\n")
  assert hint() is not None
  assert hint(f=tmp_path / "missing") is None
