"""Does the C allocator's setting change a round's speed on this CPU?

    python experiments/bench_malloc.py            # N = 256, 4,096, 16,384 (~6 min on 2 cores)
    python experiments/bench_malloc.py --quick    # N = 64, one repeat (test suite)

XLA's CPU runtime takes every temporary from the C allocator and frees it
at the end of the call (docs/planner.md, "Host memory"). glibc gives each
thread that allocates an arena of its own; an arena other than the main one
grows in heaps of at most 64 MiB, so a larger block is mapped afresh on
every call and its pages are faulted in and zeroed by the kernel, whatever
the thresholds ``cbs_jax.host_memory`` sets (they bind the main arena
only). The settings that change this can only be given when the process
starts (environment variables the C library reads at load time), so each
arm runs in a process of its own, the arms alternating, ``--repeats``
processes per arm:

* ``default``: the C library's settings (with ``cbs_jax.host_memory``'s);
* ``hugetlb``: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: glibc asks for
  transparent huge pages on the memory it maps (2 MiB pages: ~500x fewer
  faults; the kernel still zeroes every page);
* ``one_arena``: ``MALLOC_ARENA_MAX=1``: every thread allocates from the
  main arena, which honours ``host_memory``'s thresholds (no faults below
  1 GiB), at the price of one lock for all threads.

``--worker`` runs each process as a sweep's ``--workers`` do
(``sweep.pin_to_core``: single-threaded XLA on one core).

Each process times real quickstart rounds (``bench_planner.round_fn``:
generation with EOS, verification, one update; noise instruments off) at
each N: one untimed round, then the median of ``--rounds`` rounds, with the
page faults and system time they took. Reported: each arm's speed-up over
``default`` (the median over the repeats of default seconds / arm seconds,
by part), and its faults per round. Last line:

    RESULT <arm>_speedup_n<N>=<default / arm, whole round> ...
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

ARMS = {
    "default": {},
    "hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "one_arena": {"MALLOC_ARENA_MAX": "1"},
}


def child(ns: list[int], rounds: int, worker: bool) -> dict:
  """Time quickstart rounds at each N in this process: {N: {gen_s,
  update_s, round_s, faults, sys_s}} (medians over ``rounds``); ``worker``:
  run as a sweep worker does (``sweep.pin_to_core``: single-threaded XLA
  on one core)."""
  if worker:
    from cbs_jax import sweep

    sweep.pin_to_core(0)
  import jax

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  import bench_planner
  from cbs_jax import model as model_lib
  from cbs_jax import probes
  from cbs_jax import run_setup
  from configs import default as default_cfg

  config = default_cfg.get_config()
  config.noise.split_every = 0
  setup = run_setup.prepare(config)
  graphdef, params = model_lib.build(setup.model, seed=0)
  out = {"glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""), "jax": jax.__version__}
  for n in ns:
    run = bench_planner.round_fn(config, graphdef, params, setup, n)
    run()  # compiles
    probes.settle()
    run()
    rows = []
    for _ in range(rounds):
      r0 = resource.getrusage(resource.RUSAGE_SELF)
      gen, upd = run()
      r1 = resource.getrusage(resource.RUSAGE_SELF)
      rows.append((gen, upd, r1.ru_minflt - r0.ru_minflt, r1.ru_stime - r0.ru_stime))
    med = lambda i: statistics.median(r[i] for r in rows)
    out[str(n)] = dict(
        gen_s=med(0), update_s=med(1), round_s=med(0) + med(1), faults=med(2), sys_s=med(3)
    )
  return out


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ns", default="256,4096,16384")
  ap.add_argument("--repeats", type=int, default=3, help="processes per arm (alternating)")
  ap.add_argument("--rounds", type=int, default=3, help="timed rounds per N in each process")
  ap.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {list(ARMS)}")
  ap.add_argument(
      "--worker",
      action="store_true",
      help="run each process as a sweep worker (single-threaded XLA on one core)",
  )
  ap.add_argument("--quick", action="store_true", help="N = 64, one process per arm, 2 rounds")
  ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.quick:
    args.ns, args.repeats, args.rounds = "64", 1, 2
  ns = [int(x) for x in args.ns.split(",") if x]
  if args.child:
    print("CHILD " + json.dumps(child(ns, args.rounds, args.worker)), flush=True)
    return
  arms = [a for a in args.arms.split(",") if a]
  bad = [a for a in arms if a not in ARMS]
  if bad or "default" not in arms:
    ap.error(f"--arms: unknown {bad} (known: {list(ARMS)}); 'default' must be one of them")
  if args.repeats < 1 or args.rounds < 1:
    ap.error("--repeats and --rounds must be >= 1")

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  cmd = [sys.executable, os.path.abspath(__file__), "--child", f"--ns={args.ns}"]
  cmd += [f"--rounds={args.rounds}"] + (["--worker"] if args.worker else [])
  results = {a: [] for a in arms}
  t0 = time.perf_counter()
  for rep in range(args.repeats):
    for arm in arms:
      env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "MALLOC_ARENA_MAX")}
      env |= ARMS[arm]
      env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH", "")]))
      p = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True)
      line = [l for l in p.stdout.splitlines() if l.startswith("CHILD ")]
      if p.returncode or not line:
        sys.exit(f"arm {arm}: the child process failed (rc {p.returncode}):\n{p.stderr[-3000:]}")
      got = json.loads(line[0][6:])
      if got["glibc_tunables"] != ARMS[arm].get("GLIBC_TUNABLES", ""):
        sys.exit(f"arm {arm}: the child saw GLIBC_TUNABLES={got['glibc_tunables']!r}")
      results[arm].append(got)
      r = results[arm][-1]
      print(
          f"  repeat {rep + 1}/{args.repeats} {arm:>9}: "
          + ", ".join(f"N={n} {r[str(n)]['round_s'] * 1e3:.0f} ms" for n in ns),
          flush=True,
      )
  print(f"{len(arms) * args.repeats} processes in {time.perf_counter() - t0:.0f} s")
  print()
  print(
      f"{'arm':>10} {'N':>6} {'round ms':>9} {'speed-up':>9} {'gen':>6} {'update':>7} "
      f"{'faults/round':>13} {'sys ms/round':>13}"
  )
  res = []
  for arm in arms:
    for n in ns:
      k = str(n)
      cell = lambda part, a=arm: [r[k][part] for r in results[a]]
      sp = {
          part: statistics.median(d / x for d, x in zip(cell(part, "default"), cell(part)))
          for part in ("round_s", "gen_s", "update_s")
      }
      print(
          f"{arm:>10} {n:>6} {statistics.median(cell('round_s')) * 1e3:>9.1f} "
          f"{sp['round_s']:>9.3f} {sp['gen_s']:>6.3f} {sp['update_s']:>7.3f} "
          f"{statistics.median(cell('faults')):>13,.0f} {statistics.median(cell('sys_s')) * 1e3:>13.1f}"
      )
      if arm != "default":
        res.append(f"{arm}_speedup_n{n}={sp['round_s']:.3f}")
  print("speed-up: default seconds / the arm's, median over the repeats (gen, update: by part)")
  print("RESULT " + " ".join(res))


if __name__ == "__main__":
  main()
