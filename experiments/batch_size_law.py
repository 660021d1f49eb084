"""Batch-size law: samples-indexed learning curves under sqrt lr scaling,
steps/samples to a target pass rate, the fitted critical batch size, and
time to target on this machine.

    python experiments/batch_size_law.py                       # P in 4..64 at K=16
    python experiments/batch_size_law.py --prompts=4,8,16,32,64 --target=0.55
    python experiments/batch_size_law.py --quick               # tiny smoke version

Each run is the default config (same SFT base) at P prompts x K rollouts per
round, lr = lr0 * sqrt(N / 256) for Adam, stopping once held-out pass@1
reaches the target (evaluated every ``eval_rollouts`` rollouts). Runs go
through ``cbs_jax.sweep`` in ``runs/bsz``: an interrupted study resumes and
redoes no finished run. Fits S(N) = S_min (1 + B_crit / N) and compares
B_crit with the noise scale measured by experiments/noise_over_training.py.
Writes experiments/results/batch_size_law.{json,md,png}.

``--quick`` uses ``configs/default.py:smoke`` (30 SFT steps, 32 eval
prompts) at P = 2, 4 and K = 4 for a few rounds, with the SFT base, the
sweep and the outputs all under ``--out`` (default: a fresh temp folder).
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

from cbs_jax import batch as batch_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import sweep
from configs import default

# --quick: defaults of a tiny study (explicit flags still win)
QUICK = dict(prompts="2,4", rollouts=4, budget=48, eval_rollouts=16, root=None, out=None)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter,
                     argparse.RawDescriptionHelpFormatter):
  pass


def _int_list(s: str) -> list[int]:
  try:
    return [int(v) for v in s.split(",") if v.strip()]
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None


def parse_args(argv=None) -> argparse.Namespace:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=_HelpFormatter)
  ap.add_argument("--prompts", type=_int_list, default="4,8,16,32,64",
                  help="P values (comma-separated).")
  ap.add_argument("--rollouts", type=int, default=16, help="K rollouts per prompt.")
  ap.add_argument("--target", type=float, default=0.55, help="Held-out pass@1 target.")
  ap.add_argument("--budget", type=int, default=400_000, help="Max rollouts per run.")
  ap.add_argument("--eval_rollouts", type=int, default=8192,
                  help="Rollouts between evaluations.")
  ap.add_argument("--root", default="runs/bsz",
                  help="Sweep directory (--quick: <out>/runs/bsz).")
  ap.add_argument("--out", default="experiments/results",
                  help="Output folder (--quick: a fresh temp folder).")
  ap.add_argument("--quick", action="store_true",
                  help="Tiny smoke version (well under a minute): smoke config, P=2,4, "
                       "K=4, a few rounds, everything under --out.")
  args = ap.parse_args(argv)
  if args.quick:
    ap.set_defaults(**QUICK)
    args = ap.parse_args(argv)
    args.out = args.out or tempfile.mkdtemp(prefix="batch_size_law_quick_")
    args.root = args.root or os.path.join(args.out, "runs", "bsz")
  return args


def main(argv=None):
  args = parse_args(argv)
  logging.set_verbosity(logging.WARNING)
  K = args.rollouts
  if args.quick:
    base = default.get_config("smoke")
    base.sft.base_dir = os.path.abspath(os.path.join(args.out, "runs", "default", "sft_base"))
  else:
    base = default.get_config()
    base.sft.base_dir = os.path.abspath("runs/default/sft_base")  # shared SFT base
  base.train.stop_at_pass_rate = args.target
  base.train.checkpoint_every = 50
  base.train.progress = False
  overrides = []
  for p in args.prompts:
    n = p * K
    overrides.append({"batch.num_prompts": p, "batch.rollouts_per_prompt": K,
                      "train.num_rounds": max(1, args.budget // n),
                      "train.eval_every": max(1, args.eval_rollouts // n)})
  results = sweep.run_sweep(base, overrides, args.root)
  rows = []
  for ov, res in zip(overrides, results):
    name = sweep.run_name(ov)
    m = metrics_lib.read_jsonl(os.path.join(args.root, name, "metrics.jsonl"))
    n = ov["batch.num_prompts"] * K
    ev = [(r["round"], r["rollouts_seen"], r["eval_pass_rate"]) for r in m if "eval_pass_rate" in r]
    s = batch_lib.steps_to_target([e[0] for e in ev], [e[2] for e in ev], args.target)
    train_rows = [r for r in m if r["round"] > 0]
    sec_per_round = float(np.mean([r["gen_seconds"] + r["update_seconds"] for r in train_rows]))
    gen_tps = float(np.mean([r["tokens_per_s"] for r in train_rows]))
    rows.append(dict(N=n, P=ov["batch.num_prompts"], K=K, lr=train_rows[-1]["lr"],
                     steps_to_target=s, samples_to_target=None if s is None else s * n,
                     seconds_per_round=sec_per_round, gen_tokens_per_s=gen_tps,
                     rollouts_per_s=n / sec_per_round,
                     time_to_target_s=None if s is None else s * sec_per_round,
                     curve=[(e[1], e[2]) for e in ev]))
  ok = [r for r in rows if r["steps_to_target"] is not None]
  fit = batch_lib.fit_critical_batch([r["N"] for r in ok], [r["steps_to_target"] for r in ok]) \
      if len(ok) >= 2 else None
  noise_path = os.path.join(args.out, "noise_over_training.json")
  b_noise = None
  if os.path.exists(noise_path):
    nz = json.load(open(noise_path))
    b_noise = {k: (nz[k]["exact"]["b_noise"], nz[k]["exact"]["b_noise_se"]) for k in ("early", "late")}
  out = dict(target=args.target, K=K, runs=rows, fit=fit, b_noise_measured=b_noise)
  os.makedirs(args.out, exist_ok=True)
  with open(os.path.join(args.out, "batch_size_law.json"), "w") as f:
    json.dump(out, f, indent=1, default=float)

  L = [f"Target held-out pass@1 {args.target} (base ~0.40); K = {K}; lr = 3e-4 * sqrt(N/256).", "",
       "| N (rollouts/round) | P | lr | rounds to target | rollouts to target | s/round | rollouts/s | time to target (s) |",
       "|---|---|---|---|---|---|---|---|"]
  f = lambda v, fmt: "not reached" if v is None else format(v, fmt)
  for r in rows:
    L.append(f"| {r['N']} | {r['P']} | {r['lr']:.2e} | {f(r['steps_to_target'], '.0f')} | "
             f"{f(r['samples_to_target'], '.0f')} | {r['seconds_per_round']:.3f} | "
             f"{r['rollouts_per_s']:.0f} | {f(r['time_to_target_s'], '.0f')} |")
  if fit:
    L += ["", f"Fit S(N) = S_min (1 + B_crit/N): S_min = {fit['S_min']:.1f} rounds, "
              f"B_crit = {fit['B_crit']:.0f} rollouts, E_min = {fit['E_min']:.0f} rollouts, "
              f"R^2 = {fit['r2']:.3f}."]
  if b_noise:
    L.append(f"Measured B_noise at K={K} (noise_over_training): early "
             f"{b_noise['early'][0]:.0f} ± {b_noise['early'][1]:.0f}, late "
             f"{b_noise['late'][0]:.0f} ± {b_noise['late'][1]:.0f} rollouts.")
  L.append("Seconds per round are those the runs logged (generation + updates); on a shared "
           "machine they include other jobs' load, so time to target is indicative only. "
           "Steps to target come from one seed and an eval of 512 prompts (SE ~0.02).")
  text = "\n".join(L) + "\n"
  with open(os.path.join(args.out, "batch_size_law.md"), "w") as fh:
    fh.write(text)
  print(text)

  fig, ax = plt.subplots(1, 3, figsize=(15, 4))
  for r in rows:
    c = np.array(r["curve"])
    ax[0].plot(c[:, 0], c[:, 1], marker=".", label=f"N={r['N']}")
  ax[0].axhline(args.target, color="k", lw=0.5)
  ax[0].set(xlabel="rollouts generated", ylabel="eval pass@1", title="samples-indexed curves (sqrt lr)")
  ax[0].legend(fontsize=7)
  if ok:
    n = np.array([r["N"] for r in ok])
    s = np.array([r["steps_to_target"] for r in ok])
    ax[1].loglog(n * s, s, "o", label="runs")
    if fit:
      nn = np.geomspace(n.min() / 2, n.max() * 4, 50)
      ss = fit["S_min"] * (1 + fit["B_crit"] / nn)
      ax[1].loglog(nn * ss, ss, "-", label=f"fit: B_crit={fit['B_crit']:.0f}")
    ax[1].set(xlabel="rollouts to target (E)", ylabel="rounds to target (S)", title="S vs E")
    ax[1].legend(fontsize=7)
    ax[2].semilogx(n, [r["time_to_target_s"] for r in ok], "o-")
    ax[2].set(xlabel="N (rollouts per round)", ylabel="seconds to target", title="time to target on this machine")
  fig.tight_layout()
  fig.savefig(os.path.join(args.out, "batch_size_law.png"), dpi=110)
  print("wrote", args.out)


if __name__ == "__main__":
  main()
