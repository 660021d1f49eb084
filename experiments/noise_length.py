"""Intra:inter against completion length, with SFT bases matched in pass rate.

    python experiments/noise_length.py              # every base, then the fits (resumable)
    python experiments/noise_length.py --replot     # tables and figure from the committed CSV
    python experiments/noise_length.py --quick      # tiny smoke version

Published runs report tr Sigma_intra : tr Sigma_inter ~ 100:1 per rollout
with completions of hundreds of tokens; this project's tasks gave 5-37:1
with completions of 3-22 tokens, but its variants moved length, difficulty
and pass rate together (noise_anatomy). Here one task family
(``configs/noise_length.py``: 2-digit + and -, one difficulty) is written at
growing detail -- the answer alone, then worked solutions with each place
value added in k = 1, 2, 4, 8 steps -- and every base is ended at the same
held-out pass rate (``sft.stop_at_pass_rate``). Two arms:

* length: every level at pass ``TARGET``, ``SEEDS`` independent bases each;
* pass: level ``PASS_LEVEL`` at each of ``PASS_TARGETS`` (the length arm's
  bases at ``TARGET`` are shared).

Each base is measured at fixed parameters (``cbs_jax.measure``: ``--batches``
pooled batches of P x K rollouts, jackknife SEs). A base whose held-out
pass misses its target by more than ``MATCH`` (or never reached it within
``sft.steps``) is reported and left out of the fits. Fits (``cbs_jax.trend``,
each base one point, the bases at one level replicates): log ratio against
log mean completion length, with the slope's t-interval from the level
means' scatter (it carries base-to-base variation and any misfit), the
lack-of-fit test, and -- an extrapolation -- the length at which the line
would reach 100:1 (Fieller's interval); and log ratio against pass rate.

Writes experiments/results/noise_length/: the per-base table (.csv; the fits
and figure are rebuilt from it by --replot), the fits (.md), the figure,
manifest.json.
"""

from __future__ import annotations

import functools
import math
import time

import numpy as np
from absl import logging

from cbs_jax import measure
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_runner
from cbs_jax import sweep
from cbs_jax import trend
from configs import noise_length as cfg

NAME = "noise_length"
P, K = 64, 16  # per measured batch: the noise_anatomy shape
PUBLISHED = 100.0  # the published per-rollout ratio


def parse_args(argv=None):
  ap = study_runner.parser(__doc__, NAME, "one SFT base per folder below it", replot=True)
  ap.add_argument("--batches", type=int, default=6, help="batches pooled per measurement")
  args = study_runner.parse(ap, argv)
  if args.quick:
    args.batches = 2
  return args


def points(quick: bool) -> list[dict]:
  """Every base of the study: dict(arm, level, target, seed)."""
  if quick:  # three levels, one base each: the pipeline at smoke size
    return [dict(arm="length", level=lv, target=cfg.QUICK_TARGET, seed=0) for lv in (0, 1, 2)]
  out = [
      dict(arm="length", level=lv, target=cfg.TARGET, seed=s)
      for lv in cfg.LEVELS
      for s in cfg.SEEDS
  ]
  out += [
      dict(arm="pass", level=cfg.PASS_LEVEL, target=t, seed=s)
      for t in cfg.PASS_TARGETS
      if t != cfg.TARGET
      for s in cfg.SEEDS
  ]
  return out


def overrides(pt: dict) -> dict:
  """The sweep overrides of base ``pt`` over ``configs/noise_length.py:1``."""
  o = {"seed": pt["seed"], "sft.stop_at_pass_rate": pt["target"]}
  if pt["level"] == 0:
    o.update({"task.kwargs.solution_format": "answer"})
  else:
    o["task.kwargs.step_split"] = pt["level"]
  return o


def name(pt: dict) -> str:
  return f"L{pt['level']}_p{pt['target']}_s{pt['seed']}"


def is_matched(reached: bool, pass_rate: float, target: float) -> bool:
  """Reached its target and held-out pass within ``cfg.MATCH`` of it, the
  bound included (0.75 at target 0.7 is matched: no float rounding decides)."""
  return bool(reached) and abs(pass_rate - target) <= cfg.MATCH + 1e-9


def base_row(pt: dict, summary: dict) -> dict:
  """One table row: the base and its measurement."""
  e = summary["exact"]
  held = summary["base_pass_rate"]
  reached = bool(summary.get("stopped_at_pass_rate"))
  return dict(
      arm=pt["arm"],
      level=pt["level"],
      target=pt["target"],
      seed=pt["seed"],
      sft_steps=summary["sft_steps"],
      pass_rate=held,
      matched=is_matched(reached, held, pt["target"]),
      completion_len=summary["completion_len"],
      reward_mean=summary["reward_mean"],
      trace_intra=e["trace_intra"],
      trace_intra_se=e["trace_intra_se"],
      trace_inter=e["trace_inter"],
      trace_inter_se=e["trace_inter_se"],
      ratio=e["ratio"],
      ratio_se=e["ratio_se"],
      P=summary["P"],
      K=summary["K"],
      batches=summary["M"],
  )


def run_bases(args) -> list[dict]:
  pts = sorted(points(args.quick), key=lambda p: -p["level"])  # the longest SFTs start first
  base = cfg.get_config("quick" if args.quick else "1")
  run = functools.partial(
      measure.sft_base_and_measure,
      P=P if not args.quick else 8,
      K=K if not args.quick else 4,
      M=args.batches,
  )
  rows = sweep.run_sweep(
      base,
      [overrides(p) for p in pts],
      args.root,
      names=[name(p) for p in pts],
      run_fn=run,
      workers=args.workers,
  )
  order = {name(p): i for i, p in enumerate(points(args.quick))}
  done = sorted(zip(pts, rows), key=lambda pr: order[name(pr[0])])
  return [base_row(p, r["summary"]) for p, r in done]


def fits(table: list[dict], quick: bool) -> dict:
  """The two trends over the matched bases (module docstring); an arm with
  too few matched levels says why instead of a number."""
  target = cfg.QUICK_TARGET if quick else cfg.TARGET
  out = {}
  length = [
      r
      for r in table
      if r["matched"] and r["target"] == target and r["ratio"] > 0 and math.isfinite(r["ratio"])
  ]
  try:
    out["length"] = trend.fit(
        np.log([r["completion_len"] for r in length]),
        np.log([r["ratio"] for r in length]),
        [r["level"] for r in length],
        y_star=math.log(PUBLISHED),
    )
  except ValueError as e:
    out["length"] = dict(error=str(e))
  out["levels"] = group_means(length, "level")
  at = [
      r
      for r in table
      if r["matched"] and r["level"] == (1 if quick else cfg.PASS_LEVEL) and r["ratio"] > 0
  ]
  try:
    out["pass"] = trend.fit(
        [r["pass_rate"] for r in at], np.log([r["ratio"] for r in at]), [r["target"] for r in at]
    )
  except ValueError as e:
    out["pass"] = dict(error=str(e))
  out["targets"] = group_means(at, "target")
  return out


def group_means(rows: list[dict], key: str = "level", level: float = 0.9) -> list[dict]:
  """Per value of ``key`` (a level, or a target pass rate): the geometric
  mean ratio over its bases with a t-interval on the log scale (bases as
  replicates; none with one base), the mean completion length and pass
  rate -- the shape the line through them summarises."""
  out = []
  for lv in sorted({r[key] for r in rows}):
    sel = [r for r in rows if r[key] == lv]
    ci = study.seed_interval(np.log([r["ratio"] for r in sel]).tolist(), level)
    out.append(
        dict(
            {key: lv},
            n=ci["n"],
            completion_len=float(np.mean([r["completion_len"] for r in sel])),
            pass_rate=float(np.mean([r["pass_rate"] for r in sel])),
            ratio=math.exp(ci["mean"]),
            lo=math.exp(ci["lo"]) if ci["lo"] is not None else math.nan,
            hi=math.exp(ci["hi"]) if ci["hi"] is not None else math.nan,
        )
    )
  return out


def _tokens(x: float) -> str:
  """A token count for the text: thousands separated, huge bounds in e-notation."""
  if math.isnan(x):
    return "unbounded"
  if not math.isfinite(x):
    return "∞" if x > 0 else "-∞"
  return f"{x:,.0f}" if abs(x) < 1e6 else f"{x:.1e}"


def fit_lines(f: dict) -> list[str]:
  lines = []
  L = f["length"]
  if "error" in L:
    lines.append(f"- ratio against length: no fit ({L['error']})")
  else:
    lof = L["lack_of_fit"]
    lines.append(
        f"- ratio ∝ length^b over {L['n']} bases at {L['groups']} levels: "
        f"b = {L['b']:.2f} [{L['b_lo']:.2f}, {L['b_hi']:.2f}] (90% t-interval from the level "
        f"means' scatter, {L['dof']} dof); lack of fit {lof['verdict']} "
        f"(p = {lof['p_value']:.2g})."
    )
    means = "; ".join(
        f"L{m['level']} ({m['completion_len']:.0f} tokens, {m['n']} bases) {m['ratio']:.1f} "
        f"[{m['lo']:.1f}, {m['hi']:.1f}]"
        for m in f.get("levels", [])
    )
    lines.append(f"- per level, geometric mean ratio [90% t-interval over bases]: {means}.")
    if L["b_lo"] > 0:
      lines.append(
          f"- extrapolated, the line reaches {PUBLISHED:.0f}:1 at a completion of "
          f"{_tokens(math.exp(L['x_star']))} tokens [{_tokens(math.exp(L['x_star_lo']))}, "
          f"{_tokens(math.exp(L['x_star_hi']))}] (Fieller, 90%; far outside the measured range: "
          "an extrapolation, not a measurement"
          + (
              "; the line misfits, so this number leans on a form the data reject)."
              if L["lack_of_fit"].get("p_value", 1) < 0.05
              else ")."
          )
      )
    else:
      lines.append(
          f"- the slope is not resolved above 0: where the line would reach {PUBLISHED:.0f}:1 "
          "is unresolved."
      )
  Pf = f["pass"]
  if "error" in Pf:
    lines.append(f"- ratio against pass rate: no fit ({Pf['error']})")
  else:
    lof = Pf["lack_of_fit"]
    lines.append(
        f"- log ratio against held-out pass rate at one length: slope {Pf['b']:.2f} "
        f"[{Pf['b_lo']:.2f}, {Pf['b_hi']:.2f}] per unit pass ({Pf['n']} bases, "
        f"{Pf['groups']} targets); lack of fit {lof['verdict']} (p = {lof['p_value']:.2g})."
    )
  means = "; ".join(
      f"target {m['target']:g} (pass {m['pass_rate']:.2f}, {m['n']} bases) {m['ratio']:.1f} "
      f"[{m['lo']:.1f}, {m['hi']:.1f}]"
      for m in f.get("targets", [])
  )
  if means:
    lines.append(f"- per target pass rate, geometric mean ratio [90% t-interval]: {means}.")
  return lines


def analyse(args, table, t0, command):
  out = report.Results(NAME, root=args.out)
  f = fits(table, args.quick)
  show = [
      dict(
          r,
          ratio=stats.Estimate(r["ratio"], se=r["ratio_se"]),
          trace_intra=stats.Estimate(r["trace_intra"], se=r["trace_intra_se"]),
          trace_inter=stats.Estimate(r["trace_inter"], se=r["trace_inter_se"]),
      )
      for r in table
  ]
  cols = [
      "arm",
      "level",
      "target",
      "seed",
      "sft_steps",
      "pass_rate",
      "matched",
      "completion_len",
      "ratio",
      "trace_intra",
      "trace_inter",
  ]
  unmatched = [name(r) for r in table if not r["matched"]]
  notes = [
      "level: steps per place value (0: the answer alone); target: the held-out pass rate the "
      f"base was ended at; matched: reached and within ±{cfg.MATCH} of it (only matched bases "
      "enter the fits); completion_len: mean tokens of the measured rollouts; ratio: per-rollout "
      "tr Σ_intra / tr Σ_inter (published ≈ 100), ± one jackknife SE over the pooled batches "
      f"of {table[0]['P']} x {table[0]['K']} rollouts.",
      "",
      *fit_lines(f),
      f"- not matched (left out): {', '.join(unmatched) if unmatched else 'none'}.",
      "",
      f"Command: `{command}`.",
  ]
  out.table(
      show,
      cols,
      title="Intra:inter against completion length, bases matched in pass rate",
      notes="\n".join(notes),
  )
  out.figure(plots.noise_length(table, f, PUBLISHED))
  if not args.replot:
    out.manifest(
        runs_root=args.root,
        config=cfg.get_config("quick" if args.quick else "1").to_dict(),
        wall_seconds=time.time() - t0,
        points=len(table),
    )
  return f


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  if args.replot:
    out = report.Results(NAME, root=args.out)
    table = [
        dict(r, matched=r["matched"] in (True, "True")) for r in report.read_rows(out.path(".csv"))
    ]
    analyse(args, table, t0, out.command(replot=True))
  else:
    analyse(args, run_bases(args), t0, report.command_line())


if __name__ == "__main__":
  main()
