"""Off-policy reuse, drift and the clipping question.

    python experiments/offpolicy_drift.py                  # all variants
    python experiments/offpolicy_drift.py --variants=clip0.2,clip10
    python experiments/offpolicy_drift.py --quick          # tiny smoke version

Runs ``configs/offpolicy.py`` for each variant (one generation round of
N = 1024 rollouts reused for 8 updates; per-update drift and exact
trace_intra on the old rollouts) through ``cbs_jax.sweep.run_sweep``, one
run per variant in ``runs/off_<variant>`` (a finished run is read back, not
redone; an unfinished one resumes; a stored config.json that differs, e.g.
another --rounds, is an error), then writes under experiments/results/:
  offpolicy_drift.json   every number below
  offpolicy_drift.md     kappa by update index, trace_intra(kappa) fit, clip
                         fractions and pass rates per variant
  offpolicy_drift.png    kappa by update, trace_intra vs kappa with the fit,
                         pass rate over rounds

``--quick`` runs the clip0.2 variant shrunk to 30 SFT steps, P = 8, K = 4
(N = 32: 4 minibatches x 2 epochs = 8 updates of 8 rollouts), 32 eval
prompts and 3 rounds, with the runs (and their SFT base) under
``<out>/runs``; ``--out`` defaults to a fresh temp folder.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile

import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from absl import logging

from cbs_jax import drift
from cbs_jax import metrics as metrics_lib
from cbs_jax import sweep
from configs import offpolicy

# --quick: defaults of a tiny study (explicit flags still win)
QUICK = dict(variants="clip0.2", rounds=3, root=None, out=None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
  pass


def _variant_list(s: str) -> list[str]:
  names = [v.strip() for v in s.split(",") if v.strip()]
  unknown = [v for v in names if v not in offpolicy.VARIANTS]
  if unknown or not names:
    raise argparse.ArgumentTypeError(
        f"unknown variants {unknown or s!r}; known: {','.join(offpolicy.VARIANTS)}")
  return names


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
  ap.add_argument("--variants", type=_variant_list, default=",".join(offpolicy.VARIANTS),
                  help="Variants to run (comma-separated).")
  ap.add_argument("--root", default="runs",
                  help="Parent of the run directories (--quick: <out>/runs).")
  ap.add_argument("--out", default="experiments/results",
                  help="Output folder (--quick: a fresh temp folder).")
  ap.add_argument("--rounds", type=int, default=100, help="Generation rounds per variant.")
  ap.add_argument("--quick", action="store_true",
                  help="Tiny smoke version (well under a minute): clip0.2 only, shrunk "
                       "batch and SFT, 3 rounds, everything under --out.")
  args = ap.parse_args(argv)
  if args.quick:
    ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="offpolicy_drift_quick_")
    args.root = args.root or os.path.join(args.out, "runs")
  return args


def variant_config(name: str, quick: bool = False):
  """``configs/offpolicy.py:<name>``, shrunk to a smoke run when ``quick``."""
  c = offpolicy.get_config(name)
  c.train.progress = False
  if quick:  # 8 updates per round as in the study, on a tiny batch
    c.sft.steps = 30
    c.sft.batch_size = 32
    c.sft.eval_every = 0
    c.batch.num_prompts = 8
    c.batch.rollouts_per_prompt = 4
    c.noise.chunk_prompts = 2   # divides the 2 prompts of an update
    c.train.eval_every = 1
    c.train.eval_prompts = 32
  return c


def run_variant(name: str, args) -> tuple[dict, list[dict]]:
  """Run (or read back, or resume) variant ``name`` as a one-run sweep in ``root``."""
  (row,) = sweep.run_sweep(variant_config(name, args.quick),
                           [{"train.num_rounds": args.rounds}], args.root,
                           names=[f"off_{name}"], progress=False)
  rows = metrics_lib.read_jsonl(os.path.join(row["workdir"], "metrics.jsonl"))
  return row["summary"], [r for r in rows if r["round"] > 0]


def analyse(rows: list[dict]) -> dict:
  kappa = np.array([r["kappa_k3_by_update"] for r in rows])   # rounds x updates
  tri = np.array([r["trace_intra_by_update"] for r in rows])
  n = len(rows)
  out = dict(
      kappa_k3_by_update=kappa.mean(0).tolist(),
      kappa_k3_by_update_se=(kappa.std(0, ddof=1) / np.sqrt(n)).tolist(),
      kappa_k1_by_update=np.array([r["kappa_k1_by_update"] for r in rows]).mean(0).tolist(),
      trace_intra_by_update=tri.mean(0).tolist(),
      trace_intra_by_update_se=(tri.std(0, ddof=1) / np.sqrt(n)).tolist(),
      clip_frac_low_by_update=np.array([r["clip_frac_low_by_update"] for r in rows]).mean(0).tolist(),
      clip_frac_high_by_update=np.array([r["clip_frac_high_by_update"] for r in rows]).mean(0).tolist(),
      ess_by_update=np.array([r["ess_by_update"] for r in rows]).mean(0).tolist(),
      kappa_k3_mean=float(kappa[:, 1:].mean()),
      clip_frac_mean=float(np.mean([r["clip_frac_low"] + r["clip_frac_high"] for r in rows])),
      eval=[(r["round"], r["eval_pass_rate"]) for r in rows if "eval_pass_rate" in r],
  )
  out["fit"] = drift.fit_quadratic(kappa.ravel(), tri.ravel())
  # the same fit on the per-update-index means (8 points, the noise averaged out)
  out["fit_means"] = drift.fit_quadratic(kappa.mean(0), tri.mean(0))
  # binned: trace_intra averaged within kappa quantile bins (what the eye should see)
  k, t = kappa.ravel(), tri.ravel()
  edges = np.quantile(k, np.linspace(0, 1, 7))
  idx = np.clip(np.searchsorted(edges, k, side="right") - 1, 0, 5)
  out["binned"] = [(float(k[idx == b].mean()), float(t[idx == b].mean()),
                    float(t[idx == b].std(ddof=1) / np.sqrt(max((idx == b).sum(), 1))))
                   for b in range(6) if (idx == b).sum() > 1]
  return out


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  res = {}
  for name in args.variants:
    print(f"=== variant {name}", flush=True)
    summary, rows = run_variant(name, args)
    res[name] = dict(analyse(rows), base_pass_rate=summary["base_pass_rate"],
                     final_pass_rate=summary["final_pass_rate"],
                     noise=summary.get("noise"))
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "offpolicy_drift.json"), "w") as f:
    json.dump(res, f, indent=1, default=float)

  n_upd = len(next(iter(res.values()))["kappa_k3_by_update"])
  b = variant_config(args.variants[0], args.quick).batch  # the same batch for every variant
  N, n_mb = b.num_prompts * b.rollouts_per_prompt, b.num_minibatches
  L = [f"Rounds per variant: {args.rounds}; N = {N} rollouts per round, "
       f"{n_mb * b.num_epochs} updates of {N // n_mb}.",
       "", "kappa (k3, per token) by update index, mean over rounds:", "",
       "| variant | " + " | ".join(f"u{j}" for j in range(n_upd)) + " |",
       "|---|" + "---|" * n_upd]
  for name, r in res.items():
    L.append(f"| {name} | " + " | ".join(f"{v:.4f}" for v in r["kappa_k3_by_update"]) + " |")
  L += ["", "trace_intra (exact per-rollout, at current params on the old rollouts) by update index:",
        "", "| variant | " + " | ".join(f"u{j}" for j in range(n_upd)) + " |", "|---|" + "---|" * n_upd]
  for name, r in res.items():
    L.append(f"| {name} | " + " | ".join(
        f"{v:.3g}±{s:.2g}" for v, s in zip(r["trace_intra_by_update"], r["trace_intra_by_update_se"])) + " |")
  L += ["", "Fit trace_intra = a0 + a1 kappa + a2 kappa^2, over all (round, update) points and "
        "over the 8 per-update-index means:", "",
        "| variant | a0 | a1 | a2 | R^2 (all points) | a0 | a1 | a2 | R^2 (means) |",
        "|---|---|---|---|---|---|---|---|---|"]
  for name, r in res.items():
    f, g = r["fit"], r["fit_means"]
    L.append(f"| {name} | {f['a0']:.4g} | {f['a1']:.4g} | {f['a2']:.4g} | {f['r2']:.3f} | "
             f"{g['a0']:.4g} | {g['a1']:.4g} | {g['a2']:.4g} | {g['r2']:.3f} |")
  L += ["", "| variant | mean kappa_k3 (updates 1-7) | clip fraction (mean over updates) | "
        "base pass@1 | final pass@1 |", "|---|---|---|---|---|"]
  for name, r in res.items():
    L.append(f"| {name} | {r['kappa_k3_mean']:.4f} | {r['clip_frac_mean']:.4f} | "
             f"{r['base_pass_rate']:.3f} | {r['final_pass_rate']:.3f} |")
  text = "\n".join(L) + "\n"
  with open(os.path.join(args.out, "offpolicy_drift.md"), "w") as f:
    f.write(text)
  print(text)

  fig, ax = plt.subplots(1, 3, figsize=(15, 4))
  for i, (name, r) in enumerate(res.items()):
    col = f"C{i}"
    ax[0].errorbar(range(n_upd), r["kappa_k3_by_update"], yerr=r["kappa_k3_by_update_se"],
                   marker="o", capsize=2, label=name, color=col)
    b = np.array(r["binned"])
    ax[1].errorbar(b[:, 0], b[:, 1], yerr=b[:, 2], marker="o", ls="", capsize=2, label=name,
                   color=col)
    f = r["fit"]
    xs = np.linspace(0, b[:, 0].max(), 50)
    ax[1].plot(xs, f["a0"] + f["a1"] * xs + f["a2"] * xs ** 2, lw=1, color=col)
    ev = np.array(r["eval"])
    ax[2].plot(ev[:, 0], ev[:, 1], marker="o", label=name, color=col)
  ax[0].set(xlabel="update index within round", ylabel="kappa (k3)", title="drift by update")
  ax[1].set(xlabel="kappa (k3)", ylabel="tr Sigma_intra", title="intra-prompt noise vs drift (binned, quadratic fit)")
  ax[2].set(xlabel="round", ylabel="eval pass@1", title="held-out pass rate")
  for a in ax:
    a.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "offpolicy_drift.png"), dpi=110)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
