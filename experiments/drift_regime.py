"""Which reuse and learning rate reach the published drift: a kappa pilot.

    python experiments/drift_regime.py            # 4 epochs x 4 rates, 12 rounds each (~17 min)
    python experiments/drift_regime.py --quick    # tiny smoke version
    python experiments/drift_regime.py --replot   # table and figure from the committed summaries

The drift and clipping claims of study 1 were made at kappa = KL(behaviour
|| current) ~ 0.08-0.09 nats/token; one epoch of reuse at the on-policy
learning rate moves this policy ~0.005 (``drift_noise.md``), where neither
effect can show. Drift has two causes: how many updates a round's rollouts
feed (updates per round m x epochs E) and how far each update moves (the
learning rate). This pilot separates them before the noise and clipping
studies spend hours: ``configs/drift_noise.py`` pg8 (unclipped importance-
weighted policy gradient, 8 minibatches of one round of 1,024 rollouts)
with E epochs and the learning rate scaled by L, a few rounds each, kappa
measured exactly (full vocabulary) on probe rollouts no update uses, before
every update (``drift.probe_prompts``; no noise statistics, so it is
cheap).

Per (E, L): kappa before the round's last update (after m E - 1 updates),
mean ± SE over the rounds after the first (Adam warming up), the fraction
of probe tokens a 0.2 clip would touch there, and the held-out pass rate at
the end (a rate that wrecks the policy is not a regime to study). The
verdict names the configurations whose kappa lies in the published range.

Writes <out>/drift_regime/: the table (.md, .csv), each variant's summary
(``_runs.json``: kappa and the clip fraction with their SEs, kappa by
update, pass rates), kappa against the learning-rate scale per E with the
published range (.png), manifest.json. ``--replot`` rebuilds the table and
figure from ``_runs.json`` alone.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np
from absl import logging

from cbs_jax import metrics as metrics_lib
from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_runner
from configs import drift_noise

NAME = "drift_regime"
PUBLISHED = (0.080, 0.088)  # kappa with clip 0.2 and 10 (study 1)
BASE = "pg8"


def parse_args(argv=None):
  ap = study_runner.parser(__doc__, NAME, "sweep root, one run <root>/<variant> each", replot=True)
  ap.add_argument("--epochs", default=None, help="epochs E over each round (default 1,2,4,8)")
  ap.add_argument(
      "--lr_scales", default=None, help="learning rate x L (default 1,2,4,16; quick 16)"
  )
  ap.add_argument("--rounds", type=int, default=None, help="rounds per run (12; quick 2)")
  args = study_runner.parse(ap, argv)
  ints = lambda s, d: [int(x) for x in (s or d).split(",") if x]
  args.epochs = ints(args.epochs, "1,2" if args.quick else "1,2,4,8")
  args.lr_scales = ints(args.lr_scales, "16" if args.quick else "1,2,4,16")
  args.rounds = args.rounds or (2 if args.quick else 12)
  for name, vals in (("--epochs", args.epochs), ("--lr_scales", args.lr_scales)):
    if not vals or min(vals) < 1:
      ap.error(f"{name}={vals}: give positive integers")
  if args.rounds < 2:
    ap.error(f"--rounds={args.rounds}: need >= 2 (the first is left out)")
  return args


def variant_config(base, epochs: int, scale: int, rounds: int):
  c = base.copy_and_resolve_references()
  c.batch.num_epochs = epochs
  c.optim.lr = base.optim.lr * scale
  c.noise.drift_every = 0  # kappa only: the probe, no noise statistics
  c.train.num_rounds = rounds
  c.train.eval_every = rounds
  c.train.checkpoint_every = rounds
  return c


def summarise(workdir: str) -> dict:
  """kappa and the probe's 0.2-clip fraction before the last update of
  every round but the first (mean ± SE over rounds), the last held-out
  pass rate, and kappa by update index (mean over those rounds)."""
  rows = [
      r
      for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
      if "heldout_kappa_exact_by_update" in r and r.get("round", 0) > 1
  ]
  if not rows:
    raise ValueError(f"{workdir}: no rounds with the drift probe after the first")
  kap = np.array([r["heldout_kappa_exact_by_update"] for r in rows])  # [rounds, updates]
  clip = np.array(
      [
          np.add(r["heldout_clip_frac_low_by_update"], r["heldout_clip_frac_high_by_update"])
          for r in rows
      ]
  )
  se = lambda v: float(v.std(ddof=1) / np.sqrt(v.size)) if v.size > 1 else None
  scores = [
      study.score_of(r)
      for r in metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
      if study.score_of(r) is not None
  ]
  return dict(
      rounds=len(rows),
      updates=kap.shape[1],
      kappa=float(kap[:, -1].mean()),
      kappa_se=se(kap[:, -1]),
      clip=float(clip[:, -1].mean()),
      clip_se=se(clip[:, -1]),
      kappa_by_update=kap.mean(0).tolist(),
      pass_first=scores[0] if scores else None,
      pass_last=scores[-1] if scores else None,
  )


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  base_name = "quick" if args.quick else BASE
  base = drift_noise.get_config(base_name)
  configs = {
      f"e{E}x{L}": variant_config(base, E, L, args.rounds)
      for E in args.epochs
      for L in args.lr_scales
  }
  out = report.Results(NAME, root=args.out)
  if not args.replot:
    rows = study_runner.run_variants(configs, args.root, workers=args.workers)
    report.write_json(out.path("_runs.json"), {v: summarise(rows[v]["workdir"]) for v in configs})
  summaries = json.loads(paths.read_text(out.path("_runs.json")))  # as committed
  lo, hi = PUBLISHED
  table = []
  for v, c in configs.items():
    s = summaries[v]
    table.append(
        dict(
            variant=v,
            epochs=c.batch.num_epochs,
            lr_scale=int(round(c.optim.lr / base.optim.lr)),
            lr=c.optim.lr,
            updates=s["updates"],
            rounds=s["rounds"],
            kappa=stats.Estimate(s["kappa"], se=s["kappa_se"]),
            clip_frac=stats.Estimate(s["clip"], se=s["clip_se"]),
            pass_first=s["pass_first"],
            pass_last=s["pass_last"],
            in_published_range=bool(0.5 * lo <= s["kappa"] <= 2 * hi),
            kappa_by_update=[round(k, 6) for k in s["kappa_by_update"]],
        )
    )
  reach = [r["variant"] for r in table if r["in_published_range"]]
  top = max(table, key=lambda r: r["kappa"].value)
  notes = [
      f"{base_name} of configs/drift_noise.py (unclipped, m = {base.batch.num_minibatches} "
      f"minibatches of one round of {base.batch.num_prompts * base.batch.rollouts_per_prompt} "
      f"rollouts), E epochs, learning rate {base.optim.lr:g} x L, {args.rounds} rounds each "
      "from the shared SFT base. kappa: exact KL(behaviour || current) per token on probe "
      "rollouts no update uses, before the round's last update (after m E - 1 updates), mean "
      "± SE over rounds 2 ... (the first left out); clip_frac: the probe tokens whose ratio "
      "leaves [0.8, 1.2] there; pass: held-out exact expected pass rate at the first and "
      "last evaluation.",
      "",
      f"Published (study 1): kappa {lo} (clip 0.2) and {hi} (clip 10).",
      "- Within a factor of 2 of the published range: "
      + (", ".join(reach) if reach else "none")
      + f"; the largest kappa here: {top['kappa']} ({top['variant']}).",
      f"- Command: `{out.command(args.replot)}`.",
  ]
  cols = [
      "variant",
      "epochs",
      "lr",
      "updates",
      "rounds",
      "kappa",
      "clip_frac",
      "pass_first",
      "pass_last",
      "in_published_range",
  ]
  out.table(
      table, cols, title="Drift against reuse and learning rate (pilot)", notes="\n".join(notes)
  )
  series = []
  for E in args.epochs:
    rs = sorted((r for r in table if r["epochs"] == E), key=lambda r: r["lr_scale"])
    series.append(
        dict(
            label=f"{E} epoch{'s' if E > 1 else ''} ({rs[0]['updates']} updates per round)",
            x=[r["lr_scale"] for r in rs],
            y=[r["kappa"].value for r in rs],
            yerr=[r["kappa"].se or 0.0 for r in rs],
        )
    )
  out.figure(
      plots.xy_series(
          series,
          f"learning rate / {base.optim.lr:g}",
          "kappa before the last update (nats/token)",
          hlines={f"published clip 0.2: {lo}": lo, f"published clip 10: {hi}": hi},
          title="drift per round against the learning rate (bars: ± 1 SE over rounds)",
      )
  )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=args.root,
      config={v: c.to_dict() for v, c in configs.items()},
      wall_seconds=time.time() - t0,
      epochs=args.epochs,
      lr_scales=args.lr_scales,
      rounds=args.rounds,
  )


if __name__ == "__main__":
  main()
