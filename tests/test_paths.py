"""Workdirs on an object store (``gs://``), offline: a fake bucket on disk.

``fake_gcs`` routes ``gs://`` through a fake fsspec filesystem that keeps
objects under a local directory with object-store semantics: an object
appears whole when its upload closes (never in part), there is no append and
no rename. etils.epath reaches it as it would reach gcsfs. orbax writes
array data with TensorStore, whose GCS driver needs the network; the fixture
points that one driver at the same directory (orbax's own gs:// handling,
commit-success files instead of renames, is kept).

A "kill" is an exception (a BaseException, so nothing catches it) raised
before the k-th object upload: uploads are atomic, so a process killed
during one leaves the store as a process killed just before it.
"""

from __future__ import annotations

import gc
import importlib
import io
import json
import os
import re

import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.dirfs import DirFileSystem
from fsspec.implementations.local import LocalFileSystem
from orbax.checkpoint._src.path import gcs_utils
from tensorboardX import event_file_writer

from cbs_jax import config as config_lib
from cbs_jax import main as main_lib
from cbs_jax import measure
from cbs_jax import metrics as metrics_lib
from cbs_jax import paths
from cbs_jax import plan
from cbs_jax import report
from cbs_jax import run_setup
from cbs_jax import sweep
from cbs_jax import tasks
from cbs_jax import train
from cbs_jax.tasks import arithmetic

# fsspec's writable registry (``fsspec.registry`` is its read-only view)
FSSPEC_REGISTRY = importlib.import_module("fsspec.registry")._registry  # pylint: disable=W0212
TIME_KEY = re.compile(r"seconds|_per_s$|time|wall")


def strip_time(x):
  """Drop wall-clock fields (gen_seconds, update_seconds, tokens_per_s, ...)."""
  if isinstance(x, dict):
    return {k: strip_time(v) for k, v in x.items() if not TIME_KEY.search(k)}
  if isinstance(x, list):
    return [strip_time(v) for v in x]
  return x


def canon(x):
  return json.dumps(x, sort_keys=True, default=float)


class Killed(BaseException):
  """The process died here (not an Exception: no handler in the code catches it)."""


class _Upload(io.BytesIO):
  """An object being uploaded: invisible until closed, then published whole."""

  def __init__(self, store, local_path):
    super().__init__()
    self._store, self._local_path = store, local_path

  def close(self):
    if self.closed:
      return
    data = self.getvalue()
    super().close()  # first: a killed upload is gone, never retried (by __del__)
    self._store.publish(self._local_path, data)


class FakeBucket(DirFileSystem):
  """``gs://bucket/key`` kept at ``root/bucket/key``, with object-store semantics."""

  protocol = ("gcs", "gs")
  cachable = False
  root = None  # set by the fixture
  uploads = []  # keys published, in order
  kill_at = None  # raise Killed before the upload with this index (0-based)
  dead = False  # after the kill nothing is uploaded, from any thread

  def __init__(self, *args, **kwargs):
    del args, kwargs  # finalize_on_close=True, from epath
    super().__init__(path=type(self).root, fs=LocalFileSystem())

  def publish(self, local_path, data):
    cls = type(self)
    if cls.dead:  # a background writer (orbax's) swallows its Killed: the
      raise Killed(f"dead before uploading {local_path}")  # next upload dies too
    if cls.kill_at is not None and len(cls.uploads) == cls.kill_at:
      cls.kill_at, cls.dead = None, True
      raise Killed(f"killed before uploading {local_path}")
    cls.uploads.append(os.path.relpath(local_path, cls.root))
    os.makedirs(os.path.dirname(local_path), exist_ok=True)
    tmp = f"{local_path}.uploading"  # the store's own atomic publish
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, local_path)

  def open(self, path, mode="rb", **kwargs):
    if "a" in mode:
      raise NotImplementedError(f"object stores cannot append ({path})")
    if "b" not in mode:
      return io.TextIOWrapper(self.open(path, mode + "b"), encoding="utf-8")
    if "w" in mode:
      return _Upload(self, self._join(path))
    return super().open(path, mode, **kwargs)

  def mv(self, path1, path2, **kwargs):
    raise AssertionError(f"rename on an object store: {path1} -> {path2}")


@pytest.fixture
def fake_gcs(tmp_path, monkeypatch):
  """``gs://`` on a local directory (returned); TensorStore's GCS driver too."""
  root = str(tmp_path / "gcs")
  os.makedirs(root)
  monkeypatch.setattr(FakeBucket, "root", root)
  monkeypatch.setattr(FakeBucket, "uploads", [])
  monkeypatch.setattr(FakeBucket, "kill_at", None)
  monkeypatch.setattr(FakeBucket, "dead", False)
  for proto in FakeBucket.protocol:
    monkeypatch.setitem(FSSPEC_REGISTRY, proto, FakeBucket)
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access

  def kvstore(ckpt_path):
    bucket, key = gcs_utils.parse_gcs_path(ckpt_path, add_trailing_slash=False)
    return {"driver": "file", "path": os.path.join(root, bucket, key)}

  monkeypatch.setattr(gcs_utils, "get_kvstore_for_gcs", kvstore)
  monkeypatch.setattr(gcs_utils, "is_hierarchical_namespace_enabled", lambda p: False)
  yield root
  epath_backend.fsspec_backend._get_filesystem.cache_clear()  # pylint: disable=protected-access


# ------------------------------------------------------------------- the layer


def test_join_and_resolve_keep_local_paths_and_normalize_uris():
  assert paths.join("runs/a", "metrics.jsonl") == os.path.join("runs/a", "metrics.jsonl")
  assert paths.join("gs://b/run", "checkpoints") == "gs://b/run/checkpoints"
  assert paths.resolve("runs/sweep/a", "../sft_base") == "runs/sweep/sft_base"
  assert paths.resolve("runs/a", "/abs/base") == "/abs/base"
  assert paths.resolve("gs://b/sweep/a", "../sft_base") == "gs://b/sweep/sft_base"
  assert paths.resolve("gs://b/run", "sft_base") == "gs://b/run/sft_base"
  assert paths.resolve("runs/a", "gs://b/base") == "gs://b/base"
  assert paths.absolute("gs://b/x") == "gs://b/x"
  assert paths.scheme("gs://b/x") == "gs" and paths.scheme("/tmp/x") is None
  with pytest.raises(ValueError, match="leaves the bucket"):
    paths.resolve("gs://b", "../../x")


def test_uri_writes_are_single_uploads_and_append_is_refused(fake_gcs):
  p = "gs://bucket/run/summary.json"
  assert not paths.exists(p)
  paths.write_atomic(p, '{"a": 1}')
  paths.write_atomic(p, '{"a": 2}')
  assert paths.read_text(p) == '{"a": 2}'
  assert FakeBucket.uploads == ["bucket/run/summary.json"] * 2  # no tmp object, no rename
  assert sorted(os.listdir(os.path.join(fake_gcs, "bucket/run"))) == ["summary.json"]
  assert paths.isdir("gs://bucket/run") and paths.listdir("gs://bucket/run") == ["summary.json"]
  with pytest.raises(ValueError, match="no append"):
    paths.append_text(p, "x")
  with pytest.raises(FileNotFoundError, match="gs://bucket/none"):
    paths.read_text("gs://bucket/none")


def test_local_write_atomic_leaves_no_temporary(tmp_path):
  p = str(tmp_path / "a.json")
  paths.write_atomic(p, "1")
  paths.append_text(p, "2\n")
  assert open(p).read() == "12\n" and os.listdir(tmp_path) == ["a.json"]


def test_metrics_on_a_bucket_are_a_whole_prefix_after_every_row(fake_gcs):
  wd = "gs://bucket/run"
  w = metrics_lib.MetricsWriter(wd, tensorboard=False)
  for r in range(3):
    w.write({"round": r, "x": float(r)})
    assert [row["round"] for row in metrics_lib.read_jsonl(w.path)] == list(range(r + 1))
  w.close()
  # a resume from round 2 drops rows >= 2 in one upload
  w = metrics_lib.MetricsWriter(wd, resume_round=2, tensorboard=False)
  assert [row["round"] for row in metrics_lib.read_jsonl(w.path)] == [0, 1]
  assert set(FakeBucket.uploads) == {"bucket/run/metrics.jsonl"}


def test_tensorboard_events_on_a_bucket_go_through_the_layer(fake_gcs):
  w = metrics_lib.MetricsWriter("gs://bucket/run", tensorboard=True)
  w.write({"round": 0, "x": 1.0})
  w.close()
  events = [u for u in FakeBucket.uploads if u.startswith("bucket/run/tb/events.out")]
  assert events, FakeBucket.uploads


def test_report_and_sweep_files_on_a_bucket(fake_gcs):
  out = report.Results("exp", root="gs://bucket/results")
  out.table([{"a": 1, "b": [1, 2]}], ["a"], echo=False)
  out.manifest(config={"x": 1}, command="python x.py")
  assert (
      json.loads(paths.read_text("gs://bucket/results/exp/manifest.json"))["command"]
      == "python x.py"
  )
  with open(os.path.join(fake_gcs, "bucket/results/exp/exp.csv"), "rb") as f:
    assert f.read() == b'a,b\r\n1,"[1, 2]"\r\n'  # the bytes a local table has
  assert report.missing_manifests("gs://bucket/results") == []

  def run_fn(config, workdir):
    summary = {"lr": config.optim.lr}
    paths.write_atomic(paths.join(workdir, "summary.json"), json.dumps(summary))
    return summary

  base = config_lib.base_config()
  over = [{"optim.lr": 1e-3}, {"optim.lr": 2e-3}]
  rows = sweep.run_sweep(base, over, "gs://bucket/sweep", run_fn=run_fn, progress=False)
  assert [r["summary"]["lr"] for r in rows] == [1e-3, 2e-3]
  assert canon(sweep.read_results("gs://bucket/sweep")) == canon(rows)
  calls = []
  again = sweep.run_sweep(
      base, over, "gs://bucket/sweep", progress=False, run_fn=lambda c, w: calls.append(w)
  )
  assert calls == [] and canon(again) == canon(rows)
  # the ledger on a bucket: the sweep's own invocation (the second, which ran
  # nothing, adds none) and a sub-sweep's, found by one glob
  sweep.run_sweep(base, over[:1], "gs://bucket/sweep/arm", run_fn=run_fn, progress=False)
  led = report.ledger("gs://bucket/sweep")
  assert [(r["sweep"], r["ran"]) for r in led["invocations"]] == [(".", 2), ("arm", 1)]
  assert paths.glob("gs://bucket/sweep", "*/invocations.jsonl") == [
      "gs://bucket/sweep/arm/invocations.jsonl"
  ]


# ----------------------------------------------------------------- a real run


class FirstDigitOne(arithmetic.ArithmeticTask):
  """Reward 1 iff the completion starts with '1'."""

  enumerable = False

  def verify(self, problem, completion):
    return float(completion.startswith("1"))


def tiny_config(**over):
  c = config_lib.base_config()
  c.task.name = "first_digit_one"
  c.model.d_model, c.model.d_ff, c.model.num_layers = 32, 64, 1
  c.sft.steps, c.sft.batch_size, c.sft.eval_every = 5, 16, 0
  c.batch.num_prompts, c.batch.rollouts_per_prompt = 8, 8
  c.optim.lr, c.optim.ref_batch, c.optim.warmup_steps = 3e-3, 64, 0
  c.train.num_rounds, c.train.eval_every, c.train.eval_prompts = 4, 0, 32
  c.train.checkpoint_every = 2
  c.train.progress = False
  for k, v in over.items():
    section, field = k.split("__")
    c[section][field] = v
  return c


@pytest.fixture
def easy_task(monkeypatch):
  monkeypatch.setitem(tasks.TASKS, "first_digit_one", FirstDigitOne)


def close_killed_writers():
  """Close the TensorBoard event files a killed run left open (tensorboardX
  would flush them at exit, after the fake bucket is gone)."""
  for obj in gc.get_objects():
    if type(obj) is event_file_writer.EventFileWriter:  # pylint: disable=unidiomatic-typecheck
      obj.close()  # idempotent


def bucket_listing(root, prefix):
  out = []
  for base, _, files in os.walk(os.path.join(root, prefix)):
    out += [os.path.relpath(os.path.join(base, f), root) for f in files]
  return sorted(out)


def test_run_on_a_bucket_writes_everything_there_and_resumes(easy_task, fake_gcs):
  wd = "gs://bucket/runs/a"
  s = train.train_and_evaluate(tiny_config(), wd)
  rows = metrics_lib.read_jsonl(f"{wd}/metrics.jsonl")
  assert [r["round"] for r in rows] == [0, 1, 2, 3, 4]
  assert json.loads(paths.read_text(f"{wd}/summary.json"))["rounds"] == 4 == s["rounds"]
  files = bucket_listing(fake_gcs, "bucket")
  for f in (
      "bucket/runs/a/checkpoints/4/commit_success.txt",  # orbax's gs:// commit
      "bucket/runs/a/checkpoints/2/commit_success.txt",
      "bucket/runs/a/sft_base/metrics.jsonl",
      "bucket/runs/a/sft_base/checkpoints/5/commit_success.txt",
  ):
    assert f in files, files
  assert any(f.startswith("bucket/runs/a/tb/events.out") for f in files), files
  assert not [f for f in files if ".tmp" in f], files
  # a second call with more rounds resumes from round 4 in the bucket
  s2 = train.train_and_evaluate(tiny_config(train__num_rounds=6), wd)
  rows2 = metrics_lib.read_jsonl(f"{wd}/metrics.jsonl")
  assert [r["round"] for r in rows2] == list(range(7))
  assert rows2[:5] == rows
  assert s2["rounds"] == 6
  assert "bucket/runs/a/checkpoints/6/commit_success.txt" in bucket_listing(fake_gcs, "bucket")


def test_kill_before_any_upload_then_rerun_equals_an_uninterrupted_run(easy_task, fake_gcs):
  ref = "gs://bucket/ref"
  train.train_and_evaluate(tiny_config(), ref)
  ref_rows = metrics_lib.read_jsonl(f"{ref}/metrics.jsonl")
  ref_summary = json.loads(paths.read_text(f"{ref}/summary.json"))
  uploads = [u.removeprefix("bucket/ref/") for u in FakeBucket.uploads]
  print("\n".join(f"{i}: {u}" for i, u in enumerate(uploads)))
  first = lambda pred: next(i for i, u in enumerate(uploads) if pred(u))
  kills = {  # upload index -> what the kill interrupts
      "sft metrics": first(lambda u: u == "sft_base/metrics.jsonl"),
      "sft checkpoint": first(lambda u: u.startswith("sft_base/checkpoints/")),
      "first rl row": first(lambda u: u == "metrics.jsonl") + 1,
      # orbax writes this on its own thread, which logs a Killed and goes on
      "round-2 checkpoint, writer thread": first(
          lambda u: u.startswith("checkpoints/2/") and "array_metadatas" in u
      ),
      "row after a checkpoint": max(
          i for i, u in enumerate(uploads) if u.startswith("checkpoints/2/")
      )
      + 1,
      "summary": first(lambda u: u == "summary.json"),
  }
  for what, k in kills.items():
    wd = f"gs://bucket/killed_{k}"
    FakeBucket.uploads.clear()
    FakeBucket.kill_at = k
    with pytest.raises(Killed):
      train.train_and_evaluate(tiny_config(), wd)
    assert FakeBucket.kill_at is None, what
    FakeBucket.dead = False  # the rerun is a new process
    close_killed_writers()
    assert not paths.exists(f"{wd}/summary.json"), what
    train.train_and_evaluate(tiny_config(), wd)  # the rerun completes the run
    rows = metrics_lib.read_jsonl(f"{wd}/metrics.jsonl")
    assert [r["round"] for r in rows] == [0, 1, 2, 3, 4], what
    assert canon(strip_time(rows)) == canon(strip_time(ref_rows)), what
    summary = json.loads(paths.read_text(f"{wd}/summary.json"))
    assert canon(strip_time(summary)) == canon(strip_time(ref_summary)), what


def test_local_run_killed_before_its_first_checkpoint_reruns_without_a_second_round_0(
    easy_task, monkeypatch, tmp_path
):
  wd = str(tmp_path / "run")
  save = train.checkpoint

  def killed_at_first_checkpoint(*args, **kwargs):
    monkeypatch.setattr(train, "checkpoint", save)
    raise Killed("killed before the round-2 checkpoint")

  monkeypatch.setattr(train, "checkpoint", killed_at_first_checkpoint)
  with pytest.raises(Killed):
    train.train_and_evaluate(tiny_config(), wd)
  close_killed_writers()
  assert [r["round"] for r in metrics_lib.read_jsonl(f"{wd}/metrics.jsonl")] == [0, 1, 2]
  train.train_and_evaluate(tiny_config(), wd)
  assert [r["round"] for r in metrics_lib.read_jsonl(f"{wd}/metrics.jsonl")] == [0, 1, 2, 3, 4]


def test_main_measure_and_plan_keep_a_bucket_run_in_the_bucket(
    easy_task, fake_gcs, tmp_path, monkeypatch
):
  """``cbs_jax.main``'s run record (config.json, provenance.json on every
  start), the measurement's policy and record, and the planner's reads all
  go through the path layer: a ``gs://`` run leaves nothing in the working
  directory, and the planner reads it where it is."""
  cwd = tmp_path / "cwd"
  cwd.mkdir()
  monkeypatch.chdir(cwd)
  wd = "gs://bucket/runs/m"
  main_lib.run(tiny_config(), wd, command="start")
  main_lib.run(tiny_config(train__num_rounds=5), wd, command="resume")
  assert os.listdir(cwd) == []  # before, the record went to ./gs:/bucket/runs/m
  prov = json.loads(paths.read_text(f"{wd}/provenance.json"))
  assert prov["command"] == "start"
  assert [(r["command"], r["config_changes"]) for r in prov["restarts"]] == [
      ("resume", {"train.num_rounds": [4, 5]})
  ]
  config = plan.load_run_config(wd)
  assert config.to_dict() == tiny_config(train__num_rounds=5).to_dict()
  steps = [int(s) for s in paths.listdir(f"{wd}/checkpoints") if s.isdigit()]
  _, _, step = measure.load_policy(config, wd, run_setup.prepare(config))
  assert step == max(steps) == 5
  record = dict(K=8, exact=dict(b_noise=300.0, b_noise_se=40.0, b_noise_floor=230.0))
  paths.write_atomic(f"{wd}/measure_round5_P8_K8.json", json.dumps(record))
  rec = plan.load_noise(wd)
  assert rec["b_noise"] == 300.0 and rec["source"] == f"{wd}/measure_round5_P8_K8.json"
  assert os.listdir(cwd) == []
