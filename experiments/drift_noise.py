"""Gradient noise against policy drift under off-policy reuse.

    python experiments/drift_noise.py                  # 8 runs (~1 h, 2 workers)
    python experiments/drift_noise.py --quick          # tiny smoke version

Published claim: reusing a rollout batch for several updates inflates the
gradient noise quadratically in the drift kappa = KL(behaviour || current).
Runs ``configs/drift_noise.py`` pg<m> (plain importance-weighted policy
gradient, no clipping) and clip<m> (PPO clip 0.2) for m = 2, 4, 8, 16 updates
per generation round of 1,024 rollouts (one seed each). At every update j of
every round: kappa exactly (full vocabulary) on probe rollouts no update
uses, and the exact per-rollout tr Sigma_intra, tr Sigma_inter and |G|^2 at
the current parameters on update j's minibatch (not yet fitted to).

Per (m, j) the rounds are pooled (``noise_stats.pooled_estimates``: jackknife SEs
over rounds) into one point per reuse step, and tr Sigma_intra relative to
the round's first update (the within-round inflation, which removes the
slow change over training) is a ratio of sums over rounds with a jackknife
SE (``stats.ratio_of_means``; a mean of per-round ratios would be biased
upward by the small minibatches' noise). Each quantity is then
fitted against kappa, weighted by the points' SEs, constant vs linear vs
quadratic (``drift.fit_trend``); a quadratic is claimed only when it beats
the linear model. Clipped tokens stop contributing gradient, which lowers
the measured trace: hence the unclipped arm.

The reuse design above never left kappa <= 0.006 (published 0.08-0.09), so
``--design=regime`` runs where the drift gets there (``drift_regime.py``,
the pilot): variants e<E>x<L> of ``configs/drift_noise.py`` (pg8 over E
epochs, learning rate x L), 3 seeds, two axes of drift -- reuse (E = 1, 2,
4, 8 at the on-policy rate) and rate (x1, x2, x4 at E = 2) -- each fitted
on its own, every test of both in one Holm family. Rounds of all seeds are
pooled per (variant, update j).

    python experiments/drift_noise.py --design=regime   # 6 variants x 3 seeds (~25 min)

Writes experiments/results/drift_noise/ (or drift_noise_regime/): the
per-point table (.md, .csv), the fits, figures of each quantity against
kappa, manifest.json.
"""

from __future__ import annotations

import json
import os
import re
import time

import numpy as np
from absl import logging

from cbs_jax import drift
from cbs_jax import metrics as metrics_lib
from cbs_jax import noise_stats
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study_runner
from configs import drift_noise

NAME = "drift_noise"
QUANTITIES = ("inflation", "trace_intra", "trace_inter", "g2", "b_noise")
REGIME_VARIANTS = ("e1x1", "e2x1", "e4x1", "e8x1", "e2x2", "e2x4")
REGIME_SEEDS = (0, 1, 2)
PUBLISHED_KAPPA = 0.08


def parse_args(argv=None):
  ap = study_runner.parser(__doc__, NAME, "sweep root, one run <root>/<variant> each", replot=True)
  ap.add_argument(
      "--design",
      choices=("reuse", "regime"),
      default="reuse",
      help="reuse: pg<m>/clip<m>, one seed; regime: e<E>x<L> at the published drift, 3 seeds",
  )
  ap.add_argument("--reuse", default="2,4,8,16", help="updates per round m (reuse design)")
  ap.add_argument("--arms", default="pg,clip", help="pg (unclipped) and/or clip (0.2)")
  ap.add_argument(
      "--variants",
      default=",".join(REGIME_VARIANTS),
      help="regime design: e<E>x<L> variants of configs/drift_noise.py",
  )
  ap.add_argument(
      "--skip_rounds",
      type=int,
      default=5,
      help="first rounds left out of the pooling (Adam warming up)",
  )
  args = study_runner.parse(ap, argv)
  if args.quick:
    args.skip_rounds = 0
  if args.design == "regime":
    args.variants = args.variants.split(",")
    for v in args.variants:
      try:
        drift_noise.get_config(v)
      except ValueError as e:
        ap.error(f"--variants: {e}")
      if not v.startswith("e"):
        ap.error(f"--variants: {v!r} is not an e<E>x<L> variant")
  return args


def points(workdirs, K, P_mb, skip):
  """One point per update index j, the rounds (after the first ``skip``)
  of every run in ``workdirs`` (seeds of one variant) pooled."""
  if isinstance(workdirs, str):
    workdirs = [workdirs]
  rows = [
      r
      for wd in workdirs
      for r in metrics_lib.read_jsonl(os.path.join(wd, "metrics.jsonl"))
      if r.get("round", 0) > skip and "trace_intra_by_update" in r
  ]
  if not rows:
    return []
  U = len(rows[0]["trace_intra_by_update"])
  out = []
  for j in range(U):
    ests = [
        dict(
            trace_intra=r["trace_intra_by_update"][j],
            trace_inter=r["trace_inter_by_update"][j],
            g2=r["g2_by_update"][j],
        )
        for r in rows
    ]
    pooled = noise_stats.pooled_estimates(ests, P_mb, K)
    kap = np.array([r["heldout_kappa_exact_by_update"][j] for r in rows])
    # ratio of the rounds' sums, not the mean of per-round ratios: that one is
    # biased upward by ~CV(tr_0)^2, large for the small minibatches of big m
    infl, infl_se = stats.ratio_of_means(
        [r["trace_intra_by_update"][j] for r in rows], [r["trace_intra_by_update"][0] for r in rows]
    )
    clip = np.array(
        [
            r.get("clip_frac_low_by_update", [0] * U)[j]
            + r.get("clip_frac_high_by_update", [0] * U)[j]
            for r in rows
        ]
    )
    n = len(rows)
    out.append(
        dict(
            j=j,
            rounds=n,
            kappa=float(kap.mean()),
            kappa_se=float(kap.std(ddof=1) / np.sqrt(n)) if n > 1 else None,
            inflation=infl,
            inflation_se=infl_se if j else None,
            trace_intra=pooled.trace_intra,
            trace_intra_se=pooled.trace_intra_se,
            trace_inter=pooled.trace_inter,
            trace_inter_se=pooled.trace_inter_se,
            g2=pooled.g2,
            g2_se=pooled.g2_se,
            b_noise=pooled.b_noise,
            b_noise_se=pooled.b_noise_se,
            clip_frac=float(clip.mean()),
        )
    )
  return out


def regime_configs(variants, quick: bool) -> dict:
  """``{<variant>__seed=<s>: config}`` of the regime design; ``quick``: the
  tiny model of "quick" with each variant's epochs and rate scale, one seed."""
  lr0 = drift_noise.get_config("pg8").optim.lr
  out = {}
  for v in variants:
    for s in (0,) if quick else REGIME_SEEDS:
      c = drift_noise.get_config(v)
      if quick:
        q = drift_noise.get_config("quick")
        q.batch.num_epochs = c.batch.num_epochs
        q.optim.lr *= c.optim.lr / lr0
        c = q
      c.seed = s
      out[f"{v}__seed={s}"] = c
  return out


def regime_groups(table) -> dict:
  """The two axes of drift, each fitted on its own: reuse (every epoch
  count at the on-policy rate) and rate (every rate at 2 epochs); and the
  first epoch of every variant apart ("fresh": update j's minibatch not yet
  fitted, as in the reuse design): from the second epoch on, the noise is
  measured on rollouts the policy has already been fitted to, which moves
  it for a reason other than drift."""
  groups = {
      "reuse (lr x1)": [r for r in table if r["lr_scale"] == 1],
      "rate (2 epochs)": [r for r in table if r["epochs"] == 2],
      "fresh (first epoch, all)": [r for r in table if r["j"] < r["m"] // r["epochs"]],
  }
  return {g: rs for g, rs in groups.items() if len({r["arm"] for r in rs}) > 1}


def reach_lines(table) -> list[str]:
  """How close each regime variant got to the published drift: kappa and
  the inflation of tr Σ_intra at its last update of a round."""
  out = [
      f"## Drift reached (published kappa ~ {PUBLISHED_KAPPA})",
      "",
      "| variant | updates per round | kappa at the last update | inflation there |",
      "|---|---|---|---|",
  ]
  for v in dict.fromkeys(r["arm"] for r in table):
    last = max((r for r in table if r["arm"] == v), key=lambda r: r["j"])
    out.append(
        f"| {v} | {last['m']} | {stats.fmt(last['kappa'], se=last['kappa_se'])} | "
        f"{stats.fmt(last['inflation'], se=last['inflation_se'])} |"
    )
  return out + [""]


def pooled_table(args, configs, runs_of, regime: bool) -> list[dict]:
  """Run (or read back) the sweep; one pooled point per (variant, update j)."""
  rows = study_runner.run_variants(configs, args.root, workers=args.workers)
  table = []
  for v, names in runs_of.items():
    c = configs[names[0]]
    m = c.batch.num_minibatches
    arm = v if regime else ("pg" if c.rl.loss == "pg" else "clip")
    lab = dict(arm=arm, m=m * c.batch.num_epochs)
    if regime:
      E, L = (int(x) for x in re.fullmatch(r"e(\d+)x(\d+)", v).groups())
      lab |= dict(epochs=E, lr_scale=L)
    for p in points(
        [rows[n]["workdir"] for n in names],
        c.batch.rollouts_per_prompt,
        c.batch.num_prompts // m,
        args.skip_rounds,
    ):
      table.append(dict(lab, seeds=len(names), **p))
  return table


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  regime = args.design == "regime"
  out = report.Results(NAME + ("_regime" if regime else ""), root=args.out)
  if regime:
    variants = list(args.variants[:2] if args.quick else args.variants)
    configs = regime_configs(variants, args.quick)
    runs_of = {v: [n for n in configs if n.startswith(f"{v}__")] for v in variants}
  else:
    arms = args.arms.split(",")
    ms = [int(m) for m in args.reuse.split(",")]
    variants = ["quick"] if args.quick else [f"{a}{m}" for a in arms for m in ms]
    configs = {v: drift_noise.get_config(v) for v in variants}
    runs_of = {v: [v] for v in variants}
  command = out.command(args.replot)
  if args.replot:  # the pooled points of the committed fits file
    with open(out.path("_fits.json")) as f:
      table = json.load(f)["points"]
  else:
    table = pooled_table(args, configs, runs_of, regime)
  if regime:
    groups = regime_groups(table)
  else:
    groups = {a: [r for r in table if r["arm"] == a] for a in sorted({r["arm"] for r in table})}
  fits = {}
  for arm, rs in groups.items():
    pts = [r for r in rs if r["j"] > 0]  # j = 0: kappa = 0 exactly
    base = [r for r in rs if r["j"] == 0]
    fits[arm] = {}
    for q in QUANTITIES:
      sel = [r for r in pts + base if r[q] == r[q] and r[f"{q}_se"]]
      try:
        fits[arm][q] = drift.fit_trend(
            [r["kappa"] for r in sel], [r[q] for r in sel], [r[f"{q}_se"] for r in sel]
        )
      except ValueError as e:
        fits[arm][q] = dict(verdict="unresolved", error=str(e))
  # every F-test of every arm and quantity is one family (Holm): the verdicts
  # keep a 5% chance in all of calling any flat quantity a trend
  family = drift.choose_models({(a, q): f for a, fq in fits.items() for q, f in fq.items()})
  fits = {a: {q: family[(a, q)] for q in fq} for a, fq in fits.items()}

  show = [
      dict(
          arm=r["arm"],
          m=r["m"],
          seeds=r.get("seeds", 1),
          j=r["j"],
          rounds=r["rounds"],
          kappa=stats.Estimate(r["kappa"], se=r["kappa_se"]),
          inflation=stats.Estimate(r["inflation"], se=r["inflation_se"]),
          trace_intra=stats.Estimate(r["trace_intra"], se=r["trace_intra_se"]),
          trace_inter=stats.Estimate(r["trace_inter"], se=r["trace_inter_se"]),
          g2=stats.Estimate(r["g2"], se=r["g2_se"]),
          b_noise=stats.Estimate(r["b_noise"], se=r["b_noise_se"]),
          clip_frac=r["clip_frac"],
      )
      for r in table
  ]
  cols = [
      "arm",
      "m",
      "seeds",
      "j",
      "rounds",
      "kappa",
      "inflation",
      "trace_intra",
      "trace_inter",
      "g2",
      "b_noise",
      "clip_frac",
  ]
  lines = [
      "| arm | quantity | verdict (Holm) | uncorrected | p(linear) adj. [raw] | "
      "p(quadratic) adj. [raw] | linear slope ± SE | quadratic a2 ± SE | "
      "verdict's model: kappa = 0 → max |",
      "|---|---|---|---|---|---|---|---|---|",
  ]
  for arm, fq in fits.items():
    kmax = max(r["kappa"] for r in groups[arm])
    for q, f in fq.items():
      if "error" in f:
        lines.append(f"| {arm} | {q} | unresolved: {f['error']} | | | | | | |")
        continue
      y0, y1 = plots.trend_curve(f, [0.0, kmax])  # the verdict's model
      lines.append(
          f"| {arm} | {q} | {f['verdict']} | {f['verdict_uncorrected']} | "
          f"{f['p_linear_adj']:.3g} [{f['p_linear']:.3g}] | "
          f"{f['p_quadratic_adj']:.3g} [{f['p_quadratic']:.3g}] | "
          f"{stats.fmt(f['linear']['coef'][1], se=f['linear']['se'][1])} | "
          f"{stats.fmt(f['quadratic']['coef'][2], se=f['quadratic']['se'][2])} | "
          f"{y0:.3g} → {y1:.3g} at {kmax:.3g} |"
      )
  notes = [
      "kappa: KL(behaviour || current) per token, exact, on probe rollouts no update "
      "uses, before update j (j = 0: on-policy, 0). inflation: tr Σ_intra at update j / "
      "at update 0, summed over rounds before dividing (jackknife SE over rounds). Other columns: pooled over "
      "rounds at update j (jackknife SE); b_noise nan where |G|^2 is not resolved. "
      + (
          "arm: the variant e<E>x<L> (pg8 over E epochs, learning rate x L, unclipped), "
          "m: updates per round; the seeds' rounds pooled."
          if regime
          else "pg = plain importance-weighted policy gradient (no clipping); clip = PPO 0.2."
      ),
      "",
      *(reach_lines(table) if regime else []),
      "## Trend against kappa (weighted by the points' SEs; F-tests at a family-wise 0.05)",
      "",
      "Every F-test of the table (linear over constant, quadratic over linear, for each "
      "arm and quantity) is one family, Holm-corrected (`drift.choose_models`): the chance "
      "that any truly flat quantity is called a trend stays <= 0.05. The last column: the "
      "verdict's model at kappa = 0 and at the largest kappa of the group (the trend's "
      "direction: a quadratic verdict can fall).",
      "",
      *lines,
      "",
      "Published: noise inflates quadratically in kappa.",
      f"Command: `{command}`.",
  ]
  out.table(
      show,
      cols,
      title="Gradient noise against drift (off-policy reuse"
      + (", at the published drift)" if regime else ")"),
      notes="\n".join(notes),
  )
  report.write_json(out.path("_fits.json"), dict(fits=fits, points=table))
  for q in ("inflation", "trace_intra", "b_noise"):
    for arm in fits:
      sel = [r for r in groups[arm] if r[q] == r[q]]
      if not sel:
        continue
      fit = fits[arm][q] if "error" not in fits[arm][q] else None
      fig = plots.noise_vs_kappa(
          [r["kappa"] for r in sel],
          [r[q] for r in sel],
          [r[f"{q}_se"] for r in sel],
          fit=fit,
          ylabel=q.replace("_", " ") + (" (log scale)" if regime and q != "b_noise" else ""),
          title=f"{q} vs drift ({arm})",
          logy=regime and q != "b_noise",
      )
      plots.save(fig, out.path(f"_{arm.split()[0]}_{q}.png"))
  if args.replot:  # the manifest stays the sweep's
    return
  out.manifest(
      runs_root=args.root,
      config={v: c.to_dict() for v, c in configs.items()},
      wall_seconds=time.time() - t0,
      variants=variants,
  )


if __name__ == "__main__":
  main()
