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
  (``updater.RoundUpdater``, metrics read back) at a few batch sizes: ``floor
  + train_roofline(n) / efficiency``;
* ``round_trip_s``: a round's fixed cost outside its steps and its
  per-rollout host work: one trainer round of a single prompt
  (``train.round_batch``, K rollouts: prompt sampling and encoding,
  transfers, the sampler with EOS, decoding, verification, advantages)
  less the sampler alone at the same batch and K rollouts' host work; at
  least a trivial jitted call read back (one host-device round trip), also
  timed;
* ``host_per_rollout_s``: the host work of a rollout (``rollouts``' prompt
  encoding, completion decoding and verification) over a round's worth of
  rollouts sampled by the policy.

``fit_floor`` solves each ``time = count * floor + roofline * (1 /
efficiency)`` by non-negative least squares, weighting every point by its
time (relative errors: the small batches, where the floor shows, weigh as
much as the large ones). With the floor fitted, each probe's own efficiency
(``point_efficiency``) goes into ``Overheads.*_efficiency_at``, so the
planner follows an efficiency that changes with the batch (interpolated in
log batch between the probes). ``calibrate`` runs the probes and returns an
``Overheads``; the roofline it divides by is ``acc`` (default: this
device measured by ``measured_roofline``).

Units: seconds; rooflines in seconds of the given accelerator.
"""

from __future__ import annotations

import dataclasses
import functools
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
from cbs_jax import updater as updater_lib


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


def point_efficiency(p: Point, floor: float, fallback: float) -> float:
  """The efficiency one calibration point implies once the fitted floor is
  taken off its time: ``roofline_s / (seconds - count * floor)``; the
  fitted ``fallback`` where the floor leaves nothing (a point all floor)."""
  left = p.seconds - p.count * floor
  return p.roofline_s / left if left > 0.05 * p.seconds else fallback


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


def _timed(fn) -> float:
  t = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - t


class Probes:
  """The calibration probes of ``config``'s model (random init), compiled
  and warmed up at construction. ``once()`` times every probe once (a dict
  of seconds by probe name), so that a benchmark can interleave them with
  the work it predicts and let slow drift of the machine hit both alike;
  ``fit(samples)`` turns the medians of ``once()``'s results into
  ``Overheads``."""

  def __init__(
      self,
      config,
      decode_batches: Sequence[int] = (16, 256, 2048),
      update_batches: Sequence[int] = (64, 2048),
      acc: systems.Accelerator | None = None,
      seed: int = 0,
      host_rollouts: int = 4096,
  ):
    K = config.batch.rollouts_per_prompt
    bad = [n for n in update_batches if n % K]
    if bad:
      raise ValueError(f"update_batches {bad} are not multiples of K = {K}")
    if host_rollouts % K or host_rollouts <= 0:
      raise ValueError(f"host_rollouts={host_rollouts} is not a positive multiple of K = {K}")
    if len(decode_batches) < 2 or len(update_batches) < 2:
      raise ValueError("give >= 2 decode_batches and >= 2 update_batches (a floor and a slope)")
    self.setup = setup = run_setup.prepare(config)
    graphdef, params = model_lib.build(setup.model, seed=seed)
    self.acc = acc or measured_roofline(config.model.dtype)
    Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
    dims = systems.ModelDims.from_config(setup.model)
    self.fns, self.points = {}, {}  # name -> callable; name -> (count, roofline seconds)

    f = jax.jit(lambda x: x + 1)
    x = jnp.zeros((8,), jnp.float32)
    self.fns["round_trip"] = lambda: jax.device_get(f(x))

    rng = np.random.default_rng(seed)
    # the host work of a round of host_rollouts: its prompts encoded once,
    # its completions (sampled by this policy with EOS, as a round's are,
    # not random tokens) decoded and verified against their own prompts
    problems = setup.task.sample(rng, host_rollouts // K)
    gen = rollouts.rollout(
        graphdef,
        params,
        setup.task,
        setup.tok,
        problems,
        K,
        jax.random.key(seed),
        setup.layout,
        setup.sampling,
    )
    toks = np.asarray(gen["completion"])
    repeated = [p for p in problems for _ in range(K)]

    def host():
      rollouts.encode_prompts(setup.tok, problems, setup.layout)
      rollouts.verify(setup.task, repeated, rollouts.decode(setup.tok, toks))

    self.fns["host"], self.host_rollouts = host, host_rollouts

    sampler = sampling.make_sampler(
        graphdef, max_new_tokens=Tc, eos_id=None, pad_id=setup.tok.pad_id, spec=setup.sampling
    )
    for b in decode_batches:
      prompt = jnp.asarray(rng.integers(1, setup.model.vocab_size, (b, Tp)), jnp.int32)
      mask, key = jnp.ones((b, Tp), bool), jax.random.key(b)
      self.fns[f"decode@{b}"] = functools.partial(sampler, params, prompt, mask, key)
      self.points[f"decode@{b}"] = (Tc, systems.round_time(dims, self.acc, b, Tp, Tc).gen_s)

    # one round of a single prompt, and the sampler alone at its batch: the
    # difference is what a round pays besides its steps (fit: round_trip_s)
    self.round_batch = K
    self.fns[f"round@{K}"] = lambda: train.round_batch(
        config, graphdef, params, params, setup, 0, 1
    )[0]
    self.fns[f"sampler@{K}"] = functools.partial(
        sampler,
        params,
        jnp.asarray(rng.integers(1, setup.model.vocab_size, (K, Tp)), jnp.int32),
        jnp.ones((K, Tp), bool),
        jax.random.key(0),
    )

    tx = updater_lib.make_optimizer(config.optim)
    for n in update_batches:
      P = n // K
      batch, _, _ = train.round_batch(config, graphdef, params, params, setup, 0, P)
      batch["on_policy"] = jnp.ones((n,), bool)
      updater = updater_lib.RoundUpdater(config, graphdef, tx, P, setup.sampling, setup.rl)
      idx, lrs = np.arange(n)[None], np.full((1,), config.optim.lr, np.float32)
      holder = {"state": dict(params=jax.tree.map(jnp.copy, params), opt_state=tx.init(params))}

      def step(updater=updater, holder=holder, batch=batch, idx=idx, lrs=lrs):
        holder["state"], m, _ = updater(holder["state"], batch, idx, lrs, True)
        return jax.device_get(m)

      self.fns[f"update@{n}"] = step
      roof = systems.train_flops(dims, n, Tp, Tc) / self.acc.peak_flops
      self.points[f"update@{n}"] = (1, roof)
    for fn in self.fns.values():  # compile, warm up
      _timed(fn)

  def once(self) -> dict[str, float]:
    """Seconds of one call of every probe, each timed on its second call in
    a row, after the process has gone quiet (``probes.settle``): the state
    a run's steady rounds see, where a program follows itself. On the CPU a
    call that follows a larger program shares the cores with that
    program's clean-up (the quickstart update at 256 rollouts: ~30 ms
    instead of ~17 ms for ~0.3 s after a 16,384-rollout update;
    docs/planner.md, "Host memory"), which no round of a run at one batch
    size pays."""
    out = {}
    for name, fn in self.fns.items():
      probes.settle()
      jax.block_until_ready(fn())
      out[name] = _timed(fn)
    return out

  def round_fixed_s(self, med: dict) -> float:
    """A round's seconds outside its steps and its rollouts' host work,
    from the medians of ``once()``: the single-prompt round less the
    sampler at its batch and that many rollouts' host work, at least one
    round trip."""
    K = self.round_batch
    host = K * med["host"] / self.host_rollouts
    return max(med[f"round@{K}"] - med[f"sampler@{K}"] - host, med["round_trip"])

  def fit(self, samples: Sequence[dict]) -> tuple[systems.Overheads, dict]:
    """``Overheads`` from the medians of ``once()`` results, and the raw
    calibration (accelerator, points by batch)."""
    med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
    pts = {k: Point(*self.points[k], med[k]) for k in self.points}
    dec = [p for k, p in pts.items() if k.startswith("decode@")]
    upd = [p for k, p in pts.items() if k.startswith("update@")]
    d_floor, d_eff = fit_floor(dec)
    u_floor, u_eff = fit_floor(upd)
    batch_of = lambda k: int(k.split("@")[1])
    ov = systems.Overheads(
        decode_step_s=d_floor,
        update_step_s=u_floor,
        round_trip_s=self.round_fixed_s(med),
        host_per_rollout_s=med["host"] / self.host_rollouts,
        decode_efficiency=d_eff,
        train_efficiency=u_eff,
        decode_efficiency_at=tuple(
            (batch_of(k), point_efficiency(p, d_floor, d_eff))
            for k, p in pts.items()
            if k.startswith("decode@")
        ),
        train_efficiency_at=tuple(
            (batch_of(k), point_efficiency(p, u_floor, u_eff))
            for k, p in pts.items()
            if k.startswith("update@")
        ),
        source=f"floors.calibrate on {jax.devices()[0].device_kind}",
    )
    raw = dict(
        accelerator=dataclasses.asdict(self.acc),
        round_trip_s=med["round_trip"],
        round_fixed_s=ov.round_trip_s,
        decode=[
            dataclasses.asdict(p) | {"batch": int(k[7:])}
            for k, p in pts.items()
            if k.startswith("decode@")
        ],
        update=[
            dataclasses.asdict(p) | {"batch": int(k[7:])}
            for k, p in pts.items()
            if k.startswith("update@")
        ],
        samples=len(samples),
    )
    return ov, raw


def calibrate(
    config,
    *,
    decode_batches: Sequence[int] = (16, 256, 2048),
    update_batches: Sequence[int] = (64, 2048),
    reps: int = 5,
    acc: systems.Accelerator | None = None,
    seed: int = 0,
) -> tuple[systems.Overheads, dict]:
  """Measure ``config``'s model (random init) on this device: ``reps``
  timings of every probe (``Probes``), fitted from their medians. Returns
  the ``Overheads`` and the raw probe results (points, accelerator)."""
  p = Probes(config, decode_batches, update_batches, acc, seed)
  return p.fit([p.once() for _ in range(reps)])
