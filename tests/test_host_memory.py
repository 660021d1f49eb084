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
