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
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[batch_law]": 257,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[noise]": 162,
    "tests/test_multihost.py::": 153,
    "tests/test_sft.py::test_committed_sft_config_lands_in_the_band": 100,
    "tests/test_golden.py::test_run_logs_the_golden_rows[adaptive_offpolicy]": 94,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[lr_envelope]": 110,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[noise_length]": 70,
    "tests/test_sharding.py::test_sharded_run_matches_single_device": 54,
    "tests/test_floors.py::test_bench_planner_quick_prints_its_result": 47,
    "tests/test_golden.py::test_run_logs_the_golden_rows[quickstart]": 43,
    "tests/test_reliability.py::test_sweep_with_two_workers_gives_the_single_process_results": 43,
    "tests/test_reliability.py::test_sigkill_mid_run_then_restart_equals_uninterrupted_run": 38,
    "tests/test_reliability.py::test_sweep_cli_runs_the_grid": 35,
    "tests/test_colab.py::test_tour_runs_at_tiny_size": 32,
    "tests/test_readme.py::test_quickstart_then_plan_run_in_order_at_smoke_size": 31,
    "tests/test_hf.py::test_gsm8k_qwen_smoke_run_from_checkpoint": 26,
    "tests/test_floors.py::test_calibrate_measures_this_machine": 25,
    "tests/test_train.py::test_exact_noise_by_ghost_matches_vmap_in_the_trainer": 24,
    "tests/test_golden.py::test_run_logs_the_golden_rows[ppo_kl]": 23,
}


def _cost(item) -> float:
  return next((s for k, s in LONGEST.items() if item.nodeid.startswith(k)), 0.0)


def pytest_collection_modifyitems(session, config, items):
  items.sort(key=lambda item: -_cost(item))  # stable: the rest keep their order
