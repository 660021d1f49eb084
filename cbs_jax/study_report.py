"""Batch-size studies' reports: runs CSV, markdown tables of S and E, fits, figures.

Everything here formats what ``cbs_jax.study`` computed from a sweep's
records (``study.collect``, ``study.per_batch_rows``, ``study.fit_targets``):

* ``save_records`` / ``load_records``: a study's per-run records (shape,
  seed, learning rate, a few summary fields and the learning curve) as one
  compact CSV, and back -- what ``--replot`` rebuilds tables and figures
  from.
* ``write_runs_csv``: one CSV line per run with rounds / steps / rollouts
  to each target.
* ``summary_table`` / ``fit_lines``: markdown rows of S and E per N (mean
  and t-interval over seeds) and of the critical-batch fit per target.
* ``save_fits``: the fits as JSON.
* ``law_figures``: the S(N) figure, the S-E Pareto and the learning curves.
"""

from __future__ import annotations

import csv
import io

import numpy as np

from cbs_jax import paths
from cbs_jax import plots
from cbs_jax import report
from cbs_jax import rounding
from cbs_jax import stats
from cbs_jax import study

RECORD_KEYS = ("name", "N", "P", "K", "seed", "updates_per_round", "lr")
SUMMARY_KEYS = ("rounds", "rollouts_seen", "stopped_at_target", "stopped_collapsed")
RECORDS = "_curves.csv"


def save_records(
    out, groups: dict, suffix: str = RECORDS, keys=RECORD_KEYS, series: str = "curve"
) -> str:
  """Write ``{group: [record]}`` (``study.collect``'s records) as
  ``<name><suffix>``: one line per entry of each record's ``series`` (a
  dict of equal-length arrays; the curve: rounds, optimizer steps,
  rollouts and held-out pass at each evaluation), each line carrying the
  group, the record's ``keys`` and ``SUMMARY_KEYS`` of its summary (as
  ``summary.<key>``). Floats at ``rounding.stable``'s digits. A record is
  its (group, name): a name twice in one group is an error."""
  rows = []
  for group, recs in groups.items():
    names = [r.get("name") for r in recs]
    if len(set(names)) != len(names):
      dup = sorted({n for n in names if names.count(n) > 1}, key=str)
      raise ValueError(f"group {group!r} names runs {dup} more than once")
    for r in recs:
      meta = {"group": group, **{k: r.get(k) for k in keys}}
      summ = r.get("summary") or {}
      meta |= {f"summary.{k}": summ.get(k) for k in SUMMARY_KEYS}
      arrays = r[series]
      n = len(next(iter(arrays.values())))
      if not n:
        raise ValueError(f"run {r.get('name')} of {group!r} has no {series} entry to commit")
      rows += [meta | {k: float(v[i]) for k, v in arrays.items()} for i in range(n)]
  return out.rows(rows, suffix)


def load_records(
    out, targets=None, suffix: str = RECORDS, keys=RECORD_KEYS, series: str = "curve"
) -> dict:
  """``save_records``' file back as ``{group: [record]}`` in the order
  written: ``keys``, ``summary`` and ``series`` (arrays), and, given
  ``targets``, ``to_target`` of the curve (``study.to_target``) -- each
  record as ``study.collect`` makes it."""
  path = out.path(suffix)
  if not paths.exists(path):
    raise FileNotFoundError(f"{path}: no committed records to replot (run the study first)")
  fixed = {"group", *keys, *(f"summary.{k}" for k in SUMMARY_KEYS)}
  by_name: dict = {}  # group -> {name: record}, in the order first written
  for row in report.read_rows(path):
    recs = by_name.setdefault(row["group"], {})
    rec = recs.get(row["name"])
    if rec is None:
      rec = recs[row["name"]] = {k: _flag(row[k]) for k in keys}
      rec["summary"] = {k: _flag(row[f"summary.{k}"]) for k in SUMMARY_KEYS}
      rec[series] = {k: [] for k in row if k not in fixed}
    for k, v in rec[series].items():
      v.append(float(row[k]))
  groups = {g: list(recs.values()) for g, recs in by_name.items()}
  for recs in groups.values():
    for r in recs:
      r[series] = {k: np.asarray(v, np.float64) for k, v in r[series].items()}
      if targets is not None:
        r["to_target"] = study.to_target(r[series], targets)
  return groups


def _flag(cell):
  """A CSV cell with a boolean written back as the boolean."""
  return {"True": True, "False": False}.get(cell, cell) if isinstance(cell, str) else cell


def write_runs_csv(path: str, records, targets) -> None:
  """One CSV line per run: shape, seed, updates per round, and rounds /
  steps / rollouts to each target (empty where never reached)."""
  cols = ["name", "N", "P", "K", "seed", "updates_per_round", "lr"] + [
      f"{x}@{float(t)}" for t in targets for x in ("rounds", "steps", "rollouts")
  ]
  buf = io.StringIO(newline="")
  w = csv.DictWriter(buf, fieldnames=cols)
  w.writeheader()
  for r in records:
    row = {k: r.get(k) for k in cols[:7]}
    for t in targets:
      for x in ("rounds", "steps", "rollouts"):
        row[f"{x}@{float(t)}"] = r["to_target"][float(t)][x]
    w.writerow(rounding.stable(row))
  paths.write_atomic(path, buf.getvalue())


def summary_table(
    table_rows, targets, x: str = "rounds", x_label: str = "rounds", extra=()
) -> tuple[list[dict], list[str]]:
  """Formatted per-N rows (``per_batch_rows``) and their columns: S in
  ``x`` units and E in rollouts per target, ``mean [lo, hi]`` over seeds."""
  cols = ["N", "P", "K", "seeds", *extra]
  show = []
  for r in table_rows:
    d = {k: r.get(k) for k in cols}
    for t in targets:
      t = float(t)
      d[f"S@{t} ({x_label})"] = stats.Estimate(r[f"{x}@{t}"], r[f"{x}@{t}_lo"], r[f"{x}@{t}_hi"])
      d[f"E@{t} (rollouts)"] = stats.Estimate(
          r[f"rollouts@{t}"], r[f"rollouts@{t}_lo"], r[f"rollouts@{t}_hi"]
      )
      d[f"reached@{t}"] = f"{r[f'reached@{t}']}/{r['seeds']}"
    show.append(d)
  for t in targets:
    t = float(t)
    cols += [f"S@{t} ({x_label})", f"E@{t} (rollouts)", f"reached@{t}"]
  return show, cols


def fit_lines(fits, x_label: str = "rounds") -> list[str]:
  """Markdown table lines of ``{target: fit}``."""
  lines = [
      f"| target | B_crit (rollouts) | S_min ({x_label}) | E_min (rollouts) | verdict |",
      "|---|---|---|---|---|",
  ]
  for t, f in fits.items():
    if "error" in f:
      lines.append(f"| {t} | – | – | – | unresolved: {f['error']} |")
      continue
    lines.append(
        f"| {t} | {stats.fmt(f['B_crit'], f['B_crit_lo'], f['B_crit_hi'])} | "
        f"{stats.fmt(f['S_min'], f['S_min_lo'], f['S_min_hi'])} | "
        f"{stats.fmt(f['E_min'], f['E_min_lo'], f['E_min_hi'])} | {f['verdict']}"
        f"{': ' + f['why'] if f['why'] else ''} |"
    )
  return lines


def save_fits(path: str, fits_by_name: dict, **extra) -> None:
  """Fits (without their bootstrap replicates) and extras as JSON."""
  doc = {
      name: {str(t): {k: v for k, v in f.items() if k != "boot_B_crit"} for t, f in fits.items()}
      for name, fits in fits_by_name.items()
  }
  report.write_json(path, doc | extra)


def law_figures(
    out,
    records,
    fit,
    target: float,
    title: str,
    x: str = "rounds",
    step_label: str = "generation rounds",
    b_noise=None,
    prefix: str = "",
) -> None:
  """The S(N) figure, the S-E Pareto and the learning curves (mean and
  range over seeds per N, by rollouts and by ``x``) of one study."""
  pts = [
      dict(
          N=r["N"],
          S=r["to_target"][target][x],
          E=r["to_target"][target]["rollouts"],
          seed=r["seed"],
      )
      for r in records
  ]
  fit = None if fit is None or "error" in fit else fit
  plots.save(
      plots.steps_vs_batch(
          pts, fit, title=f"{title}, target {target}", step_label=step_label, b_noise=b_noise
      ),
      out.path(f"{prefix}.png"),
  )
  if any(p["S"] is not None for p in pts):
    plots.save(
        plots.pareto(pts, fit, title=f"{title}, target {target}", step_label=step_label),
        out.path(f"{prefix}_pareto.png"),
    )
  curves = []
  for N in sorted({r["N"] for r in records}):
    rs = [r for r in records if r["N"] == N]
    byr = study.mean_curve([r["curve"] for r in rs], "rollouts")
    if len(byr["x"]):
      per_step = rs[0]["curve"][x][-1] / max(rs[0]["curve"]["rollouts"][-1], 1)
      curves.append(
          dict(
              label=f"N={N}",
              rollouts=byr["x"],
              steps=byr["x"] * per_step,
              value=byr["mean"],
              lo=byr["lo"],
              hi=byr["hi"],
          )
      )
  plots.save(
      plots.learning_curves(
          curves,
          target=None,
          title=f"{title} (mean and range " "over seeds)",
          step_label=step_label,
          logx=True,
      ),
      out.path(f"{prefix}_curves.png"),
  )
