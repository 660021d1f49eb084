"""Environments for the JAX subprocesses tests launch: the caller's
environment (the session's compile cache and XLA flags, tests/conftest.py)
plus N fake host devices on the CPU, or with XLA's default optimization
level instead of the suite's faster compile."""

import inspect
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# XLA's CPU backend at optimization level 0: the same programs, with the same
# semantics (floating-point summation order aside), compiled in about half the
# time. The suite sets it for every test (tests/conftest.py): most tests
# compile more than they compute (``batch_law_on_policy.py --quick``: 194
# compiles, 38 s of its 67 s; 37 s in all at level 0), and what they check --
# agreement with an independent computation to a tolerance, equality of two
# runs under the same flags, files written -- does not depend on the level.
# What does is run at the default level, in a child process
# (``call_at_default_level``): the golden rows (bits of the default compile)
# and tests whose cost is computing, not compiling (the committed SFT config:
# 89 s at the default level, 166 s at level 0).
QUICK_COMPILE = "--xla_backend_optimization_level=0"


def host_devices(n: int) -> dict:
  flags = os.environ.get("XLA_FLAGS", "")
  return dict(
      os.environ,
      JAX_PLATFORMS="cpu",
      XLA_FLAGS=f"{flags} --xla_force_host_platform_device_count={n}".strip(),
  )


def default_compile() -> dict:
  """The caller's environment without the suite's ``QUICK_COMPILE``."""
  flags = os.environ.get("XLA_FLAGS", "").replace(QUICK_COMPILE, "")
  return dict(os.environ, XLA_FLAGS=" ".join(flags.split()))


def call_at_default_level(fn, *args):
  """``fn(*args)`` (a module-level function; its arguments and its return
  value JSON-encodable) run in a child process from the repository root at
  XLA's default optimization level; its return value."""
  where = [os.path.dirname(inspect.getfile(fn)), os.path.dirname(__file__), ROOT]
  prog = (
      f"import importlib, json, sys; sys.path[:0] = {where!r}; "
      f"fn = getattr(importlib.import_module({fn.__module__!r}), {fn.__name__!r}); "
      f"print(json.dumps(fn(*{list(args)!r})))"
  )
  out = subprocess.run(
      [sys.executable, "-c", prog], cwd=ROOT, env=default_compile(), capture_output=True, text=True
  )
  assert out.returncode == 0, f"{fn.__name__}{args} failed:\n{out.stderr[-4000:]}"
  return json.loads(out.stdout.strip().splitlines()[-1])
