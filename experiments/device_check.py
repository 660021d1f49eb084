"""Everything an accelerator session should measure, as one command.

    python experiments/device_check.py --out=$OUT          # <= 8 min on one GPU / TPU chip
    python experiments/device_check.py --quick --out=/tmp/dc   # CPU smoke run (test suite)

Why one script: an accelerator is lent rarely and briefly (docs/planner.md, "Latency floors"; the device is lent to some sessions only), so
the checks are prepared here, ordered by what they decide, and each runs in
its own subprocess under a share of one time budget: a step that fails or
runs out of time is recorded as such and the next one starts, so one broken
step never costs the rest.

Steps (in this order; the shapes are ``model.PRESETS``: 25M and Qwen2.5-0.5B
dimensions, random init, bfloat16 compute and weights; the 1.07M sampler
model in float32 as in the CPU benchmark):

1. ``grpo_25m``: 20 GRPO rounds of the quickstart task (``configs/default.py``,
   a short SFT base first) with the 25M shape: the whole trainer end to end on
   the device; seconds per round (median) and rollouts/s from its metrics.
2. ``sampler_1m``: ``bench_sampler.py`` at B = 64 / 256 / 1,024 (its RESULT:
   tokens/s, speed-up over recompute, fraction of the decode roofline), with
   ``--profile``: the device time of the largest batch by kernel kind.
3. ``update``: ``bench_scale.py`` at quickstart, 1m, 25m and Qwen2.5-0.5B
   shapes (MFU of the RL update against a matmul timed in the same run).
4. ``noise_quickstart``: ``bench_noise.py`` at the quickstart shape (split
   tracker and ghost-norm overheads over a plain gradient).
5. ``sampler_25m`` and ``sampler_qwen``: the sampler at 25M and Qwen2.5-0.5B.
6. ``noise_25m`` and ``noise_qwen``: the noise instruments at those shapes.
7. ``scan_update``: ``bench_update.py`` (scanned round vs host loop).
8. ``planner``: ``bench_planner.py`` at N = 64 / 1,024 / 16,384: this device's
   latency floors (``floors.Probes``) and the planner's predicted against
   measured rollouts/s.

Before any step it checks that every requirement of the package imports
(``REQUIREMENTS``, setup.py's ``install_requires``) and, if one does not,
names it and stops (exit 2) instead of spending the budget on steps that
would all fail. An accelerator image often brings its own JAX, Flax and
Optax but not every small requirement; ml-collections and tensorboardX are
pure Python, so on a machine without a package index their wheels can be
downloaded elsewhere and installed there without it:

    pip download --no-deps ml-collections tensorboardX -d wheels      # anywhere
    pip install --no-index --no-deps --target /tmp/site wheels/*.whl  # on the machine
    PYTHONPATH=/tmp/site python experiments/device_check.py --out=DIR

Its children run with the repository on ``PYTHONPATH``, so the package
itself need not be installed. The versions found go into the report.

Output: each step's full log ``<out>/<step>.log``, and ``<out>/device_check.json``
(device kind, jax version, per step: status ok / failed / timeout / skipped,
seconds, its RESULT fields). The lines printed last are one
``RESULT device_check_<step> key=value ...`` per step that gave one, and

    RESULT device_check device=<device kind> ok=<steps ok>/<steps>
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# the 25M shape's sizes given to the trainer (the task keeps its vocabulary)
PRESET_FLAGS = ("d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff")


# setup.py's install_requires (pip name -> the module it is imported as)
REQUIREMENTS = {
    "jax": "jax",
    "flax": "flax",
    "optax": "optax",
    "orbax-checkpoint": "orbax.checkpoint",
    "etils": "etils.epath",
    "numpy": "numpy",
    "scipy": "scipy",
    "ml-collections": "ml_collections",
    "absl-py": "absl",
    "tqdm": "tqdm",
    "tensorboardX": "tensorboardX",
    "matplotlib": "matplotlib",
}


def _found(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ImportError:  # a parent package is missing
    return False


def check_requirements(requirements: dict | None = None) -> tuple[list[str], dict]:
  """(the pip names whose module is not found here, {pip name: version} of
  those found; "?" where a module is found without package metadata), for
  ``requirements`` (default ``REQUIREMENTS``)."""
  missing, versions = [], {}
  for name, module in (REQUIREMENTS if requirements is None else requirements).items():
    if not _found(module):
      missing.append(name)
      continue
    try:
      versions[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      versions[name] = "?"
  return missing, versions


def missing_message(missing: list[str], requirements: dict | None = None) -> str:
  modules = REQUIREMENTS if requirements is None else requirements
  names = " ".join(missing)
  return (
      "missing requirements: "
      + ", ".join(f"{n} (import {modules[n]})" for n in missing)
      + f". Install them (pip install {names}); on a machine without a package index, "
      f"download their wheels elsewhere (pip download --no-deps {names} -d wheels) and install "
      "those there (pip install --no-index --no-deps --target /tmp/site wheels/*.whl, then "
      "PYTHONPATH=/tmp/site): see this script's doc"
  )


def _bench(script: str, *args: str) -> list[str]:
  return [sys.executable, os.path.join(HERE, script), *args]


def grpo_command(workdir: str, quick: bool) -> list[str]:
  """The trainer's CLI on the quickstart config with the 25M shape (the
  task's vocabulary kept) in bfloat16; ``quick``: the smoke config."""
  from cbs_jax import model  # pylint: disable=import-outside-toplevel

  cfg = os.path.join(ROOT, "configs", "default.py") + (":smoke" if quick else "")
  cmd = [sys.executable, "-m", "cbs_jax.main", f"--config={cfg}", f"--workdir={workdir}"]
  if quick:
    return cmd + ["--config.train.num_rounds=3"]
  shape = model.PRESETS["25m"]
  cmd += [f"--config.model.{k}={shape[k]}" for k in PRESET_FLAGS]
  return cmd + [
      "--config.model.dtype=bfloat16",
      "--config.model.param_dtype=bfloat16",
      "--config.sft.steps=300",
      "--config.sft.eval_every=0",
      "--config.train.num_rounds=20",
      "--config.train.eval_every=10",
  ]


def steps(out: str, quick: bool) -> list[tuple[str, list[str], float]]:
  """(name, command, share of the budget) in priority order."""
  bf = "--dtype=bfloat16"
  if quick:
    return [
        ("grpo_25m", grpo_command(os.path.join(out, "grpo_25m"), True), 0.4),
        ("sampler_1m", _bench("bench_sampler.py", "--quick"), 0.2),
        ("noise_quickstart", _bench("bench_noise.py", "--quick", "--no_ghost"), 0.2),
        ("update", _bench("bench_scale.py", "--quick", "--cases=quickstart,25m"), 0.2),
    ]
  return [
      ("grpo_25m", grpo_command(os.path.join(out, "grpo_25m"), False), 0.22),
      ("sampler_1m", _bench("bench_sampler.py", "--runs=5", "--profile"), 0.1),
      (
          "update",
          _bench("bench_scale.py", bf, "--repeats=5", "--cases=quickstart,1m,25m,qwen2.5-0.5b"),
          0.12,
      ),
      ("noise_quickstart", _bench("bench_noise.py", "--repeats=7"), 0.1),
      ("sampler_25m", _bench("bench_sampler.py", "--model=25m", bf, "--runs=3", "--profile"), 0.1),
      (
          "sampler_qwen",
          _bench("bench_sampler.py", "--model=qwen2.5-0.5b", bf, "--runs=3", "--batches=64,256"),
          0.1,
      ),
      ("noise_25m", _bench("bench_noise.py", "--model=25m", bf, "--repeats=5"), 0.08),
      (
          "noise_qwen",
          _bench("bench_noise.py", "--model=qwen2.5-0.5b", bf, "--repeats=3", "--no_ghost"),
          0.08,
      ),
      ("scan_update", _bench("bench_update.py", "--repeats=5"), 0.1),
      # the planner's floors on this device, and its prediction against real rounds
      ("planner", _bench("bench_planner.py", "--ns=64,1024,16384", "--repeats=3"), 0.08),
  ]


def parse_result(text: str) -> dict:
  """The fields of the last ``RESULT k=v ...`` line of ``text`` (floats where
  they parse)."""
  lines = [l for l in text.splitlines() if l.startswith("RESULT ")]
  if not lines:
    return {}
  fields = {}
  for tok in lines[-1].split()[1:]:
    k, _, v = tok.partition("=")
    try:
      fields[k] = float(v)
    except ValueError:
      fields[k] = v
  return fields


def grpo_summary(workdir: str) -> dict:
  """Median seconds per round (generation + update) and rollouts/s from a
  run's metrics (round 0, the base policy's eval, and the first round, which
  compiles, left out)."""
  rows = []
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      r = json.loads(line)
      if r.get("round", 0) >= 2 and "gen_seconds" in r:
        rows.append(r)
  if not rows:
    return {"rounds_logged": 0}
  secs = [r["gen_seconds"] + r.get("update_seconds", 0.0) for r in rows]
  med = statistics.median(secs)
  return {
      "rounds_logged": len(rows),
      "round_seconds": med,
      "rollouts_per_s": rows[-1]["batch_size"] / med,
      "tokens_per_s": statistics.median(r["tokens_per_s"] for r in rows),
  }


def run_step(name, cmd, timeout, out) -> dict:
  env = dict(
      os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))
  )
  t = time.perf_counter()
  log = os.path.join(out, f"{name}.log")
  print(f"[{name}] {' '.join(cmd[1:])} (limit {timeout:.0f} s)", flush=True)
  with open(log, "w") as f:
    try:
      p = subprocess.run(
          cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, check=False
      )
      status = "ok" if p.returncode == 0 else f"failed (exit {p.returncode})"
    except subprocess.TimeoutExpired:
      status = "timeout"
  with open(log) as f:
    text = f.read()
  rec = {"status": status, "seconds": time.perf_counter() - t, "result": parse_result(text)}
  if name == "grpo_25m" and status == "ok":
    rec["result"] = grpo_summary(os.path.join(out, name))
  if status != "ok":
    rec["log_tail"] = text[-1500:]
  print(f"[{name}] {status} in {rec['seconds']:.0f} s: {rec['result']}", flush=True)
  return rec


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="device_check", help="folder for logs and the JSON summary")
  ap.add_argument("--budget_s", type=float, default=480.0, help="time budget of all steps")
  ap.add_argument("--only", default="", help="comma-separated step names (default: all)")
  ap.add_argument("--quick", action="store_true", help="tiny CPU smoke version (test suite)")
  args = ap.parse_args(argv)
  if args.budget_s <= 0:
    ap.error(f"--budget_s must be positive, got {args.budget_s}")
  os.makedirs(args.out, exist_ok=True)
  plan = steps(os.path.abspath(args.out), args.quick)
  if args.only:
    names = args.only.split(",")
    unknown = sorted(set(names) - {s[0] for s in plan})
    if unknown:
      ap.error(f"--only: unknown steps {unknown}; known: {[s[0] for s in plan]}")
    plan = [s for s in plan if s[0] in names]

  missing, versions = check_requirements()
  if missing:
    print(missing_message(missing), file=sys.stderr, flush=True)
    return 2
  import jax  # pylint: disable=import-outside-toplevel

  dev = jax.devices()[0]
  device = f"{dev.device_kind} ({dev.platform}, {jax.device_count()} device(s))"
  print(f"device: {device}; " + ", ".join(f"{k} {v}" for k, v in versions.items()), flush=True)
  start = time.perf_counter()
  total_share = sum(s[2] for s in plan)
  report = {
      "device": device,
      "jax": jax.__version__,
      "versions": versions,
      "budget_s": args.budget_s,
      "steps": {},
  }
  for i, (name, cmd, share) in enumerate(plan):
    left = args.budget_s - (time.perf_counter() - start)
    later = sum(s[2] for s in plan[i + 1 :])
    # its share, plus whatever earlier steps left unused, minus the later steps' shares
    limit = max(left - args.budget_s * later / total_share, args.budget_s * share / total_share)
    limit = min(limit, left)
    if limit < 1:
      report["steps"][name] = {"status": "skipped (budget spent)", "result": {}}
      continue
    report["steps"][name] = run_step(name, cmd, limit, args.out)
    with open(os.path.join(args.out, "device_check.json"), "w") as f:
      json.dump(report, f, indent=1)
  ok = sum(r["status"] == "ok" for r in report["steps"].values())
  report["wall_s"] = time.perf_counter() - start
  with open(os.path.join(args.out, "device_check.json"), "w") as f:
    json.dump(report, f, indent=1)
  for name, r in report["steps"].items():
    if r["result"]:
      fields = " ".join(
          f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in r["result"].items()
      )
      print(f"RESULT device_check_{name} {fields}")
  print(f"RESULT device_check device={dev.device_kind.replace(' ', '_')} ok={ok}/{len(plan)}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
