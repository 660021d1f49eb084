"""A roofline model of one RL round on a named accelerator.

Why: time-to-target(N) = S(N) * round_time(N), and a larger batch N pays only
when its throughput gain exceeds its steps-to-target saving's complement, the
samples penalty (docs/planner.md, "Time to target"). Throughput is measured on the current
device; this module *predicts* it for others from two numbers per chip: peak
dense FLOP/s and HBM bandwidth (bytes/s). Every time is
``max(FLOPs / peak, bytes / bandwidth)`` — the roofline bound, which no real
kernel beats (kernel efficiency is the ``mfu`` knob of training and is left at
1 for decoding).

Model dims (``ModelDims``, from a cbs_jax model config or explicit numbers):
  V vocab, d d_model, L layers, h query heads, kv key/value heads, dh head
  width, f SwiGLU width. d_attn = h * dh.
  Parameters (exactly what ``model.build`` creates):
    embedding V d; per layer: q (d h dh) + k, v (2 d kv dh) + o (h dh d)
    + SwiGLU 3 d f + two RMSNorm scales 2 d (+ q/k/v biases (h + 2 kv) dh,
    + q/k norms 2 dh); final norm d; LM head d V (absent when tied);
    value head d.
  A = "active" (non-embedding) parameters: every parameter a token's forward
    multiplies, i.e. all but the input-embedding table, which is gathered
    (B rows, not read in full). With tied embeddings the shared table is the
    LM head and counts.
  kv_tok = L * 2 * kv * dh * kv_bytes: bytes of K and V cached per token.

Decode step (``decode_step``): ``batch`` sequences each add one token that
attends ``context`` cached positions (itself included):
  FLOPs  = batch * (2 A + 4 L d_attn context)            [FLOP]
           (2 per multiply-add of every active weight; q.k and p.v each
           2 d_attn per attended position and layer)
  bytes  = R * A * w_bytes + batch * context * kv_tok     [bytes]
           (every weight once per step for the whole batch, R = weight
           replicas read, see chips; plus the KV cache actually attended)
  time   = max(FLOPs / (chips * peak), bytes / (chips * bandwidth))   [s]
  tokens/s = batch / time.
It is memory-bound at small batch (the weight read dominates) and
compute-bound above the crossover (``crossover_batch``)
  b* = (R A w_bytes / BW) / ((2 A + 4 L d_attn c) / peak - c kv_tok / BW)
(BW, peak summed over chips), and memory-bound at every batch when the
denominator is <= 0 (attention over a long KV cache has arithmetic intensity
2 (h/kv) / kv_bytes FLOP/byte, below the ridge peak/BW of every chip here).

Round (``round_time``), N rollouts of prompt length Tp, completion length Tc:
  prefill: FLOPs = N (2 A Tp + 2 L d_attn Tp (Tp + 1))   (causal: position i
           attends i + 1 keys, sum = Tp (Tp + 1) / 2), bytes = R A w_bytes +
           N Tp kv_tok (the cache written), time = roofline max as above;
  decode:  Tc - 1 forward steps (the prefill's last logits give token 0;
           cbs_jax's sampler feeds each sampled token back, and the last one
           needs no forward); step t = 0..Tc-2 forwards token t, which
           attends Tp + t + 1 positions (``full_cache=True``: all Tp + Tc
           slots, as a dense masked sampler does; cbs_jax's sampler attends
           its length bucket, ``sampling.segment_bounds``, in between). If
           the KV cache of N sequences does not fit next to the weights,
           decoding runs in ceil(N / b_max) equal waves;
  train:   the update teacher-forces every rollout's whole sequence,
           T = Tp + Tc tokens (prompt tokens carry no loss but the backward
           pass runs through them: completion tokens attend to their keys):
           FLOPs = passes * 3 * N (2 A T + 2 L d_attn T (T + 1)), i.e. the
           classic 6 A N T plus causal attention, with passes =
           ``epochs`` (off-policy reuse: epochs over the round; minibatches
           split the same FLOPs) and ``extra_forwards`` teacher-forced
           forwards (1 FLOPs-third each: KL reference, PPO values);
           time = FLOPs / (chips * peak * mfu) (``mfu`` default 1.0: the
           roofline bound; measured trainers reach ~0.3-0.6).
  round time = prefill + decode + train [s]; rollouts/s = N / round time.
Overheads (``Overheads``, measured by ``cbs_jax.floors``): a fixed floor per
generation step and per update, per-round host round trips and host work
per rollout (verification, tokenisation), and the fraction of the roofline
the kernels achieve; none by default (the bare roofline, a lower bound).
Not modelled: gradient all-reduce and other communication, activation
memory of the update (a trainer microbatches it; the FLOPs are unchanged).

Chips: ``chips`` scales peak FLOP/s and HBM bandwidth linearly (the chips
are summed). ``parallel="data"`` (default): every chip holds a full weight
replica and decodes batch/chips sequences, so the weights are read R = chips
times per step and per-chip memory bounds the per-chip batch; this is the
same as chips independent devices, tokens/s(chips, N) = chips *
tokens/s(1, N/chips). ``parallel="model"``: ideal tensor parallelism,
weights sharded and read once (R = 1), memory pooled; communication ignored.

Units: FLOP, FLOP/s, bytes, bytes/s, seconds, tokens, rollouts.

Accelerators: ``get_accelerator`` reads the spec-sheet table
(``ACCELERATORS``); the "cpu" entry is measured on this machine, not
tabulated: ``cbs_jax.probes`` measures it (``probes.accelerator`` resolves
every name, "cpu" included), and every function here also takes an
``Accelerator``. ``generation_roofline`` is the bound for one
``sampling.generate`` call: prefill + decode of ``batch`` sequences.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import numpy as np

GB = 1e9
GIB = 2**30
TERA = 1e12

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
PARALLEL = ("data", "model")


@dataclasses.dataclass(frozen=True)
class Accelerator:
  """One chip's roofline numbers.

  Attributes:
    name: registry name.
    peak_flops: peak dense matmul FLOP/s at ``dtype`` (per chip).
    hbm_bandwidth: memory bandwidth, bytes/s (per chip).
    memory_bytes: memory capacity, bytes (per chip).
    dtype: precision of ``peak_flops``; its width is the default bytes per
      weight and per KV entry.
    source: where the numbers come from.
  """

  name: str
  peak_flops: float
  hbm_bandwidth: float
  memory_bytes: float
  dtype: str = "bfloat16"
  source: str = ""

  def __post_init__(self):
    for field in ("peak_flops", "hbm_bandwidth", "memory_bytes"):
      v = getattr(self, field)
      if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ValueError(
            f"Accelerator {self.name!r}: {field} must be a positive finite " f"number, got {v!r}"
        )
    if self.dtype not in DTYPE_BYTES:
      raise ValueError(
          f"Accelerator {self.name!r}: dtype={self.dtype!r} not in " f"{sorted(DTYPE_BYTES)}"
      )

  @property
  def dtype_bytes(self) -> int:
    return DTYPE_BYTES[self.dtype]

  @property
  def ridge(self) -> float:
    """Arithmetic intensity (FLOP/byte) above which a kernel is compute-bound."""
    return self.peak_flops / self.hbm_bandwidth


# Public spec-sheet numbers: bf16 dense (no sparsity) peak, HBM bandwidth,
# HBM capacity, per chip.
ACCELERATORS: dict[str, Accelerator] = {
    # Google Cloud TPU docs, "TPU v4" (cloud.google.com/tpu/docs/v4): 275 TFLOPs
    # bf16 peak per chip, 32 GiB HBM2, 1200 GB/s.
    "tpu_v4": Accelerator(
        "tpu_v4", 275 * TERA, 1200 * GB, 32 * GIB, source="cloud.google.com/tpu/docs/v4"
    ),
    # Google Cloud TPU docs, "TPU v5e" (cloud.google.com/tpu/docs/v5e): 197
    # TFLOPs bf16 per chip, 16 GiB HBM2, 819 GB/s.
    "tpu_v5e": Accelerator(
        "tpu_v5e", 197 * TERA, 819 * GB, 16 * GIB, source="cloud.google.com/tpu/docs/v5e"
    ),
    # Google Cloud TPU docs, "TPU v5p" (cloud.google.com/tpu/docs/v5p): 459
    # TFLOPs bf16 per chip, 95 GiB HBM2e, 2765 GB/s.
    "tpu_v5p": Accelerator(
        "tpu_v5p", 459 * TERA, 2765 * GB, 95 * GIB, source="cloud.google.com/tpu/docs/v5p"
    ),
    # NVIDIA H100 Tensor Core GPU datasheet, SXM form factor
    # (nvidia.com/en-us/data-center/h100): BF16 1,979 TFLOPS *with sparsity*,
    # i.e. 989 dense; 80 GB HBM3; 3.35 TB/s.
    "h100_sxm": Accelerator(
        "h100_sxm", 989 * TERA, 3.35e12, 80 * GB, source="NVIDIA H100 datasheet (SXM)"
    ),
    # NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200):
    # BF16 1,979 TFLOPS with sparsity (989 dense, the H100's compute), 141 GB
    # HBM3e, 4.8 TB/s.
    "h200": Accelerator("h200", 989 * TERA, 4.8e12, 141 * GB, source="NVIDIA H200 datasheet (SXM)"),
}
# names measured on this machine (``probes.accelerator``) rather than read from the table
CALIBRATED = ("cpu",)


def known_accelerators() -> list[str]:
  return sorted(ACCELERATORS) + list(CALIBRATED)


def accelerator_key(name: str) -> str:
  """The registry spelling of ``name``: case-insensitive, '-' = '_'."""
  return str(name).strip().lower().replace("-", "_")


def get_accelerator(name: str) -> Accelerator:
  """The table entry ``name`` (``accelerator_key`` spelling), or ``name``
  itself when it is an ``Accelerator``. The measured "cpu" is not in the
  table: ``probes.accelerator`` resolves it."""
  if isinstance(name, Accelerator):
    return name
  key = accelerator_key(name)
  if key in ACCELERATORS:
    return ACCELERATORS[key]
  if key in CALIBRATED:
    raise ValueError(
        f"accelerator {name!r} is measured on this machine, not read from the "
        "table: resolve it with cbs_jax.probes.accelerator"
    )
  raise ValueError(f"unknown accelerator {name!r}; known: {', '.join(known_accelerators())}")


def check_chips(chips) -> int:
  if isinstance(chips, bool) or not isinstance(chips, (int, np.integer)) or chips <= 0:
    raise ValueError(f"chips must be a positive integer, got {chips!r}")
  return int(chips)


def _check_parallel(parallel: str) -> None:
  if parallel not in PARALLEL:
    raise ValueError(f"parallel={parallel!r} not in {list(PARALLEL)}")


# ------------------------------------------------------------------ model dims


@dataclasses.dataclass(frozen=True)
class ModelDims:
  """The shape numbers the roofline needs (fields of ``model.default_config``)."""

  vocab_size: int
  d_model: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  d_ff: int
  head_dim: int = 0  # 0 = d_model // num_heads
  tie_embeddings: bool = False
  qkv_bias: bool = False
  qk_norm: bool = False
  value_head: bool = False

  def __post_init__(self):
    for name in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff"):
      v = getattr(self, name)
      if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
        raise ValueError(f"model dims: {name} must be a positive integer, got {v!r}")
    if self.head_dim < 0 or (not self.head_dim and self.d_model % self.num_heads):
      raise ValueError(
          f"model dims: head_dim={self.head_dim} with d_model={self.d_model}, "
          f"num_heads={self.num_heads}: give head_dim > 0 or heads dividing "
          "d_model"
      )
    if self.num_heads % self.num_kv_heads:
      raise ValueError(
          f"model dims: num_kv_heads={self.num_kv_heads} does not divide "
          f"num_heads={self.num_heads}"
      )

  @classmethod
  def from_config(cls, cfg: Any) -> "ModelDims":
    """From a cbs_jax model config (ConfigDict or dict) or a ModelDims."""
    if isinstance(cfg, ModelDims):
      return cfg
    get = cfg.get if hasattr(cfg, "get") else (lambda k, d=None: getattr(cfg, k, d))
    missing = [
        k
        for k in ("vocab_size", "d_model", "num_layers", "num_heads", "num_kv_heads", "d_ff")
        if get(k, None) is None
    ]
    if missing:
      raise ValueError(
          f"model config lacks {missing}; a cbs_jax model config "
          "(model.default_config) has vocab_size, d_model, num_layers, "
          "num_heads, num_kv_heads, d_ff"
      )
    kw = {f.name: get(f.name, f.default) for f in dataclasses.fields(cls)}
    kw["head_dim"] = kw["head_dim"] or 0
    return cls(**kw)

  @property
  def dh(self) -> int:
    return self.head_dim or self.d_model // self.num_heads

  @property
  def d_attn(self) -> int:
    return self.num_heads * self.dh

  @property
  def embedding_params(self) -> int:
    return self.vocab_size * self.d_model

  @property
  def layer_params(self) -> int:
    d, h, kv, dh = self.d_model, self.num_heads, self.num_kv_heads, self.dh
    n = d * h * dh + 2 * d * kv * dh + h * dh * d + 3 * d * self.d_ff + 2 * d
    if self.qkv_bias:
      n += (h + 2 * kv) * dh
    if self.qk_norm:
      n += 2 * dh
    return n

  @property
  def param_count(self) -> int:
    """All parameters (what ``model.param_count(model.build(cfg)[1])`` gives)."""
    n = self.embedding_params + self.num_layers * self.layer_params + self.d_model
    if not self.tie_embeddings:
      n += self.d_model * self.vocab_size
    if self.value_head:
      n += self.d_model
    return n

  @property
  def active_params(self) -> int:
    """A: parameters a token's forward multiplies (all but the gathered
    input-embedding table; with tied embeddings the table is the head)."""
    return self.param_count - (0 if self.tie_embeddings else self.embedding_params)

  def kv_bytes_per_token(self, kv_bytes: float) -> float:
    return self.num_layers * 2 * self.num_kv_heads * self.dh * kv_bytes

  def forward_flops(self, tokens: int, context: float) -> float:
    """FLOPs of ``tokens`` new tokens each attending ``context`` positions."""
    return tokens * (2.0 * self.active_params + 4.0 * self.num_layers * self.d_attn * context)

  def causal_forward_flops(self, seq_len: int) -> float:
    """FLOPs of one teacher-forced causal forward over ``seq_len`` tokens:
    2 A T + 4 L d_attn * T (T + 1) / 2."""
    T = seq_len
    return 2.0 * self.active_params * T + 2.0 * self.num_layers * self.d_attn * T * (T + 1)


def as_dims(model: Any = None, **explicit) -> ModelDims:
  """ModelDims from a model config, or from explicit numbers, or a config
  with some fields overridden by ``explicit``."""
  if model is None:
    return ModelDims(**explicit)
  dims = ModelDims.from_config(model)
  return dataclasses.replace(dims, **explicit) if explicit else dims


# --------------------------------------------------------------------- costs


@dataclasses.dataclass(frozen=True)
class StepCost:
  """Roofline cost of one step (all chips together)."""

  flops: float  # FLOP
  bytes: float  # bytes moved to/from HBM
  compute_s: float  # flops / (chips * peak)
  memory_s: float  # bytes / (chips * bandwidth)

  @property
  def seconds(self) -> float:
    return max(self.compute_s, self.memory_s)

  @property
  def bound(self) -> str:
    return "compute" if self.compute_s >= self.memory_s else "memory"


def _resolve(acc, chips, parallel, weight_bytes, kv_bytes):
  acc = get_accelerator(acc)
  chips = check_chips(chips)
  _check_parallel(parallel)
  wb = acc.dtype_bytes if weight_bytes is None else weight_bytes
  kb = acc.dtype_bytes if kv_bytes is None else kv_bytes
  replicas = chips if parallel == "data" else 1
  return acc, chips, replicas, wb, kb


def decode_step(
    model: Any,
    accelerator: Any,
    batch: float,
    context: float,
    chips: int = 1,
    parallel: str = "data",
    weight_bytes: float | None = None,
    kv_bytes: float | None = None,
) -> StepCost:
  """One decode step: ``batch`` sequences each add a token attending
  ``context`` positions (module docstring for the formulas)."""
  dims = ModelDims.from_config(model)
  acc, chips, R, wb, kb = _resolve(accelerator, chips, parallel, weight_bytes, kv_bytes)
  if not batch > 0 or not context >= 0:
    raise ValueError(
        f"decode_step needs batch > 0 and context >= 0, got batch={batch}, " f"context={context}"
    )
  flops = dims.forward_flops(batch, context)
  nbytes = R * dims.active_params * wb + batch * context * dims.kv_bytes_per_token(kb)
  return StepCost(
      flops, nbytes, flops / (chips * acc.peak_flops), nbytes / (chips * acc.hbm_bandwidth)
  )


def decode_tokens_per_s(model, accelerator, batch, context, **kw) -> float:
  """Generated tokens/s at ``batch`` sequences: batch / step time."""
  return batch / decode_step(model, accelerator, batch, context, **kw).seconds


def crossover_batch(
    model: Any,
    accelerator: Any,
    context: float,
    chips: int = 1,
    parallel: str = "data",
    weight_bytes: float | None = None,
    kv_bytes: float | None = None,
) -> float:
  """Batch (all chips) above which a decode step at ``context`` is
  compute-bound: b* = (R A w / BW) / ((2A + 4 L d_attn c)/peak - c kv_tok / BW),
  peak and BW summed over chips; inf if memory-bound at every batch."""
  dims = ModelDims.from_config(model)
  acc, chips, R, wb, kb = _resolve(accelerator, chips, parallel, weight_bytes, kv_bytes)
  peak, bw = chips * acc.peak_flops, chips * acc.hbm_bandwidth
  per_seq = (
      2.0 * dims.active_params + 4.0 * dims.num_layers * dims.d_attn * context
  ) / peak - context * dims.kv_bytes_per_token(kb) / bw
  if per_seq <= 0:
    return math.inf
  return (R * dims.active_params * wb / bw) / per_seq


def max_decode_batch(
    model: Any,
    accelerator: Any,
    seq_len: int,
    chips: int = 1,
    parallel: str = "data",
    weight_bytes: float | None = None,
    kv_bytes: float | None = None,
) -> int:
  """Most sequences of ``seq_len`` cached tokens whose KV cache fits beside
  the weights (data: per-chip memory, a replica per chip; model: pooled)."""
  dims = ModelDims.from_config(model)
  acc, chips, R, wb, kb = _resolve(accelerator, chips, parallel, weight_bytes, kv_bytes)
  mem = chips * acc.memory_bytes
  weights = R * dims.param_count * wb
  free = mem - weights
  if free <= 0:
    raise ValueError(
        f"the weights ({dims.param_count} params x {wb} bytes = "
        f"{dims.param_count * wb / GB:.3g} GB per replica) do not fit in "
        f"{acc.name}'s {acc.memory_bytes / GB:.3g} GB"
        + (
            " per chip (parallel='data'); try parallel='model'"
            if parallel == "data"
            else f" x {chips} chips"
        )
    )
  per_seq = seq_len * dims.kv_bytes_per_token(kb)
  if parallel == "data":  # whole sequences per chip
    return chips * int((acc.memory_bytes - dims.param_count * wb) // per_seq)
  return int(free // per_seq)


@dataclasses.dataclass(frozen=True)
class Overheads:
  """What the roofline leaves out: fixed seconds per step and achieved
  fractions of the roofline (docs/planner.md, "Latency floors").

  A step's time is ``floor + roofline / efficiency``: the fixed cost of
  issuing it (kernel launches, dispatch, loop control), which does not
  shrink with the batch, plus the roofline time at the fraction of it the
  kernels achieve.

  Attributes:
    decode_step_s: floor of one generation step (the prefill and each decode
      step).
    update_step_s: floor of one optimizer update.
    round_trip_s: fixed seconds per round outside the steps: host-device
      round trips (dispatches, synchronisations, transfers).
    host_per_rollout_s: host work per rollout (tokenising the prompt,
      decoding and verifying the completion).
    decode_efficiency: achieved fraction of the generation roofline (above
      1 only when the roofline's peak is itself a measured, beatable number).
    train_efficiency: achieved fraction of the update's compute roofline
      (multiplies ``round_time``'s ``mfu``).
    decode_efficiency_at / train_efficiency_at: optional ``((batch,
      efficiency), ...)`` measured at several batch sizes; where given they
      replace the single efficiency: interpolated in log batch between the
      measured batches and held at the end values beyond them
      (``efficiency``). A small model's kernels reach a batch-dependent
      fraction of the roofline (cache-resident at small batches, not at
      large), which one number cannot follow across N = 64 ... 16,384.
    source: how the numbers were obtained.
  """

  decode_step_s: float = 0.0
  update_step_s: float = 0.0
  round_trip_s: float = 0.0
  host_per_rollout_s: float = 0.0
  decode_efficiency: float = 1.0
  train_efficiency: float = 1.0
  decode_efficiency_at: tuple = ()
  train_efficiency_at: tuple = ()
  source: str = ""

  def __post_init__(self):
    for f in ("decode_step_s", "update_step_s", "round_trip_s", "host_per_rollout_s"):
      v = getattr(self, f)
      if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
        raise ValueError(f"Overheads.{f} must be a finite number >= 0, got {v!r}")
    for f in ("decode_efficiency", "train_efficiency"):
      v = getattr(self, f)
      if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ValueError(f"Overheads.{f} must be a finite number > 0, got {v!r}")
    for f in ("decode_efficiency_at", "train_efficiency_at"):
      pairs = tuple((float(b), float(e)) for b, e in getattr(self, f))
      if any(not (b > 0 and math.isfinite(e) and e > 0) for b, e in pairs):
        raise ValueError(f"Overheads.{f}: every (batch, efficiency) must be > 0, got {pairs!r}")
      if len({b for b, _ in pairs}) != len(pairs):
        raise ValueError(f"Overheads.{f}: a batch size appears twice in {pairs!r}")
      object.__setattr__(self, f, tuple(sorted(pairs)))

  def efficiency(self, kind: str, batch: float) -> float:
    """The achieved fraction of the roofline of a ``kind`` ("decode" or
    "train") step at ``batch``: the per-batch table where one was measured
    (log-linear between its batches, flat beyond), else the single value."""
    pairs = getattr(self, f"{kind}_efficiency_at")
    if not pairs:
      return getattr(self, f"{kind}_efficiency")
    b, e = np.log([p[0] for p in pairs]), np.array([p[1] for p in pairs])
    return float(np.interp(math.log(batch), b, e))

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)


NO_OVERHEADS = Overheads(source="the roofline alone")


# Per-kernel launch latency, seconds: the host work of one cudaLaunchKernel,
# ~5 us on A100/H100-class GPUs (NVIDIA Technical Blog, "Getting Started with
# CUDA Graphs"; the figure most inference write-ups measure, 4-6 us). A
# decode step of a jitted XLA program launches about KERNELS_PER_LAYER fused
# kernels per layer plus a few for embedding, final norm, head and sampling
# (our estimate from XLA's fusion of attention, SwiGLU and the norms); the
# backward pass about twice the forward's. TPUs run the whole jitted program
# on the device (no per-kernel host launch) and no public per-step figure is
# known: they get no documented floors (``documented_overheads`` -> None);
# ``experiments/device_check.py`` measures them where a chip is lent.
KERNEL_LAUNCH_S = {"h100_sxm": 5e-6, "h200": 5e-6}
KERNELS_PER_LAYER = 10
KERNELS_FIXED = 6
# one host-device synchronisation over PCIe (a read-back of a few bytes)
GPU_ROUND_TRIP_S = 2e-5


def documented_overheads(model: Any, accelerator: Any) -> Overheads | None:
  """Floors from the public figures above for a named GPU (None for chips
  without one): decode step = launches of one forward step; update = three
  forwards' launches (forward + backward) per update; one round trip per
  round; efficiencies 1 (the roofline's kernels)."""
  acc = get_accelerator(accelerator)
  launch = KERNEL_LAUNCH_S.get(acc.name)
  if launch is None:
    return None
  dims = ModelDims.from_config(model)
  forward = (KERNELS_PER_LAYER * dims.num_layers + KERNELS_FIXED) * launch
  return Overheads(
      decode_step_s=forward,
      update_step_s=3 * forward,
      round_trip_s=GPU_ROUND_TRIP_S,
      source=f"documented: {launch * 1e6:.0f} us per kernel launch, "
      f"{KERNELS_PER_LAYER} kernels per layer (systems.KERNEL_LAUNCH_S)",
  )


@dataclasses.dataclass(frozen=True)
class RoundCost:
  """Predicted time of one RL round of ``n`` rollouts (seconds)."""

  n: int
  prefill_s: float
  decode_s: float
  train_s: float
  waves: int  # sequential decode waves (KV-cache memory)
  decode_compute_steps: int  # decode steps (of one wave) that are compute-bound
  decode_steps: int  # decode forward steps per wave (Tc - 1)
  train_flops: float
  gen_flops: float
  gen_bytes: float = 0.0  # bytes moved by prefill + decode (all waves)
  host_s: float = 0.0  # per-round host work and round trips (``Overheads``)

  @property
  def gen_s(self) -> float:
    return self.prefill_s + self.decode_s

  @property
  def total_s(self) -> float:
    return self.prefill_s + self.decode_s + self.train_s + self.host_s

  @property
  def rollouts_per_s(self) -> float:
    return self.n / self.total_s

  def as_dict(self) -> dict:
    d = dataclasses.asdict(self)
    d.update(gen_s=self.gen_s, total_s=self.total_s, rollouts_per_s=self.rollouts_per_s)
    return d


def train_flops(
    model: Any,
    n: int,
    prompt_len: int,
    completion_len: int,
    epochs: int = 1,
    extra_forwards: int = 0,
) -> float:
  """FLOPs of a round's updates: (3 epochs + extra_forwards) * N * causal
  forward over T = Tp + Tc (= 6 A N T + attention at one epoch)."""
  dims = ModelDims.from_config(model)
  fwd = dims.causal_forward_flops(prompt_len + completion_len)
  return (3.0 * epochs + extra_forwards) * n * fwd


def round_time(
    model: Any,
    accelerator: Any,
    n: int,
    prompt_len: int,
    completion_len: int,
    chips: int = 1,
    parallel: str = "data",
    mfu: float = 1.0,
    epochs: int = 1,
    extra_forwards: int = 0,
    weight_bytes: float | None = None,
    kv_bytes: float | None = None,
    full_cache: bool = False,
    overheads: Overheads | None = None,
    updates: int | None = None,
) -> RoundCost:
  """Time of one round of ``n`` rollouts: the roofline (module docstring),
  plus ``overheads``' floors and efficiencies when given. ``updates``:
  optimizer updates per round (default ``epochs``; each pays
  ``overheads.update_step_s``)."""
  ov = overheads or NO_OVERHEADS
  updates = epochs if updates is None else updates
  dims = ModelDims.from_config(model)
  acc, chips, R, wb, kb = _resolve(accelerator, chips, parallel, weight_bytes, kv_bytes)
  for name, v, lo in (
      ("n", n, 1),
      ("prompt_len", prompt_len, 1),
      ("completion_len", completion_len, 1),
      ("epochs", epochs, 1),
      ("extra_forwards", extra_forwards, 0),
      ("updates", updates, 1),
  ):
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo:
      raise ValueError(f"round_time: {name} must be an integer >= {lo}, got {v!r}")
  if not 0 < mfu <= 1:
    raise ValueError(f"round_time: mfu must be in (0, 1], got {mfu!r}")
  Tp, Tc = int(prompt_len), int(completion_len)
  peak, bw = chips * acc.peak_flops, chips * acc.hbm_bandwidth
  kv_tok = dims.kv_bytes_per_token(kb)
  wbytes = R * dims.active_params * wb

  bmax = max_decode_batch(dims, acc, Tp + Tc, chips, parallel, wb, kb)
  if bmax < 1:
    raise ValueError(
        f"no sequence of {Tp + Tc} tokens fits beside the weights on " f"{chips} x {acc.name}"
    )
  waves = -(-n // bmax)
  b = n / waves

  pf_flops = b * (
      2.0 * dims.active_params * Tp + 2.0 * dims.num_layers * dims.d_attn * Tp * (Tp + 1)
  )
  pf_bytes = wbytes + b * Tp * kv_tok
  d_eff, t_eff = ov.efficiency("decode", b), ov.efficiency("train", n)
  prefill = ov.decode_step_s + max(pf_flops / peak, pf_bytes / bw) / d_eff

  steps = Tc - 1  # token 0 comes from the prefill's logits
  ctx = np.full(steps, float(Tp + Tc)) if full_cache else Tp + 1.0 + np.arange(steps)
  st_flops = b * (2.0 * dims.active_params + 4.0 * dims.num_layers * dims.d_attn * ctx)
  st_bytes = wbytes + b * ctx * kv_tok
  comp, memt = st_flops / peak, st_bytes / bw
  decode = float((ov.decode_step_s + np.maximum(comp, memt) / d_eff).sum())

  tf = train_flops(dims, n, Tp, Tc, epochs, extra_forwards)
  return RoundCost(
      n=int(n),
      prefill_s=waves * prefill,
      decode_s=waves * decode,
      train_s=updates * ov.update_step_s + tf / (peak * mfu * t_eff),
      waves=waves,
      decode_compute_steps=int((comp >= memt).sum()),
      decode_steps=steps,
      train_flops=tf,
      gen_flops=waves * (pf_flops + float(st_flops.sum())),
      gen_bytes=waves * (pf_bytes + float(st_bytes.sum())),
      host_s=ov.round_trip_s + n * ov.host_per_rollout_s,
  )


def rollouts_per_s(model, accelerator, n, prompt_len, completion_len, **kw) -> float:
  """N / round_time(N)."""
  return round_time(model, accelerator, n, prompt_len, completion_len, **kw).rollouts_per_s


def describe(acc: Accelerator, chips: int = 1) -> str:
  return (
      f"{chips} x {acc.name}: {acc.peak_flops / TERA:.4g} TFLOP/s {acc.dtype}, "
      f"{acc.hbm_bandwidth / GB:.4g} GB/s, {acc.memory_bytes / GB:.4g} GB per chip "
      f"(ridge {acc.ridge:.3g} FLOP/byte; {acc.source})"
  )


def dims_summary(dims: ModelDims) -> Mapping[str, Any]:
  return dict(
      params=dims.param_count,
      active_params=dims.active_params,
      d_attn=dims.d_attn,
      head_dim=dims.dh,
      kv_bytes_per_token_bf16=dims.kv_bytes_per_token(2),
  )


def generation_roofline(
    model: Any, accelerator: Any, batch: int, prompt_len: int, completion_len: int, **kw
) -> dict:
  """The roofline of one generation call (prefill + decode, ``round_time``'s
  generation part) of ``batch`` sequences: ``seconds``, ``tokens_per_s``
  (batch x completion_len generated tokens / seconds), ``flops_per_token``
  and ``bytes_per_step`` (generation FLOPs / tokens, bytes / (1 + decode
  steps): weights + the KV cache actually attended, the cache written by the
  prefill), ``bound`` ("compute" / "memory" / "mixed" over the steps), and
  ``flops`` / ``bytes``: the call's totals."""
  r = round_time(model, accelerator, batch, prompt_len, completion_len, **kw)
  tokens = batch * completion_len
  bound = (
      "compute"
      if r.decode_compute_steps == r.decode_steps
      else "memory"
      if r.decode_compute_steps == 0
      else "mixed"
  )
  return dict(
      seconds=r.gen_s,
      tokens_per_s=tokens / r.gen_s,
      flops_per_token=r.gen_flops / tokens,
      bytes_per_step=r.gen_bytes / (r.waves * (1 + r.decode_steps)),
      bound=bound,
      prefill_s=r.prefill_s,
      decode_s=r.decode_s,
      flops=r.gen_flops,
      bytes=r.gen_bytes,
  )
