"""The experiment scripts' command lines: argparse ``--help`` for each, and the
cheapest ``--quick`` modes end to end (they must write their promised files)."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = {
    "batch_size_law": ["--prompts", "--rollouts", "--target", "--budget", "--eval_rollouts",
                       "--root", "--out", "--quick"],
    "noise_over_training": ["--workdir", "--prompts", "--rollouts", "--batches", "--out",
                            "--quick"],
    "offpolicy_drift": ["--variants", "--root", "--out", "--rounds", "--quick"],
    "sft_headroom": ["--root", "--out", "--quick"],
}
OUTPUTS = {
    "batch_size_law": ["batch_size_law.json", "batch_size_law.md", "batch_size_law.png"],
    "noise_over_training": ["noise_over_training.json", "noise_over_training.md",
                            "noise_over_training.png"],
    "offpolicy_drift": ["offpolicy_drift.json", "offpolicy_drift.md", "offpolicy_drift.png"],
    "sft_headroom": ["sft_headroom.md"],
}


def _run(script, *args, cwd, timeout):
  return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", f"{script}.py"),
                         *args], cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_lists_flags(script, tmp_path):
  # from another directory: the scripts need no sys.path edits
  p = _run(script, "--help", cwd=tmp_path, timeout=120)
  assert p.returncode == 0, p.stderr
  for flag in FLAGS[script]:
    assert flag in p.stdout, (flag, p.stdout)
  assert not list(tmp_path.iterdir())  # --help writes nothing


@pytest.mark.parametrize("script", ["sft_headroom"])
def test_quick_writes_outputs(script, tmp_path):
  out = tmp_path / "out"
  p = _run(script, "--quick", f"--out={out}", cwd=tmp_path, timeout=300)
  assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]
  for name in OUTPUTS[script]:
    f = out / name
    assert f.is_file() and f.stat().st_size > 0, (name, sorted(os.listdir(out)))
  assert sorted(os.listdir(tmp_path)) == ["out"]  # runs went under --out, not the cwd


def test_bad_flag_is_an_error(tmp_path):
  p = _run("offpolicy_drift", "--variants=nosuch", cwd=tmp_path, timeout=120)
  assert p.returncode == 2 and "unknown variants" in p.stderr
