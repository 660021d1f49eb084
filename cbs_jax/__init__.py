"""cbs_jax: the critical batch size of LLM policy optimization.

Import direction (one way: no cycles, checked by tests/test_imports.py):
  paths, stats, checkpoint, metrics, controller, lr_rules, batch_law
  model -> scoring -> objective (with rl) -> ghost -> gradstats
  noise -> noise_stats -> noise_tracker;  drift
  sampling -> rollouts -> evaluation;  config (validation)
  run_setup (Setup) -> sft;  run_state (RunState)
  updater -> train -> main, measure, sweep -> study -> study_report, study_runner
  systems -> probes -> plan;  rounding -> plots -> report
  host_memory (no imports; applied here, on import)
"""

from cbs_jax import host_memory as _host_memory

__version__ = "0.1.0"

# glibc keeps XLA's freed CPU buffers instead of faulting fresh pages in on
# every call (host_memory; CBS_JAX_KEEP_FREED_MEMORY=0 keeps its defaults)
_host_memory.configure_from_env()
