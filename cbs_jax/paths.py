"""Where a run's files go: one path layer for local directories and object stores.

Every file the trainer, the SFT base, ``cbs_jax.main``'s run record,
measurements, the planner, sweeps and reports write or read goes through
this module, so a workdir may be a local directory or an object-store
URI (``gs://bucket/run`` on a TPU VM; any ``scheme://`` that ``etils.epath``
opens). Local paths keep the ``os`` calls they always had (same files, same
errors); a URI goes through ``etils.epath`` (gcsfs, or TensorFlow's gfile
where it is installed). Checkpoints go through orbax, which takes the same
URIs; the ``Checkpointer`` only avoids local-only calls on them.

Atomicity. A kill at any moment must leave a workdir that reads and resumes.
An object upload (gcsfs, or gfile, closing a file opened for writing) becomes
visible whole when it completes, or not at all:

* ``write_atomic(path, text)`` replaces a whole file. Locally it writes
  ``<path>.tmp.<pid>``, fsyncs it and renames it over ``path`` (a POSIX
  rename is atomic). On an object store a rename is a copy plus a delete,
  not atomic, but one object upload is: readers see the old object or the
  new one, never a part. So a URI is written in one upload, with no temporary
  object and no rename.
* ``append_text(path, text)`` exists for local files only (append + fsync;
  a kill can tear the last line, which ``metrics.read_jsonl`` drops). Object
  stores cannot append: ``metrics.MetricsWriter`` rewrites the whole
  ``metrics.jsonl`` object (its rows are in memory) with ``write_atomic`` at
  every row there. The object is then always a whole prefix of the run's
  rows: nothing to repair, no second object to merge. The price is
  O(rows^2) bytes uploaded over a run: with rows of a few kB, a
  thousand-round run uploads a few MB per round, small next to a checkpoint.
* ``makedirs`` is a no-op on a URI: object stores have no directories (a
  prefix exists once an object is under it).

TensorBoard event files under a URI are written through ``epath`` as well
(``TENSORBOARD_FACTORY``, which ``metrics.MetricsWriter`` registers with
tensorboardX for the URI's scheme): the event file is kept in memory and
uploaded whole at every flush, as tensorboardX's own GCS writer does (that
one needs google-cloud-storage; this one only ``etils.epath``).
"""

from __future__ import annotations

import io
import os
import posixpath
import re

from etils import epath

_URI = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def scheme(path: str) -> str | None:
  """The URI scheme of ``path`` (``"gs"`` for ``gs://b/x``), None for a local path."""
  m = _URI.match(os.fspath(path))
  return m.group(1) if m else None


def is_remote(path: str) -> bool:
  """Whether ``path`` is an object-store URI (``scheme://...``), not a local path."""
  return scheme(path) is not None


def join(base: str, *parts: str) -> str:
  """``base/part/...``: ``os.path.join`` locally, ``/``-joined under a URI."""
  if is_remote(base):
    return posixpath.join(base, *parts)
  return os.path.join(base, *parts)


def resolve(base: str, path: str) -> str:
  """``path`` itself if absolute (or a URI), else ``path`` under ``base``,
  normalized (``..`` steps up: ``resolve("gs://b/run", "../sft")`` is
  ``gs://b/sft``)."""
  if is_remote(path) or os.path.isabs(path):
    return path
  if is_remote(base):
    prefix = f"{scheme(base)}://"
    rest = posixpath.normpath(posixpath.join(base[len(prefix) :], path))
    if rest == ".." or rest.startswith("../"):
      raise ValueError(f"{path!r} under {base!r} leaves the bucket")
    return prefix + rest
  return os.path.normpath(os.path.join(base, path))


def absolute(path: str) -> str:
  """``os.path.abspath`` of a local path; a URI unchanged."""
  return path if is_remote(path) else os.path.abspath(path)


def exists(path: str) -> bool:
  if is_remote(path):
    return epath.Path(path).exists()
  return os.path.exists(path)


def isdir(path: str) -> bool:
  if is_remote(path):
    return epath.Path(path).is_dir()
  return os.path.isdir(path)


def listdir(path: str) -> list[str]:
  """The names in directory (or under prefix) ``path``."""
  if is_remote(path):
    return [p.name for p in epath.Path(path).iterdir()]
  return os.listdir(path)


def glob(path: str, pattern: str) -> list[str]:
  """The paths under directory (or prefix) ``path`` that match ``pattern``
  (``fnmatch`` rules per path component, e.g. ``"*/invocations.jsonl"``),
  sorted. One listing on an object store (``epath``'s glob), not one request
  per entry."""
  if is_remote(path):
    return sorted(os.fspath(p) for p in epath.Path(path).glob(pattern))
  import glob as glob_lib  # noqa: PLC0415

  return sorted(glob_lib.glob(os.path.join(glob_lib.escape(path), pattern)))


def makedirs(path: str) -> None:
  """Create directory ``path`` and its parents (no-op if present, or a URI)."""
  if not is_remote(path):
    os.makedirs(path, exist_ok=True)


def read_text(path: str) -> str:
  """The text of file ``path``; FileNotFoundError if it is missing."""
  if is_remote(path):
    p = epath.Path(path)
    if not p.exists():
      raise FileNotFoundError(f"no such object: {path!r}")
    return p.read_text()
  with open(path) as f:
    return f.read()


def write_atomic(path: str, text: str) -> None:
  """Replace file ``path`` by ``text`` so that a reader (or a kill) sees the
  old content or the new, never a part: tmp + fsync + rename locally, one
  object upload under a URI."""
  if is_remote(path):
    epath.Path(path).write_text(text)
    return
  tmp = f"{path}.tmp.{os.getpid()}"
  with open(tmp, "w") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def append_text(path: str, text: str) -> None:
  """Append ``text`` to local file ``path`` and fsync it; a URI is an error
  (object stores cannot append: rewrite the object with ``write_atomic``)."""
  if is_remote(path):
    raise ValueError(f"cannot append to object {path!r}: object stores have no append")
  with open(path, "a") as f:
    f.write(text)
    f.flush()
    os.fsync(f.fileno())


class _WholeObjectFile:
  """A file-like event file under a URI: written in memory, uploaded whole
  (one atomic object write) at every flush and at close."""

  def __init__(self, path: str):
    self.path = path
    self._buffer = io.BytesIO()

  def write(self, data: bytes) -> None:
    self._buffer.write(data)

  def flush(self) -> None:
    epath.Path(self.path).write_bytes(self._buffer.getvalue())

  def close(self) -> None:
    self.flush()


class _TensorBoardFactory:
  """A tensorboardX record-writer factory for URIs (``register_writer_factory``)."""

  def open(self, path: str) -> _WholeObjectFile:
    return _WholeObjectFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores have no directories


TENSORBOARD_FACTORY = _TensorBoardFactory()
