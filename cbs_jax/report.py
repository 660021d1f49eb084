"""What every experiment writes: CSV + markdown table + figure + manifest.

    out = report.Results("batch_law_on_policy", root="experiments/results")
    out.table(rows, columns)            # -> <name>.csv and <name>.md (returned, printed)
    out.figure(fig)                     # -> <name>.png
    out.manifest(config=c)              # -> manifest.json (command, wall time: this process's)

``manifest.json`` records what a figure needs to be traced to the exact code
that made it: the git commit (and whether the tree had uncommitted changes),
the full config(s), the versions of jax, flax, optax, orbax-checkpoint and
numpy, the platform and devices, the wall time and the command line.

Files go through ``paths`` (the root may be an object-store URI), each
written whole and atomically (``paths.write_atomic``).
"""

from __future__ import annotations

import csv
import datetime
import hashlib
import importlib.metadata
import io
import json
import os
import platform
import posixpath
import shlex
import subprocess
import sys
import time
from typing import Any, Sequence

from cbs_jax import paths
from cbs_jax import rounding

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy", "ml-collections")
MANIFEST = "manifest.json"
# what every manifest.json holds (tests/test_report.py checks each is filled in)
MANIFEST_KEYS = (
    "experiment",
    "started_utc",
    "wall_seconds",
    "command",
    "config",
    "git_commit",
    "git_dirty",
    "versions",
    "python",
    "platform",
    "backend",
    "devices",
)


RESULTS_DIR = "experiments/results"  # committed study results (left out of git_dirty)


def _git(*args: str, cwd: str | None = None) -> str | None:
  here = cwd or os.path.dirname(os.path.abspath(__file__))
  try:
    out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True, timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def git_dirty(cwd: str | None = None) -> bool | None:
  """Whether a tracked file of the checkout (of this package, or ``cwd``'s)
  differs from HEAD, the committed results under ``RESULTS_DIR`` left out: a
  study rewriting its own results while it runs has not changed the code
  that made them. None outside a git checkout."""
  status = _git(
      "status",
      "--porcelain",
      "--untracked-files=no",
      "--",
      ":(top)",
      f":(top,exclude){RESULTS_DIR}",
      cwd=cwd,
  )
  return None if status is None else bool(status)


def git_commit(cwd: str | None = None) -> str | None:
  """HEAD of the checkout (of this package, or ``cwd``'s); None outside git."""
  return _git("rev-parse", "HEAD", cwd=cwd)


# one line per sweep invocation that ran something (written by cbs_jax.sweep),
# so a manifest written by a read-back invocation still knows what the runs cost
LEDGER = "invocations.jsonl"


def record_invocation(root: str, record: dict) -> None:
  """Add ``record`` as a line of ``root``'s ledger (the file rewritten whole,
  ``paths.write_atomic``: object stores have no append)."""
  path = paths.join(root, LEDGER)
  old = paths.read_text(path) if paths.exists(path) else ""
  paths.write_atomic(path, old + json.dumps(record, sort_keys=True) + "\n")


def ledger(root: str, *read_roots: str) -> dict:
  """What the sweep invocations under ``root`` cost -- its own ledger and
  those of its sub-sweeps one level down (``root/<arm>/``): the records
  (oldest first, each naming its sweep folder), their summed wall seconds
  and runs, and the commits they ran at (empty when no invocation recorded
  one, e.g. runs made before the ledger existed). ``read_roots``: the other
  sweep roots a study read finished runs from (e.g. ``--on_root``); their
  records join in, ``sweep`` naming the root (``<read_root>`` or
  ``<read_root>/<arm>``), so the cost of every run a table rests on is in
  one place. A read root equal to ``root`` is counted once."""
  recs = []
  for r in dict.fromkeys([root, *read_roots]):  # in order, each once
    own = r == root
    for rec in _root_records(r):
      if not own:
        sub = rec["sweep"]
        rec["sweep"] = r if sub == "." else paths.join(r, sub)
      recs.append(rec)
  recs.sort(key=lambda r: r["started_utc"])
  return dict(
      invocations=recs,
      wall_seconds=float(sum(r["wall_seconds"] for r in recs)),
      runs=int(sum(r["ran"] for r in recs)),
      commits=sorted({r["git_commit"] for r in recs if r.get("git_commit")}),
      any_dirty=any(bool(r.get("git_dirty")) for r in recs),
  )


def _root_records(root: str) -> list[dict]:
  """The ledger lines of ``root`` and of its sub-sweeps one level down,
  each with ``sweep``: "." or the sub-folder's name. The sub-sweeps are
  found by one glob for their ledgers, not a check of every run folder
  (a sweep root on an object store can hold hundreds)."""
  own = paths.join(root, LEDGER)
  found = [(".", own)] if paths.exists(own) else []
  found += [
      (posixpath.basename(posixpath.dirname(p.replace(os.sep, "/"))), p)
      for p in paths.glob(root, f"*/{LEDGER}")
  ]
  recs = []
  for sub, path in found:
    recs += [
        dict(json.loads(x), sweep=sub) for x in paths.read_text(path).splitlines() if x.strip()
    ]
  return recs


ISA_PREFIXES = ("avx", "fma", "f16c", "amx", "sse4", "bmi", "vaes", "vpclmul", "gfni")


def processor() -> dict:
  """What decides XLA's CPU code, and so a CPU run's last bits: the
  instruction-set flags XLA can target (from /proc/cpuinfo; empty where
  that is not readable) and jaxlib's version. Why: docs/metrics.md,
  "Why the same seed gives other numbers on another machine"."""
  flags = set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          flags |= {x for x in line.split(":", 1)[1].split() if x.startswith(ISA_PREFIXES)}
  except OSError:
    pass
  try:
    jaxlib = importlib.metadata.version("jaxlib")
  except importlib.metadata.PackageNotFoundError:
    jaxlib = None
  return dict(isa=sorted(flags), jaxlib=jaxlib)


def processor_fingerprint(proc: dict | None = None) -> str:
  """A short hash of ``processor()``: runs with equal fingerprints compute
  the same bits."""
  proc = processor() if proc is None else proc
  return hashlib.sha1(json.dumps(proc, sort_keys=True).encode()).hexdigest()[:10]


def provenance() -> dict:
  """Commit, dirty flag, package versions, platform, devices and the
  processor's fingerprint."""
  versions = {}
  for p in _PACKAGES:
    try:
      versions[p] = importlib.metadata.version(p)
    except importlib.metadata.PackageNotFoundError:
      versions[p] = None
  try:
    import jax  # noqa: PLC0415  (only when a manifest is written)

    devices = [str(d) for d in jax.devices()]
    backend = jax.default_backend()
  except Exception as e:  # a manifest must never fail on a device query
    devices, backend = [f"unavailable: {e}"], None
  return dict(
      git_commit=git_commit(),
      git_dirty=git_dirty(),
      versions=versions,
      python=sys.version.split()[0],
      platform=platform.platform(),
      backend=backend,
      devices=devices,
      processor=processor_fingerprint(),
  )


def _plain(config: Any) -> Any:
  """A config (ConfigDict, dict, or lists of them) as plain JSON-able data.
  An absolute path inside the working directory is written relative to it,
  so a committed manifest names no machine's directories."""
  if hasattr(config, "to_dict"):
    return _plain(config.to_dict())
  if isinstance(config, dict):
    return {str(k): _plain(v) for k, v in config.items()}
  if isinstance(config, (list, tuple)):
    return [_plain(v) for v in config]
  if isinstance(config, str) and os.path.isabs(config):
    rel = os.path.relpath(config)
    return config if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel
  return config


def command_line(argv: Sequence[str] | None = None) -> str:
  """The command that ran this process, as a shell line: ``python -m pkg.mod
  ...`` for a module run, ``python path/to/script.py ...`` otherwise."""
  argv = list(sys.argv if argv is None else argv)
  if not argv:
    return "python"
  main = sys.modules.get("__main__")
  spec = getattr(main, "__spec__", None)
  if argv is sys.argv or argv == sys.argv:
    if spec is not None and spec.name and spec.name != "__main__":
      return shlex.join(["python", "-m", spec.name.removesuffix(".__main__"), *argv[1:]])
  return shlex.join(["python", *argv])


def missing_manifests(root: str = "experiments/results") -> list[str]:
  """Result folders ``root/<name>/`` without a ``manifest.json`` (sorted)."""
  if not paths.isdir(root):
    return []
  return sorted(
      d
      for d in paths.listdir(root)
      if paths.isdir(paths.join(root, d))
      and not d.startswith(".")
      and not paths.exists(paths.join(root, d, MANIFEST))
  )


def provenance_rows(root: str = RESULTS_DIR) -> list[dict]:
  """One row per committed result folder under ``root`` (sorted): the
  commit its manifest records, whether that tree was clean, the wall time of
  the command that wrote it, the summed wall time of every sweep invocation
  that ran its runs (``sweep_s``, where the manifest holds the ledger) and
  the command -- so a reader sees which results a clean commit produced and
  which an invocation that only read runs back."""
  rows = []
  for name in sorted(paths.listdir(root)) if paths.isdir(root) else []:
    path = paths.join(root, name, MANIFEST)
    if name.startswith(".") or not paths.exists(path):
      continue
    m = json.loads(paths.read_text(path))
    dirty = m.get("git_dirty")
    rows.append(
        dict(
            folder=name,
            commit=(m.get("git_commit") or "")[:7] or None,
            tree={True: "dirty", False: "clean"}.get(dirty, "unknown"),
            wall_s=float(m["wall_seconds"]),
            sweep_s=m["ledger"]["wall_seconds"] if m.get("ledger", {}).get("invocations") else None,
            command=f"`{m['command']}`",
        )
    )
  return rows


def provenance_table(root: str = RESULTS_DIR) -> str:
  """``provenance_rows`` as the markdown table ``experiments/README.md`` commits."""
  return markdown_table(
      provenance_rows(root),
      ["folder", "commit", "tree", "wall_s", "sweep_s", "command"],
      {"wall_s": ".0f", "sweep_s": ".0f"},
  )


def write_json(path: str, doc: Any) -> None:
  """``doc`` as indented JSON at ``path``, floats ``rounding.stable`` (numpy scalars as
  numbers), written whole (``paths.write_atomic``)."""
  paths.write_atomic(path, json.dumps(rounding.stable(doc), indent=1, default=float))


def csv_cells(row: dict) -> dict:
  """``row`` with every cell that has a ``columns(name)`` method (an
  interval: ``stats.Estimate``) spread into its numeric columns."""
  out = {}
  for k, v in row.items():
    out |= v.columns(k) if hasattr(v, "columns") else {k: v}
  return rounding.stable(out)


def read_rows(path: str) -> list[dict]:
  """The rows of a CSV written by ``Results.rows``: numbers back as floats
  (ints where integral), empty cells as None, other cells as strings."""

  def cell(v):
    if v == "":
      return None
    try:
      x = float(v)
    except ValueError:
      return v
    return int(x) if x.is_integer() and "." not in v and "e" not in v.lower() else x

  return [
      {k: cell(v) for k, v in r.items()} for r in csv.DictReader(io.StringIO(paths.read_text(path)))
  ]


def markdown_table(rows: Sequence[dict], columns: Sequence[str], fmt: dict | None = None) -> str:
  """A GitHub markdown table of ``rows`` (dicts) over ``columns``; ``fmt``
  maps a column to a format spec (default: 4 significant digits for floats)."""
  fmt = fmt or {}

  def cell(c, v):
    if v is None:
      return "–"
    if isinstance(v, float):
      return format(v, fmt.get(c, ".4g"))
    return str(v)

  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(cell(c, r.get(c)) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


class Results:
  """The output folder ``<root>/<name>/`` of one experiment."""

  def __init__(self, name: str, root: str = "experiments/results"):
    if not name or os.sep in name:
      raise ValueError(f"experiment name {name!r} must be a plain folder name")
    self.name = name
    self.dir = paths.join(root, name)
    paths.makedirs(self.dir)
    self.t0 = datetime.datetime.now(datetime.timezone.utc)
    self._clock = time.monotonic()

  def path(self, suffix: str) -> str:
    return paths.join(self.dir, f"{self.name}{suffix}")

  def table(
      self,
      rows: Sequence[dict],
      columns: Sequence[str],
      fmt: dict | None = None,
      title: str | None = None,
      notes: str = "",
      echo: bool = True,
  ) -> str:
    """Write ``<name>.csv`` (all columns of the rows) and ``<name>.md``
    (``columns``, ``title``, ``notes``); print and return the markdown. A
    cell with a ``columns(name)`` method (``stats.Estimate``) is written to
    the CSV as its numeric columns and to the markdown as its text."""
    flat = [csv_cells(r) for r in rows]
    keys = list(dict.fromkeys(k for r in flat for k in r))
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=keys)
    w.writeheader()
    for r in flat:
      w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()})
    paths.write_atomic(self.path(".csv"), buf.getvalue())
    md = (f"# {title}\n\n" if title else "") + markdown_table(rows, columns, fmt)
    if notes:
      md += "\n\n" + notes.strip() + "\n"
    paths.write_atomic(self.path(".md"), md + ("\n" if not md.endswith("\n") else ""))
    if echo:
      print(md)
    return md

  def command(self, replot: bool = False) -> str:
    """The command line a table cites: this process's (``command_line``),
    or, when only replotting, the one that ran the study (its manifest's)."""
    p = paths.join(self.dir, "manifest.json")
    if replot and paths.exists(p):
      return json.loads(paths.read_text(p))["command"]
    return command_line()

  def rows(self, rows: Sequence[dict], suffix: str) -> str:
    """Write plain ``rows`` (dicts of numbers and strings; the union of
    their keys as columns) as ``<name><suffix>``, e.g. the per-run curves a
    figure is drawn from, so ``read_rows`` can redraw it without the runs."""
    flat = [csv_cells(r) for r in rows]
    buf = io.StringIO(newline="")
    w = csv.DictWriter(buf, fieldnames=list(dict.fromkeys(k for r in flat for k in r)))
    w.writeheader()
    w.writerows(flat)
    paths.write_atomic(self.path(suffix), buf.getvalue())
    return self.path(suffix)

  def figure(self, fig, suffix: str = ".png") -> str:
    """Write ``fig`` as ``<name><suffix>`` (``plots.save``: fixed dpi, then closed)."""
    from cbs_jax import plots  # noqa: PLC0415  (matplotlib only when a figure is written)

    return plots.save(fig, self.path(suffix))

  def manifest(
      self,
      config: Any = None,
      command: Sequence[str] | str | None = None,
      wall_seconds: float | None = None,
      runs_root: str | Sequence[str] | None = None,
      **extra,
  ) -> str:
    """Write ``manifest.json``: the keys of ``MANIFEST_KEYS`` (provenance,
    the full config, the command line, wall time) plus ``extra``.

    ``command`` defaults to this process's command line (``command_line``);
    ``wall_seconds`` to the time since this ``Results`` was created. With
    ``runs_root`` (the study's sweep root; or a list of roots, its own
    first, then those it read runs from) the manifest also holds ``ledger``:
    that root's ``ledger`` -- every invocation that ran runs, their summed
    wall time and commits -- so a manifest rewritten by an invocation that
    only read the runs back still says what they cost and what made them."""
    clash = sorted(set(extra) & set(MANIFEST_KEYS + ("ledger",)))
    if clash:
      raise ValueError(f"manifest extra fields {clash} would overwrite recorded provenance")
    if wall_seconds is None:
      wall_seconds = time.monotonic() - self._clock
    if command is None:
      command = command_line()
    elif not isinstance(command, str):
      command = command_line(command)
    doc = dict(
        experiment=self.name,
        started_utc=self.t0.isoformat(),
        wall_seconds=float(wall_seconds),
        command=command,
        config=_plain(config),
        **provenance(),
        **extra,
    )
    if runs_root is not None:
      roots = [runs_root] if isinstance(runs_root, str) else list(runs_root)
      doc["ledger"] = ledger(*roots)
    path = paths.join(self.dir, MANIFEST)
    paths.write_atomic(path, json.dumps(doc, indent=1, default=str))
    return path


# python -m cbs_jax.report: the provenance table of the committed results
if __name__ == "__main__":
  print(provenance_table())
