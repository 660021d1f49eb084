"""One persistent XLA compilation cache for the whole test session.

Most tests build a tiny trainer and compile the same programs again: a
second run of a config, a resumed run, every run of an experiment's --quick
sweep, the processes of the multi-host test. The cache turns those later
compiles into a file read; it changes no numerics (the cached executable is
the one that was compiled).

The cache directory is set in the environment before JAX is imported, so the
test processes (xdist workers inherit the controller's environment) and
every subprocess a test launches use it. A cache the user configured
(``JAX_COMPILATION_CACHE_DIR``) is kept. Concurrent writers are safe: a
partly written entry read by another process is a cache miss with a warning,
never a wrong program.
"""

import os
import shutil
import tempfile

CACHE_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
_OWNED = []  # a directory this process created (removed at the end)


def pytest_configure(config):
  if "JAX_COMPILATION_CACHE_DIR" in os.environ:  # the user's, or the controller's
    return
  cache_dir = tempfile.mkdtemp(prefix="cbs_jax_test_xla_cache_")
  _OWNED.append(cache_dir)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  for k, v in CACHE_ENV.items():
    os.environ.setdefault(k, v)


def pytest_unconfigure(config):
  for d in _OWNED:
    shutil.rmtree(d, ignore_errors=True)
