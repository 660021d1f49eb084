"""Checkpoints with orbax ``CheckpointManager``: arrays plus JSON metadata.

A checkpoint step is a generation round. Each holds ``state`` (a pytree of
arrays: params, optimizer state, anything the loop needs) and ``meta`` (JSON:
round, tracker state, the model config that made the arrays). Before any
restore the stored model config is compared with the run's, so a workdir
holding another model's checkpoint is an error naming the differing fields,
and nothing in the workdir is touched. Saves are synchronous and atomic
(orbax writes to a temporary directory and renames), so a run killed at any
moment leaves the previous checkpoint intact.

Multi-process runs (``jax.distributed``): every process calls ``save`` and
``restore`` with the same step; orbax writes each array's shards from the
process that holds them and the metadata once, from process 0. A process-
local array (one that lives on this process's devices only, e.g. the SFT
warm start that every process computes identically) is saved as one
replicated global array and restored as a process-local one again.

The directory may be an object-store URI (``gs://bucket/run/checkpoints``):
orbax opens it through ``etils.epath`` and commits a step there with a
commit-success file instead of a rename. Only a local directory is made
absolute, created and checked for write access here.
"""

from __future__ import annotations

import os

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as PS

from cbs_jax import paths


def _is_local(x) -> bool:
  return jax.process_count() > 1 and isinstance(x, jax.Array) and x.is_fully_addressable


def _globalize(x):
  """A process-local array (identical on every process) as a global array
  replicated over all devices; anything else unchanged."""
  if not _is_local(x):
    return x
  mesh = jax.sharding.Mesh(np.array(jax.devices()), ("all",))
  host = np.asarray(x)
  return jax.make_array_from_callback(host.shape, NamedSharding(mesh, PS()), lambda idx: host[idx])


def _abstract(x):
  if _is_local(x):
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("all",))
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, PS()))
  return ocp.utils.to_shape_dtype_struct(x)


class CheckpointError(ValueError):
  pass


class Checkpointer:

  def __init__(self, directory: str, max_to_keep: int = 2):
    directory = paths.absolute(directory)
    if not paths.is_remote(directory):  # an object store has no directories to make
      parent = os.path.dirname(directory)
      os.makedirs(parent, exist_ok=True)
      if not os.access(parent, os.W_OK):
        raise CheckpointError(f"checkpoint directory {directory!r} is not writable")
    self.directory = directory
    self._mgr = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True
        ),
    )

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def read_meta(self, step: int | None = None) -> dict:
    step = self.latest_step() if step is None else step
    try:
      return self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # corrupted or truncated metadata
      raise CheckpointError(
          f"checkpoint {self.directory}/{step} has unreadable "
          f"metadata ({type(e).__name__}: {e})"
      ) from e

  def check_model(self, model_config: dict, step: int | None = None) -> None:
    """Raise CheckpointError if the stored model config differs from ours."""
    from cbs_jax import model as model_lib  # pylint: disable=import-outside-toplevel

    stored = self.read_meta(step).get("model", {})
    # a field the model gained after this checkpoint was written means its
    # default there (the model it wrote had none of it)
    defaults = model_lib.default_config().to_dict()
    stored = {**{k: v for k, v in defaults.items() if k not in stored}, **stored}
    diff = sorted(
        k for k in set(stored) | set(model_config) if stored.get(k) != model_config.get(k)
    )
    if diff:
      detail = ", ".join(
          f"model.{k}: checkpoint {stored.get(k)!r} vs config " f"{model_config.get(k)!r}"
          for k in diff
      )
      raise CheckpointError(
          f"{self.directory} holds a checkpoint of a different model ({detail}); "
          "use another workdir or the matching config (nothing was changed)"
      )

  def save(self, step: int, state, meta: dict) -> None:
    self._mgr.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(jax.tree.map(_globalize, state)),
            meta=ocp.args.JsonSave(meta),
        ),
        force=True,
    )
    self._mgr.wait_until_finished()

  def restore(self, step: int, like):
    """Restore ``state`` shaped like ``like`` and ``meta`` at ``step``."""
    abstract = jax.tree.map(_abstract, like)
    try:
      out = self._mgr.restore(
          step,
          args=ocp.args.Composite(
              state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()
          ),
      )
    except Exception as e:
      raise CheckpointError(
          f"checkpoint {self.directory}/{step} could not be " f"restored ({type(e).__name__}: {e})"
      ) from e
    state = jax.tree.map(  # process-local again where ``like`` was
        lambda x, l: jax.device_put(np.asarray(x.addressable_data(0)), l.sharding)
        if _is_local(l)
        else x,
        out["state"],
        like,
    )
    return state, out["meta"]

  def close(self):
    self._mgr.close()
