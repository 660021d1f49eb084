"""Device mesh and logical-axis sharding (JAX SPMD, nothing home-made).

The mesh has two axes: ``data`` (rollouts / batch rows) and ``model``
(tensor parallelism). Parameters carry logical axis names (``model.py``);
``config.mesh.rules`` (default ``DEFAULT_RULES``) maps each to a mesh axis, and a dimension the mesh axis does not
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

# logical axis name -> mesh axis (None = replicated); a run's rules come from
# ``config.mesh.rules`` (a mesh change is a config override)
DEFAULT_RULES = {"vocab": "model", "mlp": "model", "heads": "model", "kv_heads": "model",
                 "embed": None, "head_dim": None}
MESH_AXES = ("data", "model")


def format_rules(rules: dict) -> str:
  """``{"vocab": "model", "embed": None}`` -> ``"vocab=model,embed="``."""
  return ",".join(f"{k}={v or ''}" for k, v in rules.items())


def parse_rules(text: str) -> dict:
  """Inverse of ``format_rules``; ValueError naming a malformed entry or an
  unknown mesh axis."""
  rules = {}
  for item in filter(None, (t.strip() for t in str(text).split(","))):
    name, sep, axis = item.partition("=")
    if not sep or not name:
      raise ValueError(f"rule {item!r} is not 'logical_axis=mesh_axis'")
    if axis and axis not in MESH_AXES:
      raise ValueError(f"rule {item!r}: mesh axis {axis!r} is not one of {MESH_AXES}")
    rules[name.strip()] = axis.strip() or None
  return rules


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


def _spec(axes, shape, mesh, rules) -> PS:
  out = []
  for name, dim in zip(axes or (None,) * len(shape), shape):
    ax = rules.get(name) if name else None
    out.append(ax if ax and dim % mesh.shape[ax] == 0 else None)
  return PS(*out)


def param_shardings(params, mesh, rules: dict | None = None):
  """NamedSharding per parameter from its logical axis names and ``rules``
  (default ``DEFAULT_RULES``)."""
  rules = DEFAULT_RULES if rules is None else rules
  logical = nnx.get_partition_spec(params)  # PartitionSpec of logical names per leaf
  return jax.tree.map(
      lambda a, x: NamedSharding(mesh, _spec(tuple(a), x.shape, mesh, rules)), logical,
      params, is_leaf=lambda v: isinstance(v, PS))


def shard_params(params, mesh, rules: dict | None = None):
  return jax.device_put(params, param_shardings(params, mesh, rules))


def shard_batch(batch: dict, mesh) -> dict:
  """Split every array's leading (rollout) dimension over ``data`` when it divides."""
  def put(x):
    x = np.asarray(x) if not isinstance(x, jax.Array) else x
    spec = PS("data") if x.ndim and x.shape[0] % mesh.shape["data"] == 0 else PS()
    return jax.device_put(x, NamedSharding(mesh, spec))
  return {k: put(v) for k, v in batch.items()}
