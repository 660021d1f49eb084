"""cbs_jax.host_memory: freed host memory stays in the process.

The check is the kernel's own count of page faults (``getrusage``'s
``ru_minflt``), not a timing: a 128 MB block allocated and freed ten times
faults in 32,768 fresh 4 KiB pages per allocation under glibc's defaults and
none once the thresholds are fixed. Each case runs in its own process,
because the setting is process-wide and is made on import.
"""

import json
import os
import platform
import subprocess
import sys

import pytest

from cbs_jax import host_memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


_ENV_SWEEP = """
import json, os, sys
sys.path.insert(0, {root!r})
from cbs_jax import config as config_lib
from cbs_jax import sweep

def run(config, workdir):
  return {{"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "pid": os.getpid()}}

if __name__ == "__main__":
  rows = sweep.run_sweep(
      config_lib.base_config(), sweep.grid({{"seed": [0, 1]}}), sys.argv[1], run_fn=run,
      workers=2, progress=False)
  print("ROWS " + json.dumps([r["summary"] for r in rows]))
  print("PARENT " + os.environ.get("GLIBC_TUNABLES", "-"))
  print("PIDOF " + str(os.getpid()))
"""


@pytest.mark.slow
@pytest.mark.parametrize("keep", ["1", "0"])
def test_sweep_workers_start_with_huge_pages_where_they_apply(tmp_path, keep):
  """A two-worker sweep's workers see glibc's huge-page tunable (added to
  what the parent had) where the kernel offers huge pages, and not with
  CBS_JAX_KEEP_FREED_MEMORY=0; the parent's own environment is restored."""
  script = tmp_path / "env_sweep.py"
  script.write_text(_ENV_SWEEP.format(root=ROOT))
  env = dict(os.environ, GLIBC_TUNABLES="glibc.malloc.trim_threshold=1048576")
  env[host_memory.ENV] = keep
  out = subprocess.run(
      [sys.executable, str(script), str(tmp_path / "root")],
      env=env,
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=300,
  )
  assert out.returncode == 0, out.stderr[-3000:]
  lines = dict(
      l.split(" ", 1) for l in out.stdout.splitlines() if l[:5] in ("ROWS ", "PAREN", "PIDOF")
  )
  rows = json.loads(lines["ROWS"])
  assert len(rows) == 2 and str(rows[0]["pid"]) != lines["PIDOF"]  # ran in a worker
  applies = host_memory._hugepages_apply({}, host_memory.THP_ENABLED) and keep == "1"
  want = "glibc.malloc.trim_threshold=1048576" + (
      ":" + host_memory.HUGEPAGE_TUNABLE if applies else ""
  )
  assert [r["glibc_tunables"] for r in rows] == [want, want]
  assert lines["PARENT"] == "glibc.malloc.trim_threshold=1048576"


def test_hugepage_environ_adds_the_tunable_once_and_respects_the_opt_out(tmp_path):
  thp = tmp_path / "enabled"
  thp.write_text("always [madvise] never\n")
  env = lambda **kw: host_memory.hugepage_environ(kw, str(thp))
  if not GLIBC:
    assert env(A="1") == {"A": "1"}
    return
  assert env()["GLIBC_TUNABLES"] == host_memory.HUGEPAGE_TUNABLE
  assert env(GLIBC_TUNABLES="x=1")["GLIBC_TUNABLES"] == "x=1:" + host_memory.HUGEPAGE_TUNABLE
  once = env(GLIBC_TUNABLES=host_memory.HUGEPAGE_TUNABLE)
  assert once["GLIBC_TUNABLES"] == host_memory.HUGEPAGE_TUNABLE
  assert "GLIBC_TUNABLES" not in env(**{host_memory.ENV: "0"})
  thp.write_text("always madvise [never]\n")
  assert "GLIBC_TUNABLES" not in env()
