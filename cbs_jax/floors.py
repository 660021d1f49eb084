"""Latency floors and roofline efficiencies, measured on the machine at hand.

``systems.round_time`` predicts a round from the roofline; alone, it is a
lower bound that small models never approach (a decode step of a 0.1M
model is all dispatch and loop control). ``systems.Overheads`` adds what the
roofline leaves out, step by step: a step takes ``floor + roofline /
efficiency``. This module measures those numbers with the trainer's own
components (docs/planner.md, "Latency floors"):

* ``decode_step_s`` and ``decode_efficiency``: the jitted sampler
  (``sampling.make_sampler``, no EOS so every call runs all steps) timed at
  a few batch sizes; a call is 1 prefill + (Tc - 1) decode steps = Tc steps,
  so its time is ``Tc * floor + roofline_gen(b) / efficiency``;
* ``update_step_s`` and ``train_efficiency``: one optimizer update
  (``train.RoundUpdater``, metrics read back) at a few batch sizes: ``floor
  + train_roofline(n) / efficiency``;
* ``round_trip_s``: a trivial jitted call whose result is read back (one
  host-device round trip);
* ``host_per_rollout_s``: the host work of a rollout (``rollouts``' prompt
  encoding, completion decoding and verification) over many rollouts.

``fit_floor`` solves each ``time = count * floor + roofline * (1 /
efficiency)`` by non-negative least squares, weighting every point by its
time (relative errors: the small batches, where the floor shows, weigh as
much as the large ones). ``calibrate`` runs the probes and returns an
``Overheads``; the roofline it divides by is ``acc`` (default: this
device measured by ``measured_roofline``).

Units: seconds; rooflines in seconds of the given accelerator.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from scipy import optimize

from cbs_jax import model as model_lib
from cbs_jax import probes
from cbs_jax import rollouts
from cbs_jax import run_setup
from cbs_jax import sampling
from cbs_jax import systems
from cbs_jax import train


@dataclasses.dataclass(frozen=True)
class Point:
  """One calibration measurement: ``count`` steps whose roofline time is
  ``roofline_s`` took ``seconds``."""

  count: float
  roofline_s: float
  seconds: float


def fit_floor(points: Sequence[Point]) -> tuple[float, float]:
  """(floor seconds per step, efficiency) of ``seconds = count * floor +
  roofline_s / efficiency``, non-negative least squares in relative error.
  Needs two points with different roofline-per-step."""
  if len(points) < 2:
    raise ValueError(f"fit_floor needs >= 2 points, got {len(points)}")
  per = {p.roofline_s / p.count for p in points}
  if len(per) < 2:
    raise ValueError("fit_floor: the points' roofline seconds per step are all equal")
  A = np.array([[p.count, p.roofline_s] for p in points], float)
  t = np.array([p.seconds for p in points], float)
  if np.any(t <= 0):
    raise ValueError(f"fit_floor: every measured time must be > 0, got {t.tolist()}")
  (floor, inv_eff), _ = optimize.nnls(A / t[:, None], np.ones_like(t))
  if inv_eff <= 0:
    raise ValueError(
        "fit_floor: the times do not grow with the roofline (efficiency unbounded); "
        "measure at larger batches"
    )
  return float(floor), float(1.0 / inv_eff)


def measured_roofline(dtype: str = "float32", reps: int = 5) -> systems.Accelerator:
  """This device's matmul FLOP/s (``dtype``) and read bandwidth, best of
  ``reps`` (the CPU: ``probes.calibrate_cpu``'s sizes)."""
  dev = jax.devices()[0]
  on_cpu = dev.platform == "cpu"
  mm = probes.MatmulProbe(2048 if on_cpu else 8192, dtype, dev)
  bw = probes.BandwidthProbe(256 if on_cpu else 2048, dev)
  flops = mm.flops(min(mm.probe() for _ in range(reps)))
  band = bw.bandwidth(min(bw.probe() for _ in range(reps)))
  return probes.measured_accelerator(
      flops, band, name=dev.platform, dtype=dtype, source=f"measured on {dev.device_kind}"
  )


def _median_time(fn, reps: int) -> float:
  jax.block_until_ready(fn())  # compile, warm up
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    ts.append(time.perf_counter() - t)
  return statistics.median(ts)


def round_trip_seconds(reps: int = 50) -> float:
  """Median seconds of a trivial jitted call read back to the host."""
  f = jax.jit(lambda x: x + 1)
  x = jnp.zeros((8,), jnp.float32)
  return _median_time(lambda: jax.device_get(f(x)), reps)


def decode_points(graphdef, params, setup, batches, reps, acc) -> list[Point]:
  """The sampler (no EOS: all Tc steps) at each batch size in ``batches``."""
  Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
  dims = systems.ModelDims.from_config(setup.model)
  sampler = sampling.make_sampler(
      graphdef, max_new_tokens=Tc, eos_id=None, pad_id=setup.tok.pad_id, spec=setup.sampling
  )
  rng = np.random.default_rng(0)
  out = []
  for b in batches:
    prompt = jnp.asarray(rng.integers(1, setup.model.vocab_size, (b, Tp)), jnp.int32)
    mask = jnp.ones((b, Tp), bool)
    key = jax.random.key(b)
    secs = _median_time(lambda: sampler(params, prompt, mask, key), reps)
    roof = systems.round_time(dims, acc, b, Tp, Tc).gen_s
    out.append(Point(Tc, roof, secs))
  return out


def update_points(config, graphdef, params, setup, batches, reps, acc) -> list[Point]:
  """One optimizer update (``train.RoundUpdater``, no noise instrument) of a
  real rollout batch at each batch size, metrics read back."""
  K = config.batch.rollouts_per_prompt
  Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
  dims = systems.ModelDims.from_config(setup.model)
  tx = train.make_optimizer(config.optim)
  out = []
  for n in batches:
    P = n // K
    batch, _, _ = train.round_batch(config, graphdef, params, params, setup, 0, P)
    batch["on_policy"] = jnp.ones((n,), bool)
    updater = train.RoundUpdater(config, graphdef, tx, P, setup.sampling, setup.rl)
    idx = np.arange(n)[None]
    lrs = np.full((1,), config.optim.lr, np.float32)
    holder = {"state": dict(params=jax.tree.map(jnp.copy, params), opt_state=tx.init(params))}

    def step(updater=updater, holder=holder, batch=batch, idx=idx, lrs=lrs):
      holder["state"], m, _ = updater(holder["state"], batch, idx, lrs, True)
      return jax.device_get(m)

    secs = _median_time(step, reps)
    roof = systems.train_flops(dims, n, Tp, Tc) / acc.peak_flops
    out.append(Point(1, roof, secs))
  return out


def host_per_rollout_seconds(setup, n: int = 4096, reps: int = 3) -> float:
  """Seconds of host work per rollout: encode n prompts, decode n random
  completions, verify them (what ``rollouts.rollout`` does on the host)."""
  rng = np.random.default_rng(0)
  problems = setup.task.sample(rng, n)
  toks = rng.integers(0, setup.model.vocab_size, (n, setup.layout.completion_len))
  ts = []
  for _ in range(reps):
    t = time.perf_counter()
    rollouts.encode_prompts(setup.tok, problems, setup.layout)
    texts = rollouts.decode(setup.tok, toks)
    rollouts.verify(setup.task, problems, texts)
    ts.append(time.perf_counter() - t)
  return statistics.median(ts) / n


def calibrate(
    config,
    *,
    decode_batches: Sequence[int] = (16, 256, 2048),
    update_batches: Sequence[int] = (64, 2048),
    reps: int = 5,
    acc: systems.Accelerator | None = None,
    seed: int = 0,
) -> tuple[systems.Overheads, dict]:
  """Measure ``config``'s model (random init) on this device: returns the
  ``Overheads`` and the raw probe results (points, accelerator)."""
  K = config.batch.rollouts_per_prompt
  bad = [n for n in update_batches if n % K]
  if bad:
    raise ValueError(f"update_batches {bad} are not multiples of K = {K}")
  setup = run_setup.prepare(config)
  graphdef, params = model_lib.build(setup.model, seed=seed)
  acc = acc or measured_roofline(config.model.dtype)
  rt = round_trip_seconds()
  host = host_per_rollout_seconds(setup)
  dec = decode_points(graphdef, params, setup, decode_batches, reps, acc)
  upd = update_points(config, graphdef, params, setup, update_batches, reps, acc)
  d_floor, d_eff = fit_floor(dec)
  u_floor, u_eff = fit_floor(upd)
  ov = systems.Overheads(
      decode_step_s=d_floor,
      update_step_s=u_floor,
      round_trip_s=rt,
      host_per_rollout_s=host,
      decode_efficiency=d_eff,
      train_efficiency=u_eff,
      source=f"floors.calibrate on {jax.devices()[0].device_kind}",
  )
  raw = dict(
      accelerator=dataclasses.asdict(acc),
      decode=[dataclasses.asdict(p) | {"batch": b} for p, b in zip(dec, decode_batches)],
      update=[dataclasses.asdict(p) | {"batch": b} for p, b in zip(upd, update_batches)],
  )
  return ov, raw
