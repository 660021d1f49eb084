"""Adaptive batch size against fixed N: does the noise-driven controller earn
its place?

    python experiments/adaptive_batch.py \\
        --throughput=experiments/results/throughput_decision/throughput.json   # (~1-2 h)
    python experiments/adaptive_batch.py --quick                               # (minutes)

Arms, every run from the same SFT base and ``--seeds`` (>= 3) as replicates:

* adaptive:<signal> -- ``configs/adaptive_batch.py:<signal>`` for each of
  ``--signals`` (b_noise, b_noise_adam, b_crit): GRPO starting at the config
  default N = 256, the controller (``cbs_jax.controller.AdaptiveBatch``) moving N
  over power-of-two buckets from the tracker's interval, lr by the sqrt rule
  from the chosen N. The b_crit signal's ratio B_crit / B_noise comes from
  the on-policy study's fit (``--fits``) when that fit is resolved, else
  from the committed default in ``configs/adaptive_batch.py`` (said in the
  output).
* fixed small / best / large / default -- runs of the on-policy study
  (``configs/batch_law.py:on``), read back from ``--on_root``, never rerun
  here: small and large are the ends of its grid (or ``--small_n`` /
  ``--large_n``), default is the config default N = 256, best is the N with
  the least mean time-to-target at the main target in hindsight (wall clock
  with ``--throughput``, else rollouts). The adaptive runs start from that
  study's SFT base (``<on_root>/sft_base``).

Per arm and target (held-out exact expected pass rate, ``batch_law.TARGETS``):
rollouts-to-target and, with ``--throughput``, wall-clock-to-target, each the
mean over seeds with a 90% t-interval; the ratio of each adaptive arm to the
best fixed and to the default fixed arm with a 90% bootstrap interval
(seeds resampled within each arm). Wall clock is modelled, not measured:
each round costs N / rate(N) seconds with rate(N) the throughput
benchmark's rollouts/s at that N (log-log interpolation between the
measured N, the nearest end outside them), so a shared machine's load does
not decide it. Without a throughput file the output says so and reports
rollouts only.

Evaluation grid: the on-policy runs evaluate about every 2,048 rollouts
(every round above N = 2,048). An adaptive run's N changes, so it is
evaluated at the first round whose rollouts reach each multiple of
``configs/adaptive_batch.py``'s EVAL_GRID -- the same rule -- so that both
are judged on the same grid (a finer grid finds a noisy first crossing
earlier).

Goal (issue 15): adaptive within 10% of the best fixed N's time-to-target and
faster than the default fixed N. Each verdict is "met" / "not met" only when
the ratio's interval lies on one side of the threshold, else "unresolved".

Writes <out>/adaptive_batch/: the table (.md, .csv), ``_runs.csv`` (one line
per run), ``_n_<signal>.png`` (N over training beside the signal and its
interval, seed 0), ``_curves.png`` (learning curves per arm), manifest.json.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time

import numpy as np
from absl import logging

from cbs_jax import batch_law as batch_law_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from cbs_jax import sweep
from configs import adaptive_batch
from configs import batch_law

NAME = "adaptive_batch"
NEAR = 1.10  # the goal: within 10% of the best fixed N
TRAJ = "_traj.csv"  # the adaptive runs' N and signal per round
LEVEL = 0.9


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "sweep root of the adaptive runs",
      on_root_help="the on-policy study's sweep root: its finished runs are " "the fixed arms",
      replot=True,
  )
  ap.add_argument(
      "--throughput",
      default="experiments/results/throughput_decision/throughput.json",
      help='JSON of per-N rates, {"N": [...], "rollouts_per_s": [...]} (or a list '
      "of such records); absent: rollouts only",
  )
  ap.add_argument(
      "--fits",
      default=adaptive_batch.B_CRIT_FITS,
      help="the on-policy study's fits (B_crit / B_noise for the b_crit signal)",
  )
  ap.add_argument(
      "--signals",
      default=",".join(adaptive_batch.SIGNALS),
      help="controller signals to run, comma-separated",
  )
  ap.add_argument(
      "--seeds",
      default=None,
      help="seeds (replicates), comma-separated (default 0,1,2; --quick: 0,1)",
  )
  ap.add_argument("--small_n", type=int, default=0, help="small fixed N (0: the grid's least)")
  ap.add_argument("--large_n", type=int, default=0, help="large fixed N (0: the grid's largest)")
  args = study_runner.parse(ap, argv)
  args.signals = [s for s in args.signals.split(",") if s]
  bad = [s for s in args.signals if s not in adaptive_batch.SIGNALS]
  if bad or not args.signals:
    ap.error(f"--signals: unknown {bad}; known: {list(adaptive_batch.SIGNALS)}")
  args.seeds = [int(s) for s in (args.seeds or ("0,1" if args.quick else "0,1,2")).split(",") if s]
  if len(set(args.seeds)) < 2:
    ap.error("--seeds: need at least two seeds for an interval (three for the study)")
  return args


# ------------------------------------------------------------------ throughput


def load_throughput(path: str | None):
  """``{N: rollouts/s}`` from the benchmark's JSON, or None when absent."""
  if not path or not os.path.exists(path):
    return None
  with open(path) as f:
    doc = json.load(f)
  if isinstance(doc, dict) and "rows" in doc:
    doc = doc["rows"]
  if isinstance(doc, dict):
    pairs = zip(doc["N"], doc["rollouts_per_s"])
  else:
    pairs = ((r["N"], r["rollouts_per_s"]) for r in doc)
  rates = {int(n): float(r) for n, r in pairs}
  bad = {n: r for n, r in rates.items() if not (n > 0 and r > 0 and math.isfinite(r))}
  if bad or not rates:
    raise ValueError(f"{path}: rates must be positive and finite, got {bad or rates}")
  return rates


class Rate:
  """rollouts/s at any N: log-log interpolation between the measured N, the
  nearest measured rate outside them (those N are listed in ``outside``)."""

  def __init__(self, rates: dict):
    self.n = np.array(sorted(rates), np.float64)
    self.r = np.array([rates[int(n)] for n in self.n], np.float64)
    self.outside = set()

  def __call__(self, N: float) -> float:
    if N < self.n[0] or N > self.n[-1]:
      self.outside.add(int(N))
    return float(np.exp(np.interp(np.log(N), np.log(self.n), np.log(self.r))))


# ------------------------------------------------------------------ runs


def trajectory(workdir: str) -> dict:
  """Per round of the run in ``workdir``: its N and the controller's signal
  with its interval (nan where not logged, inf where unbounded)."""
  traj = dict(rounds=[], N=[], signal=[], lo=[], hi=[])
  for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")):
    if "batch_size" not in r:
      continue
    traj["rounds"].append(r["round"])
    traj["N"].append(r["batch_size"])
    for k in ("signal", "lo", "hi"):
      v = r.get("adaptive/" + ("signal" if k == "signal" else f"signal_{k}"))
      traj[k].append(math.nan if v is None else (math.inf if v == "inf" else float(v)))
  return traj


def finish(rec: dict, arm: str, targets, rate: Rate | None) -> dict:
  """A committed record (``study_report.load_records``) as an arm's run:
  the N it visited, modelled seconds at each evaluation (each round N /
  rate(N), summed; a fixed run's rounds all at its N) and to-target at each
  target (rounds, rollouts, and seconds with a rate)."""
  curve = {k: rec["curve"][k] for k in ("rounds", "rollouts", "value")}
  traj = rec.get("traj")
  if traj is None:  # a fixed-N run
    rec["N_visited"] = [int(rec["N"])]
    if rate is not None:
      curve["seconds"] = curve["rounds"] * (rec["N"] / rate(rec["N"]))
  else:
    rec["N_visited"] = sorted({int(n) for n in traj["N"]})
    if rate is not None:
      cost = np.cumsum([n / rate(n) for n in traj["N"]])
      i = np.searchsorted(traj["rounds"], curve["rounds"], side="right")
      curve["seconds"] = np.where(i > 0, cost[np.maximum(i - 1, 0)], 0.0)
  return dict(rec, arm=arm, curve=curve, to_target=study.to_target(curve, targets))


def verdict(ratio, lo, hi, threshold, better: str) -> str:
  if ratio is None:
    return "unresolved (a seed did not reach the target)"
  if hi <= threshold:
    return f"met ({better})"
  if lo > threshold:
    return "not met"
  return f"unresolved (interval straddles {threshold:g})"


# ------------------------------------------------------------------ main


def b_crit_ratio(args, main_t):
  """The b_crit signal's ratio and a sentence saying where it came from."""
  default = adaptive_batch.b_crit_calibration()["ratio"]
  if args.quick or not os.path.exists(args.fits):
    why = "quick mode" if args.quick else f"{args.fits} not found"
    return (
        default,
        (
            f"B_crit / B_noise = {default:.3f}, the committed default in "
            f"configs/adaptive_batch.py ({why})"
        ),
        None,
    )
  with open(args.fits) as f:
    doc = json.load(f)
  try:
    cal = batch_law_lib.calibration_from_fits(doc, main_t)
  except ValueError as e:
    return (
        default,
        (
            f"B_crit / B_noise = {default:.3f}, the committed default "
            f"(configs/adaptive_batch.py): {args.fits}: {e}"
        ),
        None,
    )
  if not cal["resolved"]:
    return (
        default,
        (
            f"B_crit / B_noise = {default:.3f}, the committed default "
            f"(configs/adaptive_batch.py): the fit in {args.fits} at {main_t} is "
            f"unresolved (its ratio {cal['ratio']:.3f} [{cal['lo']:.3g}, "
            f"{cal['hi']:.3g}] not used)"
        ),
        cal,
    )
  return (
      cal["ratio"],
      (
          f"B_crit / B_noise = {cal['ratio']:.3f} [{cal['lo']:.3g}, "
          f"{cal['hi']:.3g}] from {args.fits} (B_crit {cal['b_crit']:.4g} at "
          f"{main_t}, B_noise {cal['b_noise']:.4g} ± {cal['b_noise_se']:.2g}); "
          "the controller uses the point ratio"
      ),
      cal,
  )


def fixed_sweep(args):
  """The on-policy study's config and the overrides of its runs that are
  the fixed arms (quick: its quick sweep, run here if missing)."""
  if args.quick:
    c = batch_law.get_config("quick")
    over = [dict(o, seed=s) for o in batch_law.sweep("quick") if o["seed"] == 0 for s in args.seeds]
    return c, over
  return batch_law.get_config("on"), [o for o in batch_law.sweep("on") if o["seed"] in args.seeds]


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  tgt = batch_law.targets("quick" if args.quick else "on")
  main_t = float(tgt[len(tgt) // 2])
  rates = load_throughput(args.throughput)
  rate = Rate(rates) if rates else None

  # fixed arms first: a full run stops here, before running anything, if the
  # on-policy study has not finished
  out = report.Results(NAME, root=args.out)
  c_on, on_over = fixed_sweep(args)
  K = c_on.batch.rollouts_per_prompt
  if args.replot:  # the controller's calibration as the runs used it
    man = json.loads(paths.read_text(paths.join(out.dir, "manifest.json")))
    ratio, ratio_note, cal = man["b_crit_ratio"], man["b_crit_note"], man["calibration"]
  else:
    ratio, ratio_note, cal = b_crit_ratio(args, main_t)
  arg = "quick" if args.quick else adaptive_batch.SIGNALS[0]
  c = adaptive_batch.get_config(arg)
  with c.unlocked():
    c.sft.base_dir = os.path.abspath(os.path.join(args.on_root, "sft_base"))
    c.batch.adaptive_b_crit_ratio = float(ratio)
  over = [{"batch.adaptive_signal": s, "seed": sd} for s in args.signals for sd in args.seeds]
  grid = adaptive_batch.eval_grid(arg)

  def make():
    if args.quick:
      on_rows = study_runner.run_study(c_on, on_over, args.on_root, workers=args.workers)
    else:
      on_rows = study_runner.read_finished(on_over, args.on_root)
    groups = {"fixed": study.collect(on_rows, tgt, c_on)}
    study_runner.prepare_base(c, args.root)
    ad_rows = sweep.run_sweep(
        c,
        over,
        args.root,
        workers=args.workers,
        run_fn=functools.partial(study_runner.run_on_grid, grid=grid),
    )
    for s in args.signals:
      rows = [r for r in ad_rows if r["overrides"]["batch.adaptive_signal"] == s]
      groups[f"adaptive {s}"] = study.collect(rows, tgt, c)
      for rec, row in zip(groups[f"adaptive {s}"], rows):
        rec["traj"] = trajectory(row["workdir"])
    adaptive = {g: rs for g, rs in groups.items() if g != "fixed"}
    study_report.save_records(out, adaptive, TRAJ, keys=("name", "seed"), series="traj")
    return groups

  groups = study_runner.records(args, out, tgt, make)
  trajs = study_report.load_records(out, None, TRAJ, keys=("name", "seed"), series="traj")
  for g, rs in trajs.items():
    for rec, tr in zip(groups[g], rs):
      rec["traj"] = tr["traj"]
  fixed = [finish(r, "", tgt, rate) for r in groups["fixed"]]
  grid_ns = sorted({r["N"] for r in fixed})
  x_main = "seconds" if rate is not None else "rollouts"

  def mean_to(recs, t, x):
    vals = [r["to_target"][t][x] for r in recs]
    return None if any(v is None for v in vals) else float(np.mean(vals))

  by_n = {N: [r for r in fixed if r["N"] == N] for N in grid_ns}
  reached = {N: mean_to(rs, main_t, x_main) for N, rs in by_n.items()}
  reached = {N: v for N, v in reached.items() if v is not None}
  if not reached:
    best_n, best_note = None, f"no fixed N reached {main_t} with every seed"
  else:
    best_n = min(reached, key=reached.get)
    best_note = (
        f"best fixed N in hindsight = {best_n} (least mean "
        f"{'wall clock' if rate else 'rollouts'} to {main_t} over the grid "
        f"{grid_ns})"
    )
  default_n = c_on.batch.num_prompts * K
  choose = {
      "small": args.small_n or grid_ns[0],
      "default": default_n,
      "best": best_n,
      "large": args.large_n or grid_ns[-1],
  }
  missing = {k: n for k, n in choose.items() if n is not None and n not in by_n}
  if missing:
    raise SystemExit(f"fixed arms {missing} are not N of the on-policy grid {grid_ns}")
  arms = {}
  for label, N in choose.items():
    if N is not None:
      arms[f"fixed {label} (N={N})"] = [dict(r, arm=f"fixed {label}") for r in by_n[N]]
  for s in args.signals:
    arms[f"adaptive {s}"] = [finish(r, f"adaptive {s}", tgt, rate) for r in groups[f"adaptive {s}"]]

  # ------------------------------------------------------------ the table
  xs = [("rollouts", "rollouts")] + ([("seconds", "wall s")] if rate else [])
  table, per_run = [], []
  ref_best = arms.get(f"fixed best (N={best_n})")
  ref_default = arms[f"fixed default (N={default_n})"]
  verdicts = []
  for name, recs in arms.items():
    ns = sorted({n for r in recs for n in r["N_visited"]})
    d = dict(arm=name, seeds=len(recs), N=", ".join(str(n) for n in ns))
    for t in tgt:
      t = float(t)
      d[f"reached@{t}"] = (
          f"{sum(r['to_target'][t]['rounds'] is not None for r in recs)}" f"/{len(recs)}"
      )
      for x, lab in xs:
        iv = study.seed_interval([r["to_target"][t][x] for r in recs], LEVEL)
        d[f"{lab}@{t}"] = stats.Estimate(iv["mean"], iv["lo"], iv["hi"])
    vals = lambda rs: [r["to_target"][main_t][x_main] for r in rs]
    for ref_name, ref, thr, better in (
        ("best", ref_best, NEAR, "within 10% of the best"),
        ("default", ref_default, 1.0, "faster than default"),
    ):
      if ref is None:
        d[f"vs {ref_name}"] = "–"
        continue
      rr, lo, hi = stats.ratio_of_means_interval(vals(recs), vals(ref), LEVEL)
      d[f"vs {ref_name}"] = stats.Estimate(rr, lo, hi) if rr is not None else None
      if name.startswith("adaptive"):
        verdicts.append(
            f"- {name} vs fixed {ref_name}: {x_main}-to-{main_t} ratio "
            f"{d[f'vs {ref_name}']} -> {verdict(rr, lo, hi, thr, better)}"
        )
    table.append(d)
    for r in recs:
      pr = dict(
          arm=name,
          name=r["name"],
          seed=r["seed"],
          N_visited=" ".join(str(n) for n in r["N_visited"]),
          rounds=r["summary"].get("rounds"),
          stopped_at_target=r["summary"].get("stopped_at_target"),
      )
      for t in tgt:
        for x in ("rounds", "rollouts") + (("seconds",) if rate else ()):
          pr[f"{x}@{float(t)}"] = r["to_target"][float(t)][x]
      per_run.append(pr)
  cols = (
      ["arm", "N", "seeds"]
      + [f"{k}@{float(t)}" for t in tgt for k in [lab for _, lab in xs] + ["reached"]]
      + ["vs best", "vs default"]
  )
  notes = [
      f"Target metric: held-out exact expected pass rate; main target {main_t}. "
      f"Ratios: mean {x_main}-to-{main_t} of the arm over the fixed arm's, 90% bootstrap "
      "interval (seeds resampled within each arm); other cells: mean [90% t-interval] "
      "over seeds.",
      "",
      "Verdicts (issue 15's goal: within 10% of the best fixed N, faster than the " "default):",
      *verdicts,
      "",
      f"- {best_note}.",
      f"- b_crit signal: {ratio_note}.",
      "- Wall clock: "
      + (
          f"modelled from {args.throughput} (N / rate(N) per round; the compile of "
          "each new shape an adaptive run visits is not counted)"
          + (
              f"; N outside its measured range {sorted(rate.outside)} use the nearest end"
              if rate.outside
              else ""
          )
          if rate
          else f"no throughput file ({args.throughput} not found): rollouts " "only"
      ),
      f"- Evaluations every {grid} rollouts (adaptive: first round past each multiple; "
      "fixed: the on-policy study's eval_every(N)).",
      f"- Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      table,
      cols,
      title=f"Adaptive vs fixed batch size (GRPO, arithmetic, K = {K})",
      notes="\n".join(notes),
  )
  if per_run:
    out.rows(per_run, "_runs.csv")

  # ------------------------------------------------------------ figures
  for s in args.signals:
    recs = sorted(arms[f"adaptive {s}"], key=lambda r: r["seed"])
    tr = recs[0]["traj"]
    # an unresolved signal has the interval [0, inf): drawn as a gap
    ok = [math.isfinite(h) and lo > 0 for lo, h in zip(tr["lo"], tr["hi"])]
    lo = [v if k else math.nan for v, k in zip(tr["lo"], ok)]
    hi = [v if k else math.nan for v, k in zip(tr["hi"], ok)]
    plots.save(
        plots.adaptive_batch(
            tr["rounds"],
            tr["N"],
            tr["signal"],
            lo,
            hi,
            title=f"adaptive N, signal {s} (seed {recs[0]['seed']}; band: its interval where "
            "resolved)",
            signal_label=f"{s} (rollouts)",
        ),
        out.path(f"_n_{s}.png"),
    )
  curves = []
  for name, recs in arms.items():
    byr = study.mean_curve([r["curve"] for r in recs], "rollouts")
    if not len(byr["x"]):
      continue
    sx = "seconds" if rate else "rounds"
    step = [np.interp(byr["x"], r["curve"]["rollouts"], r["curve"][sx]) for r in recs]
    curves.append(
        dict(
            label=name,
            rollouts=byr["x"],
            steps=np.mean(step, 0),
            value=byr["mean"],
            lo=byr["lo"],
            hi=byr["hi"],
        )
    )
  if curves:
    plots.save(
        plots.learning_curves(
            curves,
            target=list(tgt),
            title="adaptive vs fixed (mean and range over seeds)",
            step_label="modelled wall clock (s)" if rate else "generation rounds",
            logx=True,
        ),
        out.path("_curves.png"),
    )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=[args.root, args.on_root],
      config=c,
      wall_seconds=time.time() - t0,
      targets=list(tgt),
      signals=args.signals,
      seeds=args.seeds,
      fixed_arms=choose,
      throughput=args.throughput if rate else None,
      b_crit_ratio=ratio,
      b_crit_note=ratio_note,
      calibration=cal and {k: v for k, v in cal.items()},
      eval_grid=grid,
  )


if __name__ == "__main__":
  main()
