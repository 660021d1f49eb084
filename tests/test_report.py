"""cbs_jax.report: the manifest.json that ties a result folder to the exact code,
config, library versions, machine and command that made it. Each recorded
field is checked against an independent source (git, importlib.metadata,
the library's own __version__, platform, a subprocess's real command line)."""

import csv
import datetime
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from cbs_jax import report
from cbs_jax import rounding
from configs import default

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _read(path):
  with open(path) as f:
    return json.load(f)


def _as_json(config):
  return json.loads(json.dumps(config.to_dict()))


def _git_head():
  try:
    out = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
    )
  except OSError:
    return None
  return out.stdout.strip() if out.returncode == 0 else None


def test_manifest_records_everything(tmp_path):
  config = default.get_config()
  res = report.Results("exp_a", root=str(tmp_path))
  time.sleep(0.2)
  path = res.manifest(
      config=config, command=["experiments/exp_a.py", "--quick"], targets=[0.5, 0.55]
  )
  assert path == os.path.join(str(tmp_path), "exp_a", "manifest.json")
  assert not os.path.exists(path + ".tmp")
  doc = _read(path)
  for key in report.MANIFEST_KEYS:
    assert key in doc, key
  assert doc["experiment"] == "exp_a"
  assert doc["targets"] == [0.5, 0.55]
  # the full config, every field (as JSON has it: tuples become lists)
  assert doc["config"] == _as_json(config)
  assert doc["config"]["optim"]["lr"] == config.optim.lr
  # wall time defaults to the time since Results() was created
  assert 0.2 <= doc["wall_seconds"] < 60
  assert doc["command"] == "python experiments/exp_a.py --quick"
  # versions, against importlib.metadata and the libraries' own version strings
  import flax
  import jax
  import optax

  for pkg in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "numpy"):
    assert doc["versions"][pkg] == importlib.metadata.version(pkg), pkg
  assert doc["versions"]["jax"] == jax.__version__
  assert doc["versions"]["flax"] == flax.__version__
  assert doc["versions"]["optax"] == optax.__version__
  assert doc["python"] == platform.python_version()
  assert doc["platform"] == platform.platform()
  assert doc["backend"] == jax.default_backend()
  assert doc["devices"] == [str(d) for d in jax.devices()]
  head = _git_head()
  if head is None:
    pytest.skip("not a git checkout: commit not checkable")
  assert doc["git_commit"] == head
  dirty = (
      subprocess.run(
          [
              "git",
              "status",
              "--porcelain",
              "--untracked-files=no",
              "--",
              ":(top)",
              ":(top,exclude)experiments/results",
          ],
          cwd=ROOT,
          capture_output=True,
          text=True,
      ).stdout.strip()
      != ""
  )
  assert doc["git_dirty"] is dirty


def test_manifest_explicit_wall_time_and_several_configs(tmp_path):
  res = report.Results("exp_b", root=str(tmp_path))
  configs = {"clip0.2": default.get_config(), "smoke": default.get_config("smoke")}
  doc = _read(res.manifest(config=configs, wall_seconds=12.5, command="python x.py"))
  assert doc["wall_seconds"] == 12.5
  assert doc["command"] == "python x.py"
  assert doc["config"] == {k: _as_json(v) for k, v in configs.items()}
  with pytest.raises(ValueError, match="git_commit"):
    res.manifest(git_commit="made up")


def test_manifest_writes_paths_inside_the_working_directory_relative(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  c = default.get_config()
  c.sft.base_dir = str(tmp_path / "runs" / "on" / "sft_base")  # what a study passes its runs
  doc = _read(
      report.Results("exp_c", root="res").manifest(
          config={"run": c, "outside": "/elsewhere/run"}, command="python x.py"
      )
  )
  assert doc["config"]["run"]["sft"]["base_dir"] == os.path.join("runs", "on", "sft_base")
  assert doc["config"]["outside"] == "/elsewhere/run"  # outside the directory: kept as given


@pytest.mark.parametrize("as_module", [False, True])
def test_default_command_is_the_real_command_line(tmp_path, as_module):
  """The command recorded without being told is the one that started the process."""
  (tmp_path / "expmod.py").write_text(textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {ROOT!r})
      from cbs_jax import report
      report.Results("exp_c", root={str(tmp_path)!r}).manifest(config={{"a": 1}})
      """))
  argv = ["-m", "expmod"] if as_module else ["expmod.py"]
  out = subprocess.run(
      [sys.executable, *argv, "--label", "two words"],
      cwd=str(tmp_path),
      capture_output=True,
      text=True,
      timeout=120,
  )
  assert out.returncode == 0, out.stderr
  doc = _read(tmp_path / "exp_c" / "manifest.json")
  want = ("python -m expmod" if as_module else "python expmod.py") + " --label 'two words'"
  assert doc["command"] == want
  assert doc["config"] == {"a": 1}


def test_table_and_figure(tmp_path):
  res = report.Results("exp_d", root=str(tmp_path))
  rows = [dict(N=64, S=120.0, curve=[1, 2]), dict(N=256, S=None, curve=[3])]
  md = res.table(rows, ["N", "S"], title="t", echo=False)
  assert md.splitlines()[2:] == ["| N | S |", "|---|---|", "| 64 | 120 |", "| 256 | – |"]
  with open(res.path(".csv")) as f:
    got = list(csv.DictReader(f))
  assert got[0] == {"N": "64", "S": "120.0", "curve": "[1, 2]"}
  from cbs_jax import plots

  fig = plots.learning_curves([dict(label="x", rollouts=[0, 1], steps=[0, 1], value=[0, 1])])
  path = res.figure(fig)
  with open(path, "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_missing_manifests(tmp_path):
  for name in ("with", "without"):
    os.makedirs(tmp_path / name)
  report.Results("with", root=str(tmp_path)).manifest()
  (tmp_path / "loose_file.md").write_text("x")
  assert report.missing_manifests(str(tmp_path)) == ["without"]
  assert report.missing_manifests(str(tmp_path / "absent")) == []
  with pytest.raises(ValueError):
    report.Results("a/b", root=str(tmp_path))


def test_every_committed_result_folder_has_a_manifest():
  """Each committed experiments/results/<name>/ holds a committed manifest.json
  naming its provenance (folders of experiments still running are not committed)."""
  out = subprocess.run(
      ["git", "ls-files", "experiments/results"],
      cwd=ROOT,
      capture_output=True,
      text=True,
      timeout=30,
  )
  if out.returncode != 0:
    pytest.skip("not a git checkout")
  tracked = out.stdout.split()
  folders = sorted({p.split("/")[2] for p in tracked if p.count("/") >= 3})
  missing = [d for d in folders if f"experiments/results/{d}/{report.MANIFEST}" not in tracked]
  assert not missing, f"result folders without a committed manifest.json: {missing}"
  for d in folders:
    doc = _read(os.path.join(ROOT, "experiments", "results", d, report.MANIFEST))
    absent = [k for k in report.MANIFEST_KEYS if k not in doc]
    assert not absent, f"{d}/manifest.json lacks {absent}"
    assert doc["command"] and doc["git_commit"] and doc["config"] is not None, d
    assert ROOT not in json.dumps(doc), f"{d}/manifest.json names this machine's {ROOT}"


def test_provenance_rows_read_each_manifest(tmp_path):
  """Rows come from the manifests themselves: commit cut to 7, the dirty flag
  spelled out, folders without a manifest skipped."""
  for name, dirty in (("b_study", True), ("a_study", False), ("c_unknown", None)):
    os.makedirs(tmp_path / name)
    doc = dict(
        git_commit="0123456789abcdef", git_dirty=dirty, wall_seconds=61.4, command="python x.py"
    )
    (tmp_path / name / report.MANIFEST).write_text(json.dumps(doc))
  os.makedirs(tmp_path / "no_manifest")
  led = dict(invocations=[dict(wall_seconds=100.0, ran=2)], wall_seconds=100.0)
  doc = json.loads((tmp_path / "b_study" / report.MANIFEST).read_text())
  (tmp_path / "b_study" / report.MANIFEST).write_text(json.dumps(dict(doc, ledger=led)))
  rows = report.provenance_rows(str(tmp_path))
  assert [r["folder"] for r in rows] == ["a_study", "b_study", "c_unknown"]
  assert [r["tree"] for r in rows] == ["clean", "dirty", "unknown"]
  assert {r["commit"] for r in rows} == {"0123456"}
  assert [r["sweep_s"] for r in rows] == [None, 100.0, None]
  table = report.provenance_table(str(tmp_path))
  assert "| a_study | 0123456 | clean | 61 | – | `python x.py` |" in table
  assert "| b_study | 0123456 | dirty | 61 | 100 | `python x.py` |" in table


def test_experiments_readme_provenance_table_matches_the_manifests():
  """The table in experiments/README.md is what ``python -m cbs_jax.report``
  prints from the committed manifests, so it cannot go stale."""
  with open(os.path.join(ROOT, "experiments", "README.md")) as f:
    text = f.read()
  m = re.search(r"<!-- provenance:begin -->\n(.*?)\n<!-- provenance:end -->", text, re.S)
  assert m, "experiments/README.md has no provenance table"
  want = report.provenance_table(os.path.join(ROOT, "experiments", "results"))
  assert m.group(1) == want, "regenerate it: python -m cbs_jax.report"


def test_citation_cff():
  """CITATION.cff parses, names the software at setup.py's version, and marks
  every author it does not know as a placeholder instead of inventing one."""
  yaml = pytest.importorskip("yaml")
  with open(os.path.join(ROOT, "CITATION.cff")) as f:
    cff = yaml.safe_load(f)
  for key in ("cff-version", "message", "title", "authors", "abstract", "references"):
    assert cff.get(key), key
  assert cff["type"] == "software" and "cbs_jax" in cff["title"]
  with open(os.path.join(ROOT, "setup.py")) as f:
    assert f'version="{cff["version"]}"' in f.read()
  studies = {
      n: [r for r in cff["references"] if r.get("notes", "").startswith(f"Study {n},")]
      for n in (1, 2)
  }
  assert all(len(v) == 1 for v in studies.values()), studies
  (one,), (two,) = studies[1], studies[2]
  # study 1 as found (title, venue, address); what is not known is flagged, never made up
  assert one["title"] == "Critical Batch Size for LLM Policy Optimization"
  assert one["url"].startswith("https://openreview.net/forum?id=")
  assert "PLACEHOLDER" in two["title"]
  for ref in (one, two):
    assert all("PLACEHOLDER" in a.get("name", "") for a in ref["authors"])
  for ref in cff["references"]:
    assert ref["type"] and ref["authors"], ref["title"]


def _plain_yaml(x):
  """YAML scalars as the CFF schema sees them (dates as ISO strings)."""
  if isinstance(x, dict):
    return {k: _plain_yaml(v) for k, v in x.items()}
  if isinstance(x, list):
    return [_plain_yaml(v) for v in x]
  if isinstance(x, (datetime.date, datetime.datetime)):
    return x.isoformat()
  return x


def test_citation_cff_validates_against_the_cff_schema():
  """CITATION.cff against the Citation File Format 1.2.0 JSON schema
  (tests/data/citation_file_format_1.2.0.schema.json, the schema's own
  file: https://citation-file-format.github.io/1.2.0/schema.json, as
  ``cffconvert --validate`` uses it), and a file that breaks it is caught."""
  yaml = pytest.importorskip("yaml")
  jsonschema = pytest.importorskip("jsonschema")
  schema = _read(os.path.join(ROOT, "tests", "data", "citation_file_format_1.2.0.schema.json"))
  with open(os.path.join(ROOT, "CITATION.cff")) as f:
    cff = _plain_yaml(yaml.safe_load(f))
  validator = jsonschema.Draft7Validator(schema, format_checker=jsonschema.FormatChecker())
  errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(cff)]
  assert not errors, errors
  broken = dict(cff, authors=[{"nickname": 3}], **{"cff-version": "1.2"})
  assert len(list(validator.iter_errors(broken))) >= 2


def test_one_repository_url_everywhere():
  """The Colab badge (README and notebook), the notebook's install source
  and CITATION.cff's repository-code name the same repository."""
  yaml = pytest.importorskip("yaml")
  with open(os.path.join(ROOT, "CITATION.cff")) as f:
    url = yaml.safe_load(f)["repository-code"].rstrip("/")
  slug = url.removeprefix("https://github.com/")
  badge = f"https://colab.research.google.com/github/{slug}/blob/main/colab/cbs_jax_tour.ipynb"
  for path in ("README.md", "colab/cbs_jax_tour.ipynb", "colab/cbs_jax_tour.py"):
    with open(os.path.join(ROOT, path)) as f:
      text = f.read()
    assert badge in text, path
  with open(os.path.join(ROOT, "colab", "cbs_jax_tour.py")) as f:
    assert f'REPO_URL = "{url}"' in f.read()
  with open(os.path.join(ROOT, "README.md")) as f:
    clones = re.findall(r"git clone (\S+)", f.read())
  assert clones and all(c.removesuffix(".git") == url for c in clones), clones


def test_interval_cells_are_numeric_columns_in_the_csv_and_text_in_the_markdown(tmp_path):
  from cbs_jax import stats  # pylint: disable=import-outside-toplevel

  out = report.Results("demo", root=str(tmp_path))
  rows = [
      dict(N=64, E=stats.Estimate(1.4e4, 1.16e4, 1.62e4), ratio=stats.Estimate(5.38, se=0.28)),
      dict(N=128, E=stats.Estimate(1.56e4, 1.38e4, 1.73e4), ratio=None),
  ]
  md = out.table(rows, ["N", "E", "ratio"], echo=False)
  assert "| 64 | 1.4e+04 [1.16e+04, 1.62e+04] | 5.38 ± 0.28 |" in md
  assert "| 128 | 1.56e+04 [1.38e+04, 1.73e+04] | – |" in md
  with open(out.path(".csv")) as f:
    got = list(csv.DictReader(f))
  assert list(got[0]) == ["N", "E", "E_lo", "E_hi", "ratio", "ratio_se"]
  assert [float(got[0][k]) for k in ("E", "E_lo", "E_hi", "ratio", "ratio_se")] == [
      1.4e4,
      1.16e4,
      1.62e4,
      5.38,
      0.28,
  ]
  assert got[1]["ratio"] == "" and float(got[1]["E_hi"]) == 1.73e4


def test_git_dirty_ignores_the_committed_results_a_study_rewrites(tmp_path):
  if shutil.which("git") is None:
    pytest.skip("no git")
  git = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)
  git("init", "-q")
  (tmp_path / "experiments" / "results" / "x").mkdir(parents=True)
  (tmp_path / "code.py").write_text("a = 1\n")
  (tmp_path / "experiments" / "results" / "x" / "x.md").write_text("old\n")
  git("add", ".")
  git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "init")
  assert report.git_dirty(str(tmp_path)) is False
  (tmp_path / "experiments" / "results" / "x" / "x.md").write_text("new\n")
  (tmp_path / "untracked.py").write_text("b = 2\n")
  assert report.git_dirty(str(tmp_path / "experiments")) is False  # from a subfolder too
  (tmp_path / "code.py").write_text("a = 2\n")
  assert report.git_dirty(str(tmp_path)) is True
  assert report.git_dirty(str(tmp_path.parent / "nowhere")) is None


def test_rows_written_then_read_back_are_the_same_numbers(tmp_path):
  """The per-run curves a figure is redrawn from: floats to ``rounding.stable``'s
  10 significant digits (then exact on a second round trip), integers as
  ints, text as text, a missing cell as None."""
  out = report.Results("demo", root=str(tmp_path))
  rows = [
      dict(run="a__seed=0", round=0, value=0.1 + 0.2, rollouts=1024),
      dict(run="a__seed=0", round=5, value=1 / 3, rollouts=6144, extra=-2.5e-07),
      dict(run="b", round=10, value=float("nan"), rollouts=0),
  ]
  back = report.read_rows(out.rows(rows, "_curves.csv"))
  assert [r["run"] for r in back] == ["a__seed=0", "a__seed=0", "b"]
  assert back[0]["value"] == 0.3 and back[1]["value"] == 0.3333333333
  again = report.read_rows(out.rows(back, "_again.csv"))
  assert [r["value"] for r in again[:2]] == [0.3, 0.3333333333]  # a fixed point
  assert back[1]["extra"] == -2.5e-07 and back[0]["extra"] is None
  assert back[1]["round"] == 5 and isinstance(back[1]["round"], int)
  assert math.isnan(back[2]["value"])


def test_ledger_sums_a_root_and_its_sub_sweeps(tmp_path):
  root = tmp_path / "runs"
  rec = lambda t, s, n: dict(started_utc=t, wall_seconds=s, ran=n, git_commit="c1", git_dirty=False)
  os.makedirs(root / "off4" / "some_run")
  report.record_invocation(str(root), rec("2026-01-02", 30.0, 2))
  report.record_invocation(str(root / "off4"), rec("2026-01-01", 12.5, 1))
  report.record_invocation(str(root), rec("2026-01-03", 0.5, 1))
  led = report.ledger(str(root))
  assert [(r["sweep"], r["wall_seconds"]) for r in led["invocations"]] == [
      ("off4", 12.5),
      (".", 30.0),
      (".", 0.5),
  ]
  assert led["wall_seconds"] == 43.0 and led["runs"] == 4
  assert led["commits"] == ["c1"] and led["any_dirty"] is False
  assert report.ledger(str(tmp_path / "absent"))["invocations"] == []


def test_ledger_takes_in_the_roots_a_study_read_runs_from(tmp_path):
  own, on = str(tmp_path / "shape"), str(tmp_path / "on")
  rec = lambda t, s, c: dict(started_utc=t, wall_seconds=s, ran=1, git_commit=c, git_dirty=False)
  os.makedirs(os.path.join(on, "lr_x2"))
  os.makedirs(own)
  report.record_invocation(own, rec("2026-01-03", 10.0, "c2"))
  report.record_invocation(on, rec("2026-01-01", 100.0, "c1"))
  report.record_invocation(os.path.join(on, "lr_x2"), rec("2026-01-02", 1.0, "c1"))
  led = report.ledger(own, on, own)  # its own root named twice counts once
  assert [(r["sweep"], r["wall_seconds"]) for r in led["invocations"]] == [
      (on, 100.0),
      (os.path.join(on, "lr_x2"), 1.0),
      (".", 10.0),
  ]
  assert led["wall_seconds"] == 111.0 and led["runs"] == 3 and led["commits"] == ["c1", "c2"]
  out = report.Results("study", str(tmp_path / "results"))
  doc = json.loads(open(out.manifest(runs_root=[own, on], wall_seconds=1.0)).read())
  assert doc["ledger"] == led and doc["ledger"] == report.ledger(own, on)


def test_stable_rounds_floats_to_ten_digits_and_leaves_the_rest():
  a, b = 0.8386675062352639, 0.8386675062352589  # one fit on two processors
  assert rounding.stable(a) == rounding.stable(b) == 0.8386675062
  doc = dict(x=[np.float64(1.23456789012345e-7), (2.5, 3)], n=7, ok=True, s="1.0", bad=math.nan)
  got = rounding.stable(doc)
  assert got["x"] == [1.234567890e-7, (2.5, 3)] and got["n"] == 7 and got["ok"] is True
  assert got["s"] == "1.0" and math.isnan(got["bad"]) and rounding.stable(math.inf) == math.inf
  assert isinstance(got["x"][0], float)
