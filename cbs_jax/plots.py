"""Figures shared by the experiments and the Colab tour.

Every function takes plain numbers (lists, numpy arrays, dicts -- never a
trainer object) and returns a ``matplotlib.figure.Figure``; ``save(fig,
path)`` writes it as a PNG and closes it. Figures are built with the
object-oriented API (``matplotlib.figure.Figure``), so nothing here touches
pyplot's global state or needs a display: it is safe under the Agg backend,
in tests, in subprocesses and in notebooks.

Readable in black and white: series differ by marker *and* line style, not
by colour alone (colours are the Okabe-Ito palette, which also survives
colour blindness); interval bands are light fills edged by thin dotted
lines. Every axis is labelled with its unit (rollouts, optimizer steps,
generation rounds, prompts, fraction).

    from cbs_jax import plots
    fig = plots.learning_curves([dict(label="N=256", rollouts=r, steps=s, value=v)],
                                target=0.55)
    plots.save(fig, "experiments/results/x/x.png")
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Sequence

import numpy as np
from matplotlib import ticker, transforms
from matplotlib.figure import Figure

from cbs_jax import rounding

# Okabe-Ito, black first; markers and dash patterns carry the distinction in grey.
COLORS = ("#000000", "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "<", ">")
LINESTYLES = ("-", "--", "-.", ":", (0, (5, 1, 1, 1, 1, 1)), (0, (1, 1)), (0, (8, 2)))
DPI = 120
BAND_ALPHA = 0.18


def style(i: int, n: int | None = None) -> dict:
  """Colour, marker and line style of the ``i``-th of ``n`` series (distinct
  in grey). Up to ``len(COLORS)`` series take the Okabe-Ito palette; more
  (a batch sweep's nine N) take a sequential map (viridis) in series
  order, so that no two share a colour and the order reads as a gradient
  (give the series sorted, e.g. by N)."""
  if n is not None and n > len(COLORS):
    from matplotlib import colormaps  # noqa: PLC0415

    color = colormaps["viridis"](0.92 * i / (n - 1))
  else:
    color = COLORS[i % len(COLORS)]
  return dict(
      color=color,
      marker=MARKERS[i % len(MARKERS)],
      linestyle=LINESTYLES[i % len(LINESTYLES)],
  )


def _arr(x) -> np.ndarray:
  return (
      np.array([np.nan if v is None else v for v in np.ravel(np.asarray(x, object))], np.float64)
      if x is not None
      else None
  )


def _markevery(n: int) -> int:
  return max(1, n // 12)


def _new(ncols: int = 1, nrows: int = 1, size=(5.2, 3.8), sharex=False):
  fig = Figure(figsize=(size[0] * ncols, size[1] * nrows), layout="constrained")
  axes = fig.subplots(nrows, ncols, squeeze=False, sharex=sharex)
  return fig, axes.ravel()


def _band(ax, x, lo, hi, color, label=None):
  x, lo, hi = _arr(x), _arr(lo), _arr(hi)
  ok = np.isfinite(x) & np.isfinite(lo) & np.isfinite(hi)
  if not ok.any():
    return
  ax.fill_between(x[ok], lo[ok], hi[ok], color=color, alpha=BAND_ALPHA, linewidth=0, label=label)
  for edge in (lo, hi):
    ax.plot(x[ok], edge[ok], color=color, linewidth=0.6, linestyle=":")


def _targets(ax, target):
  if target is None:
    return
  for j, t in enumerate(np.atleast_1d(np.asarray(target, np.float64))):
    ax.axhline(
        t,
        color="0.3",
        linewidth=0.9,
        linestyle=(0, (4, 2)) if j == 0 else ":",
        label=f"target {t:g}",
        zorder=0,
    )


def _legend(ax, **kw):
  handles, labels = ax.get_legend_handles_labels()
  if handles:
    ax.legend(fontsize=7, frameon=False, **kw)


def _log(ax, axis: str, base: float = 10) -> None:
  """A log scale on ``axis`` ("x" or "y") where that axis holds positive
  data; an axis with none (every run failed to reach, say) stays linear,
  where matplotlib's log locator would raise on save."""
  lim = ax.dataLim
  if np.isfinite(lim.minposx if axis == "x" else lim.minposy):
    (ax.set_xscale if axis == "x" else ax.set_yscale)("log", base=base)


def _log_ok(*arrays) -> bool:
  v = np.concatenate([np.ravel(_arr(a)) for a in arrays if a is not None])
  v = v[np.isfinite(v)]
  return v.size > 0 and bool(np.all(v > 0))


def learning_curves(
    curves: Sequence[Mapping[str, Any]],
    target=None,
    title: str | None = None,
    ylabel: str = "held-out pass rate (exact expected, fraction)",
    step_label: str = "optimizer steps",
    logx: bool = False,
) -> Figure:
  """Value against rollouts (left) and against steps (right).

  ``curves``: dicts ``dict(label=..., rollouts=[...], steps=[...],
  value=[...], lo=None|[...], hi=None|[...])``; ``lo``/``hi`` draw an
  interval band (e.g. across seeds). A curve without ``rollouts`` or
  ``steps`` is left out of that panel. ``target``: a float or a list of
  floats drawn as horizontal lines. ``step_label`` names the right panel's
  unit ("optimizer steps", or "generation rounds" off-policy); ``logx``
  puts both x axes on a log scale (curves of a batch sweep span decades).
  """
  fig, (ax_r, ax_s) = _new(2)
  for i, c in enumerate(curves):
    st = style(i, len(curves))
    v = _arr(c["value"])
    for ax, key in ((ax_r, "rollouts"), (ax_s, "steps")):
      if c.get(key) is None:
        continue
      x = _arr(c[key])
      if x.shape != v.shape:
        raise ValueError(f"curve {c.get('label')!r}: {key} has {x.size} points, value {v.size}")
      if c.get("lo") is not None and c.get("hi") is not None:
        _band(ax, x, c["lo"], c["hi"], st["color"])
      ax.plot(
          x,
          v,
          label=str(c.get("label", f"curve {i}")),
          markevery=_markevery(v.size),
          markersize=4,
          linewidth=1.3,
          **st,
      )
  for ax, xl in ((ax_r, "rollouts generated (rollouts)"), (ax_s, f"{step_label} (count)")):
    _targets(ax, target)
    ax.set_xlabel(xl)
    ax.set_ylabel(ylabel)
    if logx:
      _log(ax, "x")
    ax.grid(True, which="major", linewidth=0.3, color="0.8")
  ax_r.set_title("by rollouts", fontsize=9)
  ax_s.set_title(f"by {step_label}", fontsize=9)
  _legend(ax_s, loc="best")
  if title:
    fig.suptitle(title)
  return fig


def _points(points) -> dict:
  """(N, S, E, seed) arrays from a list of dicts or a dict of lists; E
  defaults to N * S (rollouts per step times steps)."""
  if isinstance(points, Mapping):
    cols = {k: list(v) for k, v in points.items()}
  else:
    points = list(points)
    cols = {k: [p.get(k) for p in points] for k in ("N", "S", "E", "seed")}
  N, S = _arr(cols["N"]), _arr(cols["S"])
  E = (
      _arr(cols["E"])
      if cols.get("E") is not None and any(e is not None for e in cols["E"])
      else N * S
  )
  seed = cols.get("seed") or [None] * N.size
  if not (N.size == S.size == E.size == len(seed)):
    raise ValueError("points need as many N, S, E and seed values")
  return dict(N=N, S=S, E=E, seed=list(seed))


def _n_label(n: float) -> str:
  return f"N={int(n)}" if float(n).is_integer() else f"N={n:g}"


def hyperbola(fit: Mapping[str, Any], t) -> tuple[np.ndarray, np.ndarray]:
  """Points (S, E) on (S/S_min - 1)(E/E_min - 1) = 1 at parameter
  ``t`` = B_crit / N: S = S_min (1 + t), E = E_min (1 + 1/t)."""
  t = np.asarray(t, np.float64)
  return fit["S_min"] * (1.0 + t), _e_min(fit) * (1.0 + 1.0 / t)


def _e_min(fit) -> float:
  e_min = fit.get("E_min")
  if e_min is None or not np.isfinite(e_min):
    e_min = fit["S_min"] * fit["B_crit"]
  return float(e_min)


def pareto(
    points,
    fit: Mapping[str, Any] | None = None,
    title: str | None = None,
    step_label: str = "optimizer steps",
) -> Figure:
  """Steps-to-target S against rollouts-to-target E, log-log.

  ``points``: a list of dicts ``dict(N=..., S=..., E=None, seed=None)`` or
  a dict of lists with those keys (E defaults to N * S); one marker per
  point, one marker shape per N (legend: N). Points with S None/nan (the
  target was not reached) are left out and listed in the legend.
  ``fit``: a ``batch_law.fit_critical_batch`` result (``S_min``, ``B_crit``,
  ``E_min``; optionally ``B_crit_lo``/``B_crit_hi``). It draws the
  hyperbola (S/S_min - 1)(E/E_min - 1) = 1 (line gid ``"fit"``), its
  asymptotes S_min and E_min, the knee N = B_crit (S = 2 S_min, E = 2
  E_min), and the B_crit interval as the wedge between the constant-N rays
  E = B_crit_lo S and E = B_crit_hi S.
  """
  p = _points(points)
  fig, (ax,) = _new(1, size=(8.2, 4.6))
  ok = np.isfinite(p["S"]) & np.isfinite(p["E"]) & (p["S"] > 0) & (p["E"] > 0)
  for i, n in enumerate(np.unique(p["N"])):
    st = style(i)
    m = ok & (p["N"] == n)
    ax.plot(
        p["E"][m],
        p["S"][m],
        linestyle="none",
        marker=st["marker"],
        color=st["color"],
        markersize=6,
        markerfacecolor="none" if i % 2 else st["color"],
        label=_n_label(n),
    )
    if m.any():
      ax.annotate(
          _n_label(n),
          (np.exp(np.mean(np.log(p["E"][m]))), np.max(p["S"][m])),
          textcoords="offset points",
          xytext=(4, 5),
          fontsize=7,
      )
  missed = sorted({float(n) for n in p["N"][~ok]})
  if missed:
    ax.plot(
        [], [], linestyle="none", label="not reached: " + ", ".join(_n_label(n) for n in missed)
    )
  if fit is not None and np.isfinite(fit.get("B_crit", np.nan)) and fit["S_min"] > 0:
    S_min, B = fit["S_min"], fit["B_crit"]
    n_lo = min(np.nanmin(p["N"][ok]), B) if ok.any() else B
    n_hi = max(np.nanmax(p["N"][ok]), B) if ok.any() else B
    t = np.geomspace(B / (n_hi * 4.0), B / (n_lo / 4.0), 400)  # t = B_crit / N
    s_fit, e_fit = hyperbola(fit, t)
    (line,) = ax.plot(
        e_fit,
        s_fit,
        color="0.15",
        linewidth=1.4,
        linestyle="-",
        label=f"fit: (S/S_min-1)(E/E_min-1)=1, B_crit={B:.3g}",
    )
    line.set_gid("fit")
    e_min = _e_min(fit)
    ax.axvline(e_min, color="0.4", linewidth=0.8, linestyle=":", label=f"E_min={e_min:.3g}")
    ax.axhline(S_min, color="0.4", linewidth=0.8, linestyle=(0, (1, 3)), label=f"S_min={S_min:.3g}")
    ax.plot(
        [2 * e_min],
        [2 * S_min],
        marker="*",
        markersize=11,
        color="0.15",
        linestyle="none",
        label="knee: N = B_crit",
    )
    xs = np.concatenate([p["E"][ok], [e_min / 1.3, 2 * e_min * 1.6]])
    ys = np.concatenate([p["S"][ok], [S_min / 1.3, 2 * S_min * 1.6]])
    ax.set_xlim(xs.min() / 1.15, xs.max() * 1.15)
    ax.set_ylim(ys.min() / 1.15, ys.max() * 1.4)
    lo, hi = fit.get("B_crit_lo"), fit.get("B_crit_hi")
    if lo is not None and hi is not None and np.isfinite(lo) and lo > 0:
      ss = np.geomspace(ys.min() / 2, ys.max() * 2, 50)
      hi_ray = ss * hi if np.isfinite(hi) else np.full_like(ss, xs.max() * 10)
      level = fit.get("level")
      lvl = f"{100 * level:.0f}% " if level else ""
      band = ax.fill_betweenx(
          ss,
          ss * lo,
          hi_ray,
          facecolor="0.5",
          alpha=BAND_ALPHA,
          hatch="///",
          edgecolor="0.55",
          linewidth=0,
          label=f"B_crit {lvl}interval [{lo:.3g}, {hi:.3g}] (N rays)",
      )
      band.set_gid("b_crit_interval")
  _log(ax, "x")
  _log(ax, "y")
  ax.set_xlabel("rollouts to target E (rollouts)")
  ax.set_ylabel(f"steps to target S ({step_label})")
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  ax.set_title(title or "steps vs rollouts to target", fontsize=10)
  return fig


def _noise_marks(b_noise) -> list[tuple[str, tuple[float, float, float]]]:
  """[(label, (value, lo, hi))] from steps_vs_batch's ``b_noise`` argument."""
  if b_noise is None:
    return []
  if isinstance(b_noise, Mapping):
    items = list(b_noise.items())
  elif isinstance(b_noise, (list, np.ndarray)):
    many = list(b_noise)
    items = [
        (f"measured B_noise #{i + 1}" if len(many) > 1 else "measured B_noise", v)
        for i, v in enumerate(many)
    ]
  else:
    items = [("measured B_noise", b_noise)]
  out = []
  for label, v in items:
    t = tuple(float(x) for x in v) if isinstance(v, tuple) else (float(v), math.nan, math.nan)
    if len(t) != 3:
      raise ValueError(f"b_noise {label!r}: a number or a (value, lo, hi) tuple, got {v!r}")
    if np.isfinite(t[0]) and t[0] > 0:
      out.append((str(label), t))
  return out


def steps_vs_batch(
    points,
    fit: Mapping[str, Any] | None = None,
    title: str | None = None,
    step_label: str = "optimizer steps",
    b_noise=None,
) -> Figure:
  """S(N) against N (log-log): the runs (one marker per seed, the mean per N
  as a larger marker), the fit S = S_min (1 + B_crit / N) (line gid
  ``"fit"``), the asymptote S_min, and the B_crit interval as a shaded
  vertical band. Runs that never reached the target are drawn as triangles
  at the top edge. ``points`` as in ``pareto`` (E is not needed).
  ``b_noise``: measured noise scale(s) to compare with B_crit, each drawn
  as a vertical line (its interval as a dotted pair): a number, a tuple
  ``(value, lo, hi)``, a list of those (several measurements) or a dict
  label -> number or tuple. Non-finite values are skipped."""
  p = _points(points)
  fig, (ax,) = _new(1, size=(8.2, 4.4))
  ok = np.isfinite(p["S"]) & (p["S"] > 0)
  ax.plot(
      p["N"][ok],
      p["S"][ok],
      linestyle="none",
      marker="o",
      markerfacecolor="none",
      color="0.25",
      markersize=5,
      label="runs (one per seed)",
  )
  ns = np.unique(p["N"][ok])
  if ns.size:
    means = [np.exp(np.mean(np.log(p["S"][ok & (p["N"] == n)]))) for n in ns]
    ax.plot(
        ns,
        means,
        linestyle="none",
        marker="s",
        color="0.0",
        markersize=6,
        label="geometric mean per N",
    )
  if (~ok).any():
    top = transforms.blended_transform_factory(ax.transData, ax.transAxes)
    ax.plot(
        p["N"][~ok],
        np.full((~ok).sum(), 0.97),
        transform=top,
        linestyle="none",
        marker="^",
        color="0.0",
        markerfacecolor="none",
        label="target not reached",
    )
  if fit is not None and np.isfinite(fit.get("B_crit", np.nan)) and fit["S_min"] > 0:
    S_min, B = fit["S_min"], fit["B_crit"]
    n_all = p["N"][np.isfinite(p["N"])]
    nn = np.geomspace(min(n_all.min(), B) / 2, max(n_all.max(), B) * 2, 300)
    (line,) = ax.plot(
        nn,
        S_min * (1 + B / nn),
        color="0.15",
        linewidth=1.4,
        label=f"fit S = S_min(1 + B_crit/N), R²={fit.get('r2', math.nan):.2f}",
    )
    line.set_gid("fit")
    ax.axhline(S_min, color="0.4", linewidth=0.8, linestyle=":", label=f"S_min={S_min:.3g}")
    ax.axvline(B, color="0.15", linewidth=1.0, linestyle="--", label=f"B_crit={B:.3g}")
    lo, hi = fit.get("B_crit_lo"), fit.get("B_crit_hi")
    if lo is not None and hi is not None and np.isfinite(lo):
      hi_draw = hi if np.isfinite(hi) else nn.max()
      level = fit.get("level")
      lvl = f"{100 * level:.0f}% " if level else ""
      span = ax.axvspan(
          max(lo, nn.min() / 2),
          hi_draw,
          facecolor="0.5",
          alpha=BAND_ALPHA,
          hatch="///",
          edgecolor="0.55",
          linewidth=0,
          label=f"B_crit {lvl}interval [{lo:.3g}, {hi:.3g}]",
      )
      span.set_gid("b_crit_interval")
  _log(ax, "x")
  _log(ax, "y")
  ax.set_xlabel("batch size N (rollouts per step)")
  ax.set_ylabel(f"steps to target S ({step_label})")
  for j, (label, (v, lo, hi)) in enumerate(_noise_marks(b_noise)):
    ls = ("-.", (0, (3, 1, 1, 1, 1, 1)), (0, (6, 2)))[j % 3]
    ax.axvline(
        v,
        color=COLORS[2 + j % 4],
        linewidth=1.2,
        linestyle=ls,
        label=f"{label}={v:.3g}" + (f" [{lo:.3g}, {hi:.3g}]" if np.isfinite(lo) else ""),
    )
    for edge in (lo, hi):
      if np.isfinite(edge) and edge > 0:
        ax.axvline(edge, color=COLORS[2 + j % 4], linewidth=0.7, linestyle=":")
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax, loc="upper left", bbox_to_anchor=(1.02, 1.0))
  head = title or "steps to target vs batch size"
  if fit is not None and fit.get("resolved") is False:
    head += "\nunresolved: " + str(fit.get("why", ""))
  ax.set_title(head, fontsize=10 if "\n" not in head else 8)
  return fig


def _per_label(x, label):
  return x[label] if isinstance(x, Mapping) else x


def noise_over_training(
    rounds,
    series: Mapping[str, Sequence[float]],
    bands: Mapping[str, tuple] | None = None,
    title: str | None = None,
    ylabel: str = "noise scale (rollouts)",
    xlabel: str = "training round (generation rounds)",
    logy: bool | None = None,
    logx: bool = False,
) -> Figure:
  """Noise quantities (e.g. B_noise, B_intra, K*B_inter) over training.

  ``rounds``: the shared x values, or a dict label -> x values when series
  are measured at different rounds (a tracker every round, precise
  measurements at checkpoints). ``series``: label -> values (None/nan
  where unresolved). ``bands``: label -> (lo, hi), an interval band (or
  error bars for a series of at most 12 points). ``logy``: default log when
  every finite value is positive; ``logx``: a log2 x axis (batch sizes).
  """
  bands = bands or {}
  fig, (ax,) = _new(1, size=(6.4, 4.2))
  for i, (label, y) in enumerate(series.items()):
    st = style(i)
    x, y = _arr(_per_label(rounds, label)), _arr(y)
    if x.shape != y.shape:
      raise ValueError(f"series {label!r}: {x.size} rounds but {y.size} values")
    few = y.size <= 12
    if label in bands and bands[label] is not None:
      lo, hi = (_arr(b) for b in bands[label])
      if few:
        ax.errorbar(
            x,
            y,
            yerr=np.abs(np.stack([y - lo, hi - y])),
            linestyle="none",
            capsize=3,
            color=st["color"],
            marker=st["marker"],
            label=label,
        )
        continue
      _band(ax, x, lo, hi, st["color"])
    ax.plot(
        x,
        y,
        label=label,
        markevery=_markevery(y.size),
        markersize=4,
        linewidth=1.2,
        **({**st, "linestyle": "none"} if few and y.size == 1 else st),
    )
  if logy is None:
    logy = _log_ok(*series.values())
  if logy:
    _log(ax, "y")
  if logx:
    _log(ax, "x", base=2)
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax, loc="best")
  ax.set_title(title or "gradient noise over training", fontsize=10)
  return fig


def noise_decomposition(
    labels: Sequence[str],
    intra,
    inter,
    intra_se=None,
    inter_se=None,
    title: str | None = None,
    stacked: bool = False,
    ylabel: str = "noise scale (rollouts)",
    intra_label: str = "intra-prompt (B_intra)",
    inter_label: str = "inter-prompt (K·B_inter)",
) -> Figure:
  """Bars of the intra/inter-prompt decomposition, one group per label
  (checkpoint, task variant...). Intra bars are solid, inter bars hatched
  (distinct in grey); ``*_se`` draw ± 1 SE error bars. ``stacked`` stacks
  the two (when they add up, e.g. B_noise = B_intra + K B_inter) and prints
  the inter-prompt share of each total above its bar."""
  intra, inter = _arr(intra), _arr(inter)
  if not (len(labels) == intra.size == inter.size):
    raise ValueError(f"{len(labels)} labels, {intra.size} intra, {inter.size} inter values")
  ise = None if intra_se is None else _arr(intra_se)
  ese = None if inter_se is None else _arr(inter_se)
  fig, (ax,) = _new(1, size=(max(4.5, 1.3 * len(labels) + 2.5), 4.2))
  x = np.arange(len(labels), dtype=np.float64)
  kw = dict(edgecolor="0.0", linewidth=0.8, capsize=3, error_kw=dict(linewidth=0.9))
  if stacked:
    ax.bar(x, intra, 0.6, yerr=ise, color="0.85", label=intra_label, **kw)
    ax.bar(x, inter, 0.6, bottom=intra, yerr=ese, color="0.45", hatch="//", label=inter_label, **kw)
    for xi, a, b in zip(x, intra, inter):
      if np.isfinite(a + b) and a + b > 0:
        ax.annotate(
            f"inter {100 * b / (a + b):.0f}%",
            (xi, a + b),
            textcoords="offset points",
            xytext=(0, 4),
            ha="center",
            fontsize=7,
        )
  else:
    w = 0.38
    ax.bar(x - w / 2, intra, w, yerr=ise, color="0.85", label=intra_label, **kw)
    ax.bar(x + w / 2, inter, w, yerr=ese, color="0.45", hatch="//", label=inter_label, **kw)
  ax.set_xticks(x, [str(s) for s in labels])
  ax.set_ylabel(ylabel)
  ax.set_xlabel("")
  ax.margins(y=0.15)
  ax.grid(True, axis="y", linewidth=0.3, color="0.8")
  ax.set_axisbelow(True)
  _legend(ax, loc="upper left")
  ax.set_title(title or "intra- vs inter-prompt gradient noise", fontsize=10)
  return fig


def trend_curve(fit: Mapping[str, Any], x, model: str | None = None) -> np.ndarray:
  """The fitted polynomial of a ``drift.fit_trend`` result at ``x``:
  ``model`` in (const, linear, quadratic); default: the verdict's model
  ("flat" -> const)."""
  model = model or {"flat": "const"}.get(fit["verdict"], fit["verdict"])
  coef = fit[model]["coef"]
  x = np.asarray(x, np.float64)
  return sum(c * x**k for k, c in enumerate(coef))


def noise_vs_kappa(
    kappa,
    y,
    se=None,
    fit: Mapping[str, Any] | None = None,
    ylabel: str = "tr Σ_intra (|g|², per rollout)",
    title: str | None = None,
    xlabel: str = "drift κ (KL per token, nats)",
    show_all_models: bool = True,
    logy: bool = False,
) -> Figure:
  """A noise quantity against drift kappa: points with ± SE error bars and
  the fitted trend of ``drift.fit_trend`` (the verdict's model solid, line
  gid ``"fit"``; the other models thin grey when ``show_all_models``).
  ``logy``: a log y axis, for heavy-tailed positive quantities (a few
  rounds' traces tens of times the rest).

  Several series: pass dicts label -> values for ``kappa``, ``y`` and
  (optionally) ``se`` and ``fit``."""
  multi = isinstance(kappa, Mapping)
  keys = list(kappa) if multi else [None]
  fig, (ax,) = _new(1, size=(6.0, 4.2))
  xmax = 0.0
  for i, key in enumerate(keys):
    st = style(i)
    k = _arr(kappa[key] if multi else kappa)
    v = _arr(y[key] if multi else y)
    e = None
    if se is not None:
      e = _arr(se[key] if multi else se)
    lab = key if multi else "measured (± SE)"
    ax.errorbar(
        k,
        v,
        yerr=e,
        linestyle="none",
        marker=st["marker"],
        color=st["color"],
        capsize=3,
        markersize=5,
        label=lab,
    )
    f = (fit.get(key) if multi else fit) if fit is not None else None
    xmax = max(xmax, np.nanmax(k) if np.isfinite(k).any() else 0.0)
    if f is None:
      continue
    xs = np.linspace(min(0.0, np.nanmin(k)), np.nanmax(k) * 1.05, 200)
    chosen = {"flat": "const"}.get(f["verdict"], f["verdict"])
    if show_all_models and not multi:
      for model, ls in (("const", ":"), ("linear", "--"), ("quadratic", "-.")):
        if model != chosen:
          ax.plot(
              xs,
              trend_curve(f, xs, model),
              color="0.6",
              linewidth=0.8,
              linestyle=ls,
              label=f"{model} (not chosen)",
          )
    r2 = f[chosen].get("r2", math.nan)
    (line,) = ax.plot(
        xs,
        trend_curve(f, xs, chosen),
        color=st["color"],
        linewidth=1.5,
        linestyle=st["linestyle"],
        label=f"{(key + ': ') if multi else ''}{chosen} fit ({f['verdict']}, " f"R²={r2:.2f})",
    )
    line.set_gid("fit" if not multi else f"fit:{key}")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  if logy:
    _log(ax, "y")
  ax.grid(True, linewidth=0.3, color="0.8")
  _legend(ax, loc="best")
  ax.set_title(title or "noise vs drift", fontsize=10)
  return fig


def adaptive_batch(
    rounds,
    batch_size,
    signal,
    lo=None,
    hi=None,
    title: str | None = None,
    signal_label: str = "tracked B_noise (rollouts)",
    xlabel: str = "training round (generation rounds)",
    signal_rounds=None,
    predicted=None,
) -> Figure:
  """The adaptive controller over training: the chosen N per round (top,
  a step plot, log2 axis) above the signal it tracks with its interval
  (bottom; log axis when positive; where ``lo`` / ``hi`` are given, the
  rounds whose interval is unbounded show the estimate as faint points
  only). ``signal_rounds``: x of the signal
  when it is not logged every round (default ``rounds``); ``predicted``:
  the N the controller's rule asks for at each round (dashed, top)."""
  fig, (ax_n, ax_s) = _new(1, 2, size=(6.4, 2.6), sharex=True)
  x, n = _arr(rounds), _arr(batch_size)
  ax_n.step(x, n, where="post", color="0.0", linewidth=1.4, label="chosen N")
  ax_n.plot(
      x, n, linestyle="none", marker="o", markersize=3, color="0.0", markevery=_markevery(n.size)
  )
  if _log_ok(n):
    _log(ax_n, "y", base=2)
    ax_n.yaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
  if predicted is not None:
    ax_n.step(
        x,
        _arr(predicted),
        where="post",
        color=COLORS[2],
        linestyle="--",
        linewidth=1.1,
        label="predicted optimum",
    )
    ax_n.legend(loc="best", fontsize="small")
  ax_n.set_ylabel("batch size N (rollouts per round)")
  xs, s = _arr(signal_rounds if signal_rounds is not None else rounds), _arr(signal)
  if lo is not None and hi is not None:
    lo_a, hi_a = _arr(lo), _arr(hi)
    bounded = np.isfinite(lo_a) & np.isfinite(hi_a)
    _band(ax_s, xs, lo_a, hi_a, COLORS[1], label="tracker interval (Fieller)")
    # rounds whose interval is unbounded: the point estimate means nothing
    # there (the controller ignores it), so it is drawn apart and faint
    ax_s.plot(
        xs[~bounded],
        s[~bounded],
        linestyle="none",
        marker=".",
        markersize=3,
        color="0.65",
        label="estimate, interval unbounded",
    )
    s = np.where(bounded, s, np.nan)
  ax_s.plot(xs, s, color=COLORS[1], linestyle="--", linewidth=1.3, label=signal_label)
  if not np.isfinite(s).any():  # an empty panel must say why it is empty
    ax_s.text(
        0.5,
        0.5,
        "signal never resolved",
        transform=ax_s.transAxes,
        ha="center",
        va="center",
        color="0.3",
    )
  if _log_ok(s, lo, hi):
    _log(ax_s, "y")
  ax_s.set_ylabel(signal_label)
  ax_s.set_xlabel(xlabel)
  for ax in (ax_n, ax_s):
    ax.grid(True, linewidth=0.3, color="0.8")
    _legend(ax, loc="best")
  ax_n.set_title(title or "adaptive batch size", fontsize=10)
  return fig


def lr_envelope(
    ns, best_lrs, bracketed, lr0: float, ref: int, alpha: float | None = None, title=None
) -> Figure:
  """The best learning rate per batch size on log axes: filled where the
  scan bracketed it, open where it sat at the scan's edge (a bound, not an
  optimum); the sqrt (alpha = 1/2) and linear (alpha = 1) rules through
  lr0 at ``ref``, and the fitted power law when ``alpha`` is given."""
  fig, (ax,) = _new()
  n, lr, ok = _arr(ns), _arr(best_lrs), np.asarray(bracketed, bool)
  ax.plot(n[ok], lr[ok], "o", color=COLORS[0], label="best lr (bracketed)")
  if (~ok).any():
    ax.plot(n[~ok], lr[~ok], "o", mfc="none", color=COLORS[0], label="at a scan edge")
  grid = np.geomspace(n.min(), n.max(), 50)
  for a, c, lab in ((0.5, COLORS[1], "sqrt rule (α = 1/2)"), (1.0, COLORS[2], "linear (α = 1)")):
    ax.plot(grid, lr0 * (grid / ref) ** a, "--", color=c, linewidth=1.1, label=lab)
  if alpha is not None and ok.sum() >= 2:
    c = np.exp(np.mean(np.log(lr[ok]) - alpha * np.log(n[ok])))
    ax.plot(
        grid, c * grid**alpha, "-", color=COLORS[3], linewidth=1.3, label=f"fit α = {alpha:.2f}"
    )
  _log(ax, "x", base=2)
  _log(ax, "y")
  ax.set_xlabel("batch size N (rollouts per round)")
  ax.set_ylabel("learning rate")
  if title:
    ax.set_title(title, fontsize="medium")
  _legend(ax)
  return fig


def laws(series: Sequence[Mapping[str, Any]], title=None, step_label: str = "rounds") -> Figure:
  """Several S(N) laws on one log-log axes. Each series: ``label``, ``N``
  and ``S`` (one value per run; None or non-finite: not reached, left out),
  optional ``fit`` (``batch_law.fit_critical_batch``'s dict). Drawn per
  series in its own style: the runs (small open markers), the geometric
  mean per N, the fitted S_min (1 + B_crit / N) (line gid ``"fit:<label>"``)
  and the knee (B_crit, 2 S_min) with a horizontal bar over the B_crit
  interval; the legend gives B_crit [interval], the verdict and the
  lack-of-fit p."""
  fig, (ax,) = _new(1, size=(8.2, 4.6))
  for i, s in enumerate(series):
    st = style(i)
    n, y = _arr(s["N"]), _arr(s["S"])
    ok = np.isfinite(n) & np.isfinite(y) & (y > 0)
    ax.plot(n[ok], y[ok], st["marker"], mfc="none", color=st["color"], ms=4, alpha=0.5)
    ns = np.unique(n[ok])
    means = [np.exp(np.mean(np.log(y[ok & (n == v)]))) for v in ns]
    fit = s.get("fit")
    good = fit is not None and "error" not in fit and fit["S_min"] > 0 and fit["B_crit"] > 0
    ax.plot(
        ns,
        means,
        st["marker"],
        color=st["color"],
        ms=6,
        label=None if good else f"{s['label']} (no fit)",
    )
    if good:
      S_min, B = fit["S_min"], fit["B_crit"]
      grid = np.geomspace(ns.min() / 1.3, ns.max() * 1.3, 200)
      lof = (fit.get("lack_of_fit") or {}).get("p_value")
      label = (
          f"{s['label']}: B_crit {B:.3g} [{fit['B_crit_lo']:.3g}, {fit['B_crit_hi']:.3g}] "
          f"({fit['verdict']}" + (f", lack of fit p = {lof:.2g})" if lof is not None else ")")
      )
      (line,) = ax.plot(
          grid,
          S_min * (1 + B / grid),
          linestyle=st["linestyle"],
          color=st["color"],
          linewidth=1.3,
          label=label,
      )
      line.set_gid(f"fit:{s['label']}")
      lo, hi = fit["B_crit_lo"], fit["B_crit_hi"]
      if np.isfinite(lo) and np.isfinite(hi):
        ax.errorbar(
            [B],
            [2 * S_min],
            xerr=[[B - lo], [hi - B]],
            fmt="|",
            color=st["color"],
            capsize=3,
            linewidth=1.0,
            ms=10,
        )
  _log(ax, "x", base=2)
  _log(ax, "y")
  ax.set_xlabel("batch size N (rollouts per round)")
  ax.set_ylabel(f"steps to target S ({step_label})")
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax, loc="upper right")
  ax.set_title(
      (title + "\n" if title else "")
      + "markers: mean per N (open: runs); bar at (B_crit, 2 S_min): 90% bootstrap interval",
      fontsize=8,
  )
  return fig


def rule_ratios(rows: Sequence[Mapping[str, Any]], bar: float = 1.25, title=None) -> Figure:
  """E_rule(N) / E*(N) per learning-rate rule (``rows``: rule, N, ratio,
  optional lo / hi: its interval, drawn as error bars, an open upper end as
  an upward tick; an infinite ratio -- some seed never reached -- drawn as
  a triangle at the top edge), with the ``bar`` under which a rule holds."""
  fig, (ax,) = _new(1, size=(6.4, 3.8))
  top = transforms.blended_transform_factory(ax.transData, ax.transAxes)
  for i, rule in enumerate(dict.fromkeys(r["rule"] for r in rows)):
    st = style(i + 1)
    rs = sorted((r for r in rows if r["rule"] == rule), key=lambda r: r["N"])
    n, y = _arr([r["N"] for r in rs]), _arr([r["ratio"] for r in rs])
    ok = np.isfinite(y)
    ax.plot(
        n[ok], y[ok], marker=st["marker"], linestyle=st["linestyle"], color=st["color"], label=rule
    )
    if all("lo" in r and "hi" in r for r in rs):
      lo, hi = _arr([r["lo"] for r in rs]), _arr([r["hi"] for r in rs])
      shut = ok & np.isfinite(hi)
      ax.errorbar(
          n[shut],
          y[shut],
          yerr=[y[shut] - lo[shut], hi[shut] - y[shut]],
          fmt="none",
          color=st["color"],
          capsize=2,
          linewidth=0.9,
      )
      if (ok & ~shut).any():
        ax.plot(n[ok & ~shut], y[ok & ~shut] * 1.08, "2", color=st["color"], ms=9)
    if (~ok).any():
      ax.plot(
          n[~ok],
          np.full((~ok).sum(), 0.97),
          "^",
          mfc="none",
          color=st["color"],
          transform=top,
          label=f"{rule}: target not reached",
      )
  ax.axhline(1.0, color="0.3", linewidth=0.8)
  ax.axhline(bar, color="0.3", linewidth=0.9, linestyle=(0, (4, 2)), label=f"holds below {bar:g}")
  _log(ax, "x", base=2)
  _log(ax, "y")
  ax.set_xlabel("batch size N (rollouts per round)")
  ax.set_ylabel("rollouts to target: rule / envelope best")
  if any("lo" in r for r in rows):
    ax.text(
        0.01,
        0.01,
        "bars: 90% bootstrap interval (seeds resampled in every cell, argmin retaken); "
        "tick above a point: interval open above",
        transform=ax.transAxes,
        fontsize=6,
        color="0.3",
    )
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax)
  if title:
    ax.set_title(title, fontsize=9)
  return fig


def xy_series(
    series: Sequence[Mapping[str, Any]],
    xlabel: str,
    ylabel: str,
    hlines: Mapping[str, float] | None = None,
    title=None,
    log: bool = True,
) -> Figure:
  """Several y(x) series on one axes (log-log unless ``log`` is False),
  each ``label``, ``x``, ``y`` and optional ``yerr`` (error bars, e.g. one
  SE), in its own style; ``hlines``: labelled horizontal reference lines
  (e.g. a published value)."""
  fig, (ax,) = _new(1, size=(6.4, 4.0))
  for i, s in enumerate(series):
    st = style(i)
    x, y = _arr(s["x"]), _arr(s["y"])
    yerr = _arr(s["yerr"]) if s.get("yerr") is not None else None
    ax.errorbar(
        x,
        y,
        yerr=yerr,
        marker=st["marker"],
        linestyle=st["linestyle"],
        color=st["color"],
        capsize=2,
        label=s["label"],
    )
  for j, (label, v) in enumerate((hlines or {}).items()):
    ax.axhline(v, color="0.35", linewidth=0.9, linestyle=LINESTYLES[(j + 1) % 7], label=label)
  if log:
    _log(ax, "x", base=2)
    _log(ax, "y")
  ax.set_xlabel(xlabel)
  ax.set_ylabel(ylabel)
  ax.grid(True, which="major", linewidth=0.3, color="0.8")
  _legend(ax)
  if title:
    ax.set_title(title, fontsize=9)
  return fig


def noise_length(
    rows: Sequence[Mapping[str, Any]], fits: Mapping[str, Any], published: float
) -> Figure:
  """Left: per-rollout intra:inter against mean completion length, one
  point per SFT base (error bars one jackknife SE; open markers: bases not
  matched in pass rate, left out of the fit), the fitted power law with its
  90% band (the slope's t-interval, ``trend.fit``) and the published
  ratio. Right: the same ratio against each base's held-out pass rate at
  one length."""
  fig, (ax, bx) = _new(2, size=(5.0, 3.8))
  for i, (arm, axis, xkey) in enumerate(
      (("length", ax, "completion_len"), ("pass", bx, "pass_rate"))
  ):
    st = style(i)
    if arm == "length":
      pts = [r for r in rows if r["arm"] == "length"]
    else:  # every base at the pass arm's one level (the length arm's included)
      level = min((r["level"] for r in rows if r["arm"] == "pass"), default=1)
      pts = [r for r in rows if r["level"] == level]
    for matched in (True, False):
      sel = [r for r in pts if bool(r["matched"]) == matched]
      if not sel:
        continue
      axis.errorbar(
          _arr([r[xkey] for r in sel]),
          _arr([r["ratio"] for r in sel]),
          yerr=_arr([r["ratio_se"] for r in sel]),
          marker=st["marker"],
          linestyle="none",
          color=st["color"],
          mfc=st["color"] if matched else "none",
          capsize=2,
          label="bases matched in pass rate" if matched else "not matched (left out)",
      )
    f = fits.get(arm, {})
    if "b" in f:
      xs = np.array([r[xkey] for r in pts if r["matched"]], np.float64)
      grid = np.linspace(xs.min(), xs.max(), 50)
      gx = np.log(grid) if arm == "length" else grid
      axis.plot(
          grid,
          np.exp(f["a"] + f["b"] * gx),
          color=st["color"],
          linewidth=1.0,
          label=(
              f"fit: ratio ∝ length^{f['b']:.2f} [{f['b_lo']:.2f}, {f['b_hi']:.2f}]"
              if arm == "length"
              else f"fit: log ratio slope {f['b']:.2f} [{f['b_lo']:.2f}, {f['b_hi']:.2f}]"
          ),
      )
    axis.axhline(
        published, color="0.35", linewidth=0.9, linestyle="--", label=f"published ≈ {published:g}:1"
    )
    _log(axis, "y")
    axis.grid(True, which="major", linewidth=0.3, color="0.8")
    _legend(axis)
  _log(ax, "x", base=2)
  ax.set_xlabel("mean completion length (tokens)")
  bx.set_xlabel("held-out sampled pass rate of the base")
  ax.set_ylabel("per-rollout tr Σ_intra / tr Σ_inter")
  ax.set_title("one task, worked at growing detail, bases at one pass rate", fontsize=9)
  bx.set_title("one length, bases at several pass rates", fontsize=9)
  return fig


def _sig(a):
  """``a`` (array-like, masks kept) with every value rounded by
  ``rounding.stable`` (the committed tables' digits)."""
  if not np.size(a):
    return a
  a = np.ma.asarray(a, dtype=np.float64)
  flat = np.array(rounding.stable(a.data.ravel().tolist()), np.float64)
  return np.ma.array(flat.reshape(a.shape), mask=np.ma.getmask(a))


def stabilize(fig: Figure) -> Figure:
  """Round the data of every line, marker set, band and error bar in
  ``fig`` to ``rounding.STABLE_DIGITS`` significant digits, in place. Why:
  a curve computed with numpy's exp, power or geomspace differs in the last
  bits between processors (numpy picks AVX-512 or AVX2 kernels at run
  time), and a last-bit difference in a vertex can move Agg's antialiasing,
  so the same committed data drew other PNG bytes on another machine;
  rounded, they draw the same bytes, and ``--replot`` can be checked byte
  for byte. The rounding (<= 5e-10 relative) is far below a pixel."""
  for ax in fig.axes:
    for line in ax.get_lines():
      line.set_data(*(_sig(d) for d in line.get_data()))
    for coll in ax.collections:
      offsets = coll.get_offsets()
      if len(offsets):
        coll.set_offsets(_sig(offsets))
      if hasattr(coll, "get_segments"):  # error bars (LineCollection)
        # (an empty segment reads back as shape (0,) but is set as (0, 2))
        coll.set_segments(
            [_sig(g) if np.size(g) else np.empty((0, 2)) for g in coll.get_segments()]
        )
      else:  # bands (fill_between's PolyCollection) and other paths
        for path in coll.get_paths():
          path.vertices = _sig(path.vertices).filled(np.nan)
    # the view limits were autoscaled from the unrounded data
    ax.set_xlim(*_sig(ax.get_xlim()).filled(np.nan))
    ax.set_ylim(*_sig(ax.get_ylim()).filled(np.nan))
  return fig


def save(fig: Figure, path: str, dpi: int = DPI) -> str:
  """Write ``fig`` to ``path`` as a PNG at ``dpi`` (its data rounded by
  ``stabilize``) and close it; returns the path."""
  d = os.path.dirname(path)
  if d:
    os.makedirs(d, exist_ok=True)
  stabilize(fig)
  fig.savefig(path, dpi=dpi, format="png", bbox_inches="tight")
  import matplotlib.pyplot as plt  # noqa: PLC0415  (close() if pyplot tracks it)

  plt.close(fig)
  return path
