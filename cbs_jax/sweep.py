"""Sweeps for batch-size studies: one workdir per run, restartable at any moment.

    python -m cbs_jax.sweep --config=configs/default.py --workdir=runs/sweep \
        --sweep='{"batch.num_prompts": [8, 16, 32], "seed": [0, 1]}'

The grid is the cartesian product of the JSON lists (a scalar is a list of
one). In Python, ``run_sweep(base_config, overrides, root)`` takes the list
of override dicts (dotted field -> value) directly.

On a pod (``config.distributed.enabled``) every process runs the same
command: the processes run each grid point together, in the same order, as
one multi-process job. Which runs are finished is decided by process 0 from
the shared root and broadcast, so no process skips a run another one runs;
only process 0 writes ``config.json``, ``results.jsonl`` and the ledger. The
``distributed.*`` fields (coordinator, process id) describe the launch, not
the run: they are not part of a run's identity.

Each run lives in ``root/<name>`` and first stores its full config there as
``config.json``. On a restart a run whose workdir holds ``summary.json``
(written by the trainer only when the run has finished) is not run again:
its summary is read back. An unfinished run is started again in its
workdir, where the trainer resumes from the last checkpoint. A stored
``config.json`` that differs from the run's config is an error naming the
differing fields (two configs never share a workdir). After every run, its
row (name, overrides, summary) is refreshed in ``root/results.jsonl`` by an
atomic rewrite (``paths.write_atomic``: tmp file + rename locally, one object
upload under an object-store URI root), so an interruption at any moment
loses no finished result and redoes no finished run.

The runs compile through a persistent XLA compilation cache in
``root/.xla_cache`` (``xla_cache.scoped``; ``--nocompile_cache`` or
``run_sweep(compile_cache=False)`` to do without): the second seed of a grid
point, and every later run of the same shapes, reads its programs back
instead of compiling them (``experiments/bench_parallel.py
--compare=compile_cache``: 1.13x on the on-policy study's sweep with two
seeds per N). The runs' numbers do not change.

Every invocation that runs something adds a line to ``root/invocations.jsonl``
(``report.record_invocation``: start, wall seconds, runs made of those due,
commit and dirty flag; on success, an error or Ctrl-C, not on SIGKILL), so a
study's manifest (``report.Results.manifest(runs_root=...)``) states what
its runs cost over every invocation, not only the last one's read-back.
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import itertools
import json
import os
import re
import signal
import sys
import time
from typing import Any, Callable, Sequence

import jax
import ml_collections
import numpy as np
import tqdm
from jax.experimental import multihost_utils

from cbs_jax import config as config_lib
from cbs_jax import host_memory
from cbs_jax import paths
from cbs_jax import report
from cbs_jax import sharding
from cbs_jax import train
from cbs_jax import xla_cache

RESULTS = "results.jsonl"
# fields older runs stored that the config no longer has: values derived, not
# chosen (the sampler's suppressed ids now live in run_setup.Setup.sampling)
RETIRED = ("sampling.suppress_ids",)
# fields that say how a run was launched (which process this is), not what it runs
LAUNCH = "distributed."
_UNSAFE = re.compile(r"[^A-Za-z0-9._=+-]")
_MAX_NAME = 120


def apply_overrides(
    base_config: ml_collections.ConfigDict, overrides: dict[str, Any]
) -> ml_collections.ConfigDict:
  """A copy of ``base_config`` with ``overrides`` (dotted field -> value) set.

  Unknown fields are a ValueError naming them; a value of the wrong type is
  ml_collections' TypeError, re-raised naming the dotted field.
  """
  config = copy.deepcopy(base_config)
  for dotted, value in overrides.items():
    try:
      node, leaf = config_lib.parent_and_leaf(config, dotted)
    except ValueError as e:
      raise ValueError(f"sweep override names {e}") from None
    if isinstance(node[leaf], ml_collections.ConfigDict):
      raise ValueError(f"sweep override {dotted!r} names a config section, not a field")
    try:
      node[leaf] = value
    except TypeError as e:
      raise TypeError(f"sweep override {dotted}={value!r}: {e}") from e
  return config


def _fmt(v) -> str:
  if isinstance(v, float):
    return repr(v)
  if isinstance(v, (list, tuple, dict)):
    return json.dumps(v, separators=(",", ":"), sort_keys=True)
  return str(v)


def run_name(overrides: dict[str, Any]) -> str:
  """A filesystem-safe name: ``batch.num_prompts=8__optim.lr=0.001`` (``base`` if empty)."""
  if not overrides:
    return "base"
  name = "__".join(f"{k}={_fmt(v)}" for k, v in overrides.items())
  name = _UNSAFE.sub("_", name)
  if len(name) > _MAX_NAME:  # keep names short; the hash keeps them distinct
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    name = f"{name[:_MAX_NAME - 11]}-{digest}"
  return name


def _check_name(name: str) -> None:
  if not isinstance(name, str) or not name or name in (".", "..") or _UNSAFE.search(name):
    raise ValueError(
        f"sweep run name {name!r} is not a filesystem-safe name " "(letters, digits and ._=+- only)"
    )


def _as_json(config: ml_collections.ConfigDict) -> dict:
  return json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))


def _flatten(d: dict, prefix: str = "") -> dict:
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict) and v:
      out.update(_flatten(v, key + "."))
    else:
      out[key] = v
  return out


def config_diff(a: dict, b: dict) -> list[str]:
  """Dotted fields whose values differ between two JSON config dicts."""
  fa, fb = _flatten(a), _flatten(b)
  missing = object()
  return sorted(k for k in set(fa) | set(fb) if fa.get(k, missing) != fb.get(k, missing))


def _read_json(path: str):
  """The JSON in ``path``, or None if it is missing or unreadable (torn)."""
  try:
    return json.loads(paths.read_text(path))
  except (OSError, ValueError):
    return None


def read_results(root: str) -> list[dict]:
  path = paths.join(root, RESULTS)
  rows = []
  if paths.exists(path):
    for line in paths.read_text(path).splitlines():
      if line.strip():
        rows.append(json.loads(line))
  return rows


def _store_result(root: str, row: dict) -> None:
  rows = [r for r in read_results(root)]
  for i, r in enumerate(rows):
    if r.get("name") == row["name"]:
      rows[i] = row
      break
  else:
    rows.append(row)
  paths.write_atomic(
      paths.join(root, RESULTS), "".join(json.dumps(r, default=float) + "\n" for r in rows)
  )


def _prepare_run(root, name, config) -> tuple[str, dict, bool]:
  """Check the stored config of run ``name``; returns (workdir, config json, stored?)."""
  workdir = paths.join(root, name)
  want = _as_json(config)
  cfg_path = paths.join(workdir, "config.json")
  if paths.exists(cfg_path):
    have = _read_json(cfg_path)
    if have is None:
      raise ValueError(f"{cfg_path} is unreadable; remove it (or the run) to rerun {name!r}")
    fa, fb, fd = _flatten(have), _flatten(want), _flatten(_as_json(config_lib.base_config()))
    # a field the code gained after this run was stored, left at its default,
    # does not make the run another run; nor does a retired derived field
    diff = [
        k
        for k in config_diff(have, want)
        if not (k not in fa and k in fd and fb.get(k) == fd[k])
        and not (k in RETIRED and k not in fb)
        and not k.startswith(LAUNCH)
    ]
    if diff:
      detail = ", ".join(f"{k}: stored {fa.get(k)!r} vs now {fb.get(k)!r}" for k in diff)
      raise ValueError(
          f"sweep run {name!r} in {workdir} was made with a different config "
          f"({detail}); give this run another name or root"
      )
    return workdir, want, True
  leftovers = (
      [f for f in paths.listdir(workdir) if not f.startswith("config.json.tmp")]
      if paths.isdir(workdir)
      else []
  )
  if leftovers:
    raise ValueError(
        f"{workdir} is not empty but holds no config.json: it is not a "
        f"run of this sweep; give run {name!r} another name or root"
    )
  return workdir, want, False


def _die_with_parent() -> None:
  """Linux: have the kernel kill this process when the process that spawned
  it dies (prctl PR_SET_PDEATHSIG). A sweep killed from outside (kill,
  SIGKILL, a preempted job) then takes its workers with it, instead of
  leaving them to write on into run folders that the restarted sweep opens
  as well. Elsewhere a no-op."""
  if not sys.platform.startswith("linux"):
    return
  import ctypes  # pylint: disable=import-outside-toplevel

  libc = ctypes.CDLL(None, use_errno=True)
  if libc.prctl(1, signal.SIGKILL) != 0:  # 1 = PR_SET_PDEATHSIG
    return
  if os.getppid() == 1:  # the parent died before the request was made
    os._exit(1)


# what makes a worker's XLA single-threaded (appended to XLA_FLAGS)
WORKER_XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def pin_to_core(core: int | None) -> None:
  """Make this process's XLA single-threaded and bind it to ``core`` (where
  the OS allows), as a sweep worker runs; before it builds a backend."""
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + WORKER_XLA_FLAGS).strip()
  if hasattr(os, "sched_setaffinity") and core is not None:
    os.sched_setaffinity(0, {core})


def _pin_worker(cores) -> None:
  """Process-pool initializer: die with the sweep (``_die_with_parent``),
  take one core from ``cores`` (a shared queue) and run on it
  single-threaded (``pin_to_core``)."""
  _die_with_parent()
  pin_to_core(cores.get())


def _worker_run(run_fn, config, workdir):
  return run_fn(config, workdir)


def run_sweep(
    base_config: ml_collections.ConfigDict,
    overrides: Sequence[dict[str, Any]],
    root: str,
    names: Sequence[str] | None = None,
    run_fn: Callable[[ml_collections.ConfigDict, str], dict] = train.train_and_evaluate,
    progress: bool = True,
    workers: int = 1,
    compile_cache: bool = True,
) -> list[dict]:
  """Run (or finish) every run of a sweep; returns the rows in sweep order.

  ``overrides[i]`` (dotted field -> value) applied to ``base_config`` gives
  run i, named ``names[i]`` (default: ``run_name(overrides[i])``) and run
  by ``run_fn(config, root/name)`` unless that workdir already holds its
  ``summary.json``. Every config is built, validated and compared with its
  stored ``config.json`` before the first run starts.

  ``workers > 1`` runs that many runs at once, each in its own process
  pinned to one CPU core with single-threaded XLA (``run_fn`` must then be
  picklable, e.g. a module-level function). On a small CPU two
  single-threaded runs side by side can finish a sweep sooner than one
  multi-threaded run at a time (``experiments/bench_parallel.py`` measures
  it). Only this process writes ``results.jsonl``.

  With ``base_config.distributed.enabled`` every process of the job calls
  this with the same arguments and the runs are made in lockstep (module
  docstring); ``workers`` must then be 1.

  ``compile_cache``: the runs compile through a persistent XLA cache in
  ``root/.xla_cache`` (``xla_cache.scoped``: a program compiled once is read
  back by every later run that compiles it; the numbers do not change).
  """
  distributed = bool(base_config.distributed.enabled)
  if distributed:
    if workers != 1:
      raise ValueError(
          f"workers={workers!r}: a distributed sweep runs one grid point at a time on "
          "every process (config.distributed.enabled); use workers=1"
      )
    sharding.initialize_distributed(base_config.distributed)  # before any computation
  lead = not distributed or jax.process_index() == 0
  overrides = [dict(o) for o in overrides]
  if names is None:
    names = [run_name(o) for o in overrides]
  names = list(names)
  if len(names) != len(overrides):
    raise ValueError(f"{len(names)} names for {len(overrides)} runs")
  for n in names:
    _check_name(n)
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"sweep run names are not distinct: {dup}")
  if paths.exists(root) and not paths.isdir(root):
    raise ValueError(f"sweep root {root!r} exists and is not a directory")
  runs = []
  for name, over in zip(names, overrides):
    config = apply_overrides(base_config, over)
    try:
      config_lib.validate(config)
    except ValueError as e:
      raise ValueError(f"sweep run {name!r} ({over}): {e}") from e
    runs.append((name, over, config))
  prepared = [_prepare_run(root, name, config) for name, _, config in runs]
  if lead:
    paths.makedirs(root)

  if not isinstance(workers, int) or workers < 1:
    raise ValueError(f"workers={workers!r} must be an integer >= 1")
  rows = [None] * len(runs)
  summaries = []
  for (name, over, config), (workdir, cfg_json, stored) in zip(runs, prepared):
    if lead and not stored:
      paths.makedirs(workdir)
      paths.write_atomic(
          paths.join(workdir, "config.json"), json.dumps(cfg_json, indent=2, sort_keys=True)
      )
    summaries.append(_read_json(paths.join(workdir, "summary.json")) if stored else None)
  finished = [s is not None for s in summaries]  # else never finished (or torn): (re)run
  if distributed:  # process 0's view of the shared root, for every process
    finished = [bool(f) for f in multihost_utils.broadcast_one_to_all(np.asarray(finished))]
  todo = []
  for i, ((name, over, _), (workdir, _, _)) in enumerate(zip(runs, prepared)):
    if not finished[i]:
      todo.append(i)
      continue
    summary = summaries[i] or _read_json(paths.join(workdir, "summary.json"))
    if summary is None:
      raise ValueError(
          f"process 0 found run {name!r} finished but {workdir}/summary.json is not "
          "readable from this process: is the sweep root on storage every host shares?"
      )
    rows[i] = dict(name=name, overrides=over, workdir=workdir, summary=summary)
    if lead:
      _store_result(root, rows[i])
  bar = tqdm.tqdm(
      total=len(runs), initial=len(runs) - len(todo), desc="sweep", disable=not (progress and lead)
  )
  ran = []

  def finish(i, summary):
    name, over, _ = runs[i]
    rows[i] = dict(name=name, overrides=over, workdir=prepared[i][0], summary=summary)
    if lead:
      _store_result(root, rows[i])
    ran.append(name)
    bar.update(1)

  started = datetime.datetime.now(datetime.timezone.utc).isoformat()
  clock = time.monotonic()
  try:
    if todo:
      with xla_cache.scoped(root, compile_cache, distributed):
        _run_todo(todo, runs, prepared, run_fn, workers, finish, bar)
  finally:  # an exception or Ctrl-C is recorded too; a SIGKILL is not
    if lead and todo:
      report.record_invocation(
          root,
          dict(
              started_utc=started,
              wall_seconds=time.monotonic() - clock,
              ran=len(ran),
              of=len(todo),
              completed=len(ran) == len(todo),
              workers=workers,
              git_commit=report.git_commit(),
              git_dirty=report.git_dirty(),
          ),
      )
  bar.close()
  return rows


def _run_todo(todo, runs, prepared, run_fn, workers, finish, bar) -> None:
  """Run the runs ``todo`` (indices), calling ``finish(i, summary)`` as each ends."""
  if workers == 1 or len(todo) <= 1:
    for i in todo:
      bar.set_postfix_str(runs[i][0])
      finish(i, run_fn(runs[i][2], prepared[i][0]))
  else:
    import concurrent.futures  # pylint: disable=import-outside-toplevel
    import multiprocessing  # pylint: disable=import-outside-toplevel

    ctx = multiprocessing.get_context("spawn")
    cores = ctx.Queue()
    avail = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    for w in range(workers):
      cores.put(avail[w % len(avail)] if avail else None)
    # the workers start with glibc's huge pages where they apply (read at
    # process start; host_memory.hugepage_environ): 1.5x faster rounds at
    # 4,096 rollouts and more
    before = os.environ.get("GLIBC_TUNABLES")
    if "GLIBC_TUNABLES" in (env := host_memory.hugepage_environ()):
      os.environ["GLIBC_TUNABLES"] = env["GLIBC_TUNABLES"]
    try:
      with concurrent.futures.ProcessPoolExecutor(
          max_workers=workers, mp_context=ctx, initializer=_pin_worker, initargs=(cores,)
      ) as pool:
        futures = {pool.submit(_worker_run, run_fn, runs[i][2], prepared[i][0]): i for i in todo}
        try:
          for fut in concurrent.futures.as_completed(futures):
            finish(futures[fut], fut.result())
        except BaseException:
          for fut in futures:  # a failed run stops the sweep: start nothing new
            fut.cancel()
          raise
    finally:
      if before is None:
        os.environ.pop("GLIBC_TUNABLES", None)
      else:
        os.environ["GLIBC_TUNABLES"] = before


def grid(spec: dict[str, Any]) -> list[dict[str, Any]]:
  """Cartesian product of ``{field: [values]}`` (a scalar counts as one value)."""
  if not isinstance(spec, dict):
    raise ValueError(f"--sweep must be a JSON object {{field: [values]}}, got {spec!r}")
  keys = list(spec)
  values = [v if isinstance(v, list) else [v] for v in spec.values()]
  for k, v in zip(keys, values):
    if not v:
      raise ValueError(f"--sweep field {k!r} has an empty list of values")
  return [dict(zip(keys, combo)) for combo in itertools.product(*values)]


def main(argv):
  del argv
  from absl import flags
  from absl import logging

  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  try:
    spec = json.loads(_SWEEP.value)
  except json.JSONDecodeError as e:
    raise ValueError(f"--sweep is not valid JSON ({e}): {_SWEEP.value!r}") from e
  rows = run_sweep(
      _CONFIG.value,
      grid(spec),
      _WORKDIR.value,
      workers=_WORKERS.value,
      compile_cache=_COMPILE_CACHE.value,
  )
  if jax.process_index() != 0:  # one listing per job
    return
  for row in rows:
    s = row["summary"] or {}
    print(
        json.dumps(
            {"name": row["name"]} | {k: v for k, v in s.items() if not isinstance(v, dict)},
            default=float,
        )
    )


if __name__ == "__main__":
  from absl import app
  from absl import flags
  from ml_collections import config_flags

  _CONFIG = config_flags.DEFINE_config_file(
      "config", None, "Base config file (get_config).", lock_config=True
  )
  _WORKDIR = flags.DEFINE_string("workdir", None, "Sweep root: one subdirectory per run.")
  _SWEEP = flags.DEFINE_string(
      "sweep", "{}", 'JSON {"dotted.field": [values], ...}; ' "the grid is their cartesian product."
  )
  _WORKERS = flags.DEFINE_integer(
      "workers",
      1,
      "Runs at once, each single-threaded on " "its own core (1 = one run at a time, all cores).",
  )
  _COMPILE_CACHE = flags.DEFINE_boolean(
      "compile_cache",
      True,
      "Compile through a persistent XLA cache in <workdir>/.xla_cache, so that a "
      "program compiled for one run is read back by the others (cbs_jax/xla_cache.py; "
      "--nocompile_cache: no sweep cache; one you configured yourself is still used).",
  )
  flags.mark_flags_as_required(["config", "workdir"])
  app.run(main)
