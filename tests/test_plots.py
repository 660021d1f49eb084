"""cbs_jax.plots: every figure is labelled, saves a real PNG, draws the data
it was given, and its fitted curves match closed forms computed here."""

import io
import math
import os
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest
from matplotlib.figure import Figure

from cbs_jax import batch_law, drift, plots

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _sweep(seed=0):
  """A synthetic sweep from the law S = S_min (1 + B/N), 10% scatter, 3 seeds."""
  rng = np.random.default_rng(seed)
  pts = []
  for N in (64, 128, 256, 512, 1024, 2048, 4096):
    for sd in range(3):
      pts.append(dict(N=N, S=40.0 * (1 + 600.0 / N) * (1 + 0.1 * rng.standard_normal()), seed=sd))
  fit = batch_law.fit_critical_batch(
      [p["N"] for p in pts], [p["S"] for p in pts], [p["seed"] for p in pts], n_boot=400
  )
  return pts, fit


def _gid(fig, gid):
  found = [a for ax in fig.axes for a in ax.get_children() if a.get_gid() == gid]
  assert len(found) == 1, f"expected one artist with gid {gid!r}, found {len(found)}"
  return found[0]


def _check_labelled_and_saved(fig, tmp_path, name):
  assert isinstance(fig, Figure)
  data_axes = [ax for ax in fig.axes if ax.has_data()]
  assert data_axes, "no axes with data"
  for ax in data_axes:
    # an x label on this axis or on one sharing its x axis (stacked panels), or
    # named categories (bar groups)
    sharing = ax.get_shared_x_axes().get_siblings(ax)
    assert any(a.get_xlabel().strip() for a in sharing) or (
        ax.get_xticklabels() and all(t.get_text() for t in ax.get_xticklabels())
    ), "unlabelled x axis"
    assert ax.get_ylabel().strip(), "unlabelled y axis"
  path = plots.save(fig, str(tmp_path / "sub" / f"{name}.png"))
  with open(path, "rb") as f:
    assert f.read(8) == PNG_MAGIC
  img = matplotlib.image.imread(path)
  h, w = img.shape[:2]
  assert h > 200 and w > 300
  # not a blank canvas: the image has dark (ink) pixels
  assert (img[..., :3].mean(axis=-1) < 0.3).mean() > 0.002
  return path


def _unit(label):
  return "(" in label and ")" in label


def test_learning_curves_draws_the_data_with_units(tmp_path):
  r = np.arange(0, 200, 10)
  curves = []
  for i, N in enumerate((64, 256, 1024)):
    v = 0.4 + 0.2 * (1 - np.exp(-r * N / 5e4))
    curves.append(
        dict(
            label=f"N={N}",
            rollouts=r * N,
            steps=r,
            value=v,
            lo=v - 0.02 if i == 1 else None,
            hi=v + 0.02 if i == 1 else None,
        )
    )
  fig = plots.learning_curves(curves, target=[0.5, 0.55], title="sweep")
  ax_r, ax_s = fig.axes
  assert "rollouts" in ax_r.get_xlabel() and "steps" in ax_s.get_xlabel()
  assert all(_unit(ax.get_xlabel()) and _unit(ax.get_ylabel()) for ax in (ax_r, ax_s))
  for ax, key in ((ax_r, "rollouts"), (ax_s, "steps")):
    by_label = {ln.get_label(): ln for ln in ax.get_lines()}
    for c in curves:
      ln = by_label[c["label"]]
      np.testing.assert_allclose(ln.get_xdata(), c[key])
      np.testing.assert_allclose(ln.get_ydata(), c["value"])
    # both targets as horizontal lines
    for t in (0.5, 0.55):
      np.testing.assert_allclose(by_label[f"target {t:g}"].get_ydata(), [t, t])
  # the band of the middle curve is drawn (a filled polygon), the others have none
  assert sum(len(ax.collections) for ax in (ax_r, ax_s)) == 2
  _check_labelled_and_saved(fig, tmp_path, "lc")


def test_series_distinguishable_without_colour():
  r = np.arange(10)
  curves = [dict(label=f"c{i}", rollouts=r, steps=r, value=r * i) for i in range(7)]
  ax = plots.learning_curves(curves).axes[0]
  lines = [ln for ln in ax.get_lines() if ln.get_label().startswith("c")]
  pairs = {(ln.get_marker(), str(ln.get_linestyle())) for ln in lines}
  assert len(pairs) == 7, "two series differ only by colour"
  assert len({ln.get_marker() for ln in lines}) == 7


def test_learning_curves_rejects_mismatched_lengths():
  with pytest.raises(ValueError, match="rollouts"):
    plots.learning_curves([dict(label="x", rollouts=[1, 2, 3], steps=[1, 2], value=[0, 1])])


def test_pareto_hyperbola_matches_closed_form(tmp_path):
  pts, fit = _sweep()
  fig = plots.pareto(pts, fit, title="synthetic")
  line = _gid(fig, "fit")
  E, S = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
  S_min, E_min = fit["S_min"], fit["E_min"]
  # every plotted point lies on (S/S_min - 1)(E/E_min - 1) = 1
  np.testing.assert_allclose((S / S_min - 1) * (E / E_min - 1), 1.0, rtol=1e-9)
  # and the curve passes through (S_min (1+t), E_min (1+1/t)) for t spanning the sweep:
  # interpolate log E at log S along the plotted line
  order = np.argsort(S)
  for t in (600 / 4096, 0.3, 1.0, 3.0, 600 / 64):
    e_on_line = np.exp(np.interp(np.log(S_min * (1 + t)), np.log(S[order]), np.log(E[order])))
    assert e_on_line == pytest.approx(E_min * (1 + 1 / t), rel=2e-3)
  # E_min = S_min * B_crit when the fit did not give it
  fit2 = {k: v for k, v in fit.items() if k != "E_min"}
  line2 = _gid(plots.pareto(pts, fit2), "fit")
  np.testing.assert_allclose(line2.get_xdata(), E, rtol=1e-9)
  # one marker per run, at (E = N S, S)
  ax = fig.axes[0]
  drawn = np.concatenate(
      [
          np.column_stack([ln.get_xdata(), ln.get_ydata()])
          for ln in ax.get_lines()
          if ln.get_label().startswith("N=")
      ]
  )
  want = np.array([[p["N"] * p["S"], p["S"]] for p in pts])
  assert drawn.shape == want.shape
  np.testing.assert_allclose(np.sort(drawn, axis=0), np.sort(want, axis=0))
  assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
  # the B_crit interval: the wedge between the rays E = lo S and E = hi S
  band = _gid(fig, "b_crit_interval")
  verts = band.get_paths()[0].vertices
  ratio = verts[:, 0] / verts[:, 1]
  assert ratio.min() == pytest.approx(fit["B_crit_lo"], rel=1e-6)
  assert ratio.max() == pytest.approx(fit["B_crit_hi"], rel=1e-6)
  _check_labelled_and_saved(fig, tmp_path, "pareto")


def test_pareto_without_fit_and_with_unreached_points(tmp_path):
  pts = [dict(N=64, S=100.0), dict(N=128, S=None), dict(N=256, S=30.0, E=9000.0)]
  fig = plots.pareto(pts)
  labels = [ln.get_label() for ln in fig.axes[0].get_lines()]
  assert any("not reached" in lab and "N=128" in lab for lab in labels)
  ln256 = [ln for ln in fig.axes[0].get_lines() if ln.get_label() == "N=256"][0]
  np.testing.assert_allclose(ln256.get_xdata(), [9000.0])  # an explicit E is kept
  _check_labelled_and_saved(fig, tmp_path, "pareto_nofit")


def test_steps_vs_batch_fit_and_interval(tmp_path):
  pts, fit = _sweep(1)
  pts = pts + [dict(N=32, S=None, seed=0)]
  fig = plots.steps_vs_batch(pts, fit, b_noise=(900.0, 700.0, 1200.0))
  line = _gid(fig, "fit")
  N, S = np.asarray(line.get_xdata()), np.asarray(line.get_ydata())
  np.testing.assert_allclose(S, fit["S_min"] * (1 + fit["B_crit"] / N), rtol=1e-12)
  assert N.min() <= 32 and N.max() >= 4096  # the curve spans the sweep
  span = _gid(fig, "b_crit_interval")
  x0, x1 = span.get_x(), span.get_x() + span.get_width()  # data x, axes-spanning y
  assert x0 == pytest.approx(fit["B_crit_lo"]) and x1 == pytest.approx(fit["B_crit_hi"])
  ax = fig.axes[0]
  assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
  assert "rollouts" in ax.get_xlabel() and _unit(ax.get_ylabel())
  assert any(ln.get_label() == "target not reached" for ln in ax.get_lines())
  by = {ln.get_label(): ln for ln in ax.get_lines()}
  np.testing.assert_allclose(by["measured B_noise=900 [700, 1.2e+03]"].get_xdata(), [900, 900])
  _check_labelled_and_saved(fig, tmp_path, "svb")


def test_steps_vs_batch_noise_marks():
  pts, fit = _sweep(2)
  lines = lambda fig: {
      ln.get_label(): ln.get_xdata()[0]
      for ln in fig.axes[0].get_lines()
      if "B_noise" in ln.get_label() or "base" in ln.get_label() or "late" in ln.get_label()
  }
  # a list: several measurements (not an interval); nan ones are skipped
  got = lines(plots.steps_vs_batch(pts, fit, b_noise=[900.0, 1500.0, float("nan")]))
  assert sorted(got.values()) == [900.0, 1500.0]
  got = lines(
      plots.steps_vs_batch(pts, fit, b_noise={"base": (800.0, 600.0, 1000.0), "late": 1200.0})
  )
  assert got == {"base=800 [600, 1e+03]": 800.0, "late=1.2e+03": 1200.0}
  with pytest.raises(ValueError):
    plots.steps_vs_batch(pts, fit, b_noise=(1.0, 2.0))


def test_noise_over_training_series_and_bands(tmp_path):
  r = np.arange(0, 500, 5)
  series = {
      "B_noise (tracker)": 9000 + 300 * np.sin(r / 50),
      "B_intra (tracker)": 3000 + 0 * r,
      "B_noise (precise)": [10300.0, 8900.0],
  }
  rounds = {"B_noise (tracker)": r, "B_intra (tracker)": r, "B_noise (precise)": [0, 495]}
  bands = {
      "B_noise (tracker)": (8000 + 0 * r, 10000 + 0 * r),
      "B_noise (precise)": ([7500.0, 6600.0], [13100.0, 11200.0]),
  }
  fig = plots.noise_over_training(rounds, series, bands)
  ax = fig.axes[0]
  assert ax.get_yscale() == "log" and _unit(ax.get_ylabel()) and _unit(ax.get_xlabel())
  by = {ln.get_label(): ln for ln in ax.get_lines()}
  np.testing.assert_allclose(by["B_intra (tracker)"].get_ydata(), 3000.0)
  # the two-point precise series is drawn as error bars spanning its interval
  eb = [c for c in ax.containers if c.get_label() == "B_noise (precise)"][0]
  seg = eb.lines[2][0].get_segments()
  np.testing.assert_allclose([[s[0][1], s[1][1]] for s in seg], [[7500, 13100], [6600, 11200]])
  _check_labelled_and_saved(fig, tmp_path, "not")
  with pytest.raises(ValueError):
    plots.noise_over_training([0, 1], {"x": [1.0, 2.0, 3.0]})
  # batch sizes on a log2 axis; an interval missing at one N leaves that bar out
  ns = [64, 128, 256]
  fig = plots.noise_over_training(
      ns, {"T (s)": [8.6, 6.3, 7.4]}, {"T (s)": ([6.8, None, 6.8], [10.5, None, 7.9])}, logx=True
  )
  ax = fig.axes[0]
  assert ax.get_xscale() == "log" and ax.xaxis.get_transform().base == 2
  seg = ax.containers[0].lines[2][0].get_segments()
  finite = [[s[0][1], s[1][1]] for s in seg if len(s)]
  np.testing.assert_allclose(finite, [[6.8, 10.5], [6.8, 7.9]])


@pytest.mark.parametrize("stacked", [False, True])
def test_noise_decomposition_bars(tmp_path, stacked):
  labels, intra, inter = ["base", "round 1000"], [3180.0, 2330.0], [7100.0, 6600.0]
  fig = plots.noise_decomposition(
      labels, intra, inter, [880.0, 660.0], [2000.0, 1900.0], stacked=stacked
  )
  ax = fig.axes[0]
  heights = [p.get_height() for p in ax.patches]
  bottoms = [p.get_y() for p in ax.patches]
  np.testing.assert_allclose(heights, intra + inter)
  np.testing.assert_allclose(bottoms, ([0, 0] + intra) if stacked else [0] * 4)
  hatches = [p.get_hatch() for p in ax.patches]
  assert hatches[:2] == [None, None] and all(hatches[2:])  # inter hatched: greyscale-safe
  assert [t.get_text() for t in ax.get_xticklabels()] == labels
  if stacked:
    texts = [t.get_text() for t in ax.texts]
    assert texts == [f"inter {100 * 7100 / 10280:.0f}%", f"inter {100 * 6600 / 8930:.0f}%"]
  _check_labelled_and_saved(fig, tmp_path, f"dec{stacked}")


def test_noise_vs_kappa_curve_is_the_fitted_polynomial(tmp_path):
  rng = np.random.default_rng(0)
  k = np.linspace(0.0, 0.08, 9)
  y = 270 + 1500 * k + 40000 * k**2 + rng.normal(0, 5, k.size)
  se = np.full(k.size, 5.0)
  fit = drift.fit_trend(k, y, se)
  assert fit["verdict"] == "quadratic"
  fig = plots.noise_vs_kappa(k, y, se, fit)
  line = _gid(fig, "fit")
  x = np.asarray(line.get_xdata())
  a0, a1, a2 = fit["quadratic"]["coef"]
  np.testing.assert_allclose(line.get_ydata(), a0 + a1 * x + a2 * x * x, rtol=1e-12)
  assert x.min() <= 0.0 and x.max() >= 0.08
  # a flat verdict draws the weighted mean (the constant model)
  yf = 300 + rng.normal(0, 5, k.size)
  ff = drift.fit_trend(k, yf, se)
  if ff["verdict"] == "flat":
    lf = _gid(plots.noise_vs_kappa(k, yf, se, ff), "fit")
    np.testing.assert_allclose(lf.get_ydata(), np.average(yf, weights=1 / se**2), rtol=1e-9)
  # several variants at once
  multi = plots.noise_vs_kappa({"a": k, "b": k}, {"a": y, "b": y + 10}, fit={"a": fit})
  _gid(multi, "fit:a")
  _check_labelled_and_saved(fig, tmp_path, "kappa")


def test_adaptive_batch_panels(tmp_path):
  r = np.arange(120)
  n = np.where(r < 40, 256, np.where(r < 80, 512, 1024))
  sig = 2000 + 40.0 * r
  fig = plots.adaptive_batch(r, n, sig, lo=sig * 0.7, hi=sig * 1.4)
  ax_n, ax_s = fig.axes
  step = [ln for ln in ax_n.get_lines() if ln.get_label() == "chosen N"][0]
  np.testing.assert_allclose(step.get_ydata(), n)
  assert "rollouts" in ax_n.get_ylabel() and "rollouts" in ax_s.get_ylabel()
  assert "round" in ax_s.get_xlabel()
  assert len(ax_s.collections) == 1  # the interval band
  _check_labelled_and_saved(fig, tmp_path, "adaptive")
  assert not fig.axes[1].texts  # a resolved signal needs no note
  # a signal never resolved (all None): the empty panel says so
  fig = plots.adaptive_batch(r, n, [None] * r.size)
  assert [t.get_text() for t in fig.axes[1].texts] == ["signal never resolved"]


def test_agg_safe_without_display(tmp_path):
  """In a fresh interpreter with no display, making and saving every kind of
  figure never imports an interactive backend and leaves no open pyplot figure."""
  code = f"""
import sys, numpy as np
from cbs_jax import plots
f = plots.pareto([dict(N=64, S=100.0), dict(N=256, S=40.0), dict(N=1024, S=25.0)],
                 dict(S_min=20.0, B_crit=300.0, B_crit_lo=200.0, B_crit_hi=500.0))
plots.save(f, {str(tmp_path / 'p.png')!r})
import matplotlib, matplotlib.pyplot as plt
assert plt.get_fignums() == [], plt.get_fignums()
assert not any(m.startswith(('tkinter', 'PyQt', 'PySide', 'gi.repository')) for m in sys.modules)
print('OK', matplotlib.get_backend())
"""
  env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "MPLBACKEND")}
  out = subprocess.run(
      [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
  )
  assert out.returncode == 0, out.stderr
  assert out.stdout.startswith("OK")
  assert os.path.getsize(tmp_path / "p.png") > 1000


def test_laws_draws_each_fit_and_marks_a_series_without_one():
  ns = [64, 256, 1024, 4096]
  fit = batch_law.fit_critical_batch(
      ns * 3,
      [10 * (1 + 1000 / n) * (1 + 0.05 * s) for s in (-1, 0, 1) for n in ns],
      [s for s in range(3) for _ in ns],
  )
  fig = plots.laws(
      [
          dict(label="a", N=ns * 3, S=[10 * (1 + 1000 / n) for _ in range(3) for n in ns], fit=fit),
          dict(label="b", N=ns, S=[None, 5, 4, 3], fit=dict(error="too few")),
      ]
  )
  (ax,) = fig.axes
  (line,) = [l for l in ax.get_lines() if l.get_gid() == "fit:a"]
  x, y = line.get_data()
  np.testing.assert_allclose(y, fit["S_min"] * (1 + fit["B_crit"] / x))
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert any(t.startswith("a: B_crit") for t in labels) and "b (no fit)" in labels


def test_a_law_no_run_reached_saves_on_linear_axes(tmp_path):
  """No run reached the target (a --quick sweep can end so): the figure
  saves with linear axes (a log locator raises where an axis holds no
  positive data); an axis that has data is still logarithmic."""
  fig = plots.laws([dict(label="a", N=[8, 16], S=[None, math.nan], fit=dict(error="no data"))])
  fig.savefig(tmp_path / "laws.png")
  (ax,) = fig.axes
  assert ax.get_yscale() == "linear"
  fig = plots.xy_series([dict(label="s", x=[2, 4], y=[0.0, -1.0])], "x", "y")
  fig.savefig(tmp_path / "xy.png")
  assert (fig.axes[0].get_xscale(), fig.axes[0].get_yscale()) == ("log", "linear")


def test_rule_ratios_puts_unreached_rules_on_the_top_edge():
  rows = [dict(rule="sqrt", N=n, ratio=r) for n, r in ((64, 1.1), (256, 1.0))]
  rows += [dict(rule="linear", N=n, ratio=r) for n, r in ((64, 1.6), (256, math.inf))]
  (ax,) = plots.rule_ratios(rows).axes
  labels = [t.get_text() for t in ax.get_legend().get_texts()]
  assert "linear: target not reached" in labels and "holds below 1.25" in labels


def test_nine_batch_sizes_get_nine_distinct_colours():
  """A sweep's nine N no longer wrap an eight-colour cycle (N = 64 and
  16,384 were both black): more series than the palette take a sequential
  map in series order."""
  ns = [2**k for k in range(6, 15)]
  curves = [dict(label=f"N={n}", rollouts=[0, n], steps=[0, 1], value=[0.4, 0.5]) for n in ns]
  ax = plots.learning_curves(curves).axes[0]
  colours = [
      tuple(l.get_color()) if not isinstance(l.get_color(), str) else l.get_color()
      for l in ax.get_lines()
      if l.get_label().startswith("N=")
  ]
  assert len(colours) == 9 and len(set(map(str, colours))) == 9
  few = plots.learning_curves(curves[:3]).axes[0]
  assert [l.get_color() for l in few.get_lines()][:3] == list(plots.COLORS[:3])


def test_adaptive_signal_is_not_drawn_as_a_line_where_its_interval_is_unbounded():
  inf = math.inf
  fig = plots.adaptive_batch(
      range(5), [256] * 5, [3e3, 1e6, 5e3, 3e3, 3e3], [0, 0, 0, 2e3, 2e3], [inf, inf, inf, 5e3, 4e3]
  )
  ax_s = fig.axes[1]
  (line,) = [l for l in ax_s.get_lines() if l.get_label() == "tracked B_noise (rollouts)"]
  y = np.asarray(line.get_ydata(), float)
  assert np.isnan(y[:3]).all() and np.allclose(y[3:], 3e3)
  (faint,) = [l for l in ax_s.get_lines() if l.get_label() == "estimate, interval unbounded"]
  assert list(faint.get_ydata()) == [3e3, 1e6, 5e3]


def _decimal(a):
  return np.array([float(f"{v:.10g}") for v in np.ravel(a)]).reshape(np.shape(a))


def _jittered_figure(seed: int):
  """Lines on log axes, a band, error bars (one missing) and a scatter, from
  10-digit values (what a committed table holds) each moved by up to 1e-14
  relative (what two processors' exp / power kernels can give for one
  curve; seeded)."""
  rng = np.random.default_rng(seed)
  jit = lambda a: _decimal(a) * (1 + 1e-14 * rng.uniform(-1, 1, np.shape(a)))
  g = jit(np.geomspace(64.0, 2048.0, 40))
  fig = plots.lr_envelope(
      [64, 128, 256, 512, 1024, 2048],
      jit(3e-4 * np.exp(np.linspace(-1.2, 1.0, 6))),
      [1, 1, 1, 1, 1, 0],
      lr0=3e-4,
      ref=256,
      alpha=0.41,
  )
  ax = fig.axes[0]
  ax.fill_between(g, jit(1e-4 * (g / 256) ** 0.3), jit(2e-4 * (g / 256) ** 0.45), alpha=0.2)
  yerr = jit(2e-5 * np.exp(np.linspace(0.0, 1.0, 8)))
  yerr[3] = np.nan
  ax.errorbar(g[::5], jit(1.3e-4 * (g[::5] / 256) ** 0.35), yerr=yerr, fmt="s")
  ax.scatter(g[::7], jit(1.1e-4 * (g[::7] / 256) ** 0.41))
  return fig


def test_saved_png_bytes_do_not_depend_on_the_last_bits_of_the_data(tmp_path):
  """plots.save rounds the drawn data (plots.stabilize), so the same curve
  computed with last-bit differences writes the same PNG bytes (a committed
  figure is then rebuilt byte for byte on either processor); drawn as they
  are, the same six jittered figures give several different files. The drawn
  values move by <= 5e-10 relative."""
  saved = {
      open(plots.save(_jittered_figure(s), str(tmp_path / f"{s}.png")), "rb").read()
      for s in range(6)
  }
  assert len(saved) == 1
  raw = set()
  for s in range(6):
    buf = io.BytesIO()
    _jittered_figure(s).savefig(buf, dpi=plots.DPI, format="png", bbox_inches="tight")
    raw.add(buf.getvalue())
  assert len(raw) > 1  # without the rounding, the last bits do reach the pixels
  fig = _jittered_figure(0)
  before = [np.asarray(l.get_ydata(), float) for l in fig.axes[0].get_lines()]
  plots.stabilize(fig)
  after = [np.asarray(l.get_ydata(), float) for l in fig.axes[0].get_lines()]
  for u, v in zip(before, after):
    np.testing.assert_allclose(v, u, rtol=5e-10)
