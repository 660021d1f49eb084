"""cbs_jax.main records its run: config.json (what plan and measure read) and
provenance.json (first start, then every restart), by process 0 only."""

import json
import math
import os
import types

import jax
import pytest

from cbs_jax import main as main_lib
from cbs_jax import plan
from cbs_jax import report
from cbs_jax import train
from configs import default
from configs import gsm8k_qwen
from tests import entry_points

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _load(path):
  with open(path) as f:
    return json.load(f)


def _sweep_format(config):
  """The text ``cbs_jax.sweep`` stores as a run's config.json (its recipe)."""
  plain = json.loads(json.dumps(config.to_dict(), sort_keys=True, default=str))
  return json.dumps(plain, indent=2, sort_keys=True)


def test_first_start_writes_the_config_and_its_provenance(tmp_path):
  wd = str(tmp_path / "run")
  config = default.get_config("smoke")
  main_lib.record_start(config, wd, command="python -m cbs_jax.main --x")
  with open(os.path.join(wd, "config.json")) as f:
    assert f.read() == _sweep_format(config)
  assert plan.load_run_config(wd).to_dict() == config.to_dict()
  prov = _load(os.path.join(wd, "provenance.json"))
  for key in ("git_commit", "git_dirty", "versions", "python", "platform", "backend", "devices"):
    assert key in prov, key
  assert set(prov) == {"started_utc", "command", "restarts", *report.provenance()}
  assert prov["command"] == "python -m cbs_jax.main --x" and prov["restarts"] == []
  assert prov["versions"]["jax"] == jax.__version__


def test_a_restart_keeps_the_first_record_and_appends_what_changed(tmp_path):
  wd = str(tmp_path)
  config = default.get_config("smoke")
  main_lib.record_start(config, wd, command="first")
  first = _load(os.path.join(wd, "provenance.json"))
  main_lib.record_start(config, wd, command="second")
  with config.unlocked():
    config.train.num_rounds = 9
    config.rl.clip_eps_high = 10.0
  main_lib.record_start(config, wd, command="third")
  prov = _load(os.path.join(wd, "provenance.json"))
  assert {k: v for k, v in prov.items() if k != "restarts"} == {
      k: v for k, v in first.items() if k != "restarts"
  }
  assert [r["command"] for r in prov["restarts"]] == ["second", "third"]
  assert prov["restarts"][0]["config_changes"] == {}
  assert prov["restarts"][1]["config_changes"] == {
      "rl.clip_eps_high": [0.2, 10.0],
      "train.num_rounds": [4, 9],
  }
  for r in prov["restarts"]:
    assert {"started_utc", "git_commit", "git_dirty", "versions"} <= set(r)
  assert plan.load_run_config(wd).train.num_rounds == 9  # the config it continues under


def test_an_unreadable_provenance_is_an_error_naming_it(tmp_path):
  path = tmp_path / "provenance.json"
  path.write_text("{torn")
  with pytest.raises(ValueError, match="provenance.json is unreadable"):
    main_lib.record_start(default.get_config("smoke"), str(tmp_path))
  assert path.read_text() == "{torn" and not (tmp_path / "config.json").exists()


def test_only_process_0_records_and_an_invalid_config_records_nothing(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(train, "train_and_evaluate", lambda c, w: calls.append(w) or {})
  monkeypatch.setattr(jax, "process_index", lambda: 1)
  main_lib.run(default.get_config("smoke"), str(tmp_path / "p1"))
  assert calls == [str(tmp_path / "p1")] and not (tmp_path / "p1").exists()
  monkeypatch.setattr(jax, "process_index", lambda: 0)
  bad = default.get_config("smoke")
  bad.batch.num_prompts = 0
  with pytest.raises(ValueError, match="batch.num_prompts"):
    main_lib.run(bad, str(tmp_path / "bad"))
  assert not (tmp_path / "bad").exists()


def test_hf_checkpoint_is_a_field_of_every_config(monkeypatch):
  monkeypatch.chdir(ROOT)
  got = entry_points.absl_parse(
      monkeypatch,
      "cbs_jax.main",
      ["--config=configs/default.py", "--workdir=w", "--config.hf_checkpoint=/ckpt/qwen"],
  )
  assert got["config"].hf_checkpoint == "/ckpt/qwen"
  assert default.get_config().hf_checkpoint == ""  # off unless given
  assert gsm8k_qwen.get_config().hf_checkpoint == gsm8k_qwen.CHECKPOINT_DIR


@pytest.mark.slow  # ~1.5 min on a loaded 2-core CPU (two starts, each compiling)
def test_run_records_trains_resumes_and_plan_reads_the_workdir(tmp_path):
  """main's function on a (shrunk) smoke config, resumed for one more round;
  the planner then takes the model dims from the workdir alone."""
  wd = str(tmp_path / "run")
  config = default.get_config("smoke")
  config.sft.steps, config.train.num_rounds, config.train.eval_prompts = 5, 2, 8
  summary = main_lib.run(config, wd, command="start")
  assert summary["rounds"] == 2
  config.train.num_rounds = 3
  summary = main_lib.run(config, wd, command="resume")
  assert summary["rounds"] == 3
  # the pooled noise block carries the one-sided bound the planner falls back on
  nz = summary["noise"]
  assert nz["rounds_pooled"] == 2 and nz["b_noise_floor"] >= 0.0
  assert nz["b_noise_floor"] <= nz["b_noise"] or math.isnan(nz["b_noise"])
  prov = _load(os.path.join(wd, "provenance.json"))
  assert prov["command"] == "start"
  assert [(r["command"], r["config_changes"]) for r in prov["restarts"]] == [
      ("resume", {"train.num_rounds": [2, 3]})
  ]
  flag_values = dict(
      run_dir=wd,
      config=None,
      b_crit=4096.0,
      s_min=None,
      e_min=None,
      accelerator="h100_sxm",
      chips=8,
      parallel="data",
      min_n=16,
      max_n=65536,
      prompt_len=0,
      completion_len=0,
      mfu=1.0,
  )
  res = plan.plan_from_flags(types.SimpleNamespace(**flag_values))
  assert res["best"]["n"] >= 16
