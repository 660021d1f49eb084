"""Per-round metrics: one JSON line per round, TensorBoard events, summaries.

``metrics.jsonl`` is the record of a run. On resume from round r, rows with
round >= r are dropped first (they were written after the checkpoint the run
resumes from, and will be written again), so the file never holds a
duplicated or missing round.

The file goes through ``paths``: locally each row is appended and fsynced
(a kill can tear the last line; ``read_jsonl`` drops it). Under an
object-store URI, which cannot append, every row rewrites the whole object
(one atomic upload of all rows so far), so the object is always a whole
prefix of the run's rows.
"""

from __future__ import annotations

import json
import math

import numpy as np

from cbs_jax import paths


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
  if not paths.exists(path):
    return []
  rows = []
  for line in paths.read_text(path).splitlines():
    line = line.strip()
    if line:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break  # a torn last line from a kill mid-write: drop it
  return rows


def _lines(rows) -> str:
  return "".join(json.dumps(r) + "\n" for r in rows)


class MetricsWriter:
  """Append rows to ``workdir/metrics.jsonl`` and TensorBoard scalars
  (``workdir`` a local directory or an object-store URI)."""

  def __init__(
      self,
      workdir: str,
      resume_round: int = 0,
      tensorboard: bool = True,
      filename: str = "metrics.jsonl",
      key: str = "round",
  ):
    paths.makedirs(workdir)
    self.path = paths.join(workdir, filename)
    kept = [r for r in read_jsonl(self.path) if r.get(key, -1) < resume_round]
    paths.write_atomic(self.path, _lines(kept))
    self.rows = kept
    self._remote = paths.is_remote(self.path)
    self.key = key
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      from tensorboardX import record_writer

      if self._remote:  # event files through paths too (an upload per flush)
        record_writer.register_writer_factory(paths.scheme(workdir), paths.TENSORBOARD_FACTORY)
      self._tb = SummaryWriter(paths.join(workdir, "tb"), purge_step=resume_round)

  def write(self, row: dict) -> None:
    row = {k: _clean(v) for k, v in row.items()}
    if self._remote:  # no append on an object store: upload all rows at once
      paths.write_atomic(self.path, _lines(self.rows + [row]))
    else:
      paths.append_text(self.path, _lines([row]))
    self.rows.append(row)
    if self._tb is not None:
      step = row[self.key]
      for k, v in row.items():
        if k != self.key and isinstance(v, (int, float)) and not isinstance(v, bool):
          self._tb.add_scalar(k, v, step)

  def close(self):
    if self._tb is not None:
      self._tb.close()
