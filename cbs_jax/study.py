"""Batch-size studies: from sweeps of runs to steps-to-target, curves and fits.

A study is a sweep (``cbs_jax.sweep``) over batch size N (and seeds, and
whatever else the study varies) of runs that evaluate the held-out exact
expected pass rate (``eval_expected_pass``; the sampled rate where a task
cannot enumerate its answers) every few rounds. This module reads their
``metrics.jsonl`` and turns them into what the batch-size law is fitted on:

* ``run_curve``: the learning curve of one run, indexed by generation
  rounds, optimizer steps and rollouts generated.
* ``to_target``: steps-to-target S (generation rounds and optimizer steps)
  and rollouts-to-target E = S * N at each target, linearly interpolated
  between the two evaluations around the first crossing (``batch_law.
  steps_to_target``); None where the run never reached it.
* ``seed_interval``: mean and a t-interval over seeds (seeds are the
  replicates; with 3 seeds the interval is wide, as it should be).
* ``mean_curve``: the mean curve over seeds on a common x grid, with the
  range across seeds.
* ``parser`` / ``parse``: the study scripts' shared command line (--root,
  --on_root, --out, --workers, --quick) and where --quick puts things.

Evaluations happen every ``eval_every`` rounds, so S is resolved to a
fraction of that; studies pick eval_every so that every run has tens of
evaluations before its target (see ``configs/batch_law.py``).
"""
from __future__ import annotations

import argparse
import math
import os
import tempfile
from typing import Sequence

import numpy as np

from cbs_jax import batch_law
from cbs_jax import config as config_lib
from cbs_jax import metrics as metrics_lib

SCORE_KEYS = ("eval_expected_pass", "eval_pass_rate")
ON_ROOT = "runs/batch_law_on"         # the on-policy study's sweep root, read by the others
RESULTS = "experiments/results"       # results parent folder


def parser(doc: str, name: str, root_help: str, on_root_help: str | None = None,
           workers: bool = True, root: str | None = None,
           quick_root: str | None = None) -> argparse.ArgumentParser:
  """The shared command line of a study script ``name``: --root (default
  ``runs/<name>``), --on_root when the study reads the on-policy sweep back
  (``on_root_help``), --out, --workers (runs at once, each single-threaded
  on its own core) and --quick; add the study's own flags, then ``parse``."""
  ap = argparse.ArgumentParser(description=doc,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  quick_root = quick_root or f"runs_{name}"
  ap.add_argument("--root", default=root or f"runs/{name}",
                  help=f"{root_help} (--quick: <out>/{quick_root} unless given)")
  if on_root_help:
    ap.add_argument("--on_root", default=ON_ROOT,
                    help=f"{on_root_help} (--quick: <out>/runs_on unless given; its quick "
                         "sweep is made there if missing)")
  ap.add_argument("--out", default=RESULTS,
                  help="results parent folder (--quick: a fresh temp folder)")
  if workers:
    ap.add_argument("--workers", type=int, default=2,
                    help="runs at once, each single-threaded on its own core")
  ap.add_argument("--quick", action="store_true", help="tiny smoke version (minutes)")
  ap.set_defaults(_quick_root=quick_root)
  return ap


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
  """Parse a ``parser``'s flags; with --quick, what was not given goes under
  --out (itself a fresh temp folder unless given): the sweep root to
  ``<out>/<quick root>``, the on-policy root to ``<out>/runs_on``."""
  args = ap.parse_args(argv)
  if args.quick:
    if args.out == RESULTS:
      args.out = tempfile.mkdtemp(prefix="cbs_quick_")
    if args.root == ap.get_default("root"):
      args.root = os.path.join(args.out, args._quick_root)
    if getattr(args, "on_root", None) == ON_ROOT:
      args.on_root = os.path.join(args.out, "runs_on")
  if getattr(args, "workers", 1) < 1:
    ap.error(f"--workers={args.workers} must be >= 1")
  return args


def score_of(row: dict) -> float | None:
  """The pass rate a target is judged on: exact expected where measured."""
  for k in SCORE_KEYS:
    if row.get(k) is not None:
      return float(row[k])
  return None


def run_curve(workdir: str) -> dict:
  """The learning curve of the run in ``workdir``: arrays ``rounds``,
  ``steps`` (optimizer steps), ``rollouts`` and ``value`` (the score) at
  every evaluation, round 0 (the base policy) included."""
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  if not rows:
    raise ValueError(f"{workdir} holds no metrics.jsonl rows")
  out = dict(rounds=[], steps=[], rollouts=[], value=[])
  steps = 0
  for r in rows:
    steps += int(r.get("num_updates", 0) or 0)
    v = score_of(r)
    if v is None:
      continue
    out["rounds"].append(int(r["round"]))
    out["steps"].append(steps)
    out["rollouts"].append(int(r.get("rollouts_seen", 0) or 0))  # this round's included
    out["value"].append(v)
  return {k: np.asarray(v, np.float64) for k, v in out.items()}


def to_target(curve: dict, targets: Sequence[float]) -> dict:
  """``{target: dict(rounds, steps, rollouts)}`` to reach each target
  (interpolated; None when never reached)."""
  out = {}
  for t in targets:
    out[float(t)] = {k: batch_law.steps_to_target(curve[k], curve["value"], t)
                     for k in ("rounds", "steps", "rollouts")}
  return out


def time_to_target(workdir: str, target: float) -> dict | None:
  """The logged seconds of the run in ``workdir`` up to the first
  evaluation at or above ``target``, split by what they paid for (None
  when the target was never reached):

  * ``train``: generation + update seconds, the first round counted at the
    median of the later rounds (the steady-state cost a throughput
    benchmark predicts);
  * ``compile``: the first round's excess over that median (tracing and
    XLA compilation, paid once per run);
  * ``eval``: the evaluations' seconds (measurement, not training);
  * ``total``: their sum, i.e. everything the run logged;
  * ``rollouts``: rollouts generated by the crossing round, and ``rounds``.
  """
  rows = [r for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
          if int(r.get("round", 0)) > 0]
  work, evals = [], 0.0
  for r in rows:
    work.append(float(r.get("gen_seconds", 0.0)) + float(r.get("update_seconds", 0.0)))
    evals += float(r.get("eval_expected_seconds", 0.0)) + float(r.get("eval_sampled_seconds",
                                                                      0.0))
    s = score_of(r)
    if s is not None and s >= target:
      steady = float(np.median(work[1:])) if len(work) > 1 else work[0]
      first = min(work[0], steady)
      return dict(train=first + sum(work[1:]), compile=work[0] - first, eval=evals,
                  total=sum(work) + evals, rollouts=int(r["rollouts_seen"]),
                  rounds=int(r["round"]))
  return None


def seed_interval(values, level: float = 0.9) -> dict:
  """Mean over seeds with a Student-t ``level`` interval; ``n`` counts the
  finite values (a seed that never reached the target is a None: the mean
  is then None, because a missing seed is not a fast seed)."""
  vals = [v for v in values]
  n = len(vals)
  if n == 0 or any(v is None or not math.isfinite(v) for v in vals):
    return dict(mean=None, lo=None, hi=None, n=sum(v is not None for v in vals), sd=None)
  x = np.asarray(vals, np.float64)
  m = float(x.mean())
  if n < 2:
    return dict(mean=m, lo=None, hi=None, n=n, sd=None)
  from scipy import stats as sps  # pylint: disable=import-outside-toplevel
  sd = float(x.std(ddof=1))
  h = float(sps.t.ppf((1 + level) / 2, n - 1)) * sd / math.sqrt(n)
  return dict(mean=m, lo=m - h, hi=m + h, n=n, sd=sd)


def mean_curve(curves: Sequence[dict], x: str = "rollouts", points: int = 60) -> dict:
  """Mean, min and max of ``value`` over ``curves`` on a common grid of
  ``x`` (log-spaced from the first positive x to the shortest curve's end;
  each curve linearly interpolated)."""
  ends = [c[x][-1] for c in curves if len(c[x])]
  starts = [c[x][c[x] > 0][0] for c in curves if np.any(c[x] > 0)]
  if not ends or not starts:
    return dict(x=np.array([]), mean=np.array([]), lo=np.array([]), hi=np.array([]))
  lo_x, hi_x = max(starts), min(ends)
  grid = np.geomspace(lo_x, max(hi_x, lo_x), points)
  ys = np.stack([np.interp(grid, c[x], c["value"]) for c in curves])
  return dict(x=grid, mean=ys.mean(0), lo=ys.min(0), hi=ys.max(0))


# ------------------------------------------------------------------ sweeps

def prepare_base(config, root: str) -> None:
  """Build (or find) the sweep's shared SFT base before any run starts, so
  parallel workers never build it twice. ``config.sft.base_dir`` is
  relative to a run's workdir (``root/<run>``), e.g. "../sft_base"."""
  from cbs_jax import train  # pylint: disable=import-outside-toplevel
  setup = train.prepare(config)
  train.sft_base(config, os.path.join(root, "_base_probe"), setup)


def run_study(config, overrides, root: str, workers: int = 1, progress: bool = True):
  """Run (or resume, or read back) the sweep of ``overrides`` on ``config``
  under ``root``: the SFT base first, then every run (``sweep.run_sweep``)."""
  from cbs_jax import sweep  # pylint: disable=import-outside-toplevel
  prepare_base(config, root)
  return sweep.run_sweep(config, overrides, root, workers=workers, progress=progress)


def read_finished(overrides, root: str) -> list[dict]:
  """The rows of a sweep that another command runs (never started here):
  every run of ``overrides`` under ``root`` must have finished (its
  ``summary.json`` exists); ValueError naming the first missing ones."""
  import json  # pylint: disable=import-outside-toplevel
  from cbs_jax import sweep  # pylint: disable=import-outside-toplevel
  rows, missing = [], []
  for o in overrides:
    name = sweep.run_name(o)
    wd = os.path.join(root, name)
    path = os.path.join(wd, "summary.json")
    if not os.path.exists(path):
      missing.append(name)
      continue
    with open(path) as f:
      rows.append(dict(name=name, overrides=o, workdir=wd, summary=json.load(f)))
  if missing:
    raise ValueError(f"{len(missing)} of {len(overrides)} runs under {root} have not "
                     f"finished (e.g. {missing[:3]}): run their study first")
  return rows


def collect(rows, targets: Sequence[float], config=None) -> list[dict]:
  """One record per finished run of a sweep: batch shape, seed, updates per
  round, the learning curve and ``to_target`` at each target."""
  out = []
  for row in rows:
    o = row["overrides"]
    cfg = config
    P = o.get("batch.num_prompts", cfg.batch.num_prompts if cfg else None)
    K = o.get("batch.rollouts_per_prompt", cfg.batch.rollouts_per_prompt if cfg else None)
    m = o.get("batch.num_minibatches", cfg.batch.num_minibatches if cfg else 1) * \
        o.get("batch.num_epochs", cfg.batch.num_epochs if cfg else 1)
    curve = run_curve(row["workdir"])
    out.append(dict(name=row["name"], N=P * K, P=P, K=K, seed=o.get("seed", 0),
                    updates_per_round=m, lr=o.get("optim.lr"), curve=curve,
                    to_target=to_target(curve, targets), summary=row.get("summary") or {}))
  return out


def fit_targets(records, targets, x: str = "rounds", n_boot: int = 2000,
                seed: int = 0) -> dict:
  """``{target: fit}``: ``batch_law.fit_critical_batch`` of steps-to-target
  (``x`` = "rounds" or "steps") against N, seeds as replicates; a fit that
  cannot be made (too few batch sizes reached the target) is
  ``dict(error=...)`` with the reason."""
  out = {}
  for t in targets:
    t = float(t)
    n = [r["N"] for r in records]
    s = [r["to_target"][t][x] for r in records]
    sd = [r["seed"] for r in records]
    try:
      out[t] = batch_law.fit_critical_batch(n, s, sd, n_boot=n_boot, seed=seed)
    except ValueError as e:
      out[t] = dict(error=str(e), resolved=False, verdict="unresolved")
  return out


def write_runs_csv(path: str, records, targets) -> None:
  """One CSV line per run: shape, seed, updates per round, and rounds /
  steps / rollouts to each target (empty where never reached)."""
  import csv  # pylint: disable=import-outside-toplevel
  cols = ["name", "N", "P", "K", "seed", "updates_per_round", "lr"] + [
      f"{x}@{float(t)}" for t in targets for x in ("rounds", "steps", "rollouts")]
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=cols)
    w.writeheader()
    for r in records:
      row = {k: r.get(k) for k in cols[:7]}
      for t in targets:
        for x in ("rounds", "steps", "rollouts"):
          row[f"{x}@{float(t)}"] = r["to_target"][float(t)][x]
      w.writerow(row)


def per_batch_rows(records, targets, key=lambda r: r["N"]) -> list[dict]:
  """Table rows per group (default: per N): for each target the mean
  rounds-, steps- and rollouts-to-target over seeds with t-intervals, and
  how many seeds reached it."""
  groups: dict = {}
  for r in records:
    groups.setdefault(key(r), []).append(r)
  rows = []
  for g, rs in sorted(groups.items()):
    row = dict(group=g, N=rs[0]["N"], K=rs[0]["K"], P=rs[0]["P"], seeds=len(rs),
               updates_per_round=rs[0]["updates_per_round"])
    for t in targets:
      t = float(t)
      for x in ("rounds", "steps", "rollouts"):
        iv = seed_interval([r["to_target"][t][x] for r in rs])
        row[f"{x}@{t}"] = iv["mean"]
        row[f"{x}@{t}_lo"], row[f"{x}@{t}_hi"] = iv["lo"], iv["hi"]
      row[f"reached@{t}"] = sum(r["to_target"][t]["rounds"] is not None for r in rs)
    rows.append(row)
  return rows


# ------------------------------------------------------------------ reports

def summary_table(table_rows, targets, x: str = "rounds", x_label: str = "rounds",
                  extra=()) -> tuple[list[dict], list[str]]:
  """Formatted per-N rows (``per_batch_rows``) and their columns: S in
  ``x`` units and E in rollouts per target, ``mean [lo, hi]`` over seeds."""
  from cbs_jax import stats  # pylint: disable=import-outside-toplevel
  cols = ["N", "P", "K", "seeds", *extra]
  show = []
  for r in table_rows:
    d = {k: r.get(k) for k in cols}
    for t in targets:
      t = float(t)
      d[f"S@{t} ({x_label})"] = stats.fmt(r[f"{x}@{t}"], r[f"{x}@{t}_lo"], r[f"{x}@{t}_hi"])
      d[f"E@{t} (rollouts)"] = stats.fmt(r[f"rollouts@{t}"], r[f"rollouts@{t}_lo"],
                                         r[f"rollouts@{t}_hi"])
      d[f"reached@{t}"] = f"{r[f'reached@{t}']}/{r['seeds']}"
    show.append(d)
  for t in targets:
    t = float(t)
    cols += [f"S@{t} ({x_label})", f"E@{t} (rollouts)", f"reached@{t}"]
  return show, cols


def fit_lines(fits, x_label: str = "rounds") -> list[str]:
  """Markdown table lines of ``{target: fit}``."""
  from cbs_jax import stats  # pylint: disable=import-outside-toplevel
  lines = [f"| target | B_crit (rollouts) | S_min ({x_label}) | E_min (rollouts) | verdict |",
           "|---|---|---|---|---|"]
  for t, f in fits.items():
    if "error" in f:
      lines.append(f"| {t} | – | – | – | unresolved: {f['error']} |")
      continue
    lines.append(
        f"| {t} | {stats.fmt(f['B_crit'], f['B_crit_lo'], f['B_crit_hi'])} | "
        f"{stats.fmt(f['S_min'], f['S_min_lo'], f['S_min_hi'])} | "
        f"{stats.fmt(f['E_min'], f['E_min_lo'], f['E_min_hi'])} | {f['verdict']}"
        f"{': ' + f['why'] if f['why'] else ''} |")
  return lines


def save_fits(path: str, fits_by_name: dict, **extra) -> None:
  """Fits (without their bootstrap replicates) and extras as JSON."""
  import json  # pylint: disable=import-outside-toplevel
  doc = {name: {str(t): {k: v for k, v in f.items() if k != "boot_B_crit"}
                for t, f in fits.items()} for name, fits in fits_by_name.items()}
  with open(path, "w") as fh:
    json.dump(doc | extra, fh, indent=1, default=float)


def law_figures(out, records, fit, target: float, title: str, x: str = "rounds",
                step_label: str = "generation rounds", b_noise=None, prefix: str = "") -> None:
  """The S(N) figure, the S-E Pareto and the learning curves (mean and
  range over seeds per N, by rollouts and by ``x``) of one study."""
  from cbs_jax import plots  # pylint: disable=import-outside-toplevel
  pts = [dict(N=r["N"], S=r["to_target"][target][x], E=r["to_target"][target]["rollouts"],
              seed=r["seed"]) for r in records]
  fit = None if fit is None or "error" in fit else fit
  plots.save(plots.steps_vs_batch(pts, fit, title=f"{title}, target {target}",
                                  step_label=step_label, b_noise=b_noise),
             out.path(f"{prefix}.png"))
  if any(p["S"] is not None for p in pts):
    plots.save(plots.pareto(pts, fit, title=f"{title}, target {target}",
                            step_label=step_label), out.path(f"{prefix}_pareto.png"))
  curves = []
  for N in sorted({r["N"] for r in records}):
    rs = [r for r in records if r["N"] == N]
    byr = mean_curve([r["curve"] for r in rs], "rollouts")
    if len(byr["x"]):
      per_step = rs[0]["curve"][x][-1] / max(rs[0]["curve"]["rollouts"][-1], 1)
      curves.append(dict(label=f"N={N}", rollouts=byr["x"], steps=byr["x"] * per_step,
                         value=byr["mean"], lo=byr["lo"], hi=byr["hi"]))
  plots.save(plots.learning_curves(curves, target=None, title=f"{title} (mean and range "
                                   "over seeds)", step_label=step_label, logx=True),
             out.path(f"{prefix}_curves.png"))


def overrides_between(base, other) -> dict:
  """The dotted fields (and values) where config ``other`` differs from
  ``base``: what ``sweep.apply_overrides(base, ...)`` needs to make it."""
  from cbs_jax import sweep  # pylint: disable=import-outside-toplevel
  fa = sweep._flatten(sweep._as_json(base))  # pylint: disable=protected-access
  fb = sweep._flatten(sweep._as_json(other))  # pylint: disable=protected-access
  if set(fa) != set(fb):
    raise ValueError(f"configs differ in their fields: {sorted(set(fa) ^ set(fb))}")
  return {k: config_lib.get_path(other, k) for k in sorted(fa) if fa[k] != fb[k]}


def run_variants(configs: dict, root: str, workers: int = 1, progress: bool = True):
  """Run named config variants that share an SFT base (``config.sft.base_dir``
  = "../sft_base") as one resumable sweep under ``root`` (run ``name`` in
  ``root/name``), ``workers`` at a time. Returns ``{name: row}``."""
  names = list(configs)
  base = configs[names[0]]
  over = [overrides_between(base, configs[n]) for n in names]
  prepare_base(base, root)
  from cbs_jax import sweep  # pylint: disable=import-outside-toplevel
  rows = sweep.run_sweep(base, over, root, names=names, workers=workers, progress=progress)
  return dict(zip(names, rows))
