"""Rebuild colab/cbs_jax_tour.ipynb from its percent-format twin and execute it,
so the committed notebook carries outputs that GitHub shows without running it.

    pip install jupytext nbclient ipykernel
    python colab/build_tour.py                      # the Colab size
    python colab/build_tour.py --fresh_env          # the same, as committed (below)
    python colab/build_tour.py --size=tiny --out=/tmp/tour.ipynb
    python colab/build_tour.py --sources_only      # copy the .py's cells, keep outputs

``--fresh_env`` executes the notebook in a new virtual environment that
holds only what a Colab runtime brings (JAX, Flax, Optax, Orbax and
matplotlib, at this environment's versions; ``COLAB_PREINSTALLED``) and the
build tools, so the notebook's install cell really installs cbs_jax (from
this checkout, as ``pip install <path>``) and its outputs show that install
and the notebook's own wall time. Run it from a fresh clone at a clean
commit, on an idle machine: the committed outputs are its record.

``--sources_only`` needs nothing installed: it replaces the notebook's cell
sources with the twin's (same cells, same order) and keeps the outputs of
the last execution, so a code edit that changes no output (a rename, a
reformat) does not need the notebook to be run again.
The code lives in colab/cbs_jax_tour.py; this script only pairs and executes
(`jupytext --sync` pairs without executing). The notebook runs in a fresh
scratch folder (``--rundir``), so its runs, figures and compilation cache
never land in the repository. tests/test_colab.py executes the .py twin at
the tiny size and checks that the two files hold the same code.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.join(HERE, "cbs_jax_tour.py")
IPYNB = os.path.join(HERE, "cbs_jax_tour.ipynb")


def main(argv=None):
  ap = argparse.ArgumentParser(
      description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
  )
  ap.add_argument("--size", default="colab", choices=("colab", "tiny"))
  ap.add_argument("--out", default=IPYNB, help="Notebook to write.")
  ap.add_argument("--rundir", default=None, help="Working folder (default: a fresh temp dir).")
  ap.add_argument(
      "--sources_only",
      action="store_true",
      help="Copy the twin's cell sources into the notebook; keep its outputs.",
  )
  ap.add_argument(
      "--fresh_env",
      action="store_true",
      help="Execute in a new virtual environment holding only a Colab runtime's "
      "packages and the build tools (the install cell then installs cbs_jax).",
  )
  args = ap.parse_args(argv)
  if args.sources_only:
    return copy_sources(PY, args.out)
  if args.fresh_env:
    return build_in_fresh_env(args)
  import jupytext  # noqa: PLC0415  (build-time tools, not dependencies of cbs_jax)
  from nbclient import NotebookClient  # noqa: PLC0415

  nb = jupytext.read(PY)
  rundir = args.rundir or tempfile.mkdtemp(prefix="cbs_jax_tour_")
  os.makedirs(rundir, exist_ok=True)
  os.environ["CBS_JAX_TOUR_SIZE"] = args.size  # the kernel inherits the environment
  os.environ["CBS_JAX_LOCAL_PATH"] = os.path.dirname(HERE)
  os.environ.pop("CBS_JAX_TOUR_DIR", None)
  t0 = time.time()
  NotebookClient(
      nb, timeout=None, kernel_name="python3", resources={"metadata": {"path": rundir}}
  ).execute()
  print(
      f"executed at size={args.size} in {time.time() - t0:.0f} s (run folder {rundir})",
      file=sys.stderr,
  )
  jupytext.write(nb, args.out)
  if os.path.abspath(args.out) == IPYNB:
    jupytext.write(nb, PY, fmt="py:percent")  # keep the pair's metadata in step
  print("wrote", args.out, file=sys.stderr)


# what a Colab CPU runtime already holds (the tour's install cell says so)
COLAB_PREINSTALLED = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "matplotlib")
BUILD_TOOLS = ("jupytext", "nbclient", "ipykernel")


def colab_pins() -> list[str]:
  """``COLAB_PREINSTALLED`` pinned to this environment's versions (a package
  not installed here goes unpinned)."""
  pins = []
  for name in COLAB_PREINSTALLED:
    try:
      pins.append(f"{name}=={importlib.metadata.version(name)}")
    except importlib.metadata.PackageNotFoundError:
      pins.append(name)
  return pins


def build_in_fresh_env(args) -> None:
  """Make a virtual environment with ``colab_pins()`` and the build tools,
  then run this script in it (same size, output and run folder)."""
  env_dir = tempfile.mkdtemp(prefix="cbs_jax_tour_env_")
  subprocess.run([sys.executable, "-m", "venv", env_dir], check=True)
  py = os.path.join(env_dir, "bin", "python")
  print(f"fresh environment {env_dir}: {' '.join(colab_pins())}", file=sys.stderr)
  subprocess.run([py, "-m", "pip", "install", "-q", *colab_pins(), *BUILD_TOOLS], check=True)
  cmd = [py, os.path.abspath(__file__), f"--size={args.size}", f"--out={args.out}"]
  if args.rundir:
    cmd.append(f"--rundir={args.rundir}")
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing of this checkout
  subprocess.run(cmd, check=True, env=env)


def _percent_cells(text: str) -> list[tuple[str, list[str]]]:
  """(cell_type, source lines) of a jupytext percent-format file."""
  lines = text.splitlines()
  if lines and lines[0] == "# ---":  # the YAML header
    lines = lines[lines.index("# ---", 1) + 1 :]
  cells, kind, buf = [], None, []
  for line in lines + ["# %%"]:
    if line.startswith("# %%"):
      if kind is not None:
        while buf and not buf[0].strip():
          buf.pop(0)
        while buf and not buf[-1].strip():
          buf.pop()
        if kind == "markdown":
          buf = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in buf]
        cells.append((kind, buf))
      kind, buf = ("markdown" if "[markdown]" in line else "code"), []
    else:
      buf.append(line)
  return cells


def copy_sources(py: str, ipynb: str) -> None:
  """Set each notebook cell's source to the twin's; ValueError naming the
  first cell whose type or position differs (then the notebook must be
  rebuilt by executing it)."""
  with open(py) as f:
    cells = _percent_cells(f.read())
  with open(ipynb) as f:
    nb = json.load(f)
  if [k for k, _ in cells] != [c["cell_type"] for c in nb["cells"]]:
    raise ValueError(
        f"{py} and {ipynb} differ in their cells' types or order: rebuild the "
        "notebook by executing it (python colab/build_tour.py)"
    )
  for cell, (_, lines) in zip(nb["cells"], cells):
    cell["source"] = [ln + "\n" for ln in lines[:-1]] + lines[-1:]
  with open(ipynb, "w") as f:
    json.dump(nb, f, indent=1, ensure_ascii=False)
    f.write("\n")
  print("copied the cell sources of", py, "into", ipynb, file=sys.stderr)


if __name__ == "__main__":
  main()
