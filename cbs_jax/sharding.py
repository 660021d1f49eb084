"""Device mesh and logical-axis sharding (JAX SPMD, nothing home-made).

The mesh has three axes, sized by ``config.mesh.{data,fsdp,tensor}`` (one of
them may be -1 = the devices the others leave):

* ``data``: rollouts (batch rows) are split over it; parameters are
  replicated along it;
* ``fsdp``: rollouts are split over it too, and parameters are sharded along
  it (fully-sharded data parallelism: XLA gathers each weight where it is
  used and reduce-scatters its gradient);
* ``tensor``: parameters are split along it (heads, MLP width, vocabulary:
  tensor parallelism); rollouts are replicated along it.

Parameters carry logical axis names (``model.py``); ``config.mesh.rules``
(default ``DEFAULT_RULES``) maps each to a mesh axis, so a mesh change is a
config override (``--config.mesh.fsdp=4``, ``--config.mesh.rules=...``). A
dimension the mesh axis does not divide stays replicated, and so does a
second dimension of the same parameter mapped to an axis already used. The
optimizer state is sharded like the parameters it mirrors
(``state_shardings``). Batches are split along their leading (rollout)
dimension over (data, fsdp): ``batch_sharding``. ``jax.jit`` then partitions
every computation -- generation and its KV cache, the update, the noise
statistics (whose per-rollout sums XLA reduces across the data shards) -- so
the same code runs on one CPU or a pod slice by mesh shape alone.

Multi-process (``jax.distributed``): each process holds the rows of a batch
that live on its devices (``process_rows``); ``global_batch`` assembles the
processes' local rows into one global array and ``host`` gathers a global
array back to every process.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

MESH_AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the rollout dimension is split over both
# logical axis name -> mesh axis (None = replicated); a run's rules come from
# ``config.mesh.rules`` (a mesh change is a config override)
DEFAULT_RULES = {
    "vocab": "tensor",
    "mlp": "tensor",
    "heads": "tensor",
    "kv_heads": "tensor",
    "embed": "fsdp",
    "head_dim": None,
}


def format_rules(rules: dict) -> str:
  """``{"vocab": "tensor", "embed": None}`` -> ``"vocab=tensor,embed="``."""
  return ",".join(f"{k}={v or ''}" for k, v in rules.items())


def parse_rules(text: str) -> dict:
  """Inverse of ``format_rules``; ValueError naming a malformed entry or an
  unknown mesh axis."""
  rules = {}
  for item in filter(None, (t.strip() for t in str(text).split(","))):
    name, sep, axis = item.partition("=")
    name, axis = name.strip(), axis.strip()
    if not sep or not name:
      raise ValueError(f"rule {item!r} is not 'logical_axis=mesh_axis'")
    if axis and axis not in MESH_AXES:
      raise ValueError(f"rule {item!r}: mesh axis {axis!r} is not one of {MESH_AXES}")
    rules[name] = axis or None
  return rules


def mesh_shape(
    data: int = -1, fsdp: int = 1, tensor: int = 1, num_devices: int | None = None
) -> tuple[int, int, int]:
  """(data, fsdp, tensor) for ``num_devices`` (default: all), resolving the
  one -1; ValueError naming the config fields and the device count when the
  product cannot match."""
  n = jax.device_count() if num_devices is None else num_devices
  sizes = {"data": data, "fsdp": fsdp, "tensor": tensor}
  for k, v in sizes.items():
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not (v == -1 or v > 0):
      raise ValueError(
          f"config.mesh.{k} must be a positive integer or -1 (the rest), " f"got {v!r}"
      )
  rest = [k for k, v in sizes.items() if v == -1]
  named = " x ".join(f"config.mesh.{k}={v}" for k, v in sizes.items())
  if len(rest) > 1:
    raise ValueError(f"{named}: at most one mesh axis may be -1")
  fixed = int(np.prod([v for v in sizes.values() if v != -1]))
  if rest:
    if n % fixed:
      raise ValueError(
          f"{named}: the fixed axes ({fixed} devices) do not divide the " f"{n} devices"
      )
    sizes[rest[0]] = n // fixed
  elif fixed != n:
    raise ValueError(f"{named} = {fixed} devices, but there are {n} devices")
  return sizes["data"], sizes["fsdp"], sizes["tensor"]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1) -> jax.sharding.Mesh:
  """A (data, fsdp, tensor) mesh over all devices (of all processes)."""
  shape = mesh_shape(data, fsdp, tensor)
  # Auto axes: XLA's SPMD partitioner propagates shardings through jit.
  auto = (jax.sharding.AxisType.Auto,) * 3
  return jax.make_mesh(shape, MESH_AXES, axis_types=auto)


def _spec(axes, shape, mesh, rules) -> PS:
  out, used = [], set()
  for name, dim in zip(axes or (None,) * len(shape), shape):
    ax = rules.get(name) if name else None
    ok = ax and ax not in used and mesh.shape[ax] > 1 and dim % mesh.shape[ax] == 0
    out.append(ax if ok else None)
    used.add(ax)
  return PS(*out)


def param_shardings(params, mesh, rules: dict | None = None):
  """NamedSharding per parameter from its logical axis names and ``rules``
  (default ``DEFAULT_RULES``)."""
  rules = DEFAULT_RULES if rules is None else rules
  logical = nnx.get_partition_spec(params)  # PartitionSpec of logical names per leaf
  return jax.tree.map(
      lambda a, x: NamedSharding(mesh, _spec(tuple(a), x.shape, mesh, rules)),
      logical,
      params,
      is_leaf=lambda v: isinstance(v, PS),
  )


def shard_params(params, mesh, rules: dict | None = None):
  return jax.device_put(params, param_shardings(params, mesh, rules))


def state_shardings(state, params, param_sh, mesh):
  """Shardings for an optimizer state: every sub-tree shaped like ``params``
  (Adam's moments, a master copy) takes ``param_sh``; every other leaf (step
  counts, hyperparameters) is replicated."""
  pdef = jax.tree.structure(params)
  pshapes = [np.shape(x) for x in jax.tree.leaves(params)]

  def like_params(node):
    try:
      return (
          jax.tree.structure(node) == pdef
          and [np.shape(x) for x in jax.tree.leaves(node)] == pshapes
      )
    except Exception:  # pylint: disable=broad-except
      return False

  rep = NamedSharding(mesh, PS())
  return jax.tree.map(lambda n: param_sh if like_params(n) else rep, state, is_leaf=like_params)


def shard_state(state, params, param_sh, mesh):
  return jax.device_put(state, state_shardings(state, params, param_sh, mesh))


def batch_spec(mesh, rows: int) -> PS:
  """Leading-dimension spec of a batch of ``rows`` rollouts: over (data,
  fsdp) when their product divides ``rows``, else over whichever one does,
  else replicated."""
  for axes in (BATCH_AXES, ("data",), ("fsdp",)):
    size = int(np.prod([mesh.shape[a] for a in axes]))
    if size > 1 and rows % size == 0:
      return PS(axes if len(axes) > 1 else axes[0])
  return PS()


def batch_sharding(mesh, rows: int) -> NamedSharding:
  return NamedSharding(mesh, batch_spec(mesh, rows))


def shard_batch(batch: dict, mesh) -> dict:
  """Split every array's leading (rollout) dimension over (data, fsdp).
  Host (numpy) inputs must be the same global batch on every process."""

  def put(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    spec = batch_spec(mesh, x.shape[0]) if x.ndim else PS()
    return jax.device_put(x, NamedSharding(mesh, spec))

  return {k: put(v) for k, v in batch.items()}


# ------------------------------------------------------------- multi-process


def process_rows(mesh, rows: int) -> tuple[int, int]:
  """[lo, hi): the rows of a ``rows``-row batch (sharded by ``batch_sharding``)
  that live on this process's devices. ValueError if they are not one
  contiguous block (a mesh whose batch axes interleave processes)."""
  idx = batch_sharding(mesh, rows).addressable_devices_indices_map((rows,))
  spans = sorted(
      {(s[0].start or 0, rows if s[0].stop is None else s[0].stop) for s in idx.values()}
  )
  lo, hi = spans[0][0], spans[-1][1]
  covered = sum(b - a for a, b in spans)
  if covered != hi - lo:
    raise ValueError(
        f"process {jax.process_index()}'s rows of a {rows}-row batch are not "
        f"contiguous on mesh {dict(mesh.shape)}: {spans}"
    )
  return lo, hi


def global_batch(local, mesh, rows: int):
  """Global array of ``rows`` rows from this process's rows ``local`` (those
  of ``process_rows``), sharded by ``batch_sharding``."""
  local = np.asarray(local)
  return jax.make_array_from_process_local_data(
      batch_sharding(mesh, rows), local, (rows,) + local.shape[1:]
  )


def host(x) -> np.ndarray:
  """Full numpy copy of a (possibly sharded, possibly multi-process) array,
  on every process."""
  if isinstance(x, jax.Array) and not (x.is_fully_addressable or x.is_fully_replicated):
    from jax.experimental import multihost_utils  # pylint: disable=import-outside-toplevel

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def local_rows(x, mesh) -> np.ndarray:
  """This process's rows (``process_rows``) of a global batch array, as numpy,
  whatever sharding the array came with (it is first resharded by
  ``batch_sharding``, so that each device holds whole rows)."""
  rows = x.shape[0]
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    lo, hi = process_rows(mesh, rows) if jax.process_count() > 1 else (0, rows)
    return np.asarray(x)[lo:hi]
  x = jax.jit(lambda a: a, out_shardings=batch_sharding(mesh, rows))(x)
  blocks = {}
  for s in x.addressable_shards:  # replicas (tensor axis): one copy per row block
    blocks.setdefault(s.index[0].start or 0, s.data)
  out = np.concatenate([np.asarray(blocks[k]) for k in sorted(blocks)])
  lo, hi = process_rows(mesh, rows)
  if out.shape[0] != hi - lo:
    raise AssertionError(f"local rows {out.shape[0]} != process rows [{lo}, {hi})")
  return out


def initialize_distributed(dc) -> None:
  """``jax.distributed.initialize`` from ``config.distributed`` (empty / 0 /
  -1 fields left for JAX to detect: TPU VMs, SLURM, Open MPI). Must run
  before any JAX computation; a second call is a no-op."""
  if jax.distributed.is_initialized():
    return
  kw = {}
  if dc.coordinator_address:
    kw["coordinator_address"] = dc.coordinator_address
  if dc.num_processes:
    kw["num_processes"] = int(dc.num_processes)
  if dc.process_id >= 0:
    kw["process_id"] = int(dc.process_id)
  if dc.local_device_ids:
    kw["local_device_ids"] = [int(i) for i in str(dc.local_device_ids).split(",")]
  jax.distributed.initialize(
      initialization_timeout=int(dc.initialization_timeout),
      heartbeat_timeout_seconds=int(dc.heartbeat_timeout),
      **kw,
  )


def put(tree, shardings):
  """``jax.device_put(tree, shardings)``, also across processes: an array that
  lives on this process's devices only (identical on every process, e.g. a
  warm start each process computed) goes through the host, since JAX does
  not transfer between one process's device and another's."""
  if jax.process_count() > 1:
    tree = jax.tree.map(
        lambda x: np.asarray(x) if isinstance(x, jax.Array) and x.is_fully_addressable else x, tree
    )
  return jax.device_put(tree, shardings)
