"""The design notes the code cites exist, with the sections it names."""

import os
import re
import subprocess

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tracked(*patterns):
  out = subprocess.run(
      ["git", "ls-files", *patterns], cwd=ROOT, capture_output=True, text=True
  ).stdout.split()
  return [p for p in out if os.path.exists(os.path.join(ROOT, p))]


def test_every_cited_design_note_and_section_exists():
  cited = 0
  for path in _tracked("*.py", "*.md"):
    if path == "tests/test_docs.py":
      continue
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
      text = f.read()
    assert "DESIGN.md" not in text, f"{path} cites DESIGN.md, which is not in the project"
    for m in re.finditer(r"docs/([a-z_]+\.md)(?:, \"([^\"]+)\")?", text):
      note = os.path.join(ROOT, "docs", m.group(1))
      assert os.path.exists(note), f"{path} cites docs/{m.group(1)}, which does not exist"
      cited += 1
      if m.group(2):
        with open(note, encoding="utf-8") as f:
          headings = [l.lstrip("#").strip() for l in f if l.startswith("#")]
        assert m.group(2) in headings, (path, m.group(1), m.group(2), headings)
  assert cited >= 10  # the estimators, the law and the planner cite their notes
