# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.7
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # A tour of cbs_jax: gradient noise and the critical batch size of GRPO
#
# [![Open in Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research.google.com/github/cbs-jax/cbs_jax/blob/main/colab/cbs_jax_tour.ipynb)
#
# From a fresh Colab **CPU** runtime, in under 10 minutes:
#
# 1. install cbs_jax;
# 2. train a tiny policy with GRPO on arithmetic (a supervised base first);
# 3. learning curves, by rollouts and by optimizer steps;
# 4. the live gradient-noise tracker that runs inside every training round;
# 5. a precise measurement of the checkpoint: the intra-/inter-prompt split of the noise;
# 6. a short batch-size sweep at sqrt learning-rate scaling, with the fit
#    S(N) = S_min (1 + B_crit / N) and its interval;
# 7. the planner's batch-size recommendation for a named accelerator.
#
# Everything below is the library's own code (`cbs_jax.train`, `.measure`,
# `.sweep`, `.batch_law`, `.plan`, `.plots`); the notebook only wires it. The numbers in
# the committed outputs come from one run at the `colab` size on an idle 2-core CPU
# (`python colab/build_tour.py --fresh_env`: a new virtual environment holding only
# JAX, Flax, Optax, Orbax and matplotlib, as a Colab runtime does, so the install cell
# below installed cbs_jax, from a local clone): they show what the code reports, at a
# scale far too small to be a result.
#
# This notebook is paired with `colab/cbs_jax_tour.py` (jupytext, percent format);
# edit either and run `jupytext --sync colab/cbs_jax_tour.ipynb`.

# %% [markdown]
# ## 0. Configuration
# `SIZE` is the only switch: `"colab"` (the default, under 10 minutes on a Colab CPU
# runtime) or `"tiny"` (a smoke run of a couple of minutes, what the test suite runs;
# its numbers mean nothing). Environment variables override the defaults so the
# tests can run this file unchanged.

# %%
import os

SIZE = os.environ.get("CBS_JAX_TOUR_SIZE", "colab")  # "colab" | "tiny"
REPO_URL = "https://github.com/cbs-jax/cbs_jax"  # public repository (placeholder URL)
LOCAL_PATH = os.environ.get("CBS_JAX_LOCAL_PATH")  # install from a local checkout instead
WORKDIR = os.path.abspath(os.environ.get("CBS_JAX_TOUR_DIR", "cbs_jax_tour"))
ACCELERATOR, CHIPS = "tpu_v5e", 8  # the planner's target (section 7)

SIZES = {
    # sft_steps: supervised warm start; rounds x (P prompts x K rollouts): the GRPO run;
    # measure_*: the precise measurement (M pooled batches of P x K at fixed parameters);
    # sweep_*: prompts per round at K rollouts each, seeds per batch size, the target
    # (gain in exact expected pass rate over the shared base), the rollout budget per run
    # and the rollouts between evaluations.
    "colab": dict(
        max_digits=3,
        num_layers=2,
        sft_steps=2000,
        P=16,
        K=16,
        rounds=300,
        eval_every=25,
        eval_prompts=512,
        measure_P=32,
        measure_K=16,
        measure_M=8,
        sweep_P=(8, 32, 128),
        sweep_K=16,
        seeds=(0, 1, 2),
        target_gain=0.04,
        budget=60_000,
        eval_rollouts=1024,
    ),
    "tiny": dict(
        max_digits=1,
        num_layers=1,
        sft_steps=150,
        P=4,
        K=4,
        rounds=8,
        eval_every=2,
        eval_prompts=32,
        measure_P=4,
        measure_K=4,
        measure_M=16,
        sweep_P=(2, 4, 8),
        sweep_K=4,
        seeds=(0, 1, 2),
        target_gain=0.0005,
        budget=160,
        eval_rollouts=16,
    ),
}
S = SIZES[SIZE]
FIGS = os.path.join(WORKDIR, "figures")
os.makedirs(FIGS, exist_ok=True)
print(f"size={SIZE}, workdir={os.path.relpath(WORKDIR)}")

# %% [markdown]
# ## 1. Install
# On Colab this installs cbs_jax from the repository (JAX, Flax, Optax and Orbax are
# already on the runtime, so it takes about a minute). Where cbs_jax is already
# importable from `LOCAL_PATH` (the tests), nothing is installed.

# %%
import importlib.util
import subprocess
import sys


def _installed_from():
  spec = importlib.util.find_spec("cbs_jax")
  return None if spec is None else os.path.dirname(os.path.dirname(spec.origin))


where = _installed_from()
if where is not None and (LOCAL_PATH is None or os.path.samefile(where, LOCAL_PATH)):
  print("cbs_jax already installed from", where)
else:
  source = LOCAL_PATH or f"git+{REPO_URL}"
  print("pip install", source)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", source], check=True)

# %% [markdown]
# Imports, and a persistent compilation cache: the sweep below re-runs the same
# shapes with other seeds, and XLA then reuses the compiled programs instead of
# compiling them again (several seconds each on a CPU).

# %%
import contextlib
import io
import json
import time

import jax
import numpy as np
from absl import logging

jax.config.update(
    "jax_compilation_cache_dir",  # a cache you already use is kept
    os.environ.get("JAX_COMPILATION_CACHE_DIR") or os.path.join(WORKDIR, "jax_cache"),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
logging.set_verbosity(logging.WARNING)

from cbs_jax import batch_law, lr_rules
from cbs_jax import measure, metrics, plan, plots, sweep, train
from cbs_jax import run_setup
from configs import default

try:
  from IPython.display import Image, display
except ImportError:  # plain python (the .py twin run as a script)
  Image = display = None


def show(fig, name):
  """Save a figure under FIGS and display it."""
  path = plots.save(fig, os.path.join(FIGS, f"{name}.png"))
  if display is not None:
    display(Image(filename=path))
  print("figure:", os.path.relpath(path, WORKDIR))


@contextlib.contextmanager
def quiet(log_name):
  """Send a run's per-round console lines to a log file (they are also in metrics.jsonl)."""
  with open(os.path.join(WORKDIR, log_name), "a") as f, contextlib.redirect_stdout(f):
    yield


T_START, CPU_START = time.time(), time.process_time()
print("jax", jax.__version__, "devices:", jax.devices())

# %% [markdown]
# ## 2. A tiny GRPO run on arithmetic
# `configs/default.py` is the CPU quickstart: 1-3 digit addition and subtraction, a
# 0.1M-parameter decoder, a supervised base trained on solutions with 30% label noise
# (so it samples wrong answers, as a pretrained model does before RL), then GRPO with
# P = 16 prompts x K = 16 rollouts per round. Here it is shortened (`SIZES`). Every round
# also runs the split-microbatch noise tracker (`noise.split_every = 1`), nearly free.
#
# Held-out evaluation is on prompts never drawn for training; `eval_expected_pass` is
# the **exact** expected pass@1 by teacher forcing over every accepted answer (no
# sampling noise), `eval_pass_rate` the sampled one (SE ~0.02 at 512 prompts).

# %%
config = default.get_config()
config.task.kwargs.max_digits = S["max_digits"]  # operands of 1..max_digits digits
config.model.num_layers = S["num_layers"]
config.sft.steps = S["sft_steps"]
config.sft.eval_every = 0
config.batch.num_prompts, config.batch.rollouts_per_prompt = S["P"], S["K"]
config.train.num_rounds = S["rounds"]
config.train.eval_every = S["eval_every"]
config.train.eval_prompts = S["eval_prompts"]
config.train.checkpoint_every = S["rounds"]
config.train.progress = False
config.sft.base_dir = os.path.join(WORKDIR, "sft_base")  # shared with the sweep below
RUN = os.path.join(WORKDIR, "grpo")

t0 = time.time()
with quiet("grpo.log"):
  summary = train.train_and_evaluate(config, RUN)
T_TRAIN = time.time() - t0
print(
    f"SFT + GRPO: {T_TRAIN:.0f} s  ({summary['rollouts_seen']} rollouts, "
    f"{summary['optimizer_steps']} optimizer steps)"
)
print(
    f"held-out exact expected pass@1: base {summary['base_pass_rate']:.3f} -> "
    f"{summary['final_pass_rate']:.3f}; sampled at the end: "
    f"{summary['final_sampled_pass_rate']:.3f}"
)

# %% [markdown]
# ## 3. Learning curves, by rollouts and by optimizer steps
# One update per round here, so steps = rounds and rollouts = N x steps; the two axes
# part ways in the sweep (section 6), where N varies.

# %%
rows = metrics.read_jsonl(os.path.join(RUN, "metrics.jsonl"))
ev = [r for r in rows if "eval_expected_pass" in r]
step_of_round = {0: 0}
n_steps = 0
for r in rows:
  if r["round"] > 0:
    n_steps += r.get("num_updates", 1)
    step_of_round[r["round"]] = n_steps
curves = [
    dict(
        label="exact expected pass@1",
        rollouts=[r["rollouts_seen"] for r in ev],
        steps=[step_of_round[r["round"]] for r in ev],
        value=[r["eval_expected_pass"] for r in ev],
    )
]
sampled = [r for r in ev if "eval_pass_rate" in r]
if sampled:
  p = np.array([r["eval_pass_rate"] for r in sampled])
  se = np.sqrt(p * (1 - p) / config.train.eval_prompts)
  curves.append(
      dict(
          label="sampled pass@1 (± 1 binomial SE)",
          rollouts=[r["rollouts_seen"] for r in sampled],
          steps=[step_of_round[r["round"]] for r in sampled],
          value=p,
          lo=p - se,
          hi=p + se,
      )
  )
show(
    plots.learning_curves(curves, title=f"GRPO on arithmetic, N = {S['P'] * S['K']}"),
    "learning_curves",
)

# %% [markdown]
# ## 4. The live noise tracker
# Each round's gradient is computed as four microbatches (2 prompt halves x 2 rollout
# halves); their differences give unbiased estimates of tr Σ_intra, tr Σ_inter and |G|²
# at no extra cost. A single round's |G|² is mostly noise, so the tracker keeps EMAs of
# numerator and denominator and reports B_noise = B_intra + K·B_inter (in rollouts) with
# an interval (± 2 SE) once |G|² is resolved.

# %%
tr = [r for r in rows if r["round"] > 0 and "noise_ema/g2" in r]
rounds = [r["round"] for r in tr]
K = S["K"]
get = lambda key, scale=1.0: [
    scale * float(r[key]) if r.get(key) is not None else np.nan for r in tr
]  # (metrics.jsonl writes infinity as "inf")
series = {
    "B_noise (tracker)": get("noise_ema/b_noise"),
    "B_intra (tracker)": get("noise_ema/b_intra"),
    f"K·B_inter (tracker, K={K})": get("noise_ema/b_inter", K),
}
bands = {"B_noise (tracker)": (get("noise_ema/b_noise_lo"), get("noise_ema/b_noise_hi"))}
show(
    plots.noise_over_training(rounds, dict(series), bands, title="live noise tracker (EMA)"),
    "noise_tracker",
)
fmt = lambda v: "unresolved" if v is None or not np.isfinite(float(v)) else f"{float(v):.4g}"
last = tr[-1]
print(
    f"round {last['round']}: tracker B_noise = {fmt(last.get('noise_ema/b_noise'))} rollouts "
    f"(interval {fmt(last.get('noise_ema/b_noise_lo'))} .. "
    f"{fmt(last.get('noise_ema/b_noise_hi'))}), |G|^2 EMA = {fmt(last.get('noise_ema/g2'))}, "
    f"intra:inter per rollout = {fmt(last.get('noise_ema/ratio'))}"
)

# %% [markdown]
# ## 5. A precise measurement of the checkpoint
# `cbs_jax.measure` pools M fresh batches at fixed parameters (prompts disjoint from
# training), computes every rollout's own gradient statistics exactly (streamed, never
# holding N gradients), and gives jackknife standard errors over batches. Noise scales
# are reported only where |G|² is significantly positive. We measure the supervised
# base (round 0) and the final checkpoint.
#
# The decomposition: N times the covariance of the batch gradient is
# tr Σ_intra + K·tr Σ_inter. The first part shrinks with more rollouts per prompt, the
# second only with more prompts. Group-normalised advantages make a prompt's K
# rollouts exchangeable, not independent: the split holds at the measured K.

# %%
setup = run_setup.prepare(config)
measured = {}
t0 = time.time()
for label, rnd in (("SFT base", 0), (f"after {S['rounds']} rounds", None)):
  graphdef, params, at = measure.load_policy(config, RUN, setup, round_=rnd)
  res = measure.measure(
      config,
      graphdef,
      params,
      setup,
      P=S["measure_P"],
      K=S["measure_K"],
      M=S["measure_M"],
      progress=False,
  )
  measured[label] = (at, res)
  print(f"== {label} (round {at}) ==")
  print(measure.format_table(res))
T_MEASURE = time.time() - t0
print(f"measurement: {T_MEASURE:.0f} s")

# %%
Km = S["measure_K"]
labels = list(measured)
ex = [measured[k][1]["exact"] for k in labels]
show(
    plots.noise_decomposition(
        labels,
        [e.trace_intra for e in ex],
        [Km * e.trace_inter for e in ex],
        [e.trace_intra_se for e in ex],
        [Km * e.trace_inter_se for e in ex],
        stacked=True,
        ylabel="N · Cov(batch gradient), trace (|g|² per rollout)",
        intra_label="intra-prompt: tr Σ_intra",
        inter_label=f"inter-prompt: K·tr Σ_inter (K={Km})",
        title=f"Noise decomposition ({S['measure_M']} pooled batches of "
        f"{S['measure_P']}x{Km}, ± 1 SE)",
    ),
    "noise_decomposition",
)

# %% [markdown]
# The tracker over training with the two precise measurements (markers, ± 1 SE) at the
# rounds they were taken:

# %%
for label, (at, res) in measured.items():
  e = res["exact"]
  if np.isfinite(e.b_noise) and res["K"] == K:
    series[f"B_noise precise: {label}"] = [e.b_noise]
    bands[f"B_noise precise: {label}"] = ([e.b_noise - e.b_noise_se], [e.b_noise + e.b_noise_se])
xs = {k: (rounds if "tracker" in k else [measured[k.split(": ", 1)[1]][0]]) for k in series}
show(
    plots.noise_over_training(xs, series, bands, title="gradient noise scale over training"),
    "noise_over_training",
)

# %% [markdown]
# ## 6. A short batch-size sweep at sqrt learning-rate scaling
# Runs from the same supervised base at three batch sizes N = P x K, three seeds each,
# with lr = lr0 · sqrt(N / 256) (Adam's rule, `optim.lr_rule = "sqrt"`), each stopping
# when the exact expected pass rate gains `target_gain` over the base. `cbs_jax.sweep`
# runs them resumably (rerun this cell and finished runs are read back).
# Steps-to-target S(N) is then fitted to S = S_min (1 + B_crit / N) with seeds as
# replicates and a bootstrap interval (`batch_law.fit_critical_batch`). The fit is
# *resolved* only when the B_crit interval lies inside the swept range: a knee outside
# the sweep was not observed.

# %%
base_pass = summary["base_pass_rate"]
TARGET = round(base_pass + S["target_gain"], 4)
Ks = S["sweep_K"]
sweep_base = config.copy_and_resolve_references()
sweep_base.train.stop_at_pass_rate = TARGET
sweep_base.train.eval_sampled = False  # the exact eval is the one judged on
sweep_base.noise.split_every = 0  # no tracker needed here (fewer programs to compile)
sweep_base.train.checkpoint_every = 10_000  # the last round is always saved
overrides = []
for P in S["sweep_P"]:
  for seed in S["seeds"]:
    n = P * Ks
    overrides.append(
        {
            "batch.num_prompts": P,
            "batch.rollouts_per_prompt": Ks,
            "seed": seed,
            "train.num_rounds": max(2, S["budget"] // n),
            "train.eval_every": max(1, S["eval_rollouts"] // n),
        }
    )
print(f"target: exact expected pass {TARGET} (base {base_pass:.4f}); {len(overrides)} runs")
t0 = time.time()
with quiet("sweep.log"):
  results = sweep.run_sweep(sweep_base, overrides, os.path.join(WORKDIR, "sweep"), progress=False)
T_SWEEP = time.time() - t0
print(f"sweep: {T_SWEEP:.0f} s")

points, sweep_curves = [], []
for ov, res in zip(overrides, results):
  n = ov["batch.num_prompts"] * Ks
  m = metrics.read_jsonl(os.path.join(res["workdir"], "metrics.jsonl"))
  e = [r for r in m if "eval_expected_pass" in r]
  s = batch_law.steps_to_target(
      [r["round"] for r in e], [r["eval_expected_pass"] for r in e], TARGET
  )
  lr = config.optim.lr * lr_rules.lr_scale(config.optim.lr_rule, n, config.optim.ref_batch)
  points.append(dict(N=n, S=s, seed=ov["seed"], lr=lr))
  if ov["seed"] == S["seeds"][0]:
    sweep_curves.append(
        dict(
            label=f"N={n}",
            rollouts=[r["rollouts_seen"] for r in e],
            steps=[r["round"] for r in e],
            value=[r["eval_expected_pass"] for r in e],
        )
    )
for p in points:
  print(
      f"N={p['N']:>5}  seed={p['seed']}  lr={p['lr']:.2e}  steps to target: "
      + ("not reached" if p["S"] is None else f"{p['S']:.1f}")
  )

# %%
show(
    plots.learning_curves(
        sweep_curves,
        target=TARGET,
        logx=True,
        ylabel="exact expected pass@1 (fraction)",
        title=f"sweep (seed {S['seeds'][0]}), lr ∝ sqrt(N)",
    ),
    "sweep_curves",
)
try:
  fit = batch_law.fit_critical_batch(
      [p["N"] for p in points], [p["S"] for p in points], seeds=[p["seed"] for p in points]
  )
  print(
      f"S_min = {fit['S_min']:.3g} steps [{fit['S_min_lo']:.3g}, {fit['S_min_hi']:.3g}], "
      f"B_crit = {fit['B_crit']:.4g} rollouts, {100 * fit['level']:.0f}% interval "
      f"[{fit['B_crit_lo']:.4g}, {fit['B_crit_hi']:.4g}], R² = {fit['r2']:.3f}: "
      f"{fit['verdict']} {fit['why']}"
  )
except ValueError as err:  # too few batch sizes reached the target
  fit = None
  print("no fit:", err)
final = measured[labels[-1]][1]["exact"]
b_noise = (
    (final.b_noise, final.b_noise - final.b_noise_se, final.b_noise + final.b_noise_se)
    if np.isfinite(final.b_noise) and S["measure_K"] == Ks
    else None
)
show(plots.steps_vs_batch(points, fit, b_noise=b_noise), "steps_vs_batch")
show(plots.pareto(points, fit), "pareto")

# %% [markdown]
# ## 7. The planner: which N on a given accelerator?
# `cbs_jax.plan` combines the batch-size law with a roofline model of the accelerator
# (decode reads every weight and the KV cache once per step; training costs ~6 x params
# x tokens FLOPs): time-to-target(N) = S(N) x round_time(N), with B_crit from the
# sweep's fit (and the N it recommends at either end of the fit's interval); without a
# fit, the measured B_noise stands in for B_crit.

# %%
prompt_len, completion_len, _ = plan.task_lengths(config)
recommend = lambda src: plan.recommend(
    src, ACCELERATOR, CHIPS, setup.model, prompt_len, completion_len, optim=config.optim
)
rec = None
if fit is not None:
  rec = recommend(
      dict(
          B_crit=fit["B_crit"],
          S_min=fit["S_min"],
          K=Ks,
          source=f"this notebook's sweep ({fit['verdict']})",
      )
  )
  print(plan.format_report(rec))
  # how far the recommendation moves across the fit's B_crit interval
  for edge in ("B_crit_lo", "B_crit_hi"):
    if np.isfinite(fit[edge]) and fit[edge] > 0:
      r = recommend(dict(B_crit=fit[edge], K=Ks, source=edge))
      print(f"with B_crit at {edge} = {fit[edge]:.4g}: recommended N = {r['best']['n']}")
  if not fit["resolved"]:
    print(
        "caveat: the fit is unresolved (" + fit["why"] + "), so the recommendation is only "
        "as good as that interval."
    )
else:  # no fit: the measured noise scale is the estimate of B_crit
  for cand in (
      dict(
          b_noise=final.b_noise,
          b_noise_se=final.b_noise_se,
          b_noise_floor=final.b_noise_floor,
          K=S["measure_K"],
          flag=final.flag,
          source="this notebook's precise measurement",
      ),
      dict(summary.get("noise", {}), K=K, source="the training tracker"),
  ):
    try:
      rec = recommend(cand)
      print(plan.format_report(rec))
      break
    except ValueError as err:  # |G|^2 not resolved: no noise scale to plan with
      print(f"not usable ({cand['source']}): {err}")
if rec is None:
  print("no fit and no resolved noise scale: nothing to plan with")

# %% [markdown]
# ## What this showed, and what it did not
# At this size every number above comes from a few minutes of CPU time: one base, a
# short run, a handful of pooled batches, three seeds. The point is the workflow and the
# instruments, and what they say when the data are too few: a |G|² that is not
# significantly positive leaves B_noise unreported, and a B_crit interval that leaves
# the swept range is called unresolved rather than quoted. The studies themselves (noise
# over 1,000 rounds, a sweep across the knee, off-policy drift) are `experiments/*.py`,
# with results and the command that made each figure in `experiments/results/`.
#
# About the committed outputs: they were produced by `python colab/build_tour.py` on a
# shared 2-core machine while other jobs were running, so the wall times printed above
# are several times an idle machine's. `cpu_s` below (CPU seconds of the whole notebook,
# all threads) does not depend on that load and bounds the wall time on an idle 2-core
# machine.

# %%
T_TOTAL = time.time() - T_START
timing = dict(
    size=SIZE,
    train_s=T_TRAIN,
    measure_s=T_MEASURE,
    sweep_s=T_SWEEP,
    total_s=T_TOTAL,
    cpu_s=time.process_time() - CPU_START,
    figures=sorted(os.listdir(FIGS)),
)
with open(os.path.join(WORKDIR, "tour_timing.json"), "w") as f:
  json.dump(timing, f, indent=1)
print(json.dumps(timing, indent=1))
