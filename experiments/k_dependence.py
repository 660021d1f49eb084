"""The group-baseline K formula against the measured traces at K = 4 / 16 / 64.

    python experiments/k_dependence.py          # reads experiments/results/noise_anatomy/noise_anatomy.json

docs/noise.md ("K under a group-mean baseline") derives how tr Sigma_intra
and tr Sigma_inter depend on K when advantages are centred on the group's
mean reward: four moments (q, f, h, v) fix both traces at every K
(``group_baseline.traces``). noise_anatomy measured both traces of the
"mixed" task at K = 4, 16 and 64 at two parameter points (the SFT base and
the end of training), with jackknife SEs. This fits the four moments to the
six traces of each point by weighted least squares and tests the fit
(chi^2 on 2 degrees of freedom): a small p-value says the measured traces
do not follow the formula beyond their SEs. The measured runs use GRPO's
advantages, which also divide by the group's reward std; the formula leaves
that out, so a misfit where many groups are nearly solved is the expected
way for it to fail (the note says why).

Output: ``<out>/k_dependence.md`` and ``.json`` (per point: moments with
SEs, predicted vs measured traces, chi^2, p).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cbs_jax import group_baseline
from cbs_jax import report
from cbs_jax import stats

HERE = os.path.dirname(os.path.abspath(__file__))


def analyse(rows: list[dict], variant: str = "mixed") -> dict:
  out = {}
  for stage in dict.fromkeys(r["stage"] for r in rows if r["variant"] == variant):
    rs = sorted(
        (r for r in rows if r["variant"] == variant and r["stage"] == stage),
        key=lambda r: int(r["K"]),
    )
    col = lambda k: [float(r[k]) for r in rs]
    fit = group_baseline.fit_moments(
        [int(r["K"]) for r in rs],
        col("trace_intra"),
        col("trace_inter"),
        col("trace_intra_se"),
        col("trace_inter_se"),
    )
    fit.update(
        K=[int(r["K"]) for r in rs],
        round=int(rs[0]["round"]),
        pass_rate=float(rs[0]["pass_rate"]),
        measured_intra=col("trace_intra"),
        measured_inter=col("trace_inter"),
        se_intra=col("trace_intra_se"),
        se_inter=col("trace_inter_se"),
    )
    out[stage] = fit
  return out


def markdown(res: dict, command: str) -> str:
  lines = [
      "# The group-baseline K formula against measured traces (noise_anatomy, mixed task)",
      "",
      "| point | K | tr Σ_intra measured | predicted | tr Σ_inter measured | predicted |",
      "|---|---|---|---|---|---|",
  ]
  for stage, f in res.items():
    for i, K in enumerate(f["K"]):
      lines.append(
          f"| {stage} (round {f['round']}, pass {f['pass_rate']:.2f}) | {K} | "
          f"{stats.fmt(f['measured_intra'][i], se=f['se_intra'][i])} | "
          f"{f['predicted_intra'][i]:.3g} | "
          f"{stats.fmt(f['measured_inter'][i], se=f['se_inter'][i])} | "
          f"{f['predicted_inter'][i]:.3g} |"
      )
  lines += [
      "",
      "| point | q | f | h | v | chi² (dof) | lack-of-fit p | verdict |",
      "|---|---|---|---|---|---|---|---|",
  ]
  for stage, f in res.items():
    m, se = f["moments"], f["se"]
    unphysical = [k for k in ("q", "f", "h", "v") if m[k] + 2 * se[k] < 0]
    verdict = "fits" if f["p_value"] >= 0.05 and not unphysical else "misfits"
    if unphysical:
      verdict += f" ({', '.join(unphysical)} < 0 by > 2 SE)"
    lines.append(
        f"| {stage} | "
        + " | ".join(stats.fmt(m[k], se=se[k]) for k in ("q", "f", "h", "v"))
        + f" | {f['chi2']:.3g} ({f['dof']}) | {f['p_value']:.3g} | {verdict} |"
    )
  lines += [
      "",
      "Moments are per docs/noise.md (q = E u²|s|², f = E Var(r|p) E|s|², h = E|a_p|², "
      "v = E|a_p − G|²); all four are >= 0 by definition, so a fitted value more than two "
      "SEs below 0 is a misfit too. The formula is exact for advantages centred on the group "
      "mean; these runs divide by the group's reward std as well (GRPO).",
      "",
      f"Command: `{command}`.",
  ]
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument(
      "--records",
      default=os.path.join(HERE, "results", "noise_anatomy", "noise_anatomy.json"),
      help="noise_anatomy's measurements at full precision (K = 4, 16, 64 per point)",
  )
  ap.add_argument("--variant", default="mixed")
  ap.add_argument("--out", default=os.path.join(HERE, "results", "noise_anatomy"))
  args = ap.parse_args(argv)
  with open(args.records) as f:
    rows = json.load(f)
  if not any(r["variant"] == args.variant for r in rows):
    ap.error(f"--variant={args.variant!r} has no rows in {args.records}")
  res = analyse(rows, args.variant)
  os.makedirs(args.out, exist_ok=True)
  command = "python experiments/k_dependence.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
  with open(os.path.join(args.out, "k_dependence.md"), "w") as f:
    f.write(markdown(res, command))
  # floats at rounding.stable's digits: the same on another processor's BLAS
  report.write_json(os.path.join(args.out, "k_dependence.json"), res)
  print(markdown(res, command))


if __name__ == "__main__":
  main()
