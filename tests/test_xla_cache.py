"""A sweep's persistent XLA compilation cache (``cbs_jax/xla_cache.py``):
where it goes, when there is none, that it is switched off after the sweep,
and that a run whose programs are read back from it logs the same numbers
as the run that compiled them.

The suite itself runs with a cache the test session configured
(tests/conftest.py), which ``scoped`` must leave alone; the tests of the
cache's own folder clear that configuration for their duration, and the
end-to-end test runs its sweeps in processes without it.
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.compilation_cache import compilation_cache

from cbs_jax import xla_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def no_configured_cache(monkeypatch):
  """This process without the session's cache, restored afterwards."""
  monkeypatch.delenv(xla_cache.ENV, raising=False)
  saved = jax.config.jax_compilation_cache_dir
  compilation_cache.reset_cache()
  jax.config.update("jax_compilation_cache_dir", None)
  try:
    yield
  finally:
    compilation_cache.reset_cache()
    jax.config.update("jax_compilation_cache_dir", saved)


def test_a_sweep_root_gets_its_cache_for_the_block_only(tmp_path, no_configured_cache):
  assert xla_cache.configured() is None
  with xla_cache.scoped(str(tmp_path)) as folder:
    assert folder == str(tmp_path / ".xla_cache")
    assert os.environ[xla_cache.ENV] == folder  # what worker processes read
    assert jax.config.jax_compilation_cache_dir == folder
    # a fresh function object: the in-memory cache cannot serve it
    jax.block_until_ready(jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.ones(7)))
    assert os.listdir(folder)  # the compiled program was written
  assert xla_cache.configured() is None and xla_cache.ENV not in os.environ


def test_a_relative_root_gives_an_absolute_folder(tmp_path, monkeypatch, no_configured_cache):
  monkeypatch.chdir(tmp_path)
  with xla_cache.scoped("runs/sweep") as folder:
    assert os.path.isabs(folder) and os.path.isdir(folder)
    assert os.path.samefile(folder, tmp_path / "runs" / "sweep" / ".xla_cache")


@pytest.mark.parametrize(
    "root,kwargs",
    [
        ("gs://bucket/sweep", {}),  # an object store: no local folder
        (None, {"enabled": False}),
        (None, {"distributed": True}),
    ],
)
def test_no_cache_where_it_does_not_apply(root, kwargs, tmp_path, no_configured_cache):
  root = root or str(tmp_path)
  with xla_cache.scoped(root, **kwargs) as folder:
    assert folder is None and xla_cache.configured() is None
  assert not (tmp_path / ".xla_cache").exists()


def test_a_cache_the_user_configured_is_used_as_it_is(tmp_path, monkeypatch):
  mine = str(tmp_path / "mine")
  monkeypatch.setenv(xla_cache.ENV, mine)
  with xla_cache.scoped(str(tmp_path / "sweep")) as folder:
    assert folder == mine and os.environ[xla_cache.ENV] == mine
  assert os.environ[xla_cache.ENV] == mine
  assert not (tmp_path / "sweep" / ".xla_cache").exists()


def _sweep(root: str, env: dict) -> str:
  """Runs a one-run sweep; returns its stderr (compile log included)."""
  cmd = [
      sys.executable,
      "-m",
      "cbs_jax.sweep",
      "--config=configs/default.py:smoke",
      f"--workdir={root}",
      '--sweep={"seed": [0]}',
      "--config.train.num_rounds=2",
      "--config.model.num_layers=1",
      "--config.sft.steps=30",
  ]
  r = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  return r.stderr


def _numbers(path: str) -> list[dict]:
  """A run's metrics rows without the fields that measure time."""
  with open(path) as f:
    rows = [json.loads(l) for l in f if l.strip()]
  timed = ("seconds", "tokens_per_s")
  return [{k: v for k, v in r.items() if not any(t in k for t in timed)} for r in rows]


@pytest.mark.slow
def test_a_run_read_back_from_the_cache_logs_the_same_numbers(tmp_path):
  """The first sweep compiles and fills its ``.xla_cache``; a second sweep
  of the same run elsewhere, pointed at that cache, reads its programs back
  (JAX logs each hit under ``JAX_LOG_COMPILES``), compiles nothing new, and
  logs the same rows, bit for bit."""
  env = {k: v for k, v in os.environ.items() if k != xla_cache.ENV}
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"  # every program, however small
  env["JAX_LOG_COMPILES"] = "1"
  hit = "Persistent compilation cache hit"
  first, second = str(tmp_path / "first"), str(tmp_path / "second")
  assert hit not in _sweep(first, env)
  cache = os.path.join(first, ".xla_cache")
  filled = sorted(os.listdir(cache))
  assert len(filled) > 10
  log = _sweep(second, dict(env, **{xla_cache.ENV: cache}))
  assert log.count(hit) == len(filled), log[-2000:]  # every program the first one wrote
  assert sorted(os.listdir(cache)) == filled  # nothing compiled that was not there
  assert not os.path.exists(os.path.join(second, ".xla_cache"))
  a = _numbers(os.path.join(first, "seed=0", "metrics.jsonl"))
  b = _numbers(os.path.join(second, "seed=0", "metrics.jsonl"))
  assert len(a) == 3 and a == b
