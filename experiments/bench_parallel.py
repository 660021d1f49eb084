"""Two ways to run one sweep, timed against each other: two single-threaded
runs side by side vs one multi-threaded run at a time (``--compare=workers``),
or with vs without the sweep's persistent compilation cache
(``--compare=compile_cache``).

    python experiments/bench_parallel.py            # (~5 min on a 2-core CPU)
    python experiments/bench_parallel.py --quick    # (~1 min)
    python experiments/bench_parallel.py --compare=compile_cache

Why: a sweep on a small CPU can run its runs one at a time, each using every
core through XLA's thread pool (``sweep.run_sweep(workers=1)``), or several
at once, each in its own process pinned to one core with single-threaded
XLA (``workers=2``). Which finishes a sweep sooner depends on how well one
small model's ops fill several cores; this measures it, so the studies'
``--workers`` default rests on a number.

Why the cache: every seed of a grid point compiles the same programs; with
the cache (``xla_cache.scoped``, on by default in ``sweep.run_sweep``) the
later ones read them back. Both arms run one run at a time; the child
processes run without a cache the caller may have configured, so the arm
without one compiles every program.

What: the same sweep twice -- the on-policy study's config
(``configs/batch_law.py:on``: GRPO on arithmetic, held-out expected pass
rate) at --rounds rounds, two runs per N in --ns (seeds 0 and 1, no stop
target) -- from one shared SFT base built first and not timed. Each mode
runs in a fresh subprocess under a fresh root (compiles included: a real
sweep pays them too), the modes alternate (sequential, parallel, parallel,
sequential for --repeats 2) so that slow drift of the machine hits both
alike. Run it on an otherwise idle machine. Last line:

    RESULT parallel_speedup=<sequential wall / side-by-side wall> cores=<n>
    RESULT compile_cache_speedup=<wall without / wall with the cache> cores=<n>
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

from cbs_jax import study_runner
from cbs_jax import sweep
from cbs_jax import xla_cache
from configs import batch_law

# the two arms of each comparison: (name, workers > 1, compile cache)
ARMS = {
    "workers": (("sequential", False, True), ("parallel", True, True)),
    "compile_cache": (("no cache", False, False), ("cache", False, True)),
}
RESULTS = {"workers": "parallel_speedup", "compile_cache": "compile_cache_speedup"}


def parse_args(argv=None):
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument(
      "--ns",
      default="256,2048",
      help="rollouts per round of the runs, comma-separated (two runs each)",
  )
  ap.add_argument("--rounds", type=int, default=12, help="rounds per run")
  ap.add_argument(
      "--repeats", type=int, default=2, help="timed sweeps per mode (order alternates: s p p s ...)"
  )
  ap.add_argument("--workers", type=int, default=2, help="runs side by side")
  ap.add_argument(
      "--compare",
      default="workers",
      choices=sorted(ARMS),
      help="workers: side by side vs one at a time; compile_cache: with vs without the cache",
  )
  ap.add_argument("--quick", action="store_true", help="tiny version (test suite)")
  args = ap.parse_args(argv)
  args.ns = [int(n) for n in args.ns.split(",") if n]
  if args.quick:
    args.ns, args.rounds, args.repeats = [64], 3, 1
  if args.rounds < 1 or args.repeats < 1 or args.workers < 2 or not args.ns:
    ap.error("--rounds and --repeats must be >= 1, --workers >= 2, --ns non-empty")
  return args


def _config(quick: bool, rounds: int, base_dir: str):
  c = batch_law.get_config("quick" if quick else "on")
  c.sft.base_dir = base_dir  # absolute: every timed sweep shares it
  c.train.num_rounds = rounds
  c.train.stop_at_pass_rate = 0.0  # no early stop: every run does `rounds`
  c.train.eval_every = rounds  # one evaluation, at the end
  c.train.checkpoint_every = 0
  return c


def child(arm: tuple, root: str, ns: list[int], rounds: int, quick: bool, workers: int):
  """One timed sweep (runs in its own process): prints its wall seconds."""
  _, side_by_side, cache = arm
  c = _config(quick, rounds, os.path.join(os.path.dirname(root), "sft_base"))
  K = c.batch.rollouts_per_prompt
  over = [{"batch.num_prompts": max(1, n // K), "seed": s} for n in ns for s in (0, 1)]
  t = time.perf_counter()
  sweep.run_sweep(
      c, over, root, workers=workers if side_by_side else 1, progress=False, compile_cache=cache
  )
  print(json.dumps({"wall": time.perf_counter() - t}))


def main(argv=None):
  args = parse_args(argv)
  arms = {a[0]: a for a in ARMS[args.compare]}
  if os.environ.get("CBS_BENCH_CHILD"):
    mode, root = os.environ["CBS_BENCH_CHILD"].split(":", 1)
    child(arms[mode], root, args.ns, args.rounds, args.quick, args.workers)
    return
  tmp = tempfile.mkdtemp(prefix="cbs_bench_parallel_")
  base = os.path.join(tmp, "sft_base")
  print(f"building the shared SFT base in {base} (not timed) ...", flush=True)
  study_runner.prepare_base(_config(args.quick, args.rounds, base), tmp)
  first, second = list(arms)
  order = []
  for r in range(args.repeats):
    order += [first, second] if r % 2 == 0 else [second, first]
  walls = {first: [], second: []}
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  for i, mode in enumerate(order):
    root = os.path.join(tmp, f"sweep{i}")  # a fresh root per timed sweep
    env = dict(os.environ, CBS_BENCH_CHILD=f"{mode}:{root}")
    env.pop(xla_cache.ENV, None)  # no cache the caller configured: the arms decide
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__)] + (argv or sys.argv[1:]),
        env=env,
        capture_output=True,
        text=True,
    )
    if p.returncode:
      raise SystemExit(f"{mode} sweep failed:\n{p.stderr[-3000:]}")
    wall = json.loads(p.stdout.strip().splitlines()[-1])["wall"]
    walls[mode].append(wall)
    print(
        f"{mode:<11} {len(args.ns) * 2} runs of {args.rounds} rounds at N = {args.ns}: "
        f"{wall:7.1f} s",
        flush=True,
    )
  a, b = (float(np.median(walls[m])) for m in (first, second))
  print(f"median {first} {a:.1f} s, {second} {b:.1f} s on {cores} cores")
  print(f"RESULT {RESULTS[args.compare]}={a / b:.3f} cores={cores}")


if __name__ == "__main__":
  main()
