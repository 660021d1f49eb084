"""What every experiment writes: CSV + markdown table + figure + manifest.

    out = report.Results("batch_law_on_policy", root="experiments/results")
    out.table(rows, columns)            # -> <name>.csv and <name>.md (returned, printed)
    out.figure(fig)                     # -> <name>.png
    out.manifest(config=c, command=sys.argv, wall_seconds=t)   # -> manifest.json

``manifest.json`` records what a figure needs to be traced to the exact code
that made it: the git commit (and whether the tree had uncommitted changes),
the full config(s), the versions of jax, flax, optax, orbax-checkpoint and
numpy, the platform and devices, the wall time and the command line.
"""
from __future__ import annotations

import csv
import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
from typing import Any, Sequence

_PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy",
             "ml-collections")


def _git(*args: str) -> str | None:
  here = os.path.dirname(os.path.abspath(__file__))
  try:
    out = subprocess.run(["git", *args], cwd=here, capture_output=True, text=True,
                         timeout=10)
  except (OSError, subprocess.SubprocessError):
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def provenance() -> dict:
  """Commit, dirty flag, package versions, platform and devices."""
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
  status = _git("status", "--porcelain", "--untracked-files=no")
  return dict(git_commit=_git("rev-parse", "HEAD"),
              git_dirty=None if status is None else bool(status),
              versions=versions, python=sys.version.split()[0],
              platform=platform.platform(), backend=backend, devices=devices)


def _plain(config: Any) -> Any:
  if hasattr(config, "to_dict"):
    return config.to_dict()
  if isinstance(config, dict):
    return {k: _plain(v) for k, v in config.items()}
  return config


def markdown_table(rows: Sequence[dict], columns: Sequence[str],
                   fmt: dict | None = None) -> str:
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
    self.dir = os.path.join(root, name)
    os.makedirs(self.dir, exist_ok=True)
    self.t0 = datetime.datetime.now(datetime.timezone.utc)

  def path(self, suffix: str) -> str:
    return os.path.join(self.dir, f"{self.name}{suffix}")

  def table(self, rows: Sequence[dict], columns: Sequence[str], fmt: dict | None = None,
            title: str | None = None, notes: str = "", echo: bool = True) -> str:
    """Write ``<name>.csv`` (all columns of the rows) and ``<name>.md``
    (``columns``, ``title``, ``notes``); print and return the markdown."""
    keys = list(dict.fromkeys(k for r in rows for k in r))
    with open(self.path(".csv"), "w", newline="") as f:
      w = csv.DictWriter(f, fieldnames=keys)
      w.writeheader()
      for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, (list, dict)) else v
                    for k, v in r.items()})
    md = (f"# {title}\n\n" if title else "") + markdown_table(rows, columns, fmt)
    if notes:
      md += "\n\n" + notes.strip() + "\n"
    with open(self.path(".md"), "w") as f:
      f.write(md + ("\n" if not md.endswith("\n") else ""))
    if echo:
      print(md)
    return md

  def figure(self, fig, suffix: str = ".png") -> str:
    path = self.path(suffix)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    return path

  def manifest(self, config: Any = None, command: Sequence[str] | None = None,
               wall_seconds: float | None = None, **extra) -> str:
    """Write ``manifest.json`` (provenance + config + command + wall time)."""
    doc = dict(experiment=self.name, started_utc=self.t0.isoformat(),
               wall_seconds=wall_seconds,
               command=" ".join(command if command is not None else sys.argv),
               config=_plain(config), **provenance(), **extra)
    path = os.path.join(self.dir, "manifest.json")
    with open(path + ".tmp", "w") as f:
      json.dump(doc, f, indent=1, default=str)
    os.replace(path + ".tmp", path)
    return path
