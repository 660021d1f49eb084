"""The tree is formatted with pyink (pyproject.toml: two spaces, 100 columns)."""

import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow  # ~40 s of CPU for the whole tree
@pytest.mark.skipif(
    shutil.which("pyink") is None, reason="pyink is not installed (pip install -e '.[test]')"
)
def test_tree_is_formatted_with_pyink():
  r = subprocess.run(
      ["pyink", "--check", "--quiet", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
  )
  assert r.returncode == 0, "run `pyink .` at the repository root:\n" + r.stderr[-3000:]
