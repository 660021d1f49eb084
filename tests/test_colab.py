"""The Colab tour: it runs top to bottom at the tiny size and writes its figures,
and the committed .ipynb and its percent-format .py twin hold the same cells.

The twin is parsed here with a few lines of our own (no jupytext needed), so a
notebook edited without re-syncing the twin (or the reverse) fails."""

import json
import os
import re
import subprocess
import sys
import time

import matplotlib.image
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = os.path.join(ROOT, "colab", "cbs_jax_tour.py")
IPYNB = os.path.join(ROOT, "colab", "cbs_jax_tour.ipynb")
FIGURES = (
    "learning_curves",
    "noise_tracker",
    "noise_decomposition",
    "noise_over_training",
    "sweep_curves",
    "steps_vs_batch",
    "pareto",
)
TINY_LIMIT_S = 180  # the tiny tour must fit in 3 minutes of one idle 2-core machine


def _strip_blank(lines):
  while lines and not lines[0].strip():
    lines = lines[1:]
  while lines and not lines[-1].strip():
    lines = lines[:-1]
  return lines


def _py_cells(text):
  """(cell_type, source) of a jupytext percent-format file."""
  lines = text.splitlines()
  if lines and lines[0] == "# ---":  # the YAML header
    end = lines.index("# ---", 1)
    lines = lines[end + 1 :]
  cells, kind, buf = [], None, []
  for line in lines + ["# %%"]:
    if line.startswith("# %%"):
      if kind is not None:
        body = _strip_blank(buf)
        if kind == "markdown":
          body = [ln[2:] if ln.startswith("# ") else ln.lstrip("#") for ln in body]
        cells.append((kind, "\n".join(body)))
      kind = "markdown" if "[markdown]" in line else "code"
      buf = []
    else:
      buf.append(line)
  return cells[:-1] if cells and cells[-1] == ("code", "") else cells


def _nb_cells(nb):
  return [
      (c["cell_type"], "\n".join(_strip_blank("".join(c["source"]).splitlines())))
      for c in nb["cells"]
  ]


@pytest.fixture(scope="module")
def notebook():
  with open(IPYNB) as f:
    return json.load(f)


def test_twin_and_notebook_hold_the_same_cells(notebook):
  with open(PY) as f:
    py = _py_cells(f.read())
  nb = _nb_cells(notebook)
  assert [k for k, _ in py] == [k for k, _ in nb], "cell types/order differ"
  for i, (a, b) in enumerate(zip(py, nb)):
    assert a[1] == b[1], f"cell {i} ({a[0]}) differs between the .py twin and the .ipynb"
  assert sum(k == "code" for k, _ in nb) >= 10


def test_notebook_committed_with_outputs_and_no_errors(notebook):
  code = [c for c in notebook["cells"] if c["cell_type"] == "code"]
  counts = [c.get("execution_count") for c in code]
  assert all(isinstance(n, int) for n in counts), "a code cell was never executed"
  assert counts == sorted(counts), "cells were not run top to bottom"
  outputs = [o for c in code for o in c.get("outputs", [])]
  assert not [o for o in outputs if o.get("output_type") == "error"]
  images = [o for o in outputs if "image/png" in o.get("data", {})]
  assert len(images) == len(FIGURES), "every figure is shown inline"
  text = "".join("".join(o.get("text", "")) for o in outputs)
  assert "size=colab" in text, "the committed outputs are from the Colab size"
  assert "recommended: N=" in text, "the planner's recommendation is in the outputs"
  # the committed run exercised the install cell (build_tour.py --fresh_env) and
  # took what the README and the notebook promise ("under 10 minutes")
  assert "pip install " in text and "already installed" not in text
  total_s = float(re.search(r'"total_s": ([0-9.]+)', text).group(1))
  assert total_s < 600, total_s


def test_open_in_colab_badge_points_at_this_notebook(notebook):
  first = "".join(notebook["cells"][0]["source"])
  assert "colab.research.google.com/github/" in first
  assert (
      first.split("colab.research.google.com/github/", 1)[1]
      .split(")")[0]
      .endswith("/blob/main/colab/cbs_jax_tour.ipynb")
  )
  assert not os.path.exists(os.path.join(ROOT, "colab", "cbs_jax_quickstart.ipynb"))


@pytest.mark.slow
def test_tour_runs_at_tiny_size(tmp_path):
  env = dict(
      os.environ,
      CBS_JAX_TOUR_SIZE="tiny",
      CBS_JAX_TOUR_DIR=str(tmp_path / "tour"),
      CBS_JAX_LOCAL_PATH=ROOT,
      MPLBACKEND="Agg",
  )
  load0 = os.getloadavg()[0]
  t0 = time.time()
  out = subprocess.run(
      [sys.executable, PY],
      cwd=str(tmp_path),
      env=env,
      capture_output=True,
      text=True,
      timeout=4 * TINY_LIMIT_S,
  )  # hard stop, even when oversubscribed
  wall = time.time() - t0
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-5000:]
  assert "size=tiny" in out.stdout
  assert "cbs_jax already installed from" in out.stdout  # the local path, nothing installed
  figs = tmp_path / "tour" / "figures"
  for name in FIGURES:
    path = figs / f"{name}.png"
    assert path.exists(), f"{name}.png not written"
    img = matplotlib.image.imread(str(path))
    assert img.shape[0] > 200 and img.shape[1] > 300
  with open(tmp_path / "tour" / "tour_timing.json") as f:
    timing = json.load(f)
  assert timing["size"] == "tiny"
  assert sorted(timing["figures"]) == sorted(f"{n}.png" for n in FIGURES)
  # the pieces really ran: a GRPO run, the measurement and a 9-run sweep
  assert os.path.exists(tmp_path / "tour" / "grpo" / "summary.json")
  with open(tmp_path / "tour" / "sweep" / "results.jsonl") as f:
    assert len([ln for ln in f if ln.strip()]) == 9
  assert "== SFT base (round 0) ==" in out.stdout
  assert ("recommended: N=" in out.stdout) or ("nothing to plan with" in out.stdout)
  # The budget: CPU seconds (all threads) do not depend on what else the machine runs, and
  # bound the wall time on an idle machine. Wall time is asserted too unless the machine was
  # already oversubscribed (other tests, other jobs) when the run started.
  assert timing["cpu_s"] < TINY_LIMIT_S, timing
  if load0 < (os.cpu_count() or 1):
    assert wall < TINY_LIMIT_S, (wall, timing)
