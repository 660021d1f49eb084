"""Does only the rollout count N matter? Batch shape P x K at fixed N.

    python experiments/rollout_shape.py                # (~15 min, 2 workers)
    python experiments/rollout_shape.py --quick        # tiny smoke version
    python experiments/rollout_shape.py --replot       # tables and figures from the committed files

At N = 1,024 and 4,096 rollouts per round, K = 2, 4, 16, 64 rollouts per
prompt (P = N / K prompts), 3 seeds, on-policy with the sqrt rule
(``configs/batch_law.py:shape``; the K = 16 runs are the on-policy study's,
read back from ``--on_root``). Steps-to-target per shape with t-intervals
over seeds, and the gradient-noise scale measured directly at each K on the
SFT base (``cbs_jax.measure``: batches of N = 1,024 rollouts as P x K,
pooled, jackknife SEs), so the B_noise(K) = B_intra + K B_inter law is
checked against K, not extrapolated from one K.

"Only N matters" holds at an N if the steps-to-target of every K lie within
each other's intervals; the measured B_noise(K) says why or why not: when
K B_inter is small next to B_intra, K does not matter.

Writes experiments/results/rollout_shape/: table (.md, .csv), per-run
learning curves (``_curves.csv``), to-target per run (``_runs.csv``), the
B_noise(K) measurements (``_noise.json``), figures of S against K and of
B_noise against K, manifest.json. ``--replot`` rebuilds every table and
figure from those files alone.
"""

from __future__ import annotations

import json
import os
import time
import types

from absl import logging

from cbs_jax import measure
from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import stats
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import study_runner
from configs import batch_law

NAME = "rollout_shape"
# the measured noise scales the table and figure use (``_noise.json``, per K)
NOISE_FIELDS = ("b_noise", "b_noise_se", "b_intra", "b_intra_se", "b_inter", "b_inter_se")


def parse_args(argv=None):
  ap = study_runner.parser(
      __doc__,
      NAME,
      "sweep root",
      on_root_help="the on-policy study's sweep root, the K = 16 runs",
      replot=True,
  )
  ap.add_argument(
      "--noise_batches",
      type=int,
      default=8,
      help="batches of 1,024 rollouts pooled per K (0 = skip)",
  )
  args = study_runner.parse(ap, argv)
  if args.quick:
    args.noise_batches = min(args.noise_batches, 2)
  return args


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  t0 = time.time()
  out = report.Results(NAME, root=args.out)
  if args.quick:  # N = 16: K = 4 from the quick on-policy sweep (run if missing), K = 2, 8 here
    c_on = batch_law.get_config("quick")
    c = study_runner.on_policy_base(c_on, args.on_root)
    over = [
        {
            "batch.num_prompts": 16 // k,
            "batch.rollouts_per_prompt": k,
            "seed": s,
            "train.eval_every": 2,
            "train.num_rounds": batch_law.QUICK_ROUNDS,
        }
        for k in (2, 8)
        for s in batch_law.QUICK_SEEDS
    ]
    tgt, ns, noise_n = batch_law.targets("quick"), (16,), 16
    on = [o for o in batch_law.sweep("quick") if o["batch.num_prompts"] == 4]

    def run():
      rows = study_runner.run_study(c, over, args.root, workers=args.workers)
      return rows + study_runner.run_study(c_on, on, args.on_root, workers=args.workers)

  else:
    c = study_runner.on_policy_base(batch_law.get_config("shape"), args.on_root)
    tgt, ns, noise_n = batch_law.TARGETS, batch_law.SHAPE_NS, 1024
    on = [o for o in batch_law.sweep("on") if o["batch.num_prompts"] * batch_law.K in ns]

    def run():
      rows = study_runner.run_study(c, batch_law.sweep("shape"), args.root, workers=args.workers)
      return rows + study_runner.read_finished(on, args.on_root)

  recs = study_runner.records(args, out, tgt, lambda: {"shape": study.collect(run(), tgt, c)})[
      "shape"
  ]
  main_t = float(tgt[len(tgt) // 2])
  table = study.per_batch_rows(recs, tgt, key=lambda r: (r["N"], r["K"]))

  noise = {}
  if not args.replot and args.noise_batches:
    setup = run_setup.prepare(c)
    base = os.path.join(args.root, "_base_probe")
    graphdef, params, _ = measure.load_policy(c, base, setup)
    for K in sorted({r["K"] for r in recs}):
      res = measure.measure(
          c, graphdef, params, setup, noise_n // K, K, args.noise_batches, progress=False
      )
      noise[str(K)] = {f: getattr(res["exact"], f) for f in NOISE_FIELDS}
    report.write_json(out.path("_noise.json"), noise)
  if paths.exists(out.path("_noise.json")) and (args.replot or args.noise_batches):
    noise = json.loads(paths.read_text(out.path("_noise.json")))  # as committed
  noise = {int(k): types.SimpleNamespace(**v) for k, v in noise.items()}

  rows_md = []
  for r in table:
    d = dict(N=r["N"], K=r["K"], P=r["P"], seeds=r["seeds"])
    for t in tgt:
      t = float(t)
      d[f"S@{t} (rounds)"] = stats.Estimate(
          r[f"rounds@{t}"], r[f"rounds@{t}_lo"], r[f"rounds@{t}_hi"]
      )
      d[f"reached@{t}"] = f"{r[f'reached@{t}']}/{r['seeds']}"
    e = noise.get(r["K"])
    if e is not None:
      d["B_noise(K) at base"] = stats.Estimate(e.b_noise, se=e.b_noise_se)
      d["K B_inter / B_noise"] = (
          r["K"] * e.b_inter / e.b_noise if e.b_noise and e.b_noise == e.b_noise else None
      )
    rows_md.append(d)
  cols = list(rows_md[0]) if rows_md else []
  verdicts = []
  for N in ns:
    sub = [r for r in table if r["N"] == N and r[f"rounds@{main_t}"] is not None]
    if len(sub) < 2:
      verdicts.append(f"N = {N}: unresolved (fewer than two shapes reached {main_t})")
      continue
    overlap = max(r[f"rounds@{main_t}_lo"] or r[f"rounds@{main_t}"] for r in sub) <= min(
        r[f"rounds@{main_t}_hi"] or r[f"rounds@{main_t}"] for r in sub
    )
    spread = max(r[f"rounds@{main_t}"] for r in sub) / min(r[f"rounds@{main_t}"] for r in sub)
    verdicts.append(
        f"N = {N}: steps-to-{main_t} across K differ by {spread:.2f}x; the "
        f"intervals {'overlap (only N matters, within the error)' if overlap else 'do not all overlap (K matters)'}"
    )
  notes = [
      "Only N matters?",
      "",
      *[f"- {v}" for v in verdicts],
      "",
      "S: generation rounds to the target, mean [90% t-interval] over seeds. "
      "B_noise(K): measured at the SFT base with batches of "
      f"{noise_n} rollouts as (N/K) x K, ± jackknife SE.",
      f"Command: `{out.command(args.replot)}`.",
  ]
  out.table(rows_md, cols, title="Rollout shape at fixed N", notes="\n".join(notes))
  study_report.write_runs_csv(out.path("_runs.csv"), recs, tgt)
  series = {f"N={N}": [r[f"rounds@{main_t}"] for r in table if r["N"] == N] for N in ns}
  ks = {N: [r["K"] for r in table if r["N"] == N] for N in ns}
  key = f"rounds@{main_t}"
  bands = {
      f"N={N}": tuple(
          [r[f"{key}{e}"] if r[f"{key}{e}"] is not None else r[key] for r in table if r["N"] == N]
          for e in ("_lo", "_hi")
      )
      for N in ns
  }
  fig = plots.noise_over_training(
      ks[ns[0]],
      {k: v for k, v in series.items() if len(v) == len(ks[ns[0]])},
      bands=bands,
      xlabel="rollouts per prompt K (P = N / K prompts)",
      ylabel=f"generation rounds to {main_t}",
      title=f"steps to {main_t} against the batch shape at fixed N " "(90% t-intervals over seeds)",
      logx=True,
  )
  fig.axes[0].set_xticks(ks[ns[0]], [str(k) for k in ks[ns[0]]])
  plots.save(fig, out.path(".png"))
  if noise:
    kk = sorted(noise)
    plots.save(
        plots.noise_decomposition(
            [f"K={k}" for k in kk],
            [noise[k].b_intra for k in kk],
            [k * noise[k].b_inter for k in kk],
            [noise[k].b_intra_se for k in kk],
            [k * noise[k].b_inter_se for k in kk],
            title="B_noise(K) = B_intra + K B_inter at the SFT " "base",
            stacked=True,
        ),
        out.path("_noise.png"),
    )
  if args.replot:  # the manifest stays the sweep's: its commit, command and wall time
    return
  out.manifest(
      runs_root=[args.root, args.on_root],
      config=c,
      wall_seconds=time.time() - t0,
      targets=list(tgt),
  )


if __name__ == "__main__":
  main()
