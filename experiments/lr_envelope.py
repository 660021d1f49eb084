"""The on-policy batch-size law on the learning-rate envelope: every N at its
own best learning rate, no warmup, a law with its lack-of-fit test.

    python experiments/lr_envelope.py --hours=2     # scan, then fit (resumable, ~4-6 h in all)
    python experiments/lr_envelope.py --replot      # tables and figures from the committed records
    python experiments/lr_envelope.py --quick       # tiny smoke version (minutes)
    python experiments/lr_envelope.py --arm=warmup5 --hours=1   # an arm against the envelope

Protocol (docs/batch_law.md, "The learning-rate envelope"):

* Runs are ``configs/batch_law.py:on`` (GRPO on arithmetic, K = 16, one
  update per round, the shared SFT base) with **no warmup**
  (``optim.warmup_steps = 0``: a target reached while the rate is still
  ramping up would make the warmup, not the noise, set S at large N) and
  the learning rate given outright at each N (``optim.lr_rule = constant``
  with ``optim.lr`` the scanned rate).
* Rates lie on one x2 grid anchored at lr0 = 3e-4: lr0 2^k. The constant
  rule's rate (lr0) and the linear rule's (lr0 N / 256) are grid points at
  every N; the sqrt rule's (lr0 sqrt(N / 256)) at N = 64, 256, ..., 16,384.
* Scan: seed 0 at the three grid rates nearest the sqrt rule's, then one x2
  step past whichever edge holds the best (``lr_envelope.next_rates``)
  until the best is bracketed; then seeds 1 and 2 at the best two rates and
  at each rule's grid rate (E_rule / E* with intervals).
* Caps: a run's rollout budget is ``--cap`` x the fewest rollouts to the
  highest target found so far at its N (``lr_envelope.run_cap``, never above
  the study's budget); a run stopped there is "capped" and never counts as
  reached.
* Records: every finished run is one line of the committed
  ``<out>/lr_envelope/lr_envelope_runs.csv`` (N, lr, seed, rounds and
  rollouts to each target, capped, the processor's fingerprint). The
  driver reads it first and never repeats a recorded run, so the study
  resumes across sessions and machines; ``--hours`` stops scheduling new
  runs after that long.

Results at each target (main 0.54): the envelope table (E*(N) and S*(N)
with bootstrap intervals over the argmin, the best rate and whether it is
bracketed), S*(N) = S_min (1 + B_crit / N) fitted to the runs at each N's
best rate with its lack-of-fit test (a misfit widens the interval to a case
bootstrap over N), lr*(N) ~ N^alpha with an interval beside alpha = 1/2 and
alpha = 1, and E_rule / E* per rule. Figures: the envelope with the fit,
lr*(N) on log axes with the alpha = 1/2 and 1 lines.

Arms (``--arm``; each its own records and results folder
``<out>/lr_envelope_<arm>/``), read against the on-policy envelope above
(its records must exist):

* ``warmup5``: the first design's warmup (5 optimizer steps) at each N's
  best envelope rate at the main target, 3 seeds. B_crit is fitted with and
  without the warmup from the same (N, rate) cells, side by side, and the
  runs that reached a target while the rate was still ramping are counted.
* ``off4`` / ``off8``: each round reused for 4 / 8 updates (minibatches),
  no warmup. The rate is scanned (x2 grid from the on-policy best, until
  bracketed) at three N (``OFF_SCAN_NS``); the other N run at the on-policy
  best rate shifted by the scans' median offset (in x2 steps). B_crit is
  fitted over ``OFF_NS`` and the on-policy envelope refitted over the same
  N, so the ratio B_crit(off) / B_crit(on) compares matched ranges (a
  joint bootstrap interval).
"""

from __future__ import annotations

import csv
import json
import math
import os
import time

import numpy as np
from absl import logging

from cbs_jax import batch_law as batch_law_lib
from cbs_jax import lr_envelope
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_runner
from configs import batch_law

NAME = "lr_envelope"
LR0 = batch_law.LR0
CAP = 3.0  # a run's budget: CAP x the fewest rollouts to the highest target so far at its N
MIN_SEEDS = 3
MAX_RATES = 8  # a scan that has not bracketed its best in 8 x2 steps stops there (flagged)
RULES = ("constant", "sqrt", "linear")
# a rule holds at N where E_rule / E*'s interval lies below this, fails where
# it lies at or above it, and is unresolved where the interval straddles it
HOLDS = 1.25
ARMS = ("on", "warmup5", "off4", "off8")
WARMUP_STEPS = 5  # the first design's optim.warmup_steps
OFF_NS = (
    128,
    256,
    512,
    1024,
    2048,
    4096,
    8192,
    16384,
)  # off-policy arms (>= 1 prompt per minibatch at 8)
OFF_SCAN_NS = (128, 2048, 16384)  # where the off-policy arms scan the rate
COLUMNS = ("N", "lr", "seed", "capped", "cap_rollouts", "processor")


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "the envelope's sweep root, one workdir per run (an arm's: <root>_<arm>)",
      replot=True,
  )
  ap.add_argument(
      "--hours",
      type=float,
      default=None,
      help="stop scheduling new runs after this (6; quick 1: its small grid ends by itself)",
  )
  ap.add_argument("--ns", default=None, help="batch sizes, comma-separated (default the study's)")
  ap.add_argument("--cap", type=float, default=CAP, help="run budget: cap x best rollouts at N")
  ap.add_argument(
      "--arm",
      default="on",
      choices=ARMS,
      help="on: the envelope; warmup5 / off4 / off8: an arm read against it",
  )
  args = study_runner.parse(ap, argv)
  if args.hours is None:
    args.hours = 1.0 if args.quick else 6.0  # quick: ~30 runs, 1-2 min
  # an arm's runs go beside the envelope's (<root>_<arm>: a run's folder is
  # named by its overrides, which do not name the arm) and start from the
  # envelope's SFT base
  args.on_root = args.root
  if args.arm != "on":
    args.root = args.root.rstrip("/") + f"_{args.arm}"
  if args.quick:
    default = "32,64"
  else:
    default = ",".join(str(n) for n in (OFF_NS if args.arm.startswith("off") else batch_law.NS))
  args.ns = [int(x) for x in (args.ns or default).split(",") if x]
  return args


def _lr(x: float) -> float:
  """A rate as recorded (6 significant digits), so that a scheduled rate and
  a recorded one compare equal."""
  return float(f"{x:.6g}")


def grid_k(N: int, ref: int) -> float:
  """The sqrt rule's rate as a grid exponent: lr0 sqrt(N / ref) = lr0 2^k."""
  return 0.5 * math.log2(N / ref)


def rule_rate(rule: str, N: int, lr0: float, ref: int) -> float | None:
  """A rule's rate at N when it is a grid point (lr0 2^k, k integer), else None."""
  k = {"constant": 0.0, "sqrt": grid_k(N, ref), "linear": math.log2(N / ref)}[rule]
  return lr0 * 2.0 ** k if float(k).is_integer() else None


# ---------------------------------------------------------------- records


def arm_name(arm: str) -> str:
  """The results folder (and file stem) of ``arm``."""
  return NAME if arm == "on" else f"{NAME}_{arm}"


def records_path(out: str, arm: str = "on") -> str:
  name = arm_name(arm)
  return os.path.join(out, name, f"{name}_runs.csv")


def load_records(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    rows = list(csv.DictReader(f))
  num = lambda v: None if v in ("", "None") else float(v)
  out = []
  for r in rows:
    d = {k: num(v) if "@" in k else v for k, v in r.items()}
    d.update(
        N=int(r["N"]), lr=_lr(float(r["lr"])), seed=int(r["seed"]), capped=r["capped"] == "True"
    )
    d["cap_rollouts"] = num(r["cap_rollouts"])
    out.append(d)
  return out


def save_records(path: str, recs: list[dict]) -> None:
  recs = sorted(recs, key=lambda r: (r["N"], r["lr"], r["seed"]))
  keys = list(COLUMNS) + sorted({k for r in recs for k in r if "@" in k})
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
    w.writeheader()
    w.writerows(recs)


def as_envelope_records(recs, t: float, x: str = "rollouts") -> list[dict]:
  """The envelope's records at target ``t``. A run stopped by its cap is
  capped at the targets it had not reached when stopped; a target it
  reached before the cap keeps its value (it was reached in budget)."""
  return [
      dict(
          N=r["N"],
          lr=r["lr"],
          seed=r["seed"],
          value=r.get(f"{x}@{t}"),
          capped=bool(r["capped"]) and r.get(f"{x}@{t}") is None,
      )
      for r in recs
  ]


# ---------------------------------------------------------------- scheduling


def wanted(recs, ns, targets, lr0, ref) -> list[tuple[int, float, int]]:
  """The (N, lr, seed) runs the protocol asks for next, given the records:
  at every target some scanned rate reached with every seed, the next x2
  step past an edge best, and once bracketed, the seeds at its best two
  rates and at each rule's grid rate (the union over targets: the best
  rate may differ between them)."""
  have = {(r["N"], _lr(r["lr"]), r["seed"]) for r in recs}
  rows = {}  # N -> the envelope rows at the targets where something reached
  for t in sorted(map(float, targets)):
    for row in lr_envelope.envelope(as_envelope_records(recs, t), n_boot=50):
      if math.isfinite(row["best"]):
        rows.setdefault(row["N"], []).append(row)
  want = []
  for N in ns:
    k0 = round(grid_k(N, ref))
    want += [(N, lr0 * 2.0 ** (k0 + d), 0) for d in (-1, 0, 1)]
    for row in rows.get(N, []):
      if len(row["lrs"]) < MAX_RATES:
        want += [(N, lr, 0) for lr in lr_envelope.next_rates(row)]
      if row["bracketed"]:
        order = np.argsort(row["means"], kind="stable")[:2]
        extra = [row["lrs"][i] for i in order] + [
            v for v in (rule_rate(r, N, lr0, ref) for r in RULES) if v is not None
        ]
        want += [(N, lr, s) for lr in extra for s in range(MIN_SEEDS)]
  out = []
  for w in want:
    key = (w[0], _lr(w[1]), w[2])
    if key not in have and key not in out:
      out.append(key)
  return out


def on_best_rates(on_recs, t: float) -> dict[int, float]:
  """{N: the envelope's best rate at target ``t``} where it is bracketed."""
  return {
      row["N"]: row["best_lr"]
      for row in lr_envelope.envelope(as_envelope_records(on_recs, t), n_boot=50)
      if row["bracketed"]
  }


def arm_target(on_recs, targets) -> float:
  """The target whose envelope rates the arms start from: the middle one,
  or, where the envelope brackets no N there (a short scan), the target
  where it brackets the most."""
  ts = sorted(map(float, targets))
  main_t = ts[len(ts) // 2]
  if on_best_rates(on_recs, main_t):
    return main_t
  return max(ts, key=lambda t: len(on_best_rates(on_recs, t)))


def scan_ns(ns) -> list[int]:
  """The off-policy arms' scanned N: ``OFF_SCAN_NS`` where they are in
  ``ns``, else the ends and the middle of ``ns``."""
  ns = sorted(ns)
  got = [n for n in OFF_SCAN_NS if n in ns]
  return got if len(got) == len(OFF_SCAN_NS) else sorted({ns[0], ns[len(ns) // 2], ns[-1]})


def off_shift(recs, on_best, scanned, t: float) -> int | None:
  """The off-policy arm's rate offset from the on-policy best, in x2 steps:
  the median over ``scanned`` N of log2(best_off / best_on) at ``t`` (rounded
  to the grid), once every scanned N is bracketed; None before."""
  rows = {r["N"]: r for r in lr_envelope.envelope(as_envelope_records(recs, t), n_boot=50)}
  if any(N not in rows or not rows[N]["bracketed"] for N in scanned):
    return None
  return int(round(float(np.median([math.log2(rows[N]["best_lr"] / on_best[N]) for N in scanned]))))


def wanted_arm(arm, recs, on_recs, ns, targets) -> list[tuple[int, float, int]]:
  """The (N, lr, seed) runs arm ``arm`` asks for next (module docstring):
  warmup5, the envelope's best rate at the main target with every seed;
  off4 / off8, the scan at ``scan_ns``, then (once the scans are bracketed)
  the seeds at each scanned N's best two rates and at the shifted on-policy
  best elsewhere. Batch sizes without a bracketed on-policy best are
  skipped (their envelope must be finished first)."""
  main_t = arm_target(on_recs, targets)
  on_best = on_best_rates(on_recs, main_t)
  ns = [N for N in ns if N in on_best]
  seeds = range(MIN_SEEDS)
  if arm == "warmup5":
    want = [(N, on_best[N], s) for N in ns for s in seeds]
  else:
    scanned = [N for N in scan_ns(ns) if N in ns] if ns else []
    want = [(N, on_best[N] * 2.0**d, 0) for N in scanned for d in (-1, 0, 1)]
    for t in sorted(map(float, targets)):
      for row in lr_envelope.envelope(as_envelope_records(recs, t), n_boot=50):
        if row["N"] in scanned and math.isfinite(row["best"]) and len(row["lrs"]) < MAX_RATES:
          want += [(row["N"], lr, 0) for lr in lr_envelope.next_rates(row)]
    shift = off_shift(recs, on_best, scanned, main_t) if scanned else None
    if shift is not None:
      for t in sorted(map(float, targets)):
        for row in lr_envelope.envelope(as_envelope_records(recs, t), n_boot=50):
          if row["N"] in scanned and row["bracketed"]:
            order = np.argsort(row["means"], kind="stable")[:2]
            want += [(row["N"], row["lrs"][i], s) for i in order for s in seeds]
      want += [(N, on_best[N] * 2.0**shift, s) for N in ns if N not in scanned for s in seeds]
  have = {(r["N"], _lr(r["lr"]), r["seed"]) for r in recs}
  out = []
  for N, lr, seed in want:
    key = (N, _lr(lr), seed)
    if key not in have and key not in out:
      out.append(key)
  return out


def best_so_far(recs, N, t_top) -> float | None:
  vals = [
      r.get(f"rollouts@{t_top}")
      for r in recs
      if r["N"] == N and not r["capped"] and r.get(f"rollouts@{t_top}") is not None
  ]
  return min(vals) if vals else None


def run_batch(args, config, todo, recs, tgt) -> list[dict]:
  """Run ``todo`` (N, lr, seed) with their caps; returns their records."""
  K = config.batch.rollouts_per_prompt
  t_top = float(max(tgt))
  budget = batch_law.MAX_ROLLOUTS if not args.quick else 16 * batch_law.QUICK_ROUNDS * 8
  over, caps = [], []
  for N, lr, seed in todo:
    cap = lr_envelope.run_cap(best_so_far(recs, N, t_top), args.cap, budget)
    caps.append(cap)
    over.append(
        {
            "batch.num_prompts": N // K,
            "optim.lr": lr,
            "seed": seed,
            "train.eval_every": batch_law.eval_every(N) if not args.quick else 2,
            "train.num_rounds": max(1, math.ceil(cap / N)),
        }
    )
  rows = study_runner.run_study(config, over, args.root, workers=args.workers)
  fp = report.processor_fingerprint()
  out = []
  for (N, lr, seed), cap, rec in zip(todo, caps, study.collect(rows, tgt, config)):
    d = dict(N=N, lr=lr, seed=seed, cap_rollouts=cap, processor=fp)
    for t in tgt:
      for x in ("rounds", "rollouts"):
        d[f"{x}@{float(t)}"] = rec["to_target"][float(t)][x]
    d["capped"] = d[f"rollouts@{t_top}"] is None and cap < budget
    out.append(d)
  return out


def study_config(quick: bool, arm: str = "on"):
  if arm not in ARMS:
    raise ValueError(f"unknown arm {arm!r}; known: {ARMS}")
  c = batch_law.get_config("quick" if quick else "on")
  c.optim.warmup_steps = WARMUP_STEPS if arm == "warmup5" else 0
  if arm.startswith("off"):
    c.batch.num_minibatches = int(arm[3:])
  c.optim.lr_rule = "constant"  # the scanned rate is the rate
  c.train.stop_below_pass_rate = batch_law.collapsed("quick" if quick else "on")  # diverging
  return c


# ---------------------------------------------------------------- analysis


def analyse(args, recs, tgt, lr0, ref, t_start):
  out = report.Results(NAME, root=args.out)
  main_t = float(tgt[len(tgt) // 2])
  table, fits, alphas, ratios, fit_runs, ranges = [], {}, {}, [], {}, []
  for t in map(float, tgt):
    env = lr_envelope.envelope(as_envelope_records(recs, t), n_boot=2000)
    env_s = {r["N"]: r for r in lr_envelope.envelope(as_envelope_records(recs, t, "rounds"))}
    for row in env:
      s = env_s[row["N"]]
      table.append(
          dict(
              target=t,
              N=row["N"],
              rates=" ".join(f"{v:.3g}" for v in row["lrs"]),
              best_lr=row["best_lr"],
              bracketed=row["bracketed"],
              E=stats.Estimate(row["best"], row["lo"], row["hi"]),
              S=stats.Estimate(s["best"], s["lo"], s["hi"]),
              E_star=row["best"],
              status=row["status"],
          )
      )
    ok = [r for r in env if r["bracketed"]]
    best_runs = [
        r
        for r in recs
        for row in ok
        if r["N"] == row["N"] and r["lr"] == row["best_lr"] and not r["capped"]
    ]
    fit_runs[t] = best_runs
    fits[t] = _fit(best_runs, t)
    ranges += range_rows(best_runs, t)
    try:
      alphas[t] = lr_envelope.lr_exponent(env)
    except ValueError as e:
      alphas[t] = dict(error=str(e))
    for row in env:
      for rule in RULES:
        lr = rule_rate(rule, row["N"], lr0, ref)
        scanned = [k for k, v in enumerate(row["lrs"]) if lr is not None and math.isclose(v, lr)]
        if not scanned or not math.isfinite(row["best"]):
          continue
        q = lr_envelope.rate_ratio(row, lr)
        ratios.append(
            dict(
                target=t,
                N=row["N"],
                rule=rule,
                seeds=row["seeds"][scanned[0]],
                ratio=stats.Estimate(q["ratio"], q["lo"], q["hi"]),
                holds="yes" if q["hi"] < HOLDS else "no" if q["lo"] >= HOLDS else "unresolved",
            )
        )
  lines = []
  for t, f in fits.items():
    if "error" in f:
      lines.append(f"- target {t}: no fit ({f['error']})")
      continue
    lof = f.get("lack_of_fit") or {}
    lines.append(
        f"- target {t}: B_crit {stats.fmt(f['B_crit'], f['B_crit_lo'], f['B_crit_hi'])} "
        f"rollouts ({f['verdict']}; interval over {f['interval']}); lack of fit "
        + (f"F = {lof['F']:.3g}, p = {lof['p_value']:.3g}" if lof else "not testable")
    )
  for t, a in alphas.items():
    lines.append(
        f"- target {t}: lr* ~ N^alpha, alpha = "
        + (
            stats.fmt(a["alpha"], a["lo"], a["hi"]) + f" over N {a['ns']} (sqrt rule 0.5, linear 1)"
            if "error" not in a
            else a["error"]
        )
    )
  notes = "\n".join(
      [
          f"Runs: configs/batch_law.py:on, no warmup, each rate given outright; {len(recs)} "
          f"runs recorded in {NAME}_runs.csv. E, S: least mean rollouts / rounds to the target "
          "over the scanned rates, [90% bootstrap interval over seeds resampled in every cell, "
          "argmin retaken]. A best rate at the edge of its scan is flagged, not reported as "
          "the optimum.",
          "",
          *lines,
          "",
          f"- Command: `{out.command(args.replot)}`.",
      ]
  )
  cols = ["target", "N", "rates", "best_lr", "bracketed", "E", "S", "status"]
  md = out.table(
      table, cols, title="The learning-rate envelope (on-policy, no warmup)", notes=notes
  )
  decision = decision_rows(table, throughput_path(args.out), main_t)
  if decision:
    rows, source = decision
    dec_md = report.markdown_table(
        rows, ["N", "rollouts_per_s", "E", "T", "gain", "penalty", "doubling_pays"]
    )
    best = min(rows, key=lambda r: r["T"].value)
    with open(out.path(".md"), "w") as f:
      f.write(
          md + f"\n## Time to {main_t} on this machine: E*(N) / throughput(N)\n\n{dec_md}\n\n"
          f"Throughput: {source} (rollouts/s of a round, median of the benchmark's rounds). "
          "T = E* / throughput in seconds, its interval E*'s (the throughput's own spread is "
          "not in it). At N -> 2N: gain = throughput ratio, penalty = E* ratio; doubling pays "
          f"iff gain > penalty. Least predicted T: N = {best['N']} ({best['T']} s).\n"
      )
    with open(out.path("_decision.csv"), "w", newline="") as f:
      flat = [report.csv_cells(r) for r in rows]
      w = csv.DictWriter(f, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
      w.writeheader()
      w.writerows(flat)
  if ranges:  # appended below the envelope (and the decision, when there is one)
    with open(out.path(".md"), "a") as f:
      f.write(
          "\n## Range sensitivity: the law refitted over sub-ranges of N\n\n"
          + report.markdown_table(
              ranges,
              ["target", "range", "N_min", "N_max", "points", "B_crit", "verdict", "lack_of_fit_p"],
          )
          + "\n\nEach row refits S(N) = S_min (1 + B_crit / N) to the envelope's runs (each "
          "N at its best rate) over the N range named, with the same bootstrap as the full "
          "fit [90% interval]. A B_crit that moves outside the full fit's interval when "
          "one end is dropped is decided by the range swept, not by the data within it.\n"
      )
    out.rows(ranges, "_ranges.csv")
  out.rows(ratios, "_rules.csv")
  series = []
  for t in map(float, tgt):
    runs = fit_runs[t]
    series.append(
        dict(
            label=f"target {t:g}",
            N=[r["N"] for r in runs],
            S=[r.get(f"rounds@{t}") for r in runs],
            fit=fits[t],
        )
    )
  out.figure(
      plots.laws(series, title="S*(N) on the learning-rate envelope (each N at its best rate)"),
      ".png",
  )
  main_rules = [r for r in ratios if r["target"] == main_t]
  if main_rules:
    out.figure(
        plots.rule_ratios(
            [
                dict(r, ratio=r["ratio"].value, lo=r["ratio"].lo, hi=r["ratio"].hi)
                for r in main_rules
            ],
            bar=HOLDS,
            title=f"each rule's rate against the envelope, target {main_t}",
        ),
        "_rules.png",
    )
  main_env = [r for r in table if r["target"] == main_t and math.isfinite(r["E_star"])]
  if main_env:
    a = alphas.get(main_t, {})
    fig = plots.lr_envelope(
        [r["N"] for r in main_env],
        [r["best_lr"] for r in main_env],
        [r["bracketed"] for r in main_env],
        lr0=lr0,
        ref=ref,
        alpha=a.get("alpha"),
        title=f"best learning rate per N (target {main_t}; open: at a scan edge)",
    )
    out.figure(fig, "_lr.png")
  if not args.replot:  # the manifest stays the sweep's: its commit, command, wall time
    out.manifest(
        runs_root=args.root,
        config=study_config(args.quick),
        wall_seconds=time.time() - t_start,
        targets=list(tgt),
        ns=args.ns,
        cap=args.cap,
        fits={str(t): {k: v for k, v in f.items() if k != "boot_B_crit"} for t, f in fits.items()},
        alphas={str(t): a for t, a in alphas.items()},
    )


def throughput_path(out: str) -> str:
  """The throughput benchmark's record (``experiments/throughput_decision.py``)."""
  return os.path.join(out, "throughput_decision", "throughput.json")


def decision_rows(table, path: str, t: float):
  """The time-to-target decision on the envelope: T*(N) = E*(N) / rollouts
  per second from the benchmark at ``path``, and at each doubling the
  rule "2N pays iff its throughput gain exceeds its E* penalty". None
  without the benchmark's record. Returns (rows, a description of it)."""
  if not os.path.exists(path):
    return None
  with open(path) as f:
    bench = json.load(f)
  rate = dict(zip(map(int, bench["N"]), map(float, bench["rollouts_per_s"])))
  env = {r["N"]: r for r in table if r["target"] == t and math.isfinite(r["E_star"])}
  ns = sorted(n for n in env if n in rate)
  rows = []
  for i, n in enumerate(ns):
    e = env[n]["E"]
    row = dict(
        N=n,
        rollouts_per_s=rate[n],
        E=e,
        T=stats.Estimate(e.value / rate[n], e.lo / rate[n], e.hi / rate[n]),
    )
    if i + 1 < len(ns) and ns[i + 1] == 2 * n:
      gain, pen = rate[2 * n] / rate[n], env[2 * n]["E"].value / e.value
      row |= dict(gain=gain, penalty=pen, doubling_pays=bool(gain > pen))
    rows.append(row)
  where = os.path.join(*os.path.normpath(path).split(os.sep)[-2:])  # the same from any --out
  return rows, f"{where} ({bench.get('machine', 'this machine')})"


def _fit(runs, t) -> dict:
  """S(N) law over ``runs`` (records) at target ``t``; the error as a dict."""
  try:
    return batch_law_lib.fit_critical_batch(
        [r["N"] for r in runs], [r.get(f"rounds@{t}") for r in runs], [r["seed"] for r in runs]
    )
  except ValueError as e:
    return dict(error=str(e), verdict="unresolved")


RANGES = (  # (label, N points dropped at the small end, at the large end)
    ("all N", 0, 0),
    ("drop the smallest", 1, 0),
    ("drop the largest", 0, 1),
    ("drop one at each end", 1, 1),
    ("drop the two smallest", 2, 0),
    ("drop the two largest", 0, 2),
)


def range_rows(runs, t: float) -> list[dict]:
  """The law refitted over sub-ranges of the envelope's batch sizes at
  target ``t`` (``RANGES``): how much B_crit depends on which N the sweep
  spans. ``runs``: the records the full fit used (each N at its best rate)."""
  ns = sorted({r["N"] for r in runs})
  rows = []
  for label, lo, hi in RANGES:
    keep = ns[lo : len(ns) - hi]
    f = _fit([r for r in runs if r["N"] in keep], t) if len(keep) >= 3 else {"error": "< 3 N"}
    ok = "error" not in f
    rows.append(
        dict(
            target=t,
            range=label,
            N_min=keep[0] if keep else None,
            N_max=keep[-1] if keep else None,
            points=len(keep),
            B_crit=stats.Estimate(f["B_crit"], f["B_crit_lo"], f["B_crit_hi"]) if ok else None,
            verdict=f["verdict"] if ok else f"no fit ({f['error']})",
            lack_of_fit_p=(f.get("lack_of_fit") or {}).get("p_value") if ok else None,
        )
    )
  return rows


def _b_cells(prefix: str, f: dict) -> dict:
  """A fit's B_crit, interval, verdict and lack-of-fit p as table cells."""
  if "error" in f:
    return {f"{prefix}": f"no fit ({f['error']})", f"{prefix}_B": None}
  lof = f.get("lack_of_fit") or {}
  return {
      prefix: stats.fmt(f["B_crit"], f["B_crit_lo"], f["B_crit_hi"]) + f" ({f['verdict']})",
      f"{prefix}_B": f["B_crit"],
      f"{prefix}_lo": f["B_crit_lo"],
      f"{prefix}_hi": f["B_crit_hi"],
      f"{prefix}_lof_p": lof.get("p_value"),
  }


def _ratio_cell(num: dict, den: dict) -> dict:
  if "error" in num or "error" in den:
    return dict(ratio=None)
  lo, hi = batch_law_lib.bootstrap_ratio_interval(num["boot_B_crit"], den["boot_B_crit"])
  r = num["B_crit"] / den["B_crit"]
  return dict(ratio=stats.Estimate(r, lo, hi))


def _mean_cell(runs, key) -> float | None:
  vals = [r.get(key) for r in runs]
  if not vals or any(v is None for v in vals):
    return None
  return float(np.mean(vals))


def analyse_arm(args, arm, recs, on_recs, tgt, t_start):
  """The arm against the envelope (module docstring): a per-target table of
  B_crit side by side with the ratio, and a per-N table."""
  name = arm_name(arm)
  out = report.Results(name, root=args.out)
  main_t = arm_target(on_recs, tgt)
  on_best = on_best_rates(on_recs, main_t)
  live = lambda runs: [r for r in runs if not r["capped"]]
  table, per_n, fig_series = [], [], []
  for t in map(float, tgt):
    if arm == "warmup5":
      cells = {(N, _lr(lr)) for N, lr in on_best.items() if N in args.ns}
      on_runs = live(r for r in on_recs if (r["N"], r["lr"]) in cells)
      arm_runs = live(r for r in recs if (r["N"], r["lr"]) in cells)
      how = {N: "on-policy best at the main target" for N, _ in cells}
    else:
      on_env = lr_envelope.envelope(
          as_envelope_records([r for r in on_recs if r["N"] in args.ns], t), n_boot=50
      )
      on_cells = {(row["N"], _lr(row["best_lr"])) for row in on_env if row["bracketed"]}
      on_runs = live(r for r in on_recs if (r["N"], r["lr"]) in on_cells)
      env = lr_envelope.envelope(as_envelope_records(recs, t), n_boot=50)
      scanned = scan_ns(args.ns)
      cells = {
          (row["N"], _lr(row["best_lr"]))
          for row in env
          if math.isfinite(row["best"]) and (row["bracketed"] or row["N"] not in scanned)
      }
      arm_runs = live(r for r in recs if (r["N"], r["lr"]) in cells)
      how = {
          row["N"]: ("scanned, bracketed" if row["bracketed"] else "scan at an edge")
          if row["N"] in scanned
          else "on-policy best x 2^shift"
          for row in env
      }
    f_on, f_arm = _fit(on_runs, t), _fit(arm_runs, t)
    if t == main_t:
      fig_series = [("on-policy", on_runs, f_on), (arm, arm_runs, f_arm)]
    in_warmup = sum(
        1
        for r in arm_runs
        if arm == "warmup5"
        and r.get(f"rounds@{t}") is not None
        and r[f"rounds@{t}"] <= WARMUP_STEPS
    )
    row = dict(target=t, points=f"{len(on_runs)} / {len(arm_runs)}")
    row |= _b_cells("on", f_on) | _b_cells(arm, f_arm) | _ratio_cell(f_arm, f_on)
    if arm == "warmup5":
      row["reached_in_warmup"] = f"{in_warmup}/{len(arm_runs)}"
    table.append(row)
    for N in sorted({r["N"] for r in arm_runs} | {r["N"] for r in on_runs}):
      a = [r for r in arm_runs if r["N"] == N]
      o = [r for r in on_runs if r["N"] == N]
      per_n.append(
          dict(
              target=t,
              N=N,
              lr_on=o[0]["lr"] if o else None,
              lr_arm=a[0]["lr"] if a else None,
              rate=how.get(N, "–"),
              seeds=f"{len(o)} / {len(a)}",
              S_on=_mean_cell(o, f"rounds@{t}"),
              S_arm=_mean_cell(a, f"rounds@{t}"),
              E_on=_mean_cell(o, f"rollouts@{t}"),
              E_arm=_mean_cell(a, f"rollouts@{t}"),
          )
      )
  what = {
      "warmup5": f"the first design's {WARMUP_STEPS}-step warmup vs none, every N at the "
      f"envelope's best rate at {main_t} (the same (N, rate) cells in both columns)",
      "off4": "each round reused for 4 updates vs on-policy, each at its own best rate, "
      f"fitted over the same N {list(args.ns)}",
      "off8": "each round reused for 8 updates vs on-policy, each at its own best rate, "
      f"fitted over the same N {list(args.ns)}",
  }[arm]
  shift, scanned = None, []
  if arm.startswith("off"):
    scanned = [N for N in scan_ns(args.ns) if N in on_best]
    shift = off_shift(recs, on_best, scanned, main_t) if scanned else None
  notes = "\n".join(
      [
          f"{arm} against the learning-rate envelope: {what}. B_crit [90% bootstrap interval] "
          "of S(N) = S_min (1 + B_crit / N) in rounds (case bootstrap where the law misfits, "
          "lack-of-fit p in the CSV); ratio = B_crit(arm) / B_crit(on) with the interval of "
          "the two bootstraps paired at random. points: runs fitted (on / arm). "
          f"{len(recs)} runs recorded in {name}_runs.csv.",
          ""
          if shift is None
          else f"\nRate offset from the on-policy best, from the scans at N "
          f"{scanned}: x2^{shift} (the median, target {main_t}).",
          "",
          f"- Command: `{out.command(args.replot)}`.",
      ]
  )
  cols = ["target", "points", "on", arm, "ratio"] + (
      ["reached_in_warmup"] if arm == "warmup5" else []
  )
  md = out.table(table, cols, title=f"The batch-size law, {arm} vs the envelope", notes=notes)
  per_md = report.markdown_table(
      per_n, ["target", "N", "lr_on", "lr_arm", "rate", "seeds", "S_on", "S_arm", "E_on", "E_arm"]
  )
  with open(out.path(".md"), "w") as f:
    f.write(md + "\n## Per batch size (means over seeds)\n\n" + per_md + "\n")
  with open(out.path("_per_n.csv"), "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=list(per_n[0]) if per_n else ["target"])
    w.writeheader()
    w.writerows(per_n)
  fig_t = main_t
  out.figure(
      plots.laws(
          [
              dict(
                  label=lab,
                  N=[r["N"] for r in runs],
                  S=[r.get(f"rounds@{fig_t}") for r in runs],
                  fit=f,
              )
              for lab, runs, f in fig_series
          ],
          title=f"{arm} vs the on-policy envelope, target {fig_t}",
      ),
      ".png",
  )
  if not args.replot:  # the manifest stays the sweep's: its commit, command, wall time
    out.manifest(
        runs_root=args.root,
        config=study_config(args.quick, arm),
        wall_seconds=time.time() - t_start,
        targets=list(tgt),
        ns=args.ns,
        cap=args.cap,
        shift=shift,
    )


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  c = study_config(args.quick, args.arm)
  if args.arm != "on":
    c = study_runner.on_policy_base(c, args.on_root)
  tgt = batch_law.targets("quick" if args.quick else "on")
  lr0, ref = c.optim.lr, c.optim.ref_batch
  path = records_path(args.out, args.arm)
  recs = load_records(path)
  on_recs = recs if args.arm == "on" else load_records(records_path(args.out))
  if args.arm != "on" and not on_recs:
    raise SystemExit(
        f"--arm={args.arm} reads the on-policy envelope's records at "
        f"{records_path(args.out)}: none there; run the envelope (--arm=on) first"
    )
  while not args.replot and time.time() - t0 < args.hours * 3600:
    if args.arm == "on":
      todo = wanted(recs, args.ns, tgt, lr0, ref)
    else:
      todo = wanted_arm(args.arm, recs, on_recs, args.ns, tgt)
    if not todo:
      break
    todo = todo[: max(2, args.workers)]  # a few at a time: caps follow the best so far
    cap_ref = recs if args.arm == "on" else recs + on_recs
    recs += run_batch(args, c, todo, cap_ref, tgt)
    save_records(path, recs)
  if recs and args.arm == "on":
    analyse(args, recs, tgt, lr0, ref, t0)
  elif recs:
    analyse_arm(args, args.arm, recs, on_recs, tgt, t0)
  elif args.arm != "on":
    raise SystemExit(
        f"--arm={args.arm}: the envelope at {records_path(args.out)} brackets the best rate "
        f"at no N for any target {tuple(map(float, tgt))}; nothing to run against it: run "
        "the envelope (--arm=on) longer first"
    )


if __name__ == "__main__":
  main()
