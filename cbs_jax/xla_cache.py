"""A persistent XLA compilation cache for the runs of a sweep.

A sweep compiles the same programs again and again: every seed of a grid
point, every learning rate at one batch size, the runs of a restarted sweep.
JAX's persistent compilation cache stores each compiled executable (those
that took at least ``jax_persistent_cache_min_compile_time_secs``, 1 s by
default, to compile) under a key made of the program, the compile options,
the XLA flags and the jax/jaxlib versions, so a later compile of the same
program, in this process or another, is a file read. The executable read
back is the one the compile made: the runs' numbers do not change
(tests/test_xla_cache.py checks that a run whose programs are all read back
logs the rows of the run that compiled them, bit for bit; tests/conftest.py
runs the whole suite with a cache).

``sweep.run_sweep`` runs inside ``scoped(root)``: the cache lives in
``<root>/.xla_cache`` for the sweep, in this process and in its worker
processes (they inherit ``JAX_COMPILATION_CACHE_DIR``), and is switched off
again afterwards. A cache the user configured (``JAX_COMPILATION_CACHE_DIR``
or ``jax_compilation_cache_dir``) is used as it is instead. No cache is set
up for an object-store root (the cache wants a local folder) or a
multi-process job. Like the run folders beside it, the cache must be
writable by no one the user does not trust: JAX runs what it reads back.
"""

from __future__ import annotations

import contextlib
import os

import jax
from jax.experimental.compilation_cache import compilation_cache

from cbs_jax import paths

ENV = "JAX_COMPILATION_CACHE_DIR"
FOLDER = ".xla_cache"  # under the sweep root; a dot folder, never taken for a run


def configured() -> str | None:
  """The cache folder the user set up (environment or JAX config), or None."""
  return os.environ.get(ENV) or jax.config.jax_compilation_cache_dir or None


@contextlib.contextmanager
def scoped(root: str, enabled: bool = True, distributed: bool = False):
  """Within the block, compile through a persistent cache in
  ``<root>/.xla_cache`` (module doc); yields the folder in use, or None
  where there is none (``enabled`` False, an object-store ``root``, a
  ``distributed`` job). A cache the user configured is used as it is and
  left as it was."""
  user = configured()
  if user or not enabled or distributed or paths.is_remote(root):
    yield user
    return
  folder = os.path.abspath(os.path.join(root, FOLDER))  # workers may start elsewhere
  os.makedirs(folder, exist_ok=True)
  compilation_cache.set_cache_dir(folder)
  os.environ[ENV] = folder  # for worker processes, read when they import jax
  try:
    yield folder
  finally:
    os.environ.pop(ENV, None)
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", None)
