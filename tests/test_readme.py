"""README.md's commands work: the first hour of a new user.

Every command in README.md's code blocks (4-space indented or ``` fenced) is
read: each ``python -m cbs_jax.X`` / ``python experiments/X.py`` / ``python
colab/X.py`` names an entry point that exists and every flag it passes is
one that entry point parses (absl flags and ``--config.x.y=`` overrides
through the real parser, argparse scripts through their own parser); every
``pip install`` names extras that setup.py defines. The slow test then runs
the quickstart in order in a fresh directory at smoke size: the main command
(``configs/default.py:smoke``), then the planner on its workdir.
"""

import importlib.util
import os
import re
import runpy
import shlex
import subprocess
import sys

import pytest
import setuptools

from cbs_jax import config as config_lib
from tests import entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.md")
_SEPARATORS = ("&&", "||", ";", "|")
_PIP_TARGET = re.compile(r"^\.(?:\[([A-Za-z0-9_,\-]*)\])?$")


def code_blocks(text: str) -> list[str]:
  """The text of each ``` fenced or 4-space indented code block of a
  markdown document (an indented block starts after a blank line; inside a
  list item its lines are indented further, as in README.md)."""
  blocks, current, fenced, indented, prev_blank = [], [], False, False, True
  for line in text.splitlines():
    if line.lstrip().startswith("```"):
      if fenced:
        blocks.append("\n".join(current))
        current = []
      fenced = not fenced
      continue
    if fenced:
      current.append(line)
    elif line.startswith("    ") and (indented or prev_blank):
      indented = True
      current.append(line)
    elif indented and not line.strip():
      current.append(line)
    elif indented:
      blocks.append("\n".join(current))
      current, indented = [], False
    prev_blank = not line.strip()
  if current:
    blocks.append("\n".join(current))
  return blocks


def _split(line: str) -> list[list[str]]:
  """Shell segments (token lists) of one logical command line; a quoted
  argument holding a command (``--command="cd x && python ..."``) is split too."""
  tokens = []
  for token in shlex.split(line, comments=True):
    inner = token.split("=", 1)[1] if token.startswith("-") and "=" in token else token
    if " " in inner and re.search(r"\b(python3?|pip3?)\b", inner):
      tokens += [";", *[t for seg in _split(inner) for t in [*seg, ";"]]]
    else:
      tokens.append(token)
  segments, current = [], []
  for token in tokens:
    if token in _SEPARATORS:
      segments.append(current)
      current = []
    else:
      current.append(token)
  segments.append(current)
  return [s for s in segments if s]


def readme_commands(text: str) -> list[dict]:
  """The python and pip commands of the README's code blocks, in order:
  dicts with ``kind`` (module | script | pip), ``target`` (module name, script
  path or pip targets), ``args`` and ``line`` (the logical line they came from)."""
  out = []
  for block in code_blocks(text):
    for line in block.replace("\\\n", " ").splitlines():
      if not re.search(r"\b(python3?|pip3?)\b", line):
        continue  # not a command (the layout block, output)
      for seg in _split(line.strip()):
        while seg and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", seg[0]):
          seg = seg[1:]  # environment assignments (XLA_FLAGS=...)
        if len(seg) >= 2 and seg[0] in ("python", "python3"):
          if seg[1] == "-m" and len(seg) >= 3:
            if seg[2] == "pip":
              out.append(dict(kind="pip", target=seg[3:], args=seg[3:], line=line))
            else:
              out.append(dict(kind="module", target=seg[2], args=seg[3:], line=line))
          elif seg[1].endswith(".py"):
            out.append(dict(kind="script", target=seg[1], args=seg[2:], line=line))
        elif seg and seg[0] in ("pip", "pip3"):
          out.append(dict(kind="pip", target=seg[1:], args=seg[1:], line=line))
  return out


def inline_commands(text: str) -> list[dict]:
  """The ``python ...`` commands of the README's inline code spans (prose and
  tables, e.g. the benchmarks), outside its code blocks; marked inline."""
  for block in code_blocks(text):
    text = text.replace(block, "")
  spans = re.findall(r"`(python3? [^`]+)`", text)
  return [
      dict(c, inline=True) for c in readme_commands("\n\n".join("    " + s for s in spans) + "\n")
  ]


def _readme():
  with open(README) as f:
    return f.read()


COMMANDS = readme_commands(_readme()) + inline_commands(_readme())
OURS = [
    c
    for c in COMMANDS
    if (c["kind"] == "module" and c["target"].startswith("cbs_jax."))
    or (c["kind"] == "script" and c["target"].split("/")[0] in ("experiments", "colab"))
]


def _id(c):
  return f"{c['target']} {' '.join(c['args'])}"[:80]


def setup_extras() -> dict:
  """setup.py's ``extras_require`` (setup.py run with setuptools.setup captured)."""
  captured = {}
  saved = setuptools.setup
  setuptools.setup = lambda **kwargs: captured.update(kwargs)
  try:
    runpy.run_path(os.path.join(ROOT, "setup.py"), run_name="__main__")
  finally:
    setuptools.setup = saved
  return captured.get("extras_require", {})


# ------------------------------------------------------------ the parsing


def test_readme_reader_finds_indented_fenced_and_nested_commands():
  text = (
      "intro\n\n    pip install -e . && python -m cbs_jax.main --a=1 \\\n"
      '        --b=2\n\nprose\n* item\n\n      gcloud x --command="cd y && \\\n'
      '          python3 -m cbs_jax.plan --c=3"\n\n```bash\nX=1 python experiments/e.py'
      " --d\n```\n    not code: no blank line before\n"
  )
  got = [(c["kind"], c["target"], c["args"]) for c in readme_commands(text)]
  assert got == [
      ("pip", ["install", "-e", "."], ["install", "-e", "."]),
      ("module", "cbs_jax.main", ["--a=1", "--b=2"]),
      ("module", "cbs_jax.plan", ["--c=3"]),
      ("script", "experiments/e.py", ["--d"]),
  ]


def test_readme_has_the_first_hour_commands():
  targets = [c["target"] for c in COMMANDS if c["kind"] != "pip"]
  for want in ("cbs_jax.main", "cbs_jax.plan", "cbs_jax.measure"):
    assert want in targets, f"README.md's code blocks have no python -m {want}"
  assert any(c["kind"] == "pip" for c in COMMANDS)


@pytest.mark.parametrize("command", OURS, ids=_id)
def test_readme_command_names_an_entry_point_and_its_flags(command, monkeypatch):
  monkeypatch.chdir(ROOT)  # config files are named relative to the repository root
  kind, target, args = command["kind"], command["target"], command["args"]
  where = f"README.md: {command['line']!r}"
  if kind == "module":
    assert importlib.util.find_spec(target) is not None, f"{where}: no module {target}"
    try:
      entry_points.absl_parse(monkeypatch, target, args)
    except Exception as e:  # absl / ml_collections name the flag or field
      pytest.fail(f"{where}: python -m {target} does not parse {args}: " f"{type(e).__name__}: {e}")
    return
  path = os.path.join(ROOT, target)
  assert os.path.isfile(path), f"{where}: no script {target}"
  if not args:
    return
  parser = entry_points.argparse_parser(monkeypatch, path)
  assert parser is not None, f"{where}: {target} takes no flags, the README passes {args}"
  try:
    parser.parse_args(args)
  except SystemExit:
    pytest.fail(f"{where}: {target}'s argparse parser rejects {args} (its message above)")


@pytest.mark.parametrize(
    "args",
    [
        ["--config=configs/default.py", "--workdir=w", "--bogus=1"],
        ["--config=configs/default.py", "--workdir=w", "--config.rl.no_such_field=1"],
        ["--config=configs/default.py", "--workdir=w", "--config.batch.num_prompts=many"],
        ["--config=configs/default.py"],
    ],
)
def test_the_flag_check_rejects_what_the_entry_point_rejects(args, monkeypatch):
  monkeypatch.chdir(ROOT)
  with pytest.raises(Exception):
    entry_points.absl_parse(monkeypatch, "cbs_jax.main", args)
  got = entry_points.absl_parse(
      monkeypatch,
      "cbs_jax.main",  # nothing was left over
      ["--config=configs/default.py", "--workdir=w"],
  )
  assert got["workdir"] == "w" and got["config"].batch.num_prompts == 16


def test_the_flag_check_reads_a_scripts_argparse_parser(monkeypatch):
  path = os.path.join(ROOT, "experiments", "bench_noise.py")
  parser = entry_points.argparse_parser(monkeypatch, path)
  assert parser.parse_args(["--repeats=3"]).repeats == 3
  with pytest.raises(SystemExit):
    parser.parse_args(["--no_such_flag"])


def _shipped_configs() -> dict:
  """base_config and every configs/*.py whose get_config() takes no argument."""
  out = {"base_config": config_lib.base_config()}
  for name in sorted(os.listdir(os.path.join(ROOT, "configs"))):
    if name.endswith(".py") and not name.startswith("_"):
      module = importlib.import_module(f"configs.{name[:-3]}")
      try:
        out[name] = module.get_config()
      except (TypeError, ValueError):  # needs a variant argument
        pass
  return out


def test_every_config_override_the_readme_names_is_a_config_field():
  """Also the ones in prose (``--config.batch.schedule=adaptive``): each names
  a field of a shipped config (task kwargs differ between tasks)."""
  configs = _shipped_configs()
  names = sorted(set(re.findall(r"--config\.([A-Za-z0-9_.]*[A-Za-z0-9_])", _readme())))
  assert "hf_checkpoint" in names and "distributed.enabled" in names
  for dotted in names:
    owners = []
    for name, config in configs.items():
      try:
        config_lib.get_path(config, dotted)
        owners.append(name)
      except ValueError:
        pass
    assert owners, f"README.md names --config.{dotted}, a field of no config in configs/"


def test_readme_pip_installs_name_extras_of_setup_py():
  extras = setup_extras()
  assert {"hf", "test", "parity", "tpu", "cuda"} <= set(extras)
  pips = [c for c in COMMANDS if c["kind"] == "pip" and "install" in c["args"]]
  assert pips, "README.md installs nothing"
  for c in pips:
    targets = [t for t in c["args"] if _PIP_TARGET.match(t)]
    assert targets, f"README.md: {c['line']!r} installs no '.' / '.[extras]'"
    for t in targets:
      named = [e for e in (_PIP_TARGET.match(t).group(1) or "").split(",") if e]
      unknown = sorted(set(named) - set(extras))
      assert not unknown, (
          f"README.md: {c['line']!r}: extras {unknown} are not in "
          f"setup.py's extras_require {sorted(extras)}"
      )


def test_gpu_and_tpu_extras_pin_the_accelerator_wheels():
  extras = setup_extras()
  assert any(r.startswith("jax[cuda12]") for r in extras["cuda"]), extras["cuda"]
  assert any(r.startswith("jax[tpu]") for r in extras["tpu"]), extras["tpu"]


# ------------------------------------------------------------ the running


def _first(module: str) -> dict:
  found = [
      c for c in COMMANDS if c["kind"] == "module" and c["target"] == module and not c.get("inline")
  ]
  assert found, f"README.md's code blocks have no python -m {module}"
  return found[0]


def _run(args: list[str], cwd: str) -> subprocess.CompletedProcess:
  env = dict(
      os.environ,
      PYTHONPATH=os.pathsep.join(
          [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
      ),
  )
  return subprocess.run(
      [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
  )


@pytest.mark.slow  # ~1.5 min on a loaded 2-core CPU
def test_quickstart_then_plan_run_in_order_at_smoke_size(tmp_path):
  """The README's main command (smoke config), then its plan command on that
  workdir, each run as written in a fresh directory holding only configs/."""
  os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
  main_cmd, plan_cmd = _first("cbs_jax.main"), _first("cbs_jax.plan")
  main_args = [
      a.replace("configs/default.py", "configs/default.py:smoke")
      if a.startswith("--config=")
      else a
      for a in main_cmd["args"]
  ]
  assert "--config=configs/default.py:smoke" in main_args, main_cmd["line"]
  r = _run(["-m", "cbs_jax.main", *main_args], str(tmp_path))
  assert r.returncode == 0, r.stderr[-3000:]
  workdir = [a.split("=", 1)[1] for a in main_args if a.startswith("--workdir=")][0]
  assert {"config.json", "provenance.json", "summary.json"} <= set(os.listdir(tmp_path / workdir))

  run_dir = [a.split("=", 1)[1] for a in plan_cmd["args"] if a.startswith("--run_dir=")]
  assert run_dir == [workdir], (plan_cmd["line"], main_cmd["line"])
  r = _run(["-m", "cbs_jax.plan", *plan_cmd["args"]], str(tmp_path))
  assert "no model dims" not in r.stderr, r.stderr[-3000:]
  if r.returncode != 0:
    # a smoke run's B_noise is unresolved by design (|G|^2 needs ~25k pooled
    # rollouts; the summary says nan and why): the planner must say exactly
    # that, and plan from the run's config.json once given a B_crit
    assert "no usable noise record" in r.stderr, r.stderr[-3000:]
    r = _run(["-m", "cbs_jax.plan", *plan_cmd["args"], "--b_crit=4096"], str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
  assert "recommended: N=" in r.stdout, r.stdout[-3000:]
