"""Rebuild colab/cbs_jax_tour.ipynb from its percent-format twin and execute it,
so the committed notebook carries outputs that GitHub shows without running it.

    pip install jupytext nbclient ipykernel
    python colab/build_tour.py                      # the Colab size, as committed
    python colab/build_tour.py --size=tiny --out=/tmp/tour.ipynb

The code lives in colab/cbs_jax_tour.py; this script only pairs and executes
(`jupytext --sync` pairs without executing). The notebook runs in a fresh
scratch folder (``--rundir``), so its runs, figures and compilation cache
never land in the repository. tests/test_colab.py executes the .py twin at
the tiny size and checks that the two files hold the same code.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PY = os.path.join(HERE, "cbs_jax_tour.py")
IPYNB = os.path.join(HERE, "cbs_jax_tour.ipynb")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--size", default="colab", choices=("colab", "tiny"))
  ap.add_argument("--out", default=IPYNB, help="Notebook to write.")
  ap.add_argument("--rundir", default=None, help="Working folder (default: a fresh temp dir).")
  args = ap.parse_args(argv)
  import jupytext  # noqa: PLC0415  (build-time tools, not dependencies of cbs_jax)
  from nbclient import NotebookClient  # noqa: PLC0415

  nb = jupytext.read(PY)
  rundir = args.rundir or tempfile.mkdtemp(prefix="cbs_jax_tour_")
  os.makedirs(rundir, exist_ok=True)
  os.environ["CBS_JAX_TOUR_SIZE"] = args.size        # the kernel inherits the environment
  os.environ["CBS_JAX_LOCAL_PATH"] = os.path.dirname(HERE)
  os.environ.pop("CBS_JAX_TOUR_DIR", None)
  t0 = time.time()
  NotebookClient(nb, timeout=None, kernel_name="python3",
                 resources={"metadata": {"path": rundir}}).execute()
  print(f"executed at size={args.size} in {time.time() - t0:.0f} s (run folder {rundir})",
        file=sys.stderr)
  jupytext.write(nb, args.out)
  if os.path.abspath(args.out) == IPYNB:
    jupytext.write(nb, PY, fmt="py:percent")  # keep the pair's metadata in step
  print("wrote", args.out, file=sys.stderr)


if __name__ == "__main__":
  main()
