"""Multi-host for real: two processes on this machine (localhost coordinator,
gloo CPU collectives, 4 host devices each) run a sweep of two grid points
of the smoke config (``cbs_jax.sweep`` with ``distributed`` enabled: the
pod recipe) as one 8-device job through ``jax.distributed``. Each run must
reproduce a one-process 8-device run. Killing one process in the middle of
the second run and restarting the job skips the finished first run (read
back from the shared root, never rerun), resumes the second from its last
checkpoint and finishes it as if nothing had happened.

One test, ~2-4 minutes on the 2-core machine (four JAX processes compile
the same programs); it is the only check of the multi-process path.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from cbs_jax import metrics as metrics_lib
from envs import host_devices

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = 4
FLAGS = [
    "--config=configs/default.py:smoke",
    "--config.task.kwargs.max_digits=1",
    "--config.sft.steps=30",
    "--config.sft.lr=0.01",
    f"--config.train.num_rounds={ROUNDS}",
    "--config.train.checkpoint_every=2",
    "--config.train.eval_every=2",
    "--config.train.eval_prompts=16",
]


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


# two grid points that differ only in how often they checkpoint: the same
# numbers as the one-process reference, two runs of the sweep
GRID = {"train.checkpoint_every": [1, 2]}
RUNS = ("train.checkpoint_every=1", "train.checkpoint_every=2")


def _launch(workdir, base_dir, log_dir, tag):
  port = _free_port()
  procs = []
  for i in range(2):
    cmd = [
        sys.executable,
        "-m",
        "cbs_jax.sweep",
        f"--workdir={workdir}",
        f"--sweep={json.dumps(GRID)}",
        *FLAGS,
        f"--config.sft.base_dir={base_dir}",
        "--config.distributed.enabled=True",
        f"--config.distributed.coordinator_address=127.0.0.1:{port}",
        "--config.distributed.num_processes=2",
        f"--config.distributed.process_id={i}",
        "--config.distributed.heartbeat_timeout=10",
        "--config.distributed.initialization_timeout=120",
    ]
    log = open(os.path.join(log_dir, f"{tag}{i}.log"), "w")
    procs.append(
        (
            subprocess.Popen(
                cmd, cwd=ROOT, env=host_devices(4), stdout=log, stderr=subprocess.STDOUT
            ),
            log,
        )
    )
  return procs


def _tail(log_dir, tag):
  out = []
  for i in range(2):
    with open(os.path.join(log_dir, f"{tag}{i}.log")) as f:
      lines = [l for l in f.read().splitlines() if "Gloo" not in l]
    out.append(f"--- process {i}:\n" + "\n".join(lines[-25:]))
  return "\n".join(out)


def _wait(procs, timeout):
  t0 = time.time()
  for p, log in procs:
    p.wait(timeout=max(1, timeout - (time.time() - t0)))
    log.close()
  return [p.returncode for p, _ in procs]


@pytest.mark.slow
def test_a_distributed_sweep_matches_one_process_and_survives_preemption(tmp_path):
  # the reference: one process with 8 devices (it also builds the SFT base
  # that the multi-process runs start from)
  ref_dir = tmp_path / "one"
  r = subprocess.run(
      [sys.executable, "-m", "cbs_jax.main", f"--workdir={ref_dir}", *FLAGS],
      cwd=ROOT,
      env=host_devices(8),
      capture_output=True,
      text=True,
      timeout=600,
  )
  assert r.returncode == 0, r.stderr[-3000:]
  ref = metrics_lib.read_jsonl(str(ref_dir / "metrics.jsonl"))
  base = str(ref_dir / "sft_base")

  # two processes run the sweep; process 1 is killed once the second run's
  # round-2 checkpoint is complete
  root, logs = tmp_path / "sweep", tmp_path / "logs"
  logs.mkdir()
  first, second = root / RUNS[0], root / RUNS[1]
  procs = _launch(str(root), base, str(logs), "first")
  ckpts = second / "checkpoints"
  deadline = time.time() + 480
  while not (ckpts / "2").is_dir():
    assert time.time() < deadline and all(p.poll() is None for p, _ in procs), _tail(logs, "first")
    time.sleep(0.1)
  procs[1][0].send_signal(signal.SIGKILL)
  killed_at = time.time()
  assert (first / "summary.json").exists()  # the first run had finished
  assert not (ckpts / str(ROUNDS)).exists()  # the second is killed mid-run
  # the survivor notices (failed collective or missed heartbeats) and exits
  try:
    procs[0][0].wait(timeout=90)
    survivor_exit = time.time() - killed_at
  except subprocess.TimeoutExpired:
    procs[0][0].kill()
    survivor_exit = None
  for _, log in procs:
    log.close()
  print(f"survivor exited {survivor_exit} s after the kill, code {procs[0][0].returncode}")
  assert survivor_exit is not None, "process 0 kept running 90 s after process 1 died"
  assert procs[0][0].returncode != 0
  done = [int(d) for d in os.listdir(ckpts) if d.isdigit()]
  assert 2 in done and ROUNDS not in done

  # restart the whole job: the first run is read back, the second resumes
  first_metrics = (first / "metrics.jsonl").stat().st_mtime_ns
  procs = _launch(str(root), base, str(logs), "resume")
  codes = _wait(procs, 600)
  assert codes == [0, 0], _tail(logs, "resume")
  assert (first / "metrics.jsonl").stat().st_mtime_ns == first_metrics  # not rerun
  with open(logs / "resume0.log") as f:
    listing = [json.loads(l) for l in f.read().splitlines() if l.startswith('{"name"')]
  assert [row["name"] for row in listing] == list(RUNS)  # process 0 lists the sweep once
  with open(logs / "resume1.log") as f:
    assert '{"name"' not in f.read()
  with open(root / "results.jsonl") as f:
    assert [json.loads(l)["name"] for l in f if l.strip()] == list(RUNS)
  for run in (first, second):
    stored = json.loads((run / "config.json").read_text())
    assert stored["distributed"]["process_id"] == 0  # written by process 0 only
    multi = metrics_lib.read_jsonl(str(run / "metrics.jsonl"))
    # written once (process 0), every round exactly once despite the restart
    assert [r["round"] for r in multi] == [r["round"] for r in ref] == list(range(ROUNDS + 1))
    for a, b in zip(ref, multi):
      assert a.get("eval_pass_rate") == b.get("eval_pass_rate")
      assert a.get("eval_expected_pass") == pytest.approx(b.get("eval_expected_pass"), abs=1e-5)
      if a["round"]:
        assert a["reward_mean"] == b["reward_mean"]
        assert a["completion_len"] == b["completion_len"]
        assert a["entropy"] == pytest.approx(b["entropy"], rel=1e-3)
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["noise_split/trace_intra"] == pytest.approx(b["noise_split/trace_intra"], rel=5e-3)
        assert a["noise_split/g2"] == pytest.approx(b["noise_split/g2"], abs=1e-3)
    with open(run / "summary.json") as f:
      summary = json.load(f)
    assert summary["rounds"] == ROUNDS and summary["rollouts_seen"] == ROUNDS * 16
    assert not [f for f in os.listdir(run) if ".tmp" in f]  # <file>.tmp.<pid> (paths)


@pytest.mark.parametrize(
    "field,value,needle",
    [
        ("coordinator_address", "localhost", "coordinator_address='localhost' must be 'host:port'"),
        (
            "process_id",
            2,
            "process_id=2 must be -1 (auto) or in [0, " "config.distributed.num_processes=2)",
        ),
        ("heartbeat_timeout", 0, "config.distributed.heartbeat_timeout must be > 0"),
        ("local_device_ids", "0,a", "local_device_ids='0,a' must be"),
    ],
)
def test_bad_distributed_config_names_the_field(field, value, needle):
  import re  # pylint: disable=import-outside-toplevel
  from cbs_jax import config as config_lib  # pylint: disable=import-outside-toplevel

  c = config_lib.base_config()
  c.distributed.enabled, c.distributed.num_processes = True, 2
  c.distributed[field] = value
  with pytest.raises(ValueError, match=re.escape(needle)):
    config_lib.validate(c)
