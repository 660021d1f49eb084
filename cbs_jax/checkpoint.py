"""Checkpoints with orbax ``CheckpointManager``: arrays plus JSON metadata.

A checkpoint step is a generation round. Each holds ``state`` (a pytree of
arrays: params, optimizer state, anything the loop needs) and ``meta`` (JSON:
round, tracker state, the model config that made the arrays). Before any
restore the stored model config is compared with the run's, so a workdir
holding another model's checkpoint is an error naming the differing fields,
and nothing in the workdir is touched. Saves are synchronous and atomic
(orbax writes to a temporary directory and renames), so a run killed at any
moment leaves the previous checkpoint intact.
"""
from __future__ import annotations

import os

import jax
import orbax.checkpoint as ocp


class CheckpointError(ValueError):
  pass


class Checkpointer:

  def __init__(self, directory: str, max_to_keep: int = 2):
    directory = os.path.abspath(directory)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    if not os.access(parent, os.W_OK):
      raise CheckpointError(f"checkpoint directory {directory!r} is not writable")
    self.directory = directory
    self._mgr = ocp.CheckpointManager(
        directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, enable_async_checkpointing=False, create=True))

  def latest_step(self) -> int | None:
    return self._mgr.latest_step()

  def read_meta(self, step: int | None = None) -> dict:
    step = self.latest_step() if step is None else step
    try:
      return self._mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    except Exception as e:  # corrupted or truncated metadata
      raise CheckpointError(f"checkpoint {self.directory}/{step} has unreadable "
                            f"metadata ({type(e).__name__}: {e})") from e

  def check_model(self, model_config: dict, step: int | None = None) -> None:
    """Raise CheckpointError if the stored model config differs from ours."""
    stored = self.read_meta(step).get("model", {})
    diff = sorted(k for k in set(stored) | set(model_config)
                  if stored.get(k) != model_config.get(k))
    if diff:
      detail = ", ".join(f"model.{k}: checkpoint {stored.get(k)!r} vs config "
                         f"{model_config.get(k)!r}" for k in diff)
      raise CheckpointError(
          f"{self.directory} holds a checkpoint of a different model ({detail}); "
          "use another workdir or the matching config (nothing was changed)")

  def save(self, step: int, state, meta: dict) -> None:
    self._mgr.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)
    self._mgr.wait_until_finished()

  def restore(self, step: int, like):
    """Restore ``state`` shaped like ``like`` and ``meta`` at ``step``."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
      out = self._mgr.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    except Exception as e:
      raise CheckpointError(f"checkpoint {self.directory}/{step} could not be "
                            f"restored ({type(e).__name__}: {e})") from e
    return out["state"], out["meta"]

  def close(self):
    self._mgr.close()
