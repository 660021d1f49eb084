"""Mixed precision: bfloat16 parameters, float32 optimizer state.

``config.model.param_dtype = "bfloat16"`` stores the policy's parameters in
bfloat16 (half the memory, and half the bytes every decode step reads);
``config.model.dtype`` is the compute dtype. What stays float32:

* the optimizer state: ``master_weights`` keeps a float32 master copy of
  the parameters next to Adam's float32 moments, applies every update to
  the master and hands back the bfloat16 rounding of it. Without it a small
  step (lr 1e-6 on weights ~1e-2) is below bfloat16's resolution (8 bits of
  mantissa) and vanishes;
* gradients: the trainer differentiates at ``float32(params)`` (an exact
  upcast; the model casts weights to its compute dtype itself, so the
  forward is unchanged), so gradients, their norms and the per-rollout
  noise statistics built from them are float32 arrays;
* logits, log-probs, losses: the model returns float32 logits whatever the
  compute dtype, and everything downstream is float32.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax


def float32(tree):
  """Floating leaves of ``tree`` as float32 (no-op for float32 leaves)."""
  return jax.tree.map(
      lambda x: x.astype(jnp.float32)
      if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype != jnp.float32
      else x,
      tree,
  )


def cast(tree, dtype):
  """Floating leaves of ``tree`` as ``dtype``."""
  return jax.tree.map(
      lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree
  )


class MasterState(NamedTuple):
  master: Any  # float32 copy of the parameters
  inner: Any  # the wrapped optimizer's state (over the master)


def master_weights(inner: optax.GradientTransformation) -> optax.GradientTransformation:
  """``inner`` run on a float32 master copy of (low-precision) parameters.

  ``update`` casts the gradients to float32, updates the master with
  ``inner`` and returns ``master_new - float32(params)`` (float32), so that
  ``optax.apply_updates(params, updates)`` -- which adds in float32 and casts
  back to the parameter dtype -- yields the parameter-dtype rounding of the
  new master."""

  def init(params):
    master = float32(params)
    return MasterState(master, inner.init(master))

  def update(grads, state, params=None):
    if params is None:
      raise ValueError("master_weights needs the current params in update()")
    upd, inner_state = inner.update(float32(grads), state.inner, state.master)
    master = optax.apply_updates(state.master, upd)
    updates = jax.tree.map(lambda m, p: m - p.astype(jnp.float32), master, params)
    return updates, MasterState(master, inner_state)

  return optax.GradientTransformation(init, update)
