"""One persistent XLA compilation cache for the whole test session, and a
faster compile (XLA optimization level 0, tests/envs.py: ``QUICK_COMPILE``).

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

import envs

CACHE_ENV = {
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
    "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
}
_OWNED = []  # a directory this process created (removed at the end)


def pytest_configure(config):
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_backend_optimization_level" not in flags:  # a level the user set is kept
    os.environ["XLA_FLAGS"] = f"{flags} {envs.QUICK_COMPILE}".strip()
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


# The longest tests of the full suite, in seconds, set-up included
# (``.ci/run`` with ``--durations=0`` at commit d3c5f35 on the 2-core
# machine, its slower processor, compiling at level 0). They are started
# first: a chain that starts last keeps one core busy while the other has
# long finished. The order changes nothing else. It balances the two workers
# only with ``--maxschedchunk=1`` (pytest.ini): by default xdist's first
# batch per worker is a quarter of its share, consecutive (144 of 1,155
# tests), so every test below went to worker 0 -- in that run (commit
# ac0e73f) the tests took 2,137 s in all (1,069 s per worker if shared
# evenly) and the run 1,277 s. At d3c5f35: 1,973 s in all, the run 1,016 s.
LONGEST = {
    "tests/test_multihost.py::test_a_distributed_sweep_matches_one_process_and_survives_preemption": 113,
    "tests/test_golden.py::test_run_logs_the_golden_rows[adaptive_offpolicy]": 110,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[batch_law]": 108,
    "tests/test_sft.py::test_committed_sft_config_lands_in_the_band": 99,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[noise]": 74,
    "tests/test_golden.py::test_run_logs_the_golden_rows[quickstart]": 54,
    "tests/test_reliability.py::test_sigkill_mid_run_then_restart_equals_uninterrupted_run": 50,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[lr_envelope]": 47,
    "tests/test_floors.py::test_bench_planner_quick_prints_its_result": 43,
    "tests/test_sharding.py::test_sharded_run_matches_single_device": 43,
    "tests/test_train.py::test_main_writes_metrics_checkpoint_and_resumes": 42,
    "tests/test_train.py::test_exact_noise_by_ghost_matches_vmap_in_the_trainer": 40,
    "tests/test_colab.py::test_tour_runs_at_tiny_size": 40,
    "tests/test_op_profile.py::test_bench_sampler_quick_profile_says_where_the_time_goes": 39,
    "tests/test_golden.py::test_run_logs_the_golden_rows[ppo_kl]": 38,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[noise_length]": 38,
    "tests/test_paths.py::test_kill_before_any_upload_then_rerun_equals_an_uninterrupted_run": 37,
    "tests/test_objective.py::test_per_rollout_and_split_statistics_match_a_python_loop[token_mean]": 36,
    "tests/test_train.py::test_ppo_with_kl_penalty_runs_end_to_end": 31,
    "tests/test_reliability.py::test_sweep_with_two_workers_gives_the_single_process_results": 30,
    "tests/test_experiments_cli.py::test_every_study_quick_mode_writes_its_files[adaptive_wallclock]": 28,
    "tests/test_floors.py::test_calibrate_measures_this_machine": 26,
    "tests/test_bf16.py::test_bf16_run_keeps_float32_optimizer_state_and_statistics": 21,
    "tests/test_experiments_cli.py::test_bench_malloc_quick_runs_each_arm_in_its_own_process": 20,
    "tests/test_hf.py::test_gsm8k_qwen_smoke_run_from_checkpoint": 19,
    "tests/test_reliability.py::test_sweep_cli_runs_the_grid": 18,
    "tests/test_ghost.py::test_gradstats_dispatches_to_ghost": 18,
    "tests/test_objective.py::test_per_rollout_and_split_statistics_match_a_python_loop[seq_mean_token_sum_norm]": 18,
    "tests/test_readme.py::test_quickstart_then_plan_run_in_order_at_smoke_size": 17,
}


def _cost(item) -> float:
  return next((s for k, s in LONGEST.items() if item.nodeid.startswith(k)), 0.0)


def pytest_collection_modifyitems(session, config, items):
  items.sort(key=lambda item: -_cost(item))  # stable: the rest keep their order
