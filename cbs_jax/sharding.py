"""Device mesh and logical-axis sharding (JAX SPMD, nothing home-made).

The mesh has two axes: ``data`` (rollouts / batch rows) and ``model``
(tensor parallelism). Parameters carry logical axis names (``model.py``);
``RULES`` maps each to a mesh axis, and a dimension the mesh axis does not
divide stays replicated. Batches are split along their leading (rollout)
dimension over ``data``. ``jax.jit`` then partitions every computation, so
the same training code runs on one CPU or a pod slice by mesh shape alone
(``config.mesh.data``, ``config.mesh.model``).
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from flax import nnx
from jax.sharding import PartitionSpec as PS

# logical axis name -> mesh axis (None = replicated)
RULES = {"vocab": "model", "mlp": "model", "heads": "model", "kv_heads": "model",
         "embed": None, "head_dim": None}


def make_mesh(data: int = -1, model: int = 1) -> jax.sharding.Mesh:
  """A (data, model) mesh over all devices; ``data=-1`` takes what ``model`` leaves."""
  n = jax.device_count()
  if model <= 0 or n % model:
    raise ValueError(f"config.mesh.model={model} does not divide the {n} devices")
  if data == -1:
    data = n // model
  if data * model != n:
    raise ValueError(f"config.mesh.data={data} x config.mesh.model={model} != {n} devices")
  # Auto axes: XLA's SPMD partitioner propagates shardings through jit.
  auto = (jax.sharding.AxisType.Auto,) * 2
  return jax.make_mesh((data, model), ("data", "model"), axis_types=auto)


def _spec(axes, shape, mesh) -> PS:
  out = []
  for name, dim in zip(axes or (None,) * len(shape), shape):
    ax = RULES.get(name) if name else None
    out.append(ax if ax and dim % mesh.shape[ax] == 0 else None)
  return PS(*out)


def param_shardings(params, mesh):
  """NamedSharding per parameter from its logical axis names."""
  logical = nnx.get_partition_spec(params)  # PartitionSpec of logical names per leaf
  return jax.tree.map(
      lambda a, x: NamedSharding(mesh, _spec(tuple(a), x.shape, mesh)), logical, params,
      is_leaf=lambda v: isinstance(v, PS))


def shard_params(params, mesh):
  return jax.device_put(params, param_shardings(params, mesh))


def shard_batch(batch: dict, mesh) -> dict:
  """Split every array's leading (rollout) dimension over ``data`` when it divides."""
  def put(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    spec = PS("data") if x.ndim and x.shape[0] % mesh.shape["data"] == 0 else PS()
    return jax.device_put(x, NamedSharding(mesh, spec))
  return {k: put(v) for k, v in batch.items()}
