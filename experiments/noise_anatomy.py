"""Noise anatomy: what drives the per-rollout intra:inter-prompt noise ratio.

    python experiments/noise_anatomy.py                # every variant (~1 h)
    python experiments/noise_anatomy.py --quick        # tiny smoke version
    python experiments/noise_anatomy.py --variants=mixed,homog,steps --replot  # from the committed .json

Published runs report tr Sigma_intra : tr Sigma_inter ~ 100:1 per rollout
(noise scales ~311 vs ~3.2): rollouts of one prompt vary far more than
prompts do, so the critical batch size is set by the total rollout count.
This experiment measures the ratio, B_intra, B_inter and B_noise (pooled
batches at fixed parameters, jackknife SEs, ``cbs_jax.measure``) at the SFT
base and at the end of a GRPO run, across the variants of
``configs/noise_anatomy.py``: mixed vs one difficulty, short vs long
(worked) completions at matched pass rate, arithmetic vs countdown, a ~0.1M
vs a ~0.8M-parameter model, and -- for the mixed variant -- K = 4, 16, 64
measured directly (batches of 1,024 rollouts as (1024/K) x K), with each
difficulty's share of tr Sigma_inter (``noise.inter_by_group``).

Every variant is a one-run sweep under ``--root/<variant>`` (resumable).
"Matched pass rate": variants train in order, and the steps variant's run
stops once its sampled pass rate reaches the mixed variant's final one.

Writes experiments/results/noise_anatomy/: the table (.md, .csv), every
measurement (``.json``), the intra/inter decomposition figure, the
per-difficulty table, manifest.json. ``--replot`` rebuilds the tables and
figure from the ``.json`` alone.
"""

from __future__ import annotations

import json
import os
import time

from absl import logging

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import measure
from cbs_jax import metrics as metrics_lib
from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_runner
from configs import noise_anatomy

NAME = "noise_anatomy"
N_MEASURE = 1024  # rollouts per measured batch
KS = (4, 16, 64)  # K measured directly on the mixed variant


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__, NAME, "one sweep root per variant below it", workers=False, replot=True
  )
  ap.add_argument(
      "--variants",
      default="mixed,homog,steps,countdown,large",
      help="comma-separated variants of configs/noise_anatomy.py",
  )
  ap.add_argument("--batches", type=int, default=12, help="batches pooled per measurement")
  args = study_runner.parse(ap, argv)
  for v in args.variants.split(","):
    if v not in noise_anatomy.VARIANTS:
      ap.error(f"unknown variants {v!r}; known: {noise_anatomy.VARIANTS}")
  if args.quick:
    args.variants, args.batches = "quick", 2
  return args


def sampled_pass(workdir):
  """(round, sampled pass rate) at every evaluation of a run."""
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return [
      (r["round"], r.get("eval_pass_rate", study.score_of(r)))
      for r in rows
      if study.score_of(r) is not None or r.get("eval_pass_rate") is not None
  ]


def measured_row(variant, stage, rnd, pass_rate, K, res):
  e = res["exact"]
  share = K * e.b_inter / e.b_noise if e.b_noise == e.b_noise and e.b_noise else None
  return dict(
      variant=variant,
      stage=stage,
      round=rnd,
      pass_rate=pass_rate,
      K=K,
      P=res["P"],
      batches=res["M"],
      trace_intra=e.trace_intra,
      trace_intra_se=e.trace_intra_se,
      trace_inter=e.trace_inter,
      trace_inter_se=e.trace_inter_se,
      ratio=e.ratio,
      ratio_se=e.ratio_se,
      b_intra=e.b_intra,
      b_intra_se=e.b_intra_se,
      b_inter=e.b_inter,
      b_inter_se=e.b_inter_se,
      b_noise=e.b_noise,
      b_noise_se=e.b_noise_se,
      inter_share=share,
      flag=e.flag or "",
      by_difficulty=res.get("inter_by_difficulty"),
  )


def measure_variants(args, configs, variants) -> list[dict]:
  """Train each variant (in order: "steps" stops at the mixed variant's
  final pass rate) and measure it at its SFT base and at its end."""
  workdirs, ref_pass = {}, None
  for v in variants:
    over = {}
    if v == "steps" and ref_pass is not None:
      over = {"train.stop_at_pass_rate": round(float(ref_pass), 3)}
    row = study_runner.run_study(
        configs[v], [over], os.path.join(args.root, v), workers=1, progress=False
    )[0]
    workdirs[v] = row["workdir"]
    if v in ("mixed", "quick"):
      ref_pass = sampled_pass(row["workdir"])[-1][1]

  table = []
  for v in variants:
    c, wd = configs[v], workdirs[v]
    setup = run_setup.prepare(c)
    evals = sampled_pass(wd)
    end = ckpt_lib.Checkpointer(os.path.join(wd, "checkpoints")).latest_step()
    ks = {"mixed": KS, "quick": (2, 4)}.get(v, (16,))
    for stage, rnd in (("SFT base", 0), ("end", end)):
      graphdef, params, got, opt = measure.load_policy(c, wd, setup, rnd, with_opt_state=True)
      pr = dict(evals).get(got)
      for K in ks:
        P = (N_MEASURE if v != "quick" else 16) // K
        res = measure.measure(
            c,
            graphdef,
            params,
            setup,
            P,
            K,
            args.batches,
            progress=False,
            opt_state=opt,
            by_difficulty=True,
            chunk_prompts=min(4, P),
        )
        table.append(measured_row(v, stage, got, pr, K, res))
  return table


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  variants = args.variants.split(",")
  configs = {v: noise_anatomy.get_config(v) for v in variants}
  if not args.replot:
    table = measure_variants(args, configs, variants)
    # every float at full precision: the replot reads exactly what was measured
    paths.write_atomic(out.path(".json"), json.dumps(table, indent=1, default=float))
  table = json.loads(paths.read_text(out.path(".json")))

  cols = [
      "variant",
      "stage",
      "round",
      "pass_rate",
      "K",
      "ratio",
      "b_intra",
      "b_inter",
      "b_noise",
      "inter_share",
      "flag",
  ]
  show = [
      dict(
          r,
          ratio=stats.Estimate(r["ratio"], se=r["ratio_se"]),
          b_intra=stats.Estimate(r["b_intra"], se=r["b_intra_se"]),
          b_inter=stats.Estimate(r["b_inter"], se=r["b_inter_se"]),
          b_noise=stats.Estimate(r["b_noise"], se=r["b_noise_se"]),
      )
      for r in table
  ]
  diff_lines = [
      "| variant | stage | K | difficulty | prompts | contribution to tr Σ_inter "
      "(± SE) | share |",
      "|---|---|---|---|---|---|---|",
  ]
  for r in table:
    bd = r["by_difficulty"] or {}
    total = sum(d["contribution"] for d in bd.values())
    for g, d in sorted(bd.items()):
      diff_lines.append(
          f"| {r['variant']} | {r['stage']} | {r['K']} | {g} | {d['prompts']} | "
          f"{stats.fmt(d['contribution'], se=d['se'])} | "
          f"{d['contribution'] / total if total else float('nan'):.2f} |"
      )
  notes = [
      "ratio: per-rollout tr Σ_intra / tr Σ_inter (published ≈ 100); inter_share: "
      "K B_inter / B_noise, the inter-prompt part of the batch noise at this K. "
      "± one jackknife SE over pooled batches of 1,024 rollouts; B values are "
      "flagged (nan) where |G|^2 is not significantly positive.",
      "",
      "## Each difficulty's contribution to tr Σ_inter (sums to tr Σ_inter)",
      "",
      *diff_lines,
      "",
      f"Command: `{out.command(args.replot)}`.",
  ]
  out.table(
      show,
      cols,
      title="Noise anatomy: intra- vs inter-prompt gradient noise",
      notes="\n".join(notes),
  )
  k16 = [r for r in table if r["K"] == (16 if not args.quick else 4)]
  fig = plots.noise_decomposition(
      [f"{r['variant']}\n{r['stage']}" for r in k16],
      [r["b_intra"] for r in k16],
      [r["K"] * r["b_inter"] for r in k16],
      [r["b_intra_se"] for r in k16],
      [r["K"] * r["b_inter_se"] for r in k16],
      title="B_noise = B_intra + K B_inter (K = 16)",
      stacked=True,
  )
  plots.save(fig, out.path(".png"))
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=args.root,
      config={v: c.to_dict() for v, c in configs.items()},
      wall_seconds=time.time() - t0,
      variants=variants,
  )


if __name__ == "__main__":
  main()
