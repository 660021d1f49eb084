"""Running batch-size studies, and the study scripts' shared command line.

* ``parser`` / ``parse``: the study scripts' command line (--root,
  --on_root, --out, --workers, --quick, --replot) and where --quick puts
  things. The on-policy study's sweep root, which the other studies read
  back, is the default of --on_root here and nowhere else in the library:
  a script passes ``args.on_root`` to whatever reads it.
* ``run_on_grid``: one run that evaluates only on a grid of rollouts.
* ``records``: a study's per-run records, made from its runs and committed
  (``study_report.save_records``), or with --replot read from the
  committed file alone; either way the analysis reads the committed file.
* ``run_study`` / ``run_variants``: run (or resume, or read back) a sweep
  (``cbs_jax.sweep``) after building its shared SFT base once
  (``prepare_base``); ``read_finished``: the rows of a sweep another study
  ran.

What the runs are turned into is ``cbs_jax.study``; tables and figures are
``cbs_jax.study_report``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile

from cbs_jax import run_setup
from cbs_jax import study
from cbs_jax import study_report
from cbs_jax import sweep
from cbs_jax import train

RESULTS = "experiments/results"  # results parent folder


def parser(
    doc: str,
    name: str,
    root_help: str,
    on_root_help: str | None = None,
    workers: bool = True,
    root: str | None = None,
    quick_root: str | None = None,
    replot: bool = False,
) -> argparse.ArgumentParser:
  """The shared command line of a study script ``name``: --root (default
  ``runs/<name>``), --on_root when the study reads the on-policy sweep back
  (``on_root_help``; default runs/batch_law_on, where
  ``experiments/batch_law_on_policy.py`` puts it), --out, --workers (runs at
  once, each single-threaded on its own core), --quick, and --replot where
  the study can rebuild its tables and figures from its committed files
  (``replot``); add the study's own flags, then ``parse``."""
  ap = argparse.ArgumentParser(
      description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  quick_root = quick_root or f"runs_{name}"
  ap.add_argument(
      "--root",
      default=root or f"runs/{name}",
      help=f"{root_help} (--quick: <out>/{quick_root} unless given)",
  )
  if on_root_help:
    ap.add_argument(
        "--on_root",
        default="runs/batch_law_on",
        help=f"{on_root_help} (--quick: <out>/runs_on unless given; its quick "
        "sweep is made there if missing)",
    )
  ap.add_argument(
      "--out", default=RESULTS, help="results parent folder (--quick: a fresh temp folder)"
  )
  if workers:
    ap.add_argument(
        "--workers",
        type=int,
        default=None,
        help="runs at once, each single-threaded on its own core (default 2; --quick: 1, "
        "since its runs are too short to repay a worker process's start)",
    )
  ap.add_argument("--quick", action="store_true", help="tiny smoke version (minutes)")
  if replot:
    ap.add_argument(
        "--replot",
        action="store_true",
        help="tables and figures from the committed files under --out alone: nothing "
        "is run or read from --root, and the manifest stays the sweep's",
    )
  ap.set_defaults(_quick_root=quick_root, replot=False)
  return ap


def parse(ap: argparse.ArgumentParser, argv=None) -> argparse.Namespace:
  """Parse a ``parser``'s flags; with --quick, what was not given goes under
  --out (itself a fresh temp folder unless given): the sweep root to
  ``<out>/<quick root>``, the on-policy root to ``<out>/runs_on``."""
  args = ap.parse_args(argv)
  if args.quick:
    if args.out == RESULTS:
      args.out = tempfile.mkdtemp(prefix="cbs_quick_")
    if args.root == ap.get_default("root"):
      args.root = os.path.join(args.out, args._quick_root)
    on_root = ap.get_default("on_root")  # None without an --on_root flag
    if on_root is not None and args.on_root == on_root:
      args.on_root = os.path.join(args.out, "runs_on")
  if hasattr(args, "workers"):
    if args.workers is None:
      args.workers = 1 if args.quick else 2
    if args.workers < 1:
      ap.error(f"--workers={args.workers} must be >= 1")
  return args


def records(
    args, out, targets, make, suffix: str = study_report.RECORDS, keys=study_report.RECORD_KEYS
) -> dict:
  """``{group: [record]}`` of a study (``study.collect``'s records, grouped
  by arm): ``make()`` runs or reads back the sweeps and its records are
  committed under ``out`` (``study_report.save_records``); with
  ``args.replot`` nothing is made. Either way they are read back from that
  file, so a study and its --replot analyse the same bytes."""
  if not args.replot:
    study_report.save_records(out, make(), suffix, keys)
  return study_report.load_records(out, targets, suffix, keys)


def prepare_base(config, root: str) -> None:
  """Build (or find) the sweep's shared SFT base before any run starts, so
  parallel workers never build it twice. ``config.sft.base_dir`` is
  relative to a run's workdir (``root/<run>``), e.g. "../sft_base"."""
  setup = run_setup.prepare(config)
  train.sft_base(config, os.path.join(root, "_base_probe"), setup)


def on_policy_base(config, on_root: str):
  """A copy of ``config`` whose runs start from the SFT base of the
  on-policy sweep under ``on_root`` (``<on_root>/sft_base``, built there if
  missing): a study that compares its runs with the on-policy ones starts
  from the very same base policy, and trains it once."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.sft.base_dir = os.path.abspath(os.path.join(on_root, "sft_base"))
  return c


def run_study(config, overrides, root: str, workers: int = 1, progress: bool = True):
  """Run (or resume, or read back) the sweep of ``overrides`` on ``config``
  under ``root``: the SFT base first, then every run (``sweep.run_sweep``)."""
  prepare_base(config, root)
  return sweep.run_sweep(config, overrides, root, workers=workers, progress=progress)


def read_finished(overrides, root: str) -> list[dict]:
  """The rows of a sweep that another command runs (never started here):
  every run of ``overrides`` under ``root`` must have finished (its
  ``summary.json`` exists); ValueError naming the first missing ones."""
  rows, missing = [], []
  for o in overrides:
    name = sweep.run_name(o)
    wd = os.path.join(root, name)
    path = os.path.join(wd, "summary.json")
    if not os.path.exists(path):
      missing.append(name)
      continue
    with open(path) as f:
      rows.append(dict(name=name, overrides=o, workdir=wd, summary=json.load(f)))
  if missing:
    raise ValueError(
        f"{len(missing)} of {len(overrides)} runs under {root} have not "
        f"finished (e.g. {missing[:3]}): run their study first"
    )
  return rows


def run_variants(configs: dict, root: str, workers: int = 1, progress: bool = True):
  """Run named config variants that share an SFT base (``config.sft.base_dir``
  = "../sft_base") as one resumable sweep under ``root`` (run ``name`` in
  ``root/name``), ``workers`` at a time. Returns ``{name: row}``."""
  names = list(configs)
  base = configs[names[0]]
  over = [study.overrides_between(base, configs[n]) for n in names]
  prepare_base(base, root)
  rows = sweep.run_sweep(base, over, root, names=names, workers=workers, progress=progress)
  return dict(zip(names, rows))


def run_on_grid(config, workdir, grid: int):
  """``train.train_and_evaluate`` evaluating only at round 0 and at the first
  round whose rollouts reach each multiple of ``grid`` (the config evaluates
  every round; the other evaluations are skipped, so they cost nothing and a
  stop at the target happens on the grid). Module level: sweep workers
  pickle it (``functools.partial(run_on_grid, grid=...)``)."""
  evaluate = train.evaluate

  def on_grid(trainer, state):
    seen = state.counters.rollouts_seen
    done = state.log.evaluations  # the last evaluation's multiple of the grid
    if seen and done and seen // grid <= done[-1].rollouts // grid:
      return {}
    return evaluate(trainer, state)

  train.evaluate = on_grid
  try:
    return train.train_and_evaluate(config, workdir)
  finally:
    train.evaluate = evaluate
