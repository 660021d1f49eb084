"""When do the noise trackers of a run resolve? Reads a run's metrics.

    python -m cbs_jax.main --config=configs/default.py --workdir=runs/default   # the run
    python experiments/tracker_resolution.py runs/default                        # this

For the raw tracker (``noise_ema``) and the one in Adam's metric
(``noise_ema_adam``): in how many rounds its B_noise interval is bounded
(|G|^2 resolved: the controller may act), the first such round, in how
many of the rounds it was fed its |G|^2 EMA is negative, and the median
B_noise over the last 100 rounds. Prints, writes nothing.
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from cbs_jax import metrics as metrics_lib

TRACKERS = ("noise_ema", "noise_ema_adam")


def resolved(row: dict, prefix: str) -> bool:
  lo, hi = row.get(f"{prefix}/b_noise_lo"), row.get(f"{prefix}/b_noise_hi")
  return lo is not None and hi not in (None, "inf") and lo > 0


def summary(rows: list[dict], prefix: str) -> dict:
  fed = [r for r in rows if r.get(f"{prefix}/g2") is not None]
  last = [r[f"{prefix}/b_noise"] for r in rows[-100:] if r.get(f"{prefix}/b_noise") is not None]
  return dict(
      rounds=len(rows),
      resolved=sum(resolved(r, prefix) for r in rows),
      first=next((r["round"] for r in rows if resolved(r, prefix)), None),
      fed=len(fed),
      g2_negative=sum(r[f"{prefix}/g2"] < 0 for r in fed),
      b_noise_last100=float(np.median(last)) if last else None,
  )


def main(argv=None):
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("workdir", help="a run directory holding metrics.jsonl")
  args = ap.parse_args(argv)
  rows = [
      r
      for r in metrics_lib.read_jsonl(os.path.join(args.workdir, "metrics.jsonl"))
      if r.get("round")
  ]
  if not rows:
    raise SystemExit(f"{args.workdir}: no training rounds in metrics.jsonl")
  for p in TRACKERS:
    s = summary(rows, p)
    print(
        f"{p}: resolved in {s['resolved']} of {s['rounds']} rounds (first: round {s['first']}); "
        f"|G|^2 EMA negative in {s['g2_negative']} of {s['fed']} rounds it was fed; "
        f"median B_noise over the last 100 rounds: {s['b_noise_last100']}"
    )


if __name__ == "__main__":
  main()
