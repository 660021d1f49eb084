"""Per-round metrics: one JSON line per round, TensorBoard events, summaries.

``metrics.jsonl`` is the record of a run. On resume from round r, rows with
round >= r are dropped first (they were written after the checkpoint the run
resumes from, and will be written again), so the file never holds a
duplicated or missing round.
"""
from __future__ import annotations

import json
import math
import os

import numpy as np


def _clean(v):
  if isinstance(v, (np.generic,)):
    v = v.item()
  if isinstance(v, np.ndarray):
    v = v.tolist()
  if isinstance(v, float) and not math.isfinite(v):
    return None if math.isnan(v) else ("inf" if v > 0 else "-inf")
  if isinstance(v, (list, tuple)):
    return [_clean(x) for x in v]
  return v


def read_jsonl(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:
          break  # a torn last line from a kill mid-write: drop it
  return rows


class MetricsWriter:
  """Append rows to ``workdir/metrics.jsonl`` and TensorBoard scalars."""

  def __init__(self, workdir: str, resume_round: int = 0, tensorboard: bool = True,
               filename: str = "metrics.jsonl", key: str = "round"):
    os.makedirs(workdir, exist_ok=True)
    self.path = os.path.join(workdir, filename)
    kept = [r for r in read_jsonl(self.path) if r.get(key, -1) < resume_round]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)
    self.rows = kept
    self.key = key
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tb"), purge_step=resume_round)

  def write(self, row: dict) -> None:
    row = {k: _clean(v) for k, v in row.items()}
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())
    self.rows.append(row)
    if self._tb is not None:
      step = row[self.key]
      for k, v in row.items():
        if k != self.key and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, step)

  def close(self):
    if self._tb is not None:
      self._tb.close()
