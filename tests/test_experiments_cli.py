"""The experiment scripts' command lines: ``--help`` for each, a bad flag,
and every study's ``--quick`` mode end to end, chained the way the full
studies are: the on-policy sweep first, the others reading its runs back.
Each must write the files its docstring promises, under ``--out`` only.
All in this process (``experiment_scripts.run``: the script loaded as a
module, its ``main(argv)`` run from another directory), as the command line
runs it, without a new interpreter's imports per step."""

import importlib.util
import os
import re

import pytest

from cbs_jax import study_runner
from cbs_jax.controller import SIGNALS
from tests import experiment_scripts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = {
    "batch_law_on_policy": ["--root", "--out", "--workers", "--tune", "--replot", "--quick"],
    "batch_law_off_policy": ["--root", "--on_root", "--out", "--reuse", "--replot", "--quick"],
    "lr_scaling": ["--root", "--on_root", "--out", "--rules", "--replot", "--quick"],
    "rollout_shape": [
        "--root",
        "--on_root",
        "--out",
        "--noise_batches",
        "--replot",
        "--quick",
    ],
    "throughput_decision": [
        "--on_root",
        "--root",
        "--out",
        "--repeats",
        "--measure",
        "--replot",
        "--quick",
    ],
    "noise_anatomy": ["--root", "--out", "--variants", "--batches", "--replot", "--quick"],
    "drift_noise": [
        "--root",
        "--out",
        "--design",
        "--reuse",
        "--arms",
        "--variants",
        "--replot",
        "--quick",
    ],
    "drift_regime": [
        "--root",
        "--out",
        "--workers",
        "--epochs",
        "--lr_scales",
        "--rounds",
        "--replot",
        "--quick",
    ],
    "clipping_ablation": [
        "--root",
        "--out",
        "--variants",
        "--epochs",
        "--seeds",
        "--replot",
        "--quick",
    ],
    "noise_over_training": [
        "--workdir",
        "--prompts",
        "--rollouts",
        "--batches",
        "--out",
        "--quick",
    ],
    "sft_headroom": ["--root", "--out", "--quick"],
    "bench_parallel": ["--ns", "--rounds", "--repeats", "--workers", "--compare", "--quick"],
    "tracker_resolution": ["workdir"],
    "lr_envelope": [
        "--root",
        "--out",
        "--workers",
        "--hours",
        "--ns",
        "--cap",
        "--replot",
        "--arm",
        "--quick",
    ],
    "adaptive_wallclock": [
        "--root",
        "--out",
        "--seeds",
        "--best_n",
        "--accelerators",
        "--modelled_seeds",
        "--modelled_ns",
        "--switch_ablation",
        "--replot",
        "--quick",
    ],
    "adaptive_batch": [
        "--root",
        "--on_root",
        "--out",
        "--throughput",
        "--fits",
        "--signals",
        "--seeds",
        "--replot",
        "--quick",
    ],
}
# (script, extra flags, files it must write under <out>/<script>/)
CHAINS = {
    # the on-policy sweep first; the others read its runs back
    "batch_law": [
        (
            "batch_law_on_policy",
            [],
            [
                "batch_law_on_policy.md",
                "batch_law_on_policy.csv",
                "batch_law_on_policy_runs.csv",
                "batch_law_on_policy_curves.csv",
                "batch_law_on_policy.png",
                "batch_law_on_policy_curves.png",
                "manifest.json",
            ],
        ),
        (
            "batch_law_off_policy",
            ["--reuse=4"],
            [
                "batch_law_off_policy.md",
                "batch_law_off_policy.csv",
                "batch_law_off_policy_curves.csv",
                "manifest.json",
            ],
        ),
        (  # the same tables and figures from the committed curves alone
            "batch_law_off_policy",
            ["--reuse=4", "--replot", "--root={out}/no_runs", "--on_root={out}/no_runs"],
            ["batch_law_off_policy.md", "batch_law_off_policy_off4.png"],
        ),
        # the constant rule runs the same code path as linear: one of them suffices here
        (
            "lr_scaling",
            ["--rules=constant,sqrt"],
            [
                "lr_scaling.md",
                "lr_scaling.csv",
                "lr_scaling_curves.csv",
                "lr_scaling_sqrt.png",
                "manifest.json",
            ],
        ),
        (
            "rollout_shape",
            [],
            [
                "rollout_shape.md",
                "rollout_shape.csv",
                "rollout_shape_curves.csv",
                "rollout_shape_noise.json",
                "rollout_shape.png",
                "manifest.json",
            ],
        ),
        (
            "throughput_decision",
            ["--measure"],
            [
                "throughput_decision.md",
                "throughput.json",
                "throughput_decision_curves.csv",
                "throughput_decision_measured.json",
                "throughput_decision.png",
                "manifest.json",
            ],
        ),
        (  # the decision from the committed rates, curves and measured times alone
            "throughput_decision",
            ["--measure", "--replot", "--root={out}/no_runs", "--on_root={out}/no_runs"],
            ["throughput_decision.md", "throughput_decision_time.png"],
        ),
        # every signal; its fixed arms are the quick on-policy runs above (read back), its
        # wall clock modelled from the throughput just measured
        (
            "adaptive_batch",
            ["--throughput={out}/throughput_decision/throughput.json"],
            [
                "adaptive_batch.md",
                "adaptive_batch.csv",
                "adaptive_batch_runs.csv",
                "adaptive_batch_curves.csv",
                "adaptive_batch_traj.csv",
                "adaptive_batch_curves.png",
                "manifest.json",
            ]
            + [f"adaptive_batch_n_{s}.png" for s in SIGNALS],
        ),
        (  # its tables and figures from the committed curves and trajectories alone
            "adaptive_batch",
            [
                "--throughput={out}/throughput_decision/throughput.json",
                "--replot",
                "--root={out}/no_runs",
                "--on_root={out}/no_runs",
            ],
            ["adaptive_batch.md", "adaptive_batch_curves.png"],
        ),
    ],
    # the envelope scan, then --replot from its records alone
    "lr_envelope": [
        (
            "lr_envelope",
            [],
            ["lr_envelope.md", "lr_envelope.csv", "lr_envelope_runs.csv", "manifest.json"],
        ),
        (
            "lr_envelope",
            ["--replot"],
            ["lr_envelope.md", "lr_envelope_rules.csv", "lr_envelope.png"],
        ),
        # an arm against the envelope (its own folder beside the envelope's)
        (
            "lr_envelope",
            ["--arm=warmup5"],
            [
                "lr_envelope_warmup5/lr_envelope_warmup5.md",
                "lr_envelope_warmup5/lr_envelope_warmup5_runs.csv",
                "lr_envelope_warmup5/lr_envelope_warmup5.png",
                "lr_envelope_warmup5/manifest.json",
            ],
        ),
    ],
    # three SFT bases measured, then --replot from the per-base CSV
    "noise_length": [
        (
            "noise_length",
            [],
            ["noise_length.md", "noise_length.csv", "noise_length.png", "manifest.json"],
        ),
        ("noise_length", ["--replot"], ["noise_length.md", "noise_length.csv", "noise_length.png"]),
    ],
    # its own SFT base and runs (one at a time, timed)
    "adaptive_wallclock": [
        (
            "adaptive_wallclock",
            [],
            [
                "adaptive_wallclock.md",
                "adaptive_wallclock.csv",
                "adaptive_wallclock_runs.csv",
                "adaptive_wallclock_curves.csv",
                "adaptive_wallclock_traj.csv",
                "adaptive_wallclock_n.png",
                "manifest.json",
            ],
        ),
        (  # its tables and figures from the committed curves and trajectories alone
            "adaptive_wallclock",
            ["--replot", "--root={out}/no_runs"],
            ["adaptive_wallclock.md", "adaptive_wallclock_n.png"],
        ),
    ],
    # independent of the batch-size sweeps: a second test, so xdist runs the two at once
    "noise": [
        (
            "noise_anatomy",
            [],
            ["noise_anatomy.md", "noise_anatomy.csv", "noise_anatomy.png", "manifest.json"],
        ),
        ("noise_anatomy", ["--replot", "--root={out}/no_runs"], ["noise_anatomy.md"]),
        (  # the regime design: two variants (epochs 1 and 2), the reuse design's code
            "drift_noise",
            ["--design=regime"],
            [
                "drift_noise_regime/drift_noise_regime.md",
                "drift_noise_regime/drift_noise_regime_fits.json",
                "drift_noise_regime/manifest.json",
            ],
        ),
        (  # its tables, fits and figures again from the committed points alone
            "drift_noise",
            ["--design=regime", "--replot", "--root={out}/no_runs"],
            ["drift_noise_regime/drift_noise_regime.md"],
        ),
        # the kappa pilot, from drift_noise's SFT base
        (
            "drift_regime",
            ["--root={out}/runs_drift_noise"],
            [
                "drift_regime.md",
                "drift_regime.csv",
                "drift_regime_runs.json",
                "drift_regime.png",
                "manifest.json",
            ],
        ),
        ("drift_regime", ["--replot", "--root={out}/no_runs"], ["drift_regime.md"]),
        (
            "clipping_ablation",
            ["--variants=clip0.2,clip10", "--epochs=2"],
            [
                "clipping_ablation_e2/clipping_ablation_e2.md",
                "clipping_ablation_e2/clipping_ablation_e2.png",
                "clipping_ablation_e2/manifest.json",
            ],
        ),
        (  # the same tables and figures from the committed records alone
            "clipping_ablation",
            ["--variants=clip0.2,clip10", "--epochs=2", "--replot", "--root={out}/no_runs"],
            ["clipping_ablation_e2/clipping_ablation_e2.md", "clipping_ablation_e2/manifest.json"],
        ),
    ],
}


@pytest.mark.parametrize("script", sorted(FLAGS))
def test_help_lists_flags(script, tmp_path):
  code, stdout, stderr = experiment_scripts.run(script, ["--help"], cwd=tmp_path)
  assert code == 0, stderr
  for flag in FLAGS[script]:
    assert flag in stdout, (flag, stdout)
  assert not list(tmp_path.iterdir())  # --help writes nothing


def _check_adaptive(res):
  """The adaptive report: every arm, the modelled wall clock, one row per run."""
  md = (res / "adaptive_batch.md").read_text()
  assert "wall s@" in md and "modelled from" in md
  for arm in ("fixed small", "fixed default", "fixed large") + tuple(
      f"adaptive {s}" for s in SIGNALS
  ):
    assert arm in md, arm
  runs = (res / "adaptive_batch_runs.csv").read_text().splitlines()
  seeds = 2  # --quick's default
  assert len(runs) == 1 + 3 * seeds + len(SIGNALS) * seeds + (seeds if "fixed best" in md else 0)


def _check_throughput(res):
  """--measure: seed 0 of every N rerun and timed; where the quick on-policy
  run reached the target (seed 0 at N = 8 does), so does its rerun."""
  import csv  # pylint: disable=import-outside-toplevel

  with open(res / "throughput_decision.csv") as f:
    rows = list(csv.DictReader(f))
  assert {"T_measured", "run_vs_bench", "T_overhead"} <= set(rows[0])
  timed = [r for r in rows if r["T_measured"] not in ("", "None")]
  assert timed and all(
      float(r["T_measured"]) > 0 and float(r["T_overhead"]) >= 0 for r in timed
  ), rows


def _check_wallclock(res):
  """Measured seconds for every run that reached the first target, the
  calibration inside the adaptive runs', modelled seconds for the modelled
  arms, the fixed arm at --modelled_ns; one curve row per evaluation."""
  import csv  # pylint: disable=import-outside-toplevel

  with open(res / "adaptive_wallclock_runs.csv") as f:
    runs = list(csv.DictReader(f))
  arms = {r["arm"] for r in runs}
  assert {"adaptive", "adaptive h100_sxm", "adaptive tpu_v5e"} <= arms, arms
  # the two measured fixed arms and the modelled comparison's (--modelled_ns, quick: N = 32)
  assert sum(a.startswith("fixed") for a in arms) == 3 and "fixed N=32" in arms, arms
  first = next(k for k in runs[0] if k.startswith("seconds@"))
  for r in runs:
    if r[first] not in ("", "None"):
      assert float(r[first]) > 0
    if r["arm"].startswith("adaptive ") and r[first.replace("seconds", "rounds")] not in (
        "",
        "None",
    ):
      assert float(r[first.replace("seconds", "modelled_s")]) > 0
  with open(res / "adaptive_wallclock_curves.csv") as f:
    assert len(list(csv.DictReader(f))) >= len(runs)


def _check_clipping(res):

  (md,) = res.glob("clipping_ablation*.md")
  lines = md.read_text().splitlines()
  head = next(l for l in lines if l.startswith("| variant |"))
  assert "| engaged |" in head and "| plateaued |" in head, head
  rows = [l for l in lines if l.startswith("| clip")]
  assert len(rows) == 2
  for row in rows:  # an engagement verdict and plateaued seeds out of 3
    assert re.search(r"\| (engaged|did not engage) \|", row) and re.search(r"\| [0-3]/3 \|", row)


def _check_drift(res):
  (md,) = res.glob("drift_noise*.md")
  text = md.read_text()
  assert "verdict (Holm)" in text and "family-wise" in text
  if "regime" in md.name:  # how close each variant got to the published drift
    assert "## Drift reached" in text and "| e2x1 | " in text


CHECKS = {
    "clipping_ablation": _check_clipping,
    "drift_noise": _check_drift,
    "adaptive_batch": _check_adaptive,
    "throughput_decision": _check_throughput,
    "adaptive_wallclock": _check_wallclock,
}


@pytest.mark.slow
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_every_study_quick_mode_writes_its_files(chain, tmp_path):
  out = tmp_path / "out"
  for script, extra, files in CHAINS[chain]:
    extra = [e.format(out=out) for e in extra]
    code, stdout, stderr = experiment_scripts.run(
        script, ["--quick", f"--out={out}", *extra], cwd=tmp_path
    )
    assert code == 0, (script, stdout[-2000:] + stderr[-4000:])
    for name in files:  # under <out>/<script>/, or <out>/ when it names its folder
      f = out / name if "/" in name else out / script / name
      assert f.is_file() and f.stat().st_size > 0, (script, name, sorted(os.listdir(f.parent)))
    if script in CHECKS:  # the folder of the first file: the study's results
      CHECKS[script]((out / files[0] if "/" in files[0] else out / script / files[0]).parent)
  assert sorted(os.listdir(tmp_path)) == ["out"]  # runs went under --out, not the cwd


@pytest.mark.slow
def test_sft_headroom_quick_writes_outputs(tmp_path):
  out = tmp_path / "out"
  code, stdout, stderr = experiment_scripts.run(
      "sft_headroom", ["--quick", f"--out={out}"], cwd=tmp_path
  )
  assert code == 0, stdout[-2000:] + stderr[-4000:]
  assert (out / "sft_headroom" / "sft_headroom.md").stat().st_size > 0
  assert sorted(os.listdir(tmp_path)) == ["out"]


@pytest.mark.parametrize(
    "script,flags,message",
    [
        ("clipping_ablation", ["--variants=nosuch"], "unknown variants 'nosuch'"),
        ("clipping_ablation", ["--epochs=0"], "--epochs=0"),
        ("noise_anatomy", ["--variants=nosuch"], "unknown variants 'nosuch'"),
        ("drift_noise", ["--design=regime", "--variants=e0x1"], "'e0x1'"),
        ("drift_noise", ["--design=regime", "--variants=pg8"], "'pg8' is not an e<E>x<L>"),
    ],
)
def test_bad_flag_is_an_error(script, flags, message, tmp_path):
  code, _, stderr = experiment_scripts.run(script, flags, cwd=tmp_path)
  assert code == 2 and message in stderr, stderr


def test_study_command_line_puts_quick_runs_under_out(tmp_path):
  """``study_runner.parser`` / ``parse``: the defaults, --quick's paths under
  --out and its one worker (what was given explicitly is kept), and a bad
  --workers is an error."""
  ap = study_runner.parser("doc", "demo", "sweep root", on_root_help="on-policy root")
  a = study_runner.parse(ap, [])
  assert (a.root, a.on_root, a.out, a.workers) == (
      "runs/demo",
      "runs/batch_law_on",
      study_runner.RESULTS,
      2,
  )
  a = study_runner.parse(ap, ["--quick", f"--out={tmp_path}"])
  assert a.root == os.path.join(tmp_path, "runs_demo") and a.workers == 1
  assert study_runner.parse(ap, ["--quick", "--workers=2", f"--out={tmp_path}"]).workers == 2
  assert a.on_root == os.path.join(tmp_path, "runs_on")
  a = study_runner.parse(ap, ["--quick", f"--out={tmp_path}", "--root=r", "--on_root=o"])
  assert (a.root, a.on_root) == ("r", "o")
  a = study_runner.parse(ap, ["--quick"])  # a fresh temp folder
  assert a.out != study_runner.RESULTS and os.path.isdir(a.out) and a.root.startswith(a.out)
  with pytest.raises(SystemExit):
    study_runner.parse(ap, ["--workers=0"])
  plain = study_runner.parser("doc", "demo", "root", workers=False, root="x", quick_root="q")
  a = study_runner.parse(plain, ["--quick", f"--out={tmp_path}"])
  assert a.root == os.path.join(tmp_path, "q") and not hasattr(a, "on_root")


def test_on_policy_root_is_where_the_other_studies_read_it():
  """batch_law_on_policy's --root default is the --on_root default of the
  studies that read its sweep back (``study_runner.parser``)."""
  path = os.path.join(ROOT, "experiments", "batch_law_on_policy.py")
  spec = importlib.util.spec_from_file_location("batch_law_on_policy", path)
  script = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(script)
  reader = study_runner.parser("doc", "demo", "root", on_root_help="on-policy root")
  assert script.parse_args([]).root == reader.get_default("on_root") == "runs/batch_law_on"


def test_tracker_resolution_counts_resolved_rounds(tmp_path):
  """experiments/tracker_resolution.py on a hand-made metrics file."""
  from cbs_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel

  exp = experiment_scripts.load("tracker_resolution")
  rows = [dict(round=0)]
  for r in range(1, 6):
    ok = r >= 3
    rows.append(
        {
            "round": r,
            "noise_ema/g2": 1.0 if ok else -1.0,
            "noise_ema/b_noise": 100.0 * r if ok else None,
            "noise_ema/b_noise_lo": 50.0 if ok else 0.0,
            "noise_ema/b_noise_hi": 200.0 if ok else "inf",
        }
    )
  w = metrics_lib.MetricsWriter(str(tmp_path), tensorboard=False)
  for r in rows:
    w.write(r)
  w.close()
  got = exp.summary(metrics_lib.read_jsonl(str(tmp_path / "metrics.jsonl"))[1:], "noise_ema")
  assert got == dict(rounds=5, resolved=3, first=3, fed=5, g2_negative=2, b_noise_last100=400.0)
  assert exp.summary(rows[1:], "noise_ema_adam")["fed"] == 0


def test_bench_peers_quick_compares_with_tunix_or_says_it_skipped(capsys):
  """Where google-tunix is installed (the ``peers`` extra) the quick run
  times both samplers; elsewhere it says why it skipped, and exits 0."""
  code = experiment_scripts.load("bench_peers").main(["--quick"])
  out = capsys.readouterr().out
  last = out.strip().splitlines()[-1]
  assert code == 0
  if importlib.util.find_spec("tunix") is None:
    assert "SKIPPED: google-tunix is not installed" in out and last == "RESULT skipped=1"
  else:
    assert last.startswith("RESULT sampler_vs_tunix_b16=") and "decode_vs_roofline_b16=" in last


@pytest.mark.slow
def test_bench_noise_quick_split_only_times_both_cell_forms(tmp_path):
  """The split path's quick run times its cells in both forms and says which
  one ``cells="auto"`` takes: 4 x 4 rollouts of 9 + 5 tokens make cells of
  56 token rows, below ``SEPARATE_MIN_ROWS``, so the vmapped form."""
  from cbs_jax import gradstats  # pylint: disable=import-outside-toplevel

  code, out, err = experiment_scripts.run("bench_noise", ["--quick", "--split_only"], str(tmp_path))
  assert code == 0, err[-3000:]
  last = out.strip().splitlines()[-1]
  assert last.startswith("RESULT split_overhead=")
  fields = dict(kv.split("=") for kv in last.split()[1:])
  assert fields["cell_rows"] == "56" and 56 < gradstats.SEPARATE_MIN_ROWS
  assert fields["auto_form"] == "vmapped"
  r, lo, hi = (float(fields[k]) for k in ("separate_vs_vmapped", "separate_lo", "separate_hi"))
  assert 0 < r and lo <= r <= hi
  assert fields["split_goal"] in ("met", "not_met", "unresolved")
  assert "ghost_overhead" not in fields  # --split_only: no exact paths


@pytest.mark.slow
def test_bench_malloc_quick_runs_each_arm_in_its_own_process(capsys):
  """One child process per allocator arm, each started with its own
  environment (the child reports the GLIBC_TUNABLES it saw); the speed-ups
  are ratios to the default arm, which is 1 by construction."""
  experiment_scripts.load("bench_malloc").main(["--quick"])
  out = capsys.readouterr().out
  last = out.strip().splitlines()[-1]
  assert last.startswith("RESULT hugetlb_speedup_n64=") and "one_arena_speedup_n64=" in last
  rows = {l.split()[0]: l.split() for l in out.splitlines() if l.split()[:2][1:] == ["64"]}
  assert rows["default"][3] == "1.000"
  assert all(float(v.split("=")[1]) > 0 for v in last.split()[1:])


def test_bench_malloc_names_an_unknown_arm(capsys):
  with pytest.raises(SystemExit):
    experiment_scripts.load("bench_malloc").main(["--arms", "default,tcmalloc"])
  assert "tcmalloc" in capsys.readouterr().err


def test_clipping_record_reads_the_dual_clip_fraction_where_it_was_logged(tmp_path):
  """``clipping_ablation.run_record`` on hand-written metrics: the mean of
  the rounds' ``clip_frac_dual`` when the runs logged it (a dual clip),
  None when they did not (the table then has no dual_frac column)."""
  from cbs_jax import metrics as metrics_lib  # pylint: disable=import-outside-toplevel

  exp = experiment_scripts.load("clipping_ablation")

  def write(where, dual):
    w = metrics_lib.MetricsWriter(str(where), tensorboard=False)
    w.write(dict(round=0, eval_expected_pass=0.3))
    for r, d in zip((1, 2), dual):
      row = {
          "round": r,
          "num_updates": 2,
          "rollouts_seen": 16 * r,
          "eval_expected_pass": 0.3 + 0.1 * r,
          "heldout_kappa_exact_by_update": [0.0, 0.01 * r],
          "clip_frac_low_by_update": [0.0, 0.01],
          "clip_frac_high_by_update": [0.0, 0.02],
      }
      if d is not None:
        row["clip_frac_dual"] = d
      w.write(row)
    w.close()

  write(tmp_path / "dual", [0.002, 0.004])
  write(tmp_path / "plain", [None, None])
  rec = exp.run_record(str(tmp_path / "dual"))
  assert rec["dual_frac"] == pytest.approx(0.003)
  assert rec["clip_frac"] == pytest.approx(0.03) and rec["kappa_final"] == pytest.approx(0.015)
  assert exp.run_record(str(tmp_path / "plain"))["dual_frac"] is None


def _result_fields(out: str) -> dict:
  last = out.strip().splitlines()[-1]
  assert last.startswith("RESULT "), last
  return dict(kv.split("=") for kv in last.split()[1:])


@pytest.mark.slow
def test_bench_update_quick_runs_both_paths_to_the_same_parameters(tmp_path):
  """The scanned round and the host loop it replaced, from one state, end
  their round at the same parameters (float rounding apart), and the round
  did move them (random advantages where a fresh policy's are all 0)."""
  code, out, err = experiment_scripts.run("bench_update", ["--quick"], str(tmp_path))
  assert code == 0, err[-3000:]
  fields = _result_fields(out)
  assert float(fields["update_check"]) < 1e-5
  (check,) = [l for l in out.splitlines() if l.startswith("check: parameters after one round")]
  moved = [float(m) for m in re.findall(r"moved ([0-9.e+-]+)\)", check)]
  assert len(moved) == 2 and min(moved) > 1e-4, check
  assert float(fields["update_speedup"]) > 0 and fields["update_goal"] in (
      "met",
      "not_met",
      "unresolved",
  )
  assert 0 < float(fields["update_mfu_vs_matmul"]) < 2


@pytest.mark.slow
def test_bench_scale_quick_reports_each_cases_flop_utilisation(tmp_path):
  argv = ["--quick", "--cases=quickstart,25m", "--repeats=1"]
  code, out, err = experiment_scripts.run("bench_scale", argv, str(tmp_path))
  assert code == 0, err[-3000:]
  fields = _result_fields(out)
  assert set(fields) == {"train_mfu_vs_matmul", "mfu_quickstart", "mfu_25m"}
  assert fields["train_mfu_vs_matmul"] == fields["mfu_25m"]
  assert all(0 < float(v) < 2 for v in fields.values())
