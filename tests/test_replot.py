"""``--replot``: a study's committed tables, records and figures rebuilt from
its committed files alone (no runs), byte for byte, from a copy of
``experiments/results`` -- so a reader can regenerate what the README shows
and a changed analysis shows up as a diff of committed files. Each script
runs in this process (``experiment_scripts.run``), as its command line."""

import os
import shutil

import pytest

from tests import experiment_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "experiments", "results")

# (script, flags, the results folder it rewrites, other folders it reads[, the
# folder name the script writes, where the committed folder was renamed])
STUDIES = [
    ("drift_noise", [], "drift_noise", []),
    ("drift_noise", ["--design=regime"], "drift_noise_regime", []),
    ("clipping_ablation", [], "clipping_ablation", []),
    (
        "clipping_ablation",
        ["--epochs=4", "--variants=clip0.2,clip10,dualclip"],
        "clipping_ablation_e4",
        [],
    ),
    # the dual clip's own two-seed run, committed beside the three-variant one
    (
        "clipping_ablation",
        ["--epochs=4", "--variants=dualclip", "--seeds=2"],
        "clipping_ablation_e4_dualclip",
        [],
        "clipping_ablation_e4",
    ),
    # the envelope's time-to-target table reads the throughput benchmark's rates
    ("lr_envelope", [], "lr_envelope", ["throughput_decision"]),
    ("lr_envelope", ["--arm=off4"], "lr_envelope_off4", ["lr_envelope"]),
    ("lr_envelope", ["--arm=off8"], "lr_envelope_off8", ["lr_envelope"]),
    ("lr_envelope", ["--arm=warmup5"], "lr_envelope_warmup5", ["lr_envelope"]),
    ("noise_length", [], "noise_length", []),
    ("noise_anatomy", ["--variants=mixed,homog,steps"], "noise_anatomy", []),
    (
        "drift_regime",
        ["--epochs=1,2,4,8", "--lr_scales=1,2,4,16"],
        "drift_regime",
        [],
    ),
    ("adaptive_wallclock", [], "adaptive_wallclock", []),
    # the first design's studies, from their committed curves (study_report.save_records)
    ("batch_law_on_policy", ["--tune"], "batch_law_on_policy", []),
    ("batch_law_off_policy", [], "batch_law_off_policy", []),
    ("lr_scaling", [], "lr_scaling", []),
    ("rollout_shape", [], "rollout_shape", []),
    ("throughput_decision", ["--measure"], "throughput_decision", []),
    # wall clock modelled from the committed throughput benchmark (read from the checkout)
    ("adaptive_batch", [], "adaptive_batch", []),
]


@pytest.mark.slow
@pytest.mark.parametrize("study", STUDIES, ids=[s[2] for s in STUDIES])
def test_replot_rebuilds_the_committed_files_byte_for_byte(study, tmp_path):
  script, flags, committed_as, reads = study[:4]
  folder = study[4] if len(study) > 4 else committed_as
  if not os.path.isdir(os.path.join(RESULTS, committed_as)):
    pytest.fail(f"experiments/results/{committed_as} is not committed")
  out = tmp_path / "results"
  for name in reads:
    shutil.copytree(os.path.join(RESULTS, name), out / name)
  shutil.copytree(os.path.join(RESULTS, committed_as), out / folder)
  before = {f.name: f.stat().st_mtime_ns for f in (out / folder).iterdir()}
  code, stdout, stderr = experiment_scripts.run(
      script, [*flags, "--replot", f"--out={out}", f"--root={tmp_path / 'no_runs'}"], cwd=ROOT
  )
  assert code == 0, stdout[-2000:] + stderr[-4000:]
  assert not (tmp_path / "no_runs").exists()  # nothing was run
  committed = sorted(os.listdir(os.path.join(RESULTS, committed_as)))
  assert sorted(os.listdir(out / folder)) == committed
  for name in committed:  # its tables and figures rewritten; the manifest left the sweep's
    if name.endswith((".md", ".png")) and name.startswith(folder):  # not another script's
      assert (out / folder / name).stat().st_mtime_ns > before[name], f"{name} not rewritten"
    with open(os.path.join(RESULTS, committed_as, name), "rb") as f:
      assert (out / folder / name).read_bytes() == f.read(), name


def test_every_committed_results_folder_is_rebuilt_above():
  """A study added without --replot (or a folder without its test) fails here."""
  folders = {d for d in os.listdir(RESULTS) if os.path.isdir(os.path.join(RESULTS, d))}
  assert folders == {s[2] for s in STUDIES}
