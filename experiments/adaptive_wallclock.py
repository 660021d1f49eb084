"""Adaptive batch size against fixed N in measured wall clock, and the same
controller under an accelerator's throughput model.

    python experiments/adaptive_wallclock.py            # the study (~30 min, idle machine)
    python experiments/adaptive_wallclock.py --quick    # tiny smoke version (minutes)
    python experiments/adaptive_wallclock.py --replot   # tables and figures from the committed files

Part 1, measured on this machine. Arms, one run at a time (seeds
interleaved, so a change of machine speed falls on every arm alike), every
run from one SFT base (``<root>/sft_base``, the on-policy study's recipe):

* adaptive -- ``configs/adaptive_batch.py:b_noise`` with the time objective
  (``cbs_jax.controller``, ``docs/batch_law.md``: the bucket with the least
  predicted time to a target, (1 + B / N) t(N), B from the live tracker,
  t(N) the round times measured on this machine with a calibration at
  start), Adam's second moment rescaled and the lr ramped on a switch;
* fixed best -- ``--best_n`` (default 128: the least time to 0.54 of the
  on-policy study's N grid in ``experiments/results/adaptive_batch/`` when
  this study was designed; on a processor whose throughput peaks at 256
  that is the default's N, and the arm shows what 128 costs there);
* fixed default -- N = 256, the config default.

Wall clock to a target: the seconds the run spent in its rounds (generation
and updates, with every compile: the first round at each N compiles) up to
the round of the first evaluation at or past the target, plus the adaptive
run's calibration. Evaluation is left out (every arm evaluates on the same
rollout grid, ``configs/adaptive_batch.py`` EVAL_GRID). Ratios of means with
a 90% percentile bootstrap interval (seeds resampled within each arm).

Part 2, modelled. The adaptive run with ``batch.adaptive_round_time`` set to
each of ``--accelerators``: its rounds cost the accelerator's roofline time
for this model (``systems.round_time``), summed to the target. The fixed
arms under the same model: this study's fixed runs (same SFT base and
evaluation grid), rounds to the target times the modelled round time at
their N; the best fixed N is the least mean modelled time among them.

Writes <out>/adaptive_wallclock/: the table (.md, .csv), one line per run
(``_runs.csv``), the per-run curves (``_curves.csv``: round, N, rollouts,
seconds, modelled seconds, held-out pass, and each run's round timings)
and per-round trajectories (``_traj.csv``: N, the signal with its
interval, the predicted optimum), N over training beside the signal and
the predicted optimum (``_n.png``), manifest.json. ``--replot`` rebuilds
every table and figure from those files alone.
"""

from __future__ import annotations

import functools
import math
import os
import time

import numpy as np
from absl import logging

from cbs_jax import batch_law as batch_law_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from cbs_jax import sweep
from cbs_jax import systems
from cbs_jax import train
from configs import adaptive_batch
from configs import batch_law

NAME = "adaptive_wallclock"
LEVEL = 0.9
NEAR = 1.10  # the goal: within 10% of the best fixed N
# a run's committed scalars (``_curves.csv`` beside its curve) and its trajectory's file
RUN_KEYS = (
    "arm",
    "seed",
    "name",
    "modelled",
    "first_round_s",
    "median_round_s",
    "calibration_s",
    "held_for_cost",
)
TRAJ = "_traj.csv"


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__, NAME, "sweep root (one workdir per run)", workers=False, replot=True
  )
  ap.add_argument("--seeds", default=None, help="seeds, comma-separated (default 0-4; quick 0,1)")
  ap.add_argument("--best_n", type=int, default=128, help="the best fixed N (rollouts per round)")
  ap.add_argument("--accelerators", default="h100_sxm,tpu_v5e", help="modelled accelerators")
  ap.add_argument(
      "--modelled_seeds", default=None, help="seeds of the modelled runs (default 0,1,2; quick 0)"
  )
  ap.add_argument(
      "--switch_ablation",
      action="store_true",
      help="also run the first accelerator's adaptive arm with Adam's second moment kept "
      "(no rescale), with the new lr at once (no ramp) and with the first moment kept: "
      "which part of a switch costs",
  )
  ap.add_argument(
      "--modelled_ns",
      default=None,
      help="more fixed N (rollouts per round) for the modelled comparison and the switch "
      "penalty, run with the modelled seeds (default 1024,4096,8192; quick 32)",
  )
  args = study_runner.parse(ap, argv)
  seeds = lambda s, d: [int(x) for x in (s or d).split(",") if x]
  args.seeds = seeds(args.seeds, "0,1" if args.quick else "0,1,2,3,4")
  args.modelled_seeds = seeds(args.modelled_seeds, "0" if args.quick else "0,1,2")
  args.modelled_ns = seeds(args.modelled_ns, "32" if args.quick else "1024,4096,8192")
  args.accelerators = [a for a in args.accelerators.split(",") if a]
  for a in args.accelerators:
    try:
      systems.get_accelerator(a)
    except ValueError as e:
      ap.error(f"--accelerators: {e}")
  if len(set(args.seeds)) < 2:
    ap.error("--seeds: need at least two seeds for an interval")
  return args


# ---------------------------------------------------------------- configs


def configs(args):
  """(adaptive config, fixed config, targets, eval grid)."""
  arg = "quick" if args.quick else "b_noise"
  ad = adaptive_batch.get_config(arg)
  fx = batch_law.get_config("quick" if args.quick else "on")
  with fx.unlocked():
    fx.train.eval_every = 1  # evaluations on the rollout grid (run_on_grid)
    fx.train.num_rounds = ad.train.num_rounds
  tgt = batch_law.targets("quick" if args.quick else "on")
  return ad, fx, tgt, adaptive_batch.eval_grid(arg)


def arms(args, ad, fx):
  """{arm: (config, overrides per seed)} of part 1, and part 2's: the
  modelled adaptive arms and the fixed arms at ``--modelled_ns`` (rounds
  to the target do not depend on the machine's load, so these run at the
  modelled seeds only)."""
  K = fx.batch.rollouts_per_prompt
  default_n = fx.batch.num_prompts * K
  best_n = (4 * K) if args.quick else args.best_n
  if best_n % K:
    raise SystemExit(f"--best_n={best_n} is not a multiple of K={K}")
  measured = {
      "adaptive": (ad, {}),
      f"fixed best (N={best_n})": (fx, {"batch.num_prompts": best_n // K}),
      f"fixed default (N={default_n})": (fx, {"batch.num_prompts": default_n // K}),
  }
  modelled = {f"adaptive {a}": (ad, {"batch.adaptive_round_time": a}) for a in args.accelerators}
  if args.switch_ablation:
    a = args.accelerators[0]
    modelled[f"adaptive {a}, nu kept"] = (
        ad,
        {"batch.adaptive_round_time": a, "batch.adaptive_rescale_nu": False},
    )
    modelled[f"adaptive {a}, no ramp"] = (
        ad,
        {"batch.adaptive_round_time": a, "batch.adaptive_switch_warmup": 0},
    )
    modelled[f"adaptive {a}, mu kept"] = (
        ad,
        {"batch.adaptive_round_time": a, "batch.adaptive_rescale_mu": False},
    )
  bad = [n for n in args.modelled_ns if n % K]
  if bad:
    raise SystemExit(f"--modelled_ns {bad} are not multiples of K={K}")
  modelled |= {
      f"fixed N={n}": (fx, {"batch.num_prompts": n // K})
      for n in args.modelled_ns
      if n not in (best_n, default_n)
  }
  return measured, modelled


def run(config, over, root, grid):
  return sweep.run_sweep(
      config,
      [over],
      root,
      workers=1,
      progress=False,
      run_fn=functools.partial(study_runner.run_on_grid, grid=grid),
  )[0]


# ---------------------------------------------------------------- a run


def record(row, arm, round_model=None):
  """A run's curve (rounds, N, rollouts, measured seconds, modelled seconds
  with ``round_model``, held-out score), its per-round trajectory and round
  timings."""
  rows = metrics_lib.read_jsonl(os.path.join(row["workdir"], "metrics.jsonl"))
  summ = row.get("summary") or {}
  sec = float(summ.get("calibration_seconds") or 0.0)
  msec = 0.0
  curve = {k: [] for k in ("round", "N", "rollouts", "seconds", "modelled_s", "score")}
  traj = {k: [] for k in ("round", "N", "signal", "lo", "hi", "target")}
  N = None
  for r in rows:
    if "batch_size" in r:
      N = r["batch_size"]
      sec += r["gen_seconds"] + r["update_seconds"]
      if round_model is not None:
        msec += round_model(N)
      traj["round"].append(r["round"])
      traj["N"].append(N)
      for k, f in (("signal", "adaptive/signal"), ("lo", "adaptive/signal_lo")):
        traj[k].append(_float(r.get(f)))
      traj["hi"].append(_float(r.get("adaptive/signal_hi")))
      traj["target"].append(_float(r.get("adaptive/target_batch_size")))
    score = study.score_of(r)
    if score is None:
      continue
    curve["round"].append(r["round"])
    curve["N"].append(N)
    curve["rollouts"].append(r.get("rollouts_seen", 0) or 0)
    curve["seconds"].append(sec)
    curve["modelled_s"].append(msec)
    curve["score"].append(score)
  secs = [r["gen_seconds"] + r["update_seconds"] for r in rows if "batch_size" in r]
  curve["N"] = [_float(n) for n in curve["N"]]  # nan before the first round
  return dict(
      arm=arm,
      seed=row["overrides"].get("seed", 0),
      name=row["name"],
      modelled=round_model is not None,
      curve=curve,
      traj=traj,
      # where the seconds go: the first round compiles; the calibration is timed apart
      first_round_s=secs[0] if secs else None,
      median_round_s=float(np.median(secs)) if secs else None,
      calibration_s=float(summ.get("calibration_seconds") or 0.0),
      held_for_cost=next(
          (r["adaptive/held_for_cost"] for r in reversed(rows) if "adaptive/held_for_cost" in r),
          None,
      ),
  )


def finish(rec, targets) -> dict:
  """A committed record (``study_report.load_records``) with the N it
  visited and its to-target values (rounds, rollouts, measured seconds,
  and modelled seconds where it ran under a model)."""
  c = rec["curve"]
  xs = ("rounds", "rollouts", "seconds") + (("modelled_s",) if rec["modelled"] else ())
  to = {
      float(t): {
          x: batch_law_lib.steps_to_target(c["round" if x == "rounds" else x], c["score"], t)
          for x in xs
      }
      for t in targets
  }
  return dict(rec, to=to, N_visited=sorted({int(n) for n in rec["traj"]["N"]}))


def _float(v):
  if v is None:
    return math.nan
  return math.inf if v == "inf" else float(v)


def verdict(r, lo, hi, threshold):
  if r is None:
    return "unresolved (a seed did not reach the target)"
  if hi <= threshold:
    return "met"
  if lo > threshold:
    return "not met"
  return f"unresolved (interval straddles {threshold:g})"


# ------------------------------------------------------ the switch penalty


def after_switch(rec, s1):
  """(new N, rollouts from the first switch to score ``s1``, score at the
  switch) of an adaptive run; None when it never switched, switched after
  reaching ``s1`` or never reached it."""
  N, rounds = rec["traj"]["N"], rec["traj"]["round"]
  i = next((j for j in range(1, len(N)) if N[j] != N[0]), None)
  if i is None:
    return None
  c = rec["curve"]
  roll = np.asarray(c["rollouts"], float)
  score = np.asarray(c["score"], float)
  r_sw = N[0] * (rounds[i] - 1)  # rollouts seen before the first round at the new N
  if not roll.size or r_sw >= roll[-1]:
    return None
  s0 = float(np.interp(r_sw, roll, score))
  after = roll >= r_sw
  r1 = batch_law_lib.steps_to_target(
      np.concatenate([[r_sw], roll[after]]), np.concatenate([[s0], score[after]]), s1
  )
  if s0 >= s1 or r1 is None:
    return None
  return N[i], r1 - r_sw, s0


def switch_penalty(adaptive, fixed_by_n, s1):
  """Rollouts an adaptive run needed from its first switch to ``s1`` over
  what runs started fresh at its new N needed between the same two scores
  (fixed arms at that N), ratio of means with a bootstrap interval.
  Returns rows per new N."""
  out = {}
  for rec in adaptive:
    a = after_switch(rec, s1)
    if a is None or a[0] not in fixed_by_n:
      continue
    n_new, need, s0 = a
    fresh = []
    for f in fixed_by_n[n_new]:
      c = f["curve"]
      r0 = batch_law_lib.steps_to_target(c["rollouts"], c["score"], s0)
      r1 = batch_law_lib.steps_to_target(c["rollouts"], c["score"], s1)
      if r0 is not None and r1 is not None:
        fresh.append(r1 - r0)
    if fresh:
      o = out.setdefault(n_new, dict(adaptive=[], fresh=[]))
      o["adaptive"].append(need)
      o["fresh"].append(float(np.mean(fresh)))
  rows = []
  for n_new, o in sorted(out.items()):
    r, lo, hi = (
        stats.ratio_of_means_interval(o["adaptive"], o["fresh"])
        if len(o["adaptive"]) >= 2
        else (None,) * 3
    )
    rows.append(dict(N=n_new, runs=len(o["adaptive"]), ratio=r, lo=lo, hi=hi))
  return rows


# ------------------------------------------------------ the modelled fixed arms


def fixed_modelled(fixed_arms, main_t, model):
  """{N: [modelled seconds to main_t per seed]} of this study's fixed arms
  (their rounds to the target x the model's round time at their N): runs
  from the same SFT base and evaluation grid as the adaptive ones."""
  out = {}
  for rs in fixed_arms:
    for r in rs:
      N = r["N_visited"][0]
      v = r["to"][main_t]["rounds"]
      out.setdefault(N, []).append(None if v is None else v * model(N))
  return out


# ---------------------------------------------------------------- main


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  ad, fx, tgt, grid = configs(args)
  main_t = float(tgt[len(tgt) // 2])
  measured, modelled = arms(args, ad, fx)
  setup = run_setup.prepare(ad)
  models = {a: train.round_time_model(ad, setup, a) for a in args.accelerators}
  out = report.Results(NAME, root=args.out)

  def make():
    study_runner.prepare_base(fx, args.root)
    recs = {a: [] for a in measured}
    for seed in args.seeds:  # interleaved: seed by seed, every arm
      for arm, (c, over) in measured.items():
        recs[arm].append(record(run(c, dict(over, seed=seed), args.root, grid), arm))
    mrecs = {a: [] for a in modelled}
    for seed in args.modelled_seeds:
      for arm, (c, over) in modelled.items():
        acc = over.get("batch.adaptive_round_time")
        row = run(c, dict(over, seed=seed), args.root, grid)
        mrecs[arm].append(record(row, arm, models.get(acc)))
    groups = recs | mrecs
    study_report.save_records(out, groups, TRAJ, keys=("name", "seed"), series="traj")
    return groups

  groups = study_runner.records(args, out, None, make, keys=RUN_KEYS)
  trajs = study_report.load_records(out, None, TRAJ, keys=("name", "seed"), series="traj")
  for g, rs in groups.items():
    for r, tr in zip(rs, trajs[g]):
      r["traj"] = tr["traj"]
  groups = {g: [finish(r, tgt) for r in rs] for g, rs in groups.items()}
  recs = {a: groups[a] for a in measured}
  mrecs = {a: groups[a] for a in modelled}
  mfixed = {a: rs for a, rs in mrecs.items() if a.startswith("fixed")}
  mrecs = {a: rs for a, rs in mrecs.items() if not a.startswith("fixed")}

  # ------------------------------------------------------------ part 1 table
  best_arm = next(a for a in measured if a.startswith("fixed best"))
  default_arm = next(a for a in measured if a.startswith("fixed default"))
  table, verdicts = [], []
  val = lambda rs, x: [r["to"][main_t][x] for r in rs]
  for arm, rs in recs.items():
    d = dict(arm=arm, N=" ".join(str(n) for n in sorted({n for r in rs for n in r["N_visited"]})))
    d["seeds"] = len(rs)
    for t in tgt:
      t = float(t)
      d[f"reached@{t}"] = f"{sum(r['to'][t]['rounds'] is not None for r in rs)}/{len(rs)}"
      for x, lab in (("rollouts", "rollouts"), ("seconds", "wall s")):
        iv = study.seed_interval(val(rs, x) if t == main_t else [r["to"][t][x] for r in rs], LEVEL)
        d[f"{lab}@{t}"] = stats.Estimate(iv["mean"], iv["lo"], iv["hi"])
    for ref, thr, lab in ((best_arm, NEAR, "vs best"), (default_arm, 1.0, "vs default")):
      r_, lo, hi = stats.ratio_of_means_interval(val(rs, "seconds"), val(recs[ref], "seconds"))
      d[lab] = stats.Estimate(r_, lo, hi) if r_ is not None else None
      if arm == "adaptive":
        verdicts.append(
            f"- adaptive vs {ref}: measured seconds-to-{main_t} ratio {d[lab]} "
            f"(goal {'<= ' if thr > 1 else '< '}{thr:g}) -> {verdict(r_, lo, hi, thr)}"
        )
    table.append(d)

  # ------------------------------------------------------------ the switch penalty
  fixed_by_n = {}
  for arm, rs in list(recs.items()) + list(mfixed.items()):
    if arm.startswith("fixed") and rs:
      fixed_by_n[rs[0]["N_visited"][0]] = rs
  ablation = {a: rs for a, rs in mrecs.items() if "," in a}
  adaptive_all = recs["adaptive"] + [r for a, rs in mrecs.items() if a not in ablation for r in rs]
  penalty = switch_penalty(adaptive_all, fixed_by_n, main_t)
  switched = sum(len(set(r["traj"]["N"])) > 1 for r in adaptive_all)
  penalty_lines = [
      f"- Switch penalty at the new N = {p['N']}: rollouts from the switch to {main_t} over "
      f"what fresh runs at that N needed between the same scores, {p['runs']} runs: "
      + (
          stats.fmt(p["ratio"], p["lo"], p["hi"])
          if p["ratio"] is not None
          else "one run, no interval"
      )
      for p in penalty
  ] or [
      f"- Switch penalty: not measurable ({switched} of {len(adaptive_all)} adaptive runs "
      "switched before the target to an N with a fixed arm)."
  ]
  for arm, rs in ablation.items():
    for p in switch_penalty(rs, fixed_by_n, main_t):
      penalty_lines.append(
          f"- Switch penalty of {arm} at the new N = {p['N']}, {p['runs']} runs: "
          + (stats.fmt(p["ratio"], p["lo"], p["hi"]) if p["ratio"] is not None else "one run")
      )

  # ------------------------------------------------------------ part 2 table
  mtable = []
  for arm, rs in mrecs.items():
    acc = modelled[arm][1]["batch.adaptive_round_time"]
    fixed = fixed_modelled(
        [rs for a, rs in list(recs.items()) + list(mfixed.items()) if a.startswith("fixed")],
        main_t,
        models[acc],
    )
    # candidates: every seed reached, and two seeds at least (an interval)
    means = {N: float(np.mean(v)) for N, v in fixed.items() if len(v) >= 2 and None not in v}
    best_n = min(means, key=means.get) if means else None
    ad_s = val(rs, "modelled_s")
    d = dict(
        accelerator=arm.removeprefix("adaptive "),
        adaptive_N=" ".join(str(n) for n in sorted({n for r in rs for n in r["N_visited"]})),
    )
    iv = study.seed_interval(ad_s, LEVEL)
    d["adaptive s"] = stats.Estimate(iv["mean"], iv["lo"], iv["hi"])
    d["best fixed N"] = best_n if best_n else "–"
    if best_n:
      ivb = study.seed_interval(fixed[best_n], LEVEL)
      d["best fixed s"] = stats.Estimate(ivb["mean"], ivb["lo"], ivb["hi"])
      r_, lo, hi = stats.ratio_of_means_interval(ad_s, fixed[best_n])
      d["vs best"] = stats.Estimate(r_, lo, hi) if r_ is not None else None
      verdicts.append(
          f"- modelled {d['accelerator']}: adaptive vs best fixed N={best_n} under the same model: "
          f"{d['vs best']} -> {verdict(r_, lo, hi, NEAR)}"
      )
    mtable.append(d)

  # ------------------------------------------------------------ files
  cols = (
      ["arm", "N", "seeds"]
      + [f"{k}@{float(t)}" for t in tgt for k in ("rollouts", "wall s", "reached")]
      + ["vs best", "vs default"]
  )
  notes = [
      f"Measured on this machine, one run at a time, seeds {args.seeds} interleaved. Target: "
      f"held-out exact expected pass rate, main {main_t}. Wall s: seconds in rounds "
      "(generation + updates, compiles included) to the first evaluation at or past the "
      "target, plus the adaptive run's calibration; evaluations excluded. Cells: mean "
      "[90% t-interval] over seeds; ratios: of means, 90% percentile bootstrap (seeds "
      "resampled within each arm).",
      "",
      "Verdicts (goal: adaptive <= 1.1x the best fixed N and below the default):",
      *verdicts,
      *penalty_lines,
      "",
      "Modelled (part 2): "
      + "; ".join(
          f"{d['accelerator']}: adaptive visited N {d['adaptive_N']}, "
          f"{d['adaptive s']} s vs best fixed N={d['best fixed N']} "
          f"{d.get('best fixed s', '–')} s (ratio {d.get('vs best', '–')})"
          for d in mtable
      )
      + f". Fixed arms: this study's fixed runs (N = {sorted(fixed_by_n)}), rounds to {main_t} "
      "x the modelled round time at their N (the same SFT base, rate rule and evaluation grid "
      "as the adaptive runs). Switch penalty: every adaptive run, measured or modelled, that "
      "switched to an N with a fixed arm.",
      f"- Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      table,
      cols,
      title="Adaptive vs fixed batch size in measured wall clock",
      notes="\n".join(notes),
  )
  runs = []
  for arm, rs in list(recs.items()) + list(mrecs.items()) + list(mfixed.items()):
    for r in rs:
      pr = dict(arm=arm, seed=r["seed"], N_visited=" ".join(map(str, r["N_visited"])))
      for k in ("first_round_s", "median_round_s", "calibration_s", "held_for_cost"):
        pr[k] = r[k]
      for t in tgt:
        for x, v in r["to"][float(t)].items():
          pr[f"{x}@{float(t)}"] = v
      runs.append(pr)
  out.rows(runs, "_runs.csv")
  r0 = sorted(recs["adaptive"], key=lambda r: r["seed"])[0]
  tr = r0["traj"]
  ok = [math.isfinite(h) and lo > 0 for lo, h in zip(tr["lo"], tr["hi"])]
  plots.save(
      plots.adaptive_batch(
          tr["round"],
          tr["N"],
          tr["signal"],
          [v if k else math.nan for v, k in zip(tr["lo"], ok)],
          [v if k else math.nan for v, k in zip(tr["hi"], ok)],
          title=f"adaptive N (time objective, seed {r0['seed']}); dashed: the predicted optimum",
          signal_label="B_noise (rollouts)",
          predicted=tr["target"],
      ),
      out.path("_n.png"),
  )
  moved = [r for rs in mrecs.values() for r in rs if len(r["N_visited"]) > 1]
  if moved:  # the first modelled run that switched: where the model took it
    m0 = moved[0]
    tr = m0["traj"]
    plots.save(
        plots.adaptive_batch(
            tr["round"],
            tr["N"],
            tr["signal"],
            tr["lo"],
            tr["hi"],
            title=f"{m0['arm']} (modelled round times, seed {m0['seed']}); "
            "dashed: the predicted optimum",
            signal_label="B_noise (rollouts)",
            predicted=tr["target"],
        ),
        out.path("_n_modelled.png"),
    )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=args.root,
      config=ad,
      wall_seconds=time.time() - t0,
      targets=list(tgt),
      seeds=args.seeds,
      modelled_seeds=args.modelled_seeds,
      modelled_ns=args.modelled_ns,
      accelerators=args.accelerators,
      arms={a: o for a, (_, o) in measured.items()},
      switch_penalty=penalty,
      eval_grid=grid,
  )


if __name__ == "__main__":
  main()
