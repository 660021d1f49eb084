"""One round's optimizer updates as one jitted program: ``RoundUpdater``.

``RoundUpdater`` runs all ``num_minibatches x num_epochs`` optimizer updates
of a round as one jitted, donated call: minibatches are gathered to a
leading axis inside the jit (the prompt permutation of each epoch is made
on the host by the trainer, from (seed, round) alone) and ``lax.scan``
walks them with the learning rates passed in as an array. The first update
of an on-policy round is exactly on-policy (its old log-probs are the
trainer's own, stop-gradient, so ratios are exactly 1); later updates use
importance ratios against the sampler's behaviour log-probs. Noise
statistics ride on the first update (the split path, exact per-rollout
moments) and, under drift, exact per-rollout trace_intra at every update
with the held-out drift probe (``probe_drift``); one exact computation
serves both when they coincide.

Also here: the optimizer (``make_optimizer``: Adam(W) with the learning
rate injected per update) and the preconditioner of its step
(``adam_metric_of``), which the split path's Adam-metric statistics use.
The trainer (``train``), ``measure``, ``floors`` and the benchmarks build
their updates from this module.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import optax

from cbs_jax import drift
from cbs_jax import gradstats
from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import precision
from cbs_jax import rl
from cbs_jax import scoring
from cbs_jax import sharding


def make_optimizer(oc, param_dtype: str = "float32") -> optax.GradientTransformation:
  """Adam(W) with the learning rate as an injected hyperparameter (set per update);
  for low-precision parameters, over a float32 master copy (precision.py)."""

  def make(learning_rate):
    parts = [optax.clip_by_global_norm(oc.grad_clip)] if oc.grad_clip else []
    parts.append(
        optax.adamw(learning_rate, b1=oc.b1, b2=oc.b2, eps=oc.eps, weight_decay=oc.weight_decay)
    )
    tx = optax.chain(*parts)
    return tx if param_dtype == "float32" else precision.master_weights(tx)

  return optax.inject_hyperparams(make)(learning_rate=oc.lr)


def adam_metric_warmup(b2: float) -> int:
  """Optimizer steps before the Adam-metric tracker takes estimates:
  ceil(1 / (1 - b2)), the memory of Adam's second moment."""
  return math.ceil(1.0 / (1.0 - b2))


def adam_metric_of(opt_state, oc):
  """The function grad -> Adam's preconditioner for this update
  (``gradstats.adam_metric`` with the gradient Adam receives: clipped to
  ``oc.grad_clip`` as ``make_optimizer`` clips it); None without Adam."""
  if gradstats.adam_state(opt_state) is None:
    return None

  def metric(grad):
    if oc.grad_clip:
      norm = optax.tree.norm(grad)
      grad = jax.tree.map(lambda g: g * jnp.minimum(1.0, oc.grad_clip / (norm + 1e-30)), grad)
    return gradstats.adam_metric(opt_state, oc.b2, oc.eps, grad)

  return metric


def probe_drift(
    graphdef, params, probe, sampling_spec: scoring.SamplingSpec, rl_spec: rl.RLSpec
) -> dict:
  """Drift of ``params`` from the behaviour policy on the probe's tokens:
  ``drift.drift_stats`` (k1/k3, ratios, clip fractions at ``rl_spec``'s clip
  range, ESS) plus ``kappa_exact``, the full-vocabulary KL(behaviour ||
  current) per token (log-probs of ``sampling_spec``, the behaviour's
  distribution)."""
  cur = scoring.score(
      graphdef,
      params,
      probe["prompt"],
      probe["prompt_mask"],
      probe["completion"],
      probe["completion_mask"],
      sampling_spec,
  )
  mask = probe["completion_mask"]
  st = drift.drift_stats(
      probe["logp_old"],
      cur.logprobs,
      mask,
      rl_spec.clip_eps_low,
      rl_spec.clip_eps_high,
      probe["adv"],
  )
  kl = drift.exact_kl(probe["logp_all_b"], cur.logits)
  st["kappa_exact"] = jnp.sum(kl * mask) / jnp.maximum(mask.sum(), 1.0)
  return {f"heldout_{k}": v for k, v in st.items()}


class RoundUpdater:
  """Every optimizer update of one round as one jitted, donated call.

  ``__call__(state, batch, idx_UxB, lrs_U, on_policy_first, split=, exact=,
  drift=)`` gathers the U minibatches ``batch[idx_UxB[j]]``, runs the first
  update (with the split-microbatch gradient when ``split``; exact
  per-rollout moments at its parameters when ``exact`` or ``drift``), then
  ``lax.scan``s the other U-1 (exact trace_intra before each when
  ``drift``). Returns ``(state, metrics, extras)``: ``metrics`` a dict of
  [U] arrays, ``extras`` the split / preconditioned-split / exact moments
  and per-update drift estimates that were asked for. One compile per
  combination of the static flags.
  """

  def __init__(
      self,
      config,
      graphdef,
      tx,
      P_mb: int,
      sampling_spec: scoring.SamplingSpec,
      rl_spec: rl.RLSpec,
      mesh=None,
  ):
    self.c, self.graphdef, self.tx, self.P_mb = config, graphdef, tx, P_mb
    self.sampling_spec, self.rl_spec = sampling_spec, rl_spec
    self.K = config.batch.rollouts_per_prompt
    self.mesh = mesh
    self._fns = {}

  def __call__(
      self,
      state,
      batch,
      idx_UxB,
      lrs_U,
      on_policy_first,
      *,
      split=False,
      exact=False,
      drift=False,
      probe=None,
  ):
    flags = (bool(split), bool(exact), bool(drift))
    if flags not in self._fns:
      self._fns[flags] = jax.jit(
          functools.partial(self._round, split=flags[0], exact=flags[1], drift=flags[2]),
          donate_argnums=(0,),
      )
    return self._fns[flags](
        state,
        batch,
        jnp.asarray(idx_UxB, jnp.int32),
        jnp.asarray(lrs_U, jnp.float32),
        jnp.asarray(on_policy_first),
        probe,
    )

  def _exact_moments(self, params, mb):
    c = self.c
    return gradstats.group_moments(
        precision.float32(params),
        self.graphdef,
        mb,
        self.P_mb,
        self.K,
        self.rl_spec,
        self.sampling_spec,
        c.noise.chunk_prompts,
        method=c.noise.exact_method,
    )

  def _drift_estimates(self, moments):
    return noise.exact_estimates(gradstats.sum_leaves(moments))

  def _place(self, x):
    """Split a minibatch's rollout axis over the mesh's data axis."""
    if self.mesh is None:
      return x
    return jax.lax.with_sharding_constraint(x, sharding.batch_sharding(self.mesh, x.shape[0]))

  def _round(self, state, batch, idx_UxB, lrs_U, on_policy_first, probe, *, split, exact, drift):
    B_mb = idx_UxB.shape[1]
    mbs = jax.tree.map(lambda x: x[idx_UxB], batch)  # leaves [U, B_mb, ...]
    take = lambda j: {k: self._place(v[j]) for k, v in mbs.items()}
    first = dict(take(0), on_policy=jnp.full((B_mb,), on_policy_first))
    extras = {}
    if exact or drift:
      moments = self._exact_moments(state["params"], first)
      if exact:
        extras["exact"] = moments
      if drift:
        d0 = self._drift_estimates(moments)
    held = lambda params: (
        {}
        if probe is None
        else probe_drift(self.graphdef, params, probe, self.sampling_spec, self.rl_spec)
    )
    h0 = held(state["params"])
    state, m0, sm = self._update(state, first, lrs_U[0], split=split)
    m0.update(h0)
    if split:
      extras["split"], extras["split_adam"] = sm
    metrics = jax.tree.map(lambda x: x[None], m0)
    drifts = jax.tree.map(lambda x: x[None], d0) if drift else None
    U = idx_UxB.shape[0]
    if U > 1:
      rest = {k: v[1:] for k, v in mbs.items()}

      def body(state, xs):
        mb, lr = xs
        mb = dict({k: self._place(v) for k, v in mb.items()}, on_policy=jnp.zeros((B_mb,), bool))
        d = self._drift_estimates(self._exact_moments(state["params"], mb)) if drift else {}
        h = held(state["params"])
        state, m, _ = self._update(state, mb, lr, split=False)
        return state, (m | h, d)

      state, (ms, ds) = jax.lax.scan(body, state, (rest, lrs_U[1:]))
      cat = lambda a, b: jnp.concatenate([a, b])
      metrics = jax.tree.map(cat, metrics, ms)
      if drift:
        drifts = jax.tree.map(cat, drifts, ds)
    if drift:
      extras["drift"] = drifts
    return state, metrics, extras

  def _update(self, state, mb, lr, *, split):
    """One optimizer update on minibatch ``mb``; returns (state, metrics,
    (split moments, split moments in Adam's metric) or None)."""
    c, graphdef = self.c, self.graphdef
    params, opt_state = state["params"], state["opt_state"]
    gparams = precision.float32(params)  # float32 gradients whatever the param dtype
    moments = None
    if split:  # raw, and in the metric of this update's Adam step (with its gradient)
      metric = adam_metric_of(opt_state, c.optim)
      loss, grads, aux, moments = gradstats.split_grads(
          gparams, graphdef, mb, self.P_mb, self.K, self.rl_spec, self.sampling_spec, metric=metric
      )
      if metric is None:
        moments = (moments, None)
    else:
      counts = objective.counts_of(mb)
      (loss, aux), grads = jax.value_and_grad(objective.batch_loss, has_aux=True)(
          gparams, graphdef, mb, counts, self.rl_spec, self.sampling_spec
      )
    gnorm = optax.tree.norm(grads)
    opt_state.hyperparams["learning_rate"] = lr
    updates, new_opt = self.tx.update(grads, opt_state, params)
    new_params = optax.apply_updates(params, updates)
    unorm = optax.tree.norm(updates)  # a finite loss/grad can still give a non-finite step
    finite = jnp.isfinite(loss) & jnp.isfinite(gnorm) & jnp.isfinite(unorm)
    keep = lambda new, old: jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, old)
    state = dict(params=keep(new_params, params), opt_state=keep(new_opt, opt_state))
    mask = mb["completion_mask"]
    ntok = jnp.maximum(mask.sum(), 1.0)
    # sampler vs trainer log-probs of the same tokens at the same parameters
    # (meaningful on on-policy updates only): a health check of the layout.
    gap = jnp.max(jnp.abs(aux["logp"] - mb["logp_old"]) * mask)
    m = dict(
        loss=loss,
        grad_norm=gnorm,
        update_norm=unorm,
        finite=finite,
        lr=lr,
        grad_clipped=(gnorm > c.optim.grad_clip) if c.optim.grad_clip else False,
        entropy=jnp.sum(aux["entropy"]) / ntok,
        sampler_logp_gap=jnp.where(mb["on_policy"][0], gap, jnp.nan),
    )
    m.update(
        drift.drift_stats(
            aux["logp_old"],
            aux["logp"],
            mask,
            self.rl_spec.clip_eps_low,
            self.rl_spec.clip_eps_high,
            mb["adv"],
            self.rl_spec.clip_c if self.rl_spec.loss == "ppo" else 0.0,  # the loss that reads it
        )
    )
    return state, m, moments
