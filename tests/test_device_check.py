"""``experiments/device_check.py``, the one command an accelerator session
runs: its driver isolates steps (a failing or overrunning step is recorded
and the next one runs), shares one time budget, and reads RESULT lines and
the trainer's metrics; its trainer command builds a valid 25M config. The
benchmarks it calls have their own ``--quick`` tests."""

import json
import sys

import pytest

from cbs_jax import model
from configs import default as default_cfg
from tests import experiment_scripts

dc = experiment_scripts.load("device_check")


def _py(code: str) -> list[str]:
  return [sys.executable, "-c", code]


def test_a_failing_or_overrunning_step_is_recorded_and_the_next_runs(tmp_path, monkeypatch, capsys):
  plan = [
      ("good", _py("print('log line'); print('RESULT speed=2.5 kind=fast')"), 1.0),
      ("broken", _py("import sys; print('RESULT x=1'); sys.exit(3)"), 1.0),
      ("slow", _py("import time; time.sleep(60)"), 1.0),
      ("after", _py("print('RESULT y=7')"), 1.0),
  ]
  monkeypatch.setattr(dc, "steps", lambda out, quick: plan)
  assert dc.main([f"--out={tmp_path}", "--budget_s=8"]) == 0
  rep = json.loads((tmp_path / "device_check.json").read_text())
  st = rep["steps"]
  assert st["good"]["status"] == "ok" and st["good"]["result"] == {"speed": 2.5, "kind": "fast"}
  assert st["broken"]["status"] == "failed (exit 3)" and "RESULT x=1" in st["broken"]["log_tail"]
  assert st["slow"]["status"] == "timeout"
  # the slow step got its own quarter plus what the quick steps left unused,
  # and no more than leaves the last step its share
  assert 2 <= st["slow"]["seconds"] <= 8 - 2 + 1
  assert st["after"]["status"] == "ok" and st["after"]["result"] == {"y": 7.0}
  assert (tmp_path / "good.log").read_text().startswith("log line")
  out = capsys.readouterr().out.splitlines()
  assert "RESULT device_check_good speed=2.5 kind=fast" in out
  assert out[-1].startswith("RESULT device_check device=") and out[-1].endswith("ok=2/4")


def test_steps_past_the_budget_are_skipped_not_run(tmp_path, monkeypatch):
  plan = [("first", _py("import time; time.sleep(60)"), 1.0), ("second", _py("print(1)"), 0.01)]
  monkeypatch.setattr(dc, "steps", lambda out, quick: plan)
  dc.main([f"--out={tmp_path}", "--budget_s=3"])
  st = json.loads((tmp_path / "device_check.json").read_text())["steps"]
  assert st["first"]["status"] == "timeout"
  assert st["second"]["status"].startswith("skipped")


def test_bad_arguments_name_the_field(tmp_path, capsys):
  with pytest.raises(SystemExit):
    dc.main([f"--out={tmp_path}", "--only=nosuch"])
  assert "--only: unknown steps ['nosuch']" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    dc.main([f"--out={tmp_path}", "--budget_s=0"])
  assert "--budget_s must be positive" in capsys.readouterr().err


def test_the_full_plan_runs_every_step_and_its_trainer_config_is_the_25m_shape():
  plan = dc.steps("/tmp/x", quick=False)
  names = [s[0] for s in plan]
  assert names[0] == "grpo_25m" and len(set(names)) == len(names) == 10
  cmd = dict((s[0], s[1]) for s in plan)["grpo_25m"]
  c = default_cfg.get_config()
  for arg in cmd:
    if arg.startswith("--config."):
      key, _, value = arg[len("--config.") :].partition("=")
      section, field = key.split(".")
      old = c[section][field]
      c[section][field] = type(old)(value)
  want = model.PRESETS["25m"]
  assert {k: c.model[k] for k in dc.PRESET_FLAGS} == {k: want[k] for k in dc.PRESET_FLAGS}
  model.validate_config(c.model)
  assert c.train.num_rounds == 20 and c.model.dtype == "bfloat16"


def test_grpo_summary_reads_round_seconds_from_metrics(tmp_path):
  rows = [{"round": 0, "eval_expected_pass": 0.1}]
  rows += [
      {"round": r, "gen_seconds": g, "update_seconds": 1.0, "batch_size": 256, "tokens_per_s": 10.0}
      for r, g in [(1, 50.0), (2, 1.0), (3, 3.0), (4, 2.0)]
  ]
  (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
  s = dc.grpo_summary(str(tmp_path))
  assert s["rounds_logged"] == 3 and s["round_seconds"] == 3.0  # round 1 (compiles) left out
  assert s["rollouts_per_s"] == pytest.approx(256 / 3.0)


def test_preset_shapes_match_their_published_parameter_counts():
  from cbs_jax import systems  # pylint: disable=import-outside-toplevel

  count = lambda name: systems.ModelDims.from_config(model.preset_config(name)).param_count
  assert count("qwen2.5-0.5b") == 494_032_768  # Qwen2.5-0.5B's reported size
  assert count("25m") == 25_240_064
  p = model.param_count(model.build(model.preset_config("1m"))[1])
  assert p == count("1m")
  kept = model.preset_config("25m", model.default_config().copy_and_resolve_references(), True)
  assert kept.vocab_size == model.default_config().vocab_size and kept.d_model == 512
  with pytest.raises(ValueError, match="unknown model preset 'big'"):
    model.preset_config("big")


def _install_requires() -> list[str]:
  """setup.py's install_requires, read from its source (the package need
  not be installed), as bare distribution names."""
  import ast  # pylint: disable=import-outside-toplevel
  import os  # pylint: disable=import-outside-toplevel
  import re  # pylint: disable=import-outside-toplevel

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  with open(os.path.join(root, "setup.py"), encoding="utf-8") as f:
    tree = ast.parse(f.read())
  (call,) = [
      n for n in ast.walk(tree) if isinstance(n, ast.keyword) and n.arg == "install_requires"
  ]
  return [re.split(r"[\[<>=!~; ]", ast.literal_eval(e))[0] for e in call.value.elts]


def test_the_requirements_checked_are_setup_pys_and_each_imports_here():
  assert sorted(dc.REQUIREMENTS) == sorted(_install_requires())
  missing, versions = dc.check_requirements()
  assert missing == [] and set(versions) == set(dc.REQUIREMENTS)
  import jax  # pylint: disable=import-outside-toplevel

  assert versions["jax"] == jax.__version__


def test_a_missing_requirement_is_named_before_any_step_runs(tmp_path, monkeypatch, capsys):
  reqs = dict(dc.REQUIREMENTS, **{"no-such-dist": "no_such_module_xyz", "sub-dist": "json.nope"})
  assert dc.check_requirements(reqs)[0] == ["no-such-dist", "sub-dist"]
  monkeypatch.setattr(dc, "REQUIREMENTS", reqs)
  ran = []
  monkeypatch.setattr(dc, "run_step", lambda *a: ran.append(a) or {})
  assert dc.main([f"--out={tmp_path}"]) == 2
  err = capsys.readouterr().err
  assert "missing requirements: no-such-dist (import no_such_module_xyz), sub-dist" in err
  assert "pip download --no-deps no-such-dist sub-dist" in err
  assert ran == [] and not (tmp_path / "device_check.json").exists()
