"""Where a compiled call's time goes: its wall time by kind of XLA op, from a
JAX profiler trace.

``profile(fn, calls)`` runs ``fn()`` (warm it up first: compilation would be
traced too) ``calls`` times under ``jax.profiler.trace`` with a Perfetto trace,
and ``attribute`` splits the traced time among the ops that ran:

* an op's *kind* is its name without the instance number XLA appends
  (``dot.1240`` -> ``dot``, ``ynn_fusion.121`` -> ``ynn_fusion``);
* on an accelerator only the device's events count (its kernels), on a CPU
  the host threads' where XLA runs the ops, not those that run Python;
* the runtime's own events are left out: Python frames (``$...``), end
  markers (``end: ...``), C++ runtime scopes (names with ``::``: thread-pool
  waits, the thunk executor), the jit entry (``PjitFunction(...)``) and
  control flow whose body ops are traced themselves (``while``,
  ``conditional``, ``call``);
* every instant is shared equally among the ops running then, on any thread,
  so that an op split across threads is counted once, two ops side by side
  each get half, and the kinds' times add up to the time some op ran
  (``busy``); what the calls' wall time holds beyond that (dispatch, host
  work, waits) is ``idle``.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile
import time

import jax

_CONTROL = ("while", "conditional", "call")


def kind(name: str) -> str | None:
  """The op kind of a trace event's name, or None for the runtime's events."""
  if name.startswith(("$", "end: ", "PjitFunction(")) or "::" in name:
    return None
  k = re.sub(r"(\.\d+)+$", "", name)
  return None if k in _CONTROL else k


def attribute(events) -> dict:
  """``{kind: seconds}`` from ``(start_s, end_s, kind)`` intervals: each
  instant shared equally among the intervals covering it."""
  edges = sorted({t for s, e, _ in events for t in (s, e)})
  if not edges:
    return {}
  opening = collections.defaultdict(list)
  closing = collections.defaultdict(list)
  for s, e, k in events:
    if e > s:
      opening[s].append(k)
      closing[e].append(k)
  active: collections.Counter = collections.Counter()
  out: collections.Counter = collections.Counter()
  for t0, t1 in zip(edges, edges[1:]):
    active.subtract(closing[t0])
    active.update(opening[t0])
    n = sum(active.values())
    if n:
      for k, c in active.items():
        if c:
          out[k] += (t1 - t0) * c / n
  return dict(out)


def trace_events(path: str):
  """``(start_s, end_s, kind)`` of every op event in a Perfetto JSON trace.
  Where the trace has device processes (``/device:GPU:0``, ``/device:TPU:0``:
  what an accelerator ran), only their events count, not the host's
  launches, and of those, where a device has an "XLA Ops" line, only that
  line (its other lines repeat the same time as kernels per stream, or as
  whole programs: "XLA Modules"); on a CPU the ops run on host threads and
  every process counts."""
  with gzip.open(path) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  meta = lambda what: {
      (e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", ""))
      for e in events
      if e.get("ph") == "M" and e.get("name") == what
  }
  devices = {pid for (pid, _), name in meta("process_name").items() if name.startswith("/device:")}
  lines = {key: name for key, name in meta("thread_name").items() if key[0] in devices}
  op_lines = {key for key, name in lines.items() if name == "XLA Ops"}
  skip_lines = {key for key, name in lines.items() if name == "XLA Modules"}
  # threads that run Python (their frames are "$..." events): what they
  # record (e.g. ``np.asarray(jax.Array)`` around a wait) is the caller's, not an op
  python = {
      (e.get("pid"), e.get("tid"))
      for e in events
      if e.get("ph") == "X" and str(e.get("name", "")).startswith("$")
  }
  out = []
  for e in events:
    line = (e.get("pid"), e.get("tid"))
    if devices and line[0] not in devices or line in python or line in skip_lines:
      continue
    if op_lines and line not in op_lines:
      continue
    k = kind(e.get("name", "")) if e.get("ph") == "X" else None
    if k is not None:
      t = float(e["ts"]) * 1e-6
      out.append((t, t + float(e.get("dur", 0.0)) * 1e-6, k))
  return out


def profile(fn, calls: int = 2) -> dict:
  """Trace ``calls`` calls of ``fn()`` (already compiled and warm) and return
  ``wall_s`` (per call, timed around each call), ``busy_s`` / ``idle_s``
  per call and ``kinds``: ``{kind: seconds per call}``, largest first."""
  with tempfile.TemporaryDirectory() as d:
    walls = []
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(calls):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        walls.append(time.perf_counter() - t)
    (path,) = glob.glob(os.path.join(d, "**", "perfetto_trace.json.gz"), recursive=True)
    by_kind = attribute(trace_events(path))
  wall = sum(walls) / calls
  kinds = {k: v / calls for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}
  busy = sum(kinds.values())
  return dict(wall_s=wall, busy_s=busy, idle_s=max(wall - busy, 0.0), kinds=kinds)


def format_table(prof: dict, top: int = 8) -> str:
  """The ``top`` kinds and the rest as lines of milliseconds per call and
  share of the wall time."""
  wall = prof["wall_s"]
  items = list(prof["kinds"].items())
  rows = items[:top]
  rest = sum(v for _, v in items[top:])
  if rest:
    rows.append(("(other kinds)", rest))
  rows.append(("(idle: no op running)", prof["idle_s"]))
  width = max(len(k) for k, _ in rows)
  lines = [f"  {'op kind':<{width}} {'ms/call':>9} {'share':>6}"]
  lines += [f"  {k:<{width}} {v * 1e3:9.2f} {v / wall:6.1%}" for k, v in rows]
  return "\n".join(lines)
