"""Batch-size recommendation: the N that reaches a target soonest in wall time.

    python -m cbs_jax.plan --run_dir=runs/default --accelerator=h100_sxm --chips=8
    python -m cbs_jax.plan --b_crit=2500 --s_min=29 --config=configs/default.py \\
        --accelerator=tpu_v5e --chips=4

The law (docs/batch_law.md, "The law"): to reach a fixed target,
  S(N) = S_min (1 + B / N)       generation rounds (optimizer steps on-policy)
  E(N) = N S(N) = E_min (1 + N / B),  E_min = S_min B    rollouts generated
with B = B_crit from a fit of S(N) over a sweep (``--b_crit``, optionally
``--s_min`` or ``--e_min``), or, when only a noise measurement is at hand
(``--run_dir``), B = B_noise as the estimate of B_crit. McCandlish et al.
(2018) predict B_crit ~ B_noise(simple) and found the simple noise scale an
upper-ish proxy (it can overstate B_crit by a factor of a few when the
Hessian is ill-conditioned); the output says which B was used.

The systems side (``cbs_jax.systems``): one round of N rollouts takes
round_time(N) seconds on ``chips`` x ``accelerator`` (roofline: prefill +
decode + update), so
  time-to-target(N) = S(N) * round_time(N)              [s]
  relative time      = time(N) / min_N' time(N')       (S_min cancels)
(``cbs_jax.time_optimal``: the one implementation of this rule, which the
adaptive controller shares)
The absolute time is reported only when S_min is known. A larger N pays
while its throughput gain, round_time(N) / N falling, outweighs the samples
penalty E(N) / E_min = 1 + N / B; the minimum sits where
d log round_time / d log N = B / (N + B).

Learning rate at each N: ``optim.lr * lr_scale(optim.lr_rule, N,
optim.ref_batch)`` (constant: 1, sqrt: sqrt(N / ref), linear: N / ref).

Inputs it reads: a run directory's noise record, preferring a fixed-
parameter ``measure_*.json`` (``python -m cbs_jax.measure``; its ``exact``
block, latest round) over the training tracker's pooled ``noise`` block in
``summary.json``; a record whose B_noise is not finite and positive (|G|^2
not resolved) is skipped, with its flag in the error if none is usable. The
model dims, optimizer and task come from ``--config`` or the run
directory's ``config.json`` (written by ``cbs_jax.main`` and ``cbs_jax.sweep``); prompt and
completion lengths from the task's layout (``rollouts.Layout``) unless given.
B_noise is measured at the run's K; the table keeps that K (P = N / K).
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from typing import Any, Mapping, Sequence

import ml_collections
import numpy as np

from cbs_jax import lr_rules
from cbs_jax import paths
from cbs_jax import probes
from cbs_jax import systems
from cbs_jax import time_optimal

SUMMARY = "summary.json"
MEASURE_GLOB = "measure_*.json"
_MEASURE_RE = re.compile(r"measure_round(\d+)_P(\d+)_K(\d+)\.json$")


# ----------------------------------------------------------------- inputs


def _finite_pos(x) -> bool:
  try:
    return x is not None and math.isfinite(float(x)) and float(x) > 0
  except (TypeError, ValueError):
    return False


def load_noise(run_dir: str) -> dict:
  """The best usable noise record of ``run_dir``: dict(b_noise, b_noise_se,
  b_noise_floor, K, source, kind, flag). A record with a resolved B_noise
  is preferred (measurements, latest round first, then the training
  summary); where none is resolved, the first with a one-sided bound
  B_noise >= b_noise_floor > 0 (b_noise None: ``recommend`` then plans for
  the worst B above the bound). Raises ValueError naming the directory,
  the files looked for and why each found record is unusable."""
  if not paths.isdir(run_dir):
    raise ValueError(f"run_dir {run_dir!r} is not a directory")
  looked = f"{SUMMARY} (its 'noise' block) and {MEASURE_GLOB} (from python -m cbs_jax.measure)"
  candidates, rejected = [], []

  def _rank(path):
    m = _MEASURE_RE.search(os.path.basename(path))
    return (int(m.group(1)) if m else -1, path)

  for path in sorted(paths.glob(run_dir, MEASURE_GLOB), key=_rank, reverse=True):
    try:
      rec = json.loads(paths.read_text(path))
      ex = rec["exact"]
      candidates.append(
          dict(
              b_noise=ex.get("b_noise"),
              b_noise_se=ex.get("b_noise_se"),
              b_noise_floor=ex.get("b_noise_floor"),
              K=rec.get("K", ex.get("K")),
              P=rec.get("P"),
              M=rec.get("M"),
              flag=ex.get("flag", ""),
              source=path,
              kind="fixed-parameter measurement (cbs_jax.measure, exact)",
          )
      )
    except (OSError, ValueError, KeyError, TypeError) as e:
      rejected.append(f"{path}: unreadable ({type(e).__name__}: {e})")
  spath = paths.join(run_dir, SUMMARY)
  if paths.exists(spath):
    try:
      summary = json.loads(paths.read_text(spath))
      nz = summary.get("noise")
      if nz is None:
        rejected.append(f"{spath}: no 'noise' block (split tracker off or < 2 rounds)")
      else:
        candidates.append(
            dict(
                b_noise=nz.get("b_noise"),
                b_noise_se=nz.get("b_noise_se"),
                b_noise_floor=nz.get("b_noise_floor"),
                K=nz.get("K"),
                rounds_pooled=nz.get("rounds_pooled"),
                flag=nz.get("flag", ""),
                source=spath,
                kind="training tracker, pooled split estimates (summary.json)",
            )
        )
    except (OSError, ValueError, AttributeError) as e:
      rejected.append(f"{spath}: unreadable ({type(e).__name__}: {e})")
  for c in candidates:
    if _finite_pos(c["b_noise"]):
      c["b_noise"] = float(c["b_noise"])
      c["b_noise_se"] = float(c["b_noise_se"]) if c.get("b_noise_se") is not None else None
      return c
  for c in candidates:  # none resolved: the first with a one-sided bound B_noise >= floor > 0
    if _finite_pos(c.get("b_noise_floor")):
      return dict(c, b_noise=None, b_noise_se=None, b_noise_floor=float(c["b_noise_floor"]))
    floor = c.get("b_noise_floor")
    rejected.append(
        f"{c['source']}: b_noise={c['b_noise']!r} not finite and positive"
        + (f" (flag: {c['flag']})" if c.get("flag") else "")
        + ("" if floor is None else f" and its lower bound b_noise_floor={floor!r} is not > 0")
    )
  if not candidates and not rejected:
    raise ValueError(f"run_dir {run_dir!r} holds no noise record: looked for {looked}")
  raise ValueError(
      f"run_dir {run_dir!r} has no usable noise record (looked for {looked}): "
      + "; ".join(rejected)
  )


def load_run_config(run_dir: str) -> ml_collections.ConfigDict | None:
  """``run_dir/config.json`` as a ConfigDict, or None when absent."""
  path = paths.join(run_dir, "config.json")
  if not paths.exists(path):
    return None
  return ml_collections.ConfigDict(json.loads(paths.read_text(path)))


def task_lengths(config) -> tuple[int, int, int]:
  """(prompt_len, completion_len, vocab_size) of the config's task, as
  training lays it out (``rollouts.Layout.for_task``)."""
  from cbs_jax import rollouts
  from cbs_jax import tasks

  kw = config.task.get("kwargs", {})
  kw = kw.to_dict() if hasattr(kw, "to_dict") else dict(kw)
  task = tasks.make_task(config.task.name, **kw)
  max_new = config.get("sampling", {}).get("max_new_tokens", 0) or 0
  layout = rollouts.Layout.for_task(task, max_new)
  return layout.prompt_len, layout.completion_len, tasks.make_tokenizer(task).vocab_size


def _normalise_b(noise_or_fit: Mapping[str, Any]) -> dict:
  """{b, b_se, s_min, K, source, is_fit} from a fit or a noise record."""
  if not isinstance(noise_or_fit, Mapping):
    raise ValueError(
        f"noise_or_fit must be a mapping with b_crit (a fit) or b_noise "
        f"(a noise record), got {type(noise_or_fit).__name__}"
    )
  d = {str(k).lower(): v for k, v in noise_or_fit.items()}
  s_min, e_min = d.get("s_min"), d.get("e_min")
  for name, v in (("s_min", s_min), ("e_min", e_min)):
    if v is not None and not _finite_pos(v):
      raise ValueError(f"{name}={v!r} must be a positive finite number")
  b = d.get("b_crit")
  if b is None and s_min is not None and e_min is not None:
    b = float(e_min) / float(s_min)
  if b is not None:
    if not _finite_pos(b):
      raise ValueError(f"b_crit={b!r} must be a positive finite number (rollouts)")
    b = float(b)
    if s_min is None and e_min is not None:
      s_min = float(e_min) / b
    return dict(
        b=b,
        b_se=d.get("b_crit_se"),
        s_min=None if s_min is None else float(s_min),
        K=d.get("k"),
        is_fit=True,
        source=d.get("source", "fit of S(N) = S_min (1 + B_crit / N)"),
    )
  if "b_noise" in d:
    common = dict(
        s_min=None if s_min is None else float(s_min),
        K=d.get("k"),
        is_fit=False,
        source=d.get("source", "noise record"),
    )
    if _finite_pos(d["b_noise"]):
      se = d.get("b_noise_se")
      return dict(common, b=float(d["b_noise"]), b_se=float(se) if _finite_pos(se) else None)
    if _finite_pos(d.get("b_noise_floor")):  # unresolved, bounded below
      return dict(common, b=None, b_se=None, b_floor=float(d["b_noise_floor"]))
    raise ValueError(
        f"b_noise={d['b_noise']!r} must be a positive finite number (rollouts), or "
        f"b_noise_floor (a lower bound) one; got b_noise_floor={d.get('b_noise_floor')!r}"
        + (f"; flag: {d['flag']}" if d.get("flag") else "")
    )
  raise ValueError(f"noise_or_fit has neither b_crit nor b_noise; keys: {sorted(d)}")


def powers_of_two(min_n: int, max_n: int) -> list[int]:
  for name, v in (("min_n", min_n), ("max_n", max_n)):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
      raise ValueError(f"{name} must be a positive integer, got {v!r}")
  if min_n > max_n:
    raise ValueError(f"min_n={min_n} > max_n={max_n}")
  lo = 1 << max(0, math.ceil(math.log2(min_n)))
  ns = []
  while lo <= max_n:
    ns.append(lo)
    lo *= 2
  if not ns:
    raise ValueError(f"no power of two in [min_n={min_n}, max_n={max_n}]")
  return ns


# ----------------------------------------------------------------- the plan


def recommend(
    noise_or_fit: Mapping[str, Any],
    accelerator: Any,
    chips: int,
    model_cfg: Any,
    prompt_len: int,
    completion_len: int,
    *,
    optim: Any = None,
    ns: Sequence[int] | None = None,
    min_n: int = 16,
    max_n: int = 65536,
    parallel: str = "data",
    mfu: float = 1.0,
    epochs: int = 1,
    extra_forwards: int = 0,
    full_cache: bool = False,
    overheads: Any = "documented",
) -> dict:
  """Predicted time-to-target over N and the N that minimises it.

  Args:
    noise_or_fit: a fit {b_crit, [s_min | e_min], [b_crit_se]} or a noise
      record {b_noise, [b_noise_se], [K], ...} (``load_noise``); keys are
      case-insensitive (``batch_law.fit_critical_batch``'s S_min/B_crit work).
    accelerator: a ``systems`` registry name or an ``Accelerator``.
    chips: chip count (> 0), see ``systems`` for how it scales.
    model_cfg: a cbs_jax model config or ``systems.ModelDims``.
    prompt_len, completion_len: Tp, Tc tokens per rollout.
    optim: config with lr, lr_rule, ref_batch (None: no lr column).
    ns: the batch sizes (rollouts) to tabulate; default powers of two in
      [min_n, max_n].
    parallel, mfu, epochs, extra_forwards, full_cache: ``systems.round_time``.
    overheads: a ``systems.Overheads`` (e.g. ``floors.calibrate``'s for this
      machine), "documented" (``systems.documented_overheads``: the public
      floors of a named GPU, none elsewhere) or None (the bare roofline).

  A noise record whose B_noise is not resolved but bounded below
  ({b_noise: None or nan, b_noise_floor > 0}, ``load_noise``) is planned
  for the worst B above the bound: the rows are evaluated at B = floor,
  each with its ``worst`` slowdown over every B >= floor
  (``time_optimal.worst_slowdowns``), and the recommendation is the N with
  the least (``time_optimal.minimax_n``, as the adaptive controller
  starts).

  Returns a dict: b (None when only bounded), b_se, b_floor (None unless
  only bounded), b_is_fit, b_source, K, s_min, accelerator, chips, dims,
  rows (one per N: n, p, s_rel = S/S_min, e_rel = E/E_min, round_s, gen_s,
  train_s, rollouts_per_s, time_rel, time_s (None without S_min), worst
  (None unless only bounded), lr, decode_bound), best (the row with least
  time, or least worst slowdown), n_range_2se (argmin at B -+ 2 SE when the
  SE is known; argmin at B = floor and as B -> inf when only bounded),
  reasoning (lines of text).
  """
  info = _normalise_b(noise_or_fit)
  acc = probes.accelerator(accelerator)
  chips = systems.check_chips(chips)
  dims = systems.ModelDims.from_config(model_cfg)
  ns = powers_of_two(min_n, max_n) if ns is None else [int(n) for n in ns]
  if not ns or any(n <= 0 for n in ns):
    raise ValueError(f"ns must be positive batch sizes, got {ns!r}")
  b, K = info["b"], info["K"]
  K = int(K) if K else None
  if isinstance(overheads, str):
    if overheads != "documented":
      raise ValueError(f"overheads={overheads!r}: an Overheads, 'documented' or None")
    overheads = systems.documented_overheads(dims, acc)  # None where no figure is documented
  lr_of = None
  if optim is not None:
    lr0, rule, ref = optim["lr"], optim.get("lr_rule", "sqrt"), optim.get("ref_batch", 256)
    lr_of = lambda n: lr0 * lr_rules.lr_scale(rule, n, ref)

  costs = [
      systems.round_time(
          dims,
          acc,
          n,
          prompt_len,
          completion_len,
          chips=chips,
          parallel=parallel,
          mfu=mfu,
          epochs=epochs,
          extra_forwards=extra_forwards,
          full_cache=full_cache,
          overheads=overheads,
      )
      for n in ns
  ]
  round_of = dict(zip(ns, (c.total_s for c in costs))).__getitem__
  b_floor = info.get("b_floor")
  # only a lower bound on B: rows at the bound, and the choice for the worst B above it
  worst = None if b is not None else time_optimal.worst_slowdowns(ns, b_floor, round_of)
  b_rows = b if b is not None else b_floor
  times = [time_optimal.relative_time(n, b_rows, round_of(n)) for n in ns]  # / S_min
  t_best = min(times)
  rows = []
  for n, c, t in zip(ns, costs, times):
    rows.append(
        dict(
            n=n,
            p=(n // K if K and n % K == 0 else None),
            s_rel=1.0 + b_rows / n,
            e_rel=1.0 + n / b_rows,
            round_s=c.total_s,
            gen_s=c.gen_s,
            train_s=c.train_s,
            rollouts_per_s=c.rollouts_per_s,
            time_rel=t / t_best,
            time_s=None if info["s_min"] is None else info["s_min"] * t,
            worst=None if worst is None else worst[n],
            lr=None if lr_of is None else lr_of(n),
            waves=c.waves,
            decode_bound=(
                "compute"
                if c.decode_compute_steps == c.decode_steps
                else "memory"
                if c.decode_compute_steps == 0
                else "mixed"
            ),
        )
    )
  if worst is None:
    best = rows[ns.index(time_optimal.best_n(ns, b, round_of))]
  else:
    best = rows[ns.index(time_optimal.minimax_n(ns, b_floor, round_of))]

  n_range = None
  if worst is not None:  # the optimum over B in [floor, inf)
    n_range = (
        time_optimal.best_n(ns, b_floor, round_of),
        time_optimal.best_n(ns, math.inf, round_of),
    )
  elif info["b_se"]:
    lo_b = b - 2 * info["b_se"]
    n_lo = time_optimal.best_n(ns, lo_b, round_of) if lo_b > 0 else ns[0]
    n_range = (n_lo, time_optimal.best_n(ns, b + 2 * info["b_se"], round_of))

  out = dict(
      b=b,
      b_se=info["b_se"],
      b_floor=b_floor,
      b_is_fit=info["is_fit"],
      b_source=info["source"],
      K=K,
      s_min=info["s_min"],
      accelerator=acc.name,
      accelerator_desc=systems.describe(acc, chips),
      chips=chips,
      parallel=parallel,
      mfu=mfu,
      prompt_len=prompt_len,
      completion_len=completion_len,
      dims=dict(systems.dims_summary(dims)),
      rows=rows,
      best=best,
      n_range_2se=n_range,
      overheads=None if overheads is None else overheads.as_dict(),
  )
  out["reasoning"] = _reasoning(out, dims, acc, chips, parallel, prompt_len, completion_len)
  return out


def _reasoning(res, dims, acc, chips, parallel, Tp, Tc) -> list[str]:
  rows, best, b = res["rows"], res["best"], res["b"]
  floor = res.get("b_floor")
  lines = []
  if res["b_is_fit"]:
    lines.append(f"B = B_crit = {b:.4g} rollouts from {res['b_source']}.")
  elif b is None:
    b = floor
    lines.append(
        f"B_noise is not resolved in {res['b_source']} (|G|^2 within 2 SE of 0); its "
        f"one-sided 2-SE bound is B_noise >= {floor:.4g} rollouts. The table is at that "
        "bound; the recommendation is the N whose time to target is the least multiple "
        "of the best N's at the worst B >= the bound (column 'worst'). Resolve B with "
        "python -m cbs_jax.measure at a checkpoint, or fit B_crit from a sweep (--b_crit)."
    )
  else:
    lines.append(
        f"B = B_noise = {b:.4g} rollouts"
        + (f" (+-{res['b_se']:.2g})" if res["b_se"] else "")
        + f" used as the estimate of B_crit (from {res['b_source']}); "
        "B_noise is an upper-ish proxy (McCandlish et al. 2018), so a fitted "
        "B_crit may put the optimum lower."
    )
  rps = np.array([r["rollouts_per_s"] for r in rows])
  i90 = int(np.argmax(rps >= 0.9 * rps.max()))
  ctx = Tp + (Tc + 1) / 2
  bstar = systems.crossover_batch(dims, acc, ctx, chips, parallel)
  cross = (
      "memory-bound at every batch (KV-cache reads dominate)"
      if math.isinf(bstar)
      else f"compute-bound above ~{bstar:.3g} sequences"
  )
  lines.append(
      f"Throughput: {rps[0]:.4g} rollouts/s at N={rows[0]['n']} rising to "
      f"{rps.max():.4g}; it reaches 90% of that at N={rows[i90]['n']} (decode at "
      f"the mean context {ctx:g} is {cross}; the update is compute-bound)."
  )
  lines.append(
      f"Samples: E/E_min = 1 + N/B, x2 at N = B = {b:.4g}"
      + (" (at the bound)" if floor is not None else "")
      + "; beyond it each "
      "doubling of N nearly doubles the rollouts to target and saves less than a "
      "third of the rounds."
  )
  k = rows.index(best)
  why = []
  if floor is not None:  # minimax: the neighbours' worst slowdowns
    why = [
        f"N={r['n']} would be up to x{r['worst']:.3f} slower"
        for r in rows[max(k - 1, 0) : k + 2]
        if r is not best
    ]
  if floor is None and k + 1 < len(rows):
    up = rows[k + 1]
    why.append(
        f"doubling to N={up['n']} cuts rounds x{up['s_rel'] / best['s_rel']:.3f} "
        f"but lengthens each round x{up['round_s'] / best['round_s']:.3f}"
    )
  if floor is None and k > 0:
    dn = rows[k - 1]
    why.append(
        f"halving to N={dn['n']} shortens rounds x{dn['round_s'] / best['round_s']:.3f} "
        f"but needs x{dn['s_rel'] / best['s_rel']:.3f} the rounds"
    )
  lr = "" if best["lr"] is None else f", lr {best['lr']:.3g}"
  lines.append(
      f"Recommended N = {best['n']}"
      + (f" (P = {best['p']} prompts x K = {res['K']})" if best["p"] else "")
      + f"{lr}: "
      + ("; ".join(why) or "the only N")
      + "."
  )
  if k in (0, len(rows) - 1) and len(rows) > 1:
    lines.append("The optimum is at the edge of the table: widen --min_n/--max_n.")
  if res["n_range_2se"] and floor is not None:
    lo, hi = res["n_range_2se"]
    lines.append(
        f"For B from the bound to infinity the optimum moves over N = {lo} .. {hi}; "
        f"N = {best['n']} is within x{best['worst']:.3f} of it at every such B."
    )
  elif res["n_range_2se"]:
    lo, hi = res["n_range_2se"]
    lines.append(f"With B at -2 SE .. +2 SE the optimum moves over N = {lo} .. {hi}.")
  if res["s_min"] is not None:
    lines.append(
        f"Predicted time to target at N={best['n']}: {best['time_s']:.4g} s "
        f"(S_min = {res['s_min']:.4g} rounds; roofline, so a lower bound)."
    )
  else:
    lines.append(
        "S_min unknown: times are relative to the best N (S_min cancels in the " "argmin)."
    )
  return lines


def format_report(res: dict) -> str:
  head = [
      f"accelerator: {res['accelerator_desc']}, parallel={res['parallel']}, "
      f"update mfu={res['mfu']}",
      f"model: {res['dims']['params']} params ({res['dims']['active_params']} active); "
      f"prompt {res['prompt_len']} + completion {res['completion_len']} tokens",
      (
          f"B >= {res['b_floor']:.4g} rollouts (B_noise unresolved: its one-sided 2-SE bound)"
          if res["b"] is None
          else f"B = {res['b']:.4g} rollouts "
          f"({'B_crit fit' if res['b_is_fit'] else 'B_noise as B_crit'})"
      ),
      "latency floors: "
      + (
          "none (the bare roofline, a lower bound on time)"
          if not res.get("overheads")
          else res["overheads"]["source"]
      ),
  ]
  bounded = res["b"] is None
  cols = ["N", "P", "S/S_min", "E/E_min", "rollouts/s", "round_s", "rel_time"]
  if res["s_min"] is not None:
    cols.append("time_s")
  if bounded:
    cols.append("worst")
  cols += ["lr", "decode"]
  lines = head + ["", "".join(f"{c:>12}" for c in cols)]
  for r in res["rows"]:
    vals = [
        f"{r['n']}",
        "-" if r["p"] is None else f"{r['p']}",
        f"{r['s_rel']:.4f}",
        f"{r['e_rel']:.4f}",
        f"{r['rollouts_per_s']:.4g}",
        f"{r['round_s']:.3g}",
        f"{r['time_rel']:.4f}",
    ]
    if res["s_min"] is not None:
      vals.append(f"{r['time_s']:.4g}")
    if bounded:
      vals.append(f"{r['worst']:.4f}")
    vals += ["-" if r["lr"] is None else f"{r['lr']:.3g}", r["decode_bound"]]
    mark = "  <- best" if r is res["best"] else ""
    lines.append("".join(f"{v:>12}" for v in vals) + mark)
  lr = "" if res["best"]["lr"] is None else f" lr={res['best']['lr']:.4g}"
  lines += ["", f"recommended: N={res['best']['n']}{lr}"] + [f"  {s}" for s in res["reasoning"]]
  return "\n".join(lines)


# ----------------------------------------------------------------- CLI


def _define_flags():
  from absl import flags
  from ml_collections import config_flags

  config_flags.DEFINE_config_file(
      "config",
      None,
      "Config of the run (model dims, optimizer, " "task); default: the run_dir's config.json.",
  )
  flags.DEFINE_string("run_dir", None, "Run directory with summary.json and/or measure_*.json.")
  flags.DEFINE_float("b_crit", None, "Fitted B_crit (rollouts), instead of a run_dir's B_noise.")
  flags.DEFINE_float("s_min", None, "Fitted S_min (rounds): gives absolute times.")
  flags.DEFINE_float("e_min", None, "Fitted E_min (rollouts); S_min = E_min / B_crit.")
  flags.DEFINE_string(
      "accelerator",
      "cpu",
      "One of: " + ", ".join(systems.known_accelerators()) + " (cpu is measured on this machine).",
  )
  flags.DEFINE_integer("chips", 1, "Number of chips.")
  flags.DEFINE_enum("parallel", "data", list(systems.PARALLEL), "How chips share the work.")
  flags.DEFINE_integer("min_n", 16, "Smallest N (rollouts) tabulated (powers of two).")
  flags.DEFINE_integer("max_n", 65536, "Largest N tabulated.")
  flags.DEFINE_integer("prompt_len", 0, "Prompt tokens Tp (0: from the config's task).")
  flags.DEFINE_integer("completion_len", 0, "Completion tokens Tc (0: from the config's task).")
  flags.DEFINE_float("mfu", 1.0, "Utilisation of the update (1.0 = roofline bound).")
  flags.DEFINE_enum(
      "floors",
      "documented",
      ["documented", "calibrate", "none"],
      "Latency floors: a named GPU's documented ones (documented), this machine's measured "
      "with the config's model (calibrate: cbs_jax.floors, ~20 s), or the bare roofline.",
  )
  flags.DEFINE_string("json_out", None, "Also write the result as JSON here.")


def plan_from_flags(F) -> dict:
  run_cfg = load_run_config(F.run_dir) if F.run_dir and paths.isdir(F.run_dir) else None
  if F.b_crit is not None:
    rec = dict(b_crit=F.b_crit, s_min=F.s_min, e_min=F.e_min, source="--b_crit")
  elif F.run_dir:
    rec = load_noise(F.run_dir)
    if F.s_min is not None:
      rec["s_min"] = F.s_min
  else:
    raise ValueError("give --run_dir (a run directory with a noise record) or --b_crit")
  config = F.config if F.config is not None else run_cfg
  if config is None:
    raise ValueError(
        "no model dims: pass --config=configs/... or a --run_dir holding " "config.json"
    )
  config = ml_collections.ConfigDict(config.to_dict())
  Tp, Tc = F.prompt_len, F.completion_len
  if not (Tp and Tc):
    try:
      tp, tc, vocab = task_lengths(config)
    except (ValueError, KeyError, AttributeError, TypeError) as e:
      raise ValueError(
          f"cannot lay out the config's task ({e}); pass --prompt_len and " "--completion_len"
      ) from None
    Tp, Tc = Tp or tp, Tc or tc
    config.model.vocab_size = vocab  # what training sets from the tokenizer
  rl = config.get("rl", {})
  extra = int(bool(rl.get("kl_beta", 0.0))) + int(rl.get("advantage", "") == "gae")
  epochs = int(config.get("batch", {}).get("num_epochs", 1))
  K = rec.get("K") or config.get("batch", {}).get("rollouts_per_prompt")
  rec = dict(rec, K=K)
  floors_flag = getattr(F, "floors", "documented")  # a caller's namespace may predate --floors
  overheads = {"documented": "documented", "none": None}.get(floors_flag)
  if floors_flag == "calibrate":
    from cbs_jax import floors  # pylint: disable=import-outside-toplevel

    if systems.accelerator_key(F.accelerator) != "cpu":
      raise ValueError("--floors=calibrate measures this machine: use --accelerator=cpu")
    overheads, _ = floors.calibrate(config)
  return recommend(
      rec,
      F.accelerator,
      F.chips,
      config.model,
      Tp,
      Tc,
      optim=config.get("optim"),
      min_n=F.min_n,
      max_n=F.max_n,
      parallel=F.parallel,
      mfu=F.mfu,
      epochs=epochs,
      extra_forwards=extra,
      overheads=overheads,
  )


def main(argv):
  from absl import flags

  if len(argv) > 1:
    print(f"plan: error: unexpected arguments {argv[1:]}", file=sys.stderr)
    return 2
  F = flags.FLAGS
  try:
    res = plan_from_flags(F)
  except ValueError as e:
    print(f"plan: error: {e}", file=sys.stderr)
    return 1
  print(format_report(res))
  if F.json_out:
    paths.write_atomic(F.json_out, json.dumps(res, indent=1, default=float))
    print(f"wrote {F.json_out}")
  return 0


if __name__ == "__main__":
  from absl import app

  _define_flags()
  app.run(main)
