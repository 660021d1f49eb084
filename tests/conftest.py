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


# The longest tests of the full suite, in seconds (``--durations`` on the
# 2-core machine). They are started first: xdist hands tests out in
# collection order, and a five-minute chain that starts last keeps one core
# busy while the other has long finished. The order changes nothing else.
LONGEST = {
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[batch_law]": 327,
    "tests/test_multihost.py::": 142,
    "tests/test_sft.py::test_committed_sft_config_lands_in_the_band": 131,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[noise]": 125,
    "tests/test_golden.py::test_run_logs_the_golden_rows[adaptive_offpolicy]": 102,
    "tests/test_sharding.py::test_sharded_run_matches_single_device": 94,
    "tests/test_reliability.py::test_sigkill_mid_run_then_restart_equals_uninterrupted_run": 72,
    "tests/test_golden.py::test_run_logs_the_golden_rows[quickstart]": 69,
    "tests/test_colab.py::test_tour_runs_at_tiny_size": 65,
    "tests/test_train.py::test_exact_noise_by_ghost_matches_vmap_in_the_trainer": 56,
    "tests/test_objective.py::test_loss_and_gradient_identical_under_microbatching": 53,
    "tests/test_train.py::test_main_writes_metrics_checkpoint_and_resumes": 43,
    "tests/test_train.py::test_reuse_makes_kappa_positive_and_growing": 39,
    "tests/test_train.py::test_ppo_with_kl_penalty_runs_end_to_end": 35,
    "tests/test_train.py::test_adaptive_batch_follows_the_tracker_within_buckets": 34,
    "tests/test_adaptive.py::test_resumed_adaptive_run_makes_the_same_choices": 32,
}


def _cost(item) -> float:
  return next((s for k, s in LONGEST.items() if item.nodeid.startswith(k)), 0.0)


def pytest_collection_modifyitems(session, config, items):
  items.sort(key=lambda item: -_cost(item))  # stable: the rest keep their order
