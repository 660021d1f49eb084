"""``train_and_evaluate(config, workdir)``: the RL loop wires named steps.

A run is a ``Trainer`` (what stays fixed: config, setup, mesh, model graph,
SFT base, optimizer, checkpointer, writer, compiled updates) and a
``run_state.RunState`` (what changes, and what a checkpoint holds: params,
optimizer state, history, counters, noise trackers, controller, summary
log). One round of the loop (``_train_rl``) is

    P, signal = choose_prompts(config, state, rnd)     # fixed, or the controller decides
    batch = round_batch(...)                           # generate, verify, advantages
    rows, extras = update_round(trainer, state, ...)   # every update: ONE jitted call
    row = round_row(...)                               # metrics of the round (pure)
    row |= update_trackers(config, state, extras, P)   # the noise trackers take the round
    evaluate(trainer, state), checkpoint(trainer, state)

``update_round`` runs all ``num_minibatches x num_epochs`` optimizer updates
of a round as one jitted call (``updater.RoundUpdater``: a ``lax.scan`` over
the minibatches, noise statistics riding on the first update); the prompt
permutation of each epoch is made here on the host, from (seed, round) alone.
Noise statistics are asked for every ``noise.split_every`` rounds (split
path), every ``noise.exact_every`` (exact per-rollout moments) and, under
drift, every ``noise.drift_every`` (exact trace_intra at every update).

Each round's randomness (prompts, sampling keys, minibatch order) derives
from (seed, round) alone, so a run resumed from a checkpoint repeats the
uninterrupted run exactly. Every step is a public function, reused by
``measure``, ``sweep`` and the experiments.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import config as config_lib
from cbs_jax import batch_switch
from cbs_jax import controller as controller_lib
from cbs_jax import drift
from cbs_jax import gradstats
from cbs_jax import hf
from cbs_jax import lr_rules
from cbs_jax import metrics as metrics_lib
from cbs_jax import model as model_lib
from cbs_jax import noise
from cbs_jax import noise_stats
from cbs_jax import noise_tracker
from cbs_jax import paths
from cbs_jax import precision
from cbs_jax import rl
from cbs_jax import rollouts
from cbs_jax import run_setup
from cbs_jax import run_state
from cbs_jax import sampling
from cbs_jax import scoring
from cbs_jax import sft
from cbs_jax import sharding
from cbs_jax import systems
from cbs_jax import time_optimal
from cbs_jax import updater as updater_lib


class NonFiniteError(FloatingPointError):
  pass


def sft_base(config, workdir: str, setup: run_setup.Setup):
  """(graphdef, params, summary) of the SFT base: ``config.sft.base_dir``
  (relative to ``workdir`` unless absolute), trained there if missing."""
  return sft.train_sft(config, setup, paths.resolve(workdir, config.sft.base_dir))


# teacher-forced scoring of a whole round (PPO values, KL reference), compiled once
_score = jax.jit(scoring.score, static_argnums=(0, 6))


def round_batch(
    config,
    graphdef,
    behaviour,
    ref_params,
    setup: run_setup.Setup,
    rnd: int,
    P: int | None = None,
    mesh=None,
    *,
    seed: int | None = None,
    with_ref: bool = True,
):
  """Generate, verify and score one round of P prompts (default
  ``config.batch.num_prompts``) x K rollouts from the ``behaviour`` params,
  sampled from ``setup.sampling``.

  ``seed`` (default ``config.seed``) seeds the round's prompts and sampling
  keys; ``with_ref=False`` leaves the reference log-probs at zero (a batch no
  KL penalty reads) instead of scoring ``ref_params`` when the KL is on.
  Returns ``(batch, rewards_PxK, gen)``: ``batch`` holds the arrays of
  ``objective.BATCH_KEYS`` but ``on_policy`` (set per update), with
  advantages from ``rl.token_advantages`` of ``setup.rl`` (PPO: critic
  values of the behaviour params, GAE, whitening); ``gen`` is the rollout output.
  """
  P = P or config.batch.num_prompts
  K = config.batch.rollouts_per_prompt
  seed = config.seed if seed is None else seed
  problems = setup.task.sample(np.random.default_rng([seed, 1, rnd]), P)
  key = jax.random.fold_in(jax.random.key(seed), rnd)
  spec = setup.sampling
  if jax.process_count() > 1:  # each process generates and verifies its own prompts
    out = _process_rollout(graphdef, behaviour, setup, problems, K, key, mesh)
    rewards = jax.device_put(out["rewards"], jax.NamedSharding(mesh, jax.P()))
  else:
    out = rollouts.rollout(
        graphdef, behaviour, setup.task, setup.tok, problems, K, key, setup.layout, spec, mesh
    )
    rewards = jnp.asarray(out["rewards"])
  mask = out["completion_mask"]
  b = dict(
      prompt=out["prompt"],
      prompt_mask=out["prompt_mask"],
      completion=out["completion"],
      completion_mask=mask,
      logp_old=out["logp_old"],
  )
  score = lambda p: _score(graphdef, p, b["prompt"], b["prompt_mask"], b["completion"], mask, spec)
  values = score(behaviour).values if setup.rl.advantage == "gae" else None
  b["adv"], b["returns"] = rl.token_advantages(setup.rl, rewards, mask, values)
  zeros = jnp.zeros_like(mask)
  b["old_values"] = zeros if values is None else values
  b["logp_ref"] = score(ref_params).logprobs if with_ref and setup.rl.kl_beta else zeros
  if jax.process_count() > 1:  # host copies of what the metrics read
    out = dict(out, completion_mask=sharding.host(mask), lengths=sharding.host(out["lengths"]))
  out = dict(out, difficulty=np.array([p.difficulty for p in problems]))
  return b, out["rewards"], out


def _process_rollout(graphdef, params, setup: run_setup.Setup, problems, K, key, mesh) -> dict:
  """``rollouts.rollout`` across processes: this process encodes, decodes and
  verifies only the prompts whose K rollouts live on its devices
  (``sharding.process_rows``); generation is one jitted SPMD call over the
  global batch. Returns the batch arrays (global) and ``rewards`` [P, K]
  gathered to every process."""
  B = len(problems) * K
  lo, hi = sharding.process_rows(mesh, B)
  if lo % K or hi % K:
    raise ValueError(
        f"process {jax.process_index()} holds rollouts [{lo}, {hi}) of {B}: "
        f"config.batch.rollouts_per_prompt={K} must divide each process's share "
        "(make config.batch.num_prompts a multiple of the process count)"
    )
  mine = problems[lo // K : hi // K]
  prompt, pmask = rollouts.encode_prompts(setup.tok, mine, setup.layout)
  prompt, pmask = (sharding.global_batch(np.repeat(x, K, axis=0), mesh, B) for x in (prompt, pmask))
  sampler = sampling.make_sampler(  # jitted; its KV cache is sharded like the batch
      graphdef,
      max_new_tokens=setup.layout.completion_len,
      eos_id=setup.tok.eos_id,
      pad_id=setup.tok.pad_id,
      spec=setup.sampling,
  )
  out = sampler(params, prompt, pmask, key)
  texts = rollouts.decode(setup.tok, sharding.local_rows(out.tokens, mesh))
  local = rollouts.verify(setup.task, [p for p in mine for _ in range(K)], texts)
  rewards = sharding.host(sharding.global_batch(local, mesh, B)).reshape(-1, K)
  return dict(
      prompt=prompt,
      prompt_mask=pmask,
      completion=out.tokens,
      completion_mask=out.mask,
      logp_old=out.logprobs,
      lengths=out.lengths,
      rewards=rewards,
      texts=texts,
  )


def probe_batch(config, graphdef, behaviour, setup: run_setup.Setup, rnd: int, mesh=None):
  """The round's drift probe: ``config.drift.probe_prompts`` prompts x K
  rollouts from the behaviour policy that no update is fitted to (own
  prompts and key stream), with their advantages and the behaviour's full
  processed log-prob rows ``logp_all_b`` [B, Tc, V] for the exact KL.
  None when the probe is off."""
  Q = config.drift.probe_prompts
  if not Q:
    return None
  # another stream of prompts and sampling keys; no KL reference (no loss reads it)
  b, _, _ = round_batch(
      config,
      graphdef,
      behaviour,
      None,
      setup,
      rnd,
      Q,
      mesh,
      seed=config.seed + 7_919,
      with_ref=False,
  )
  b["logp_all_b"] = _score(
      graphdef,
      behaviour,
      b["prompt"],
      b["prompt_mask"],
      b["completion"],
      b["completion_mask"],
      setup.sampling,
  ).logits
  return b


# ------------------------------------------------------------------------ run


@dataclasses.dataclass
class Trainer:
  """What stays fixed through an RL run (the state that changes is a
  ``run_state.RunState``): config and setup, mesh, the model's graph and its
  frozen SFT base, the optimizer, the checkpoint manager, the metrics writer
  and the compiled update functions, one set per prompts-per-update bucket."""

  config: Any
  workdir: str
  setup: run_setup.Setup
  ckpt: ckpt_lib.Checkpointer
  mesh: Any
  graphdef: Any
  base_params: Any
  base_summary: dict
  tx: optax.GradientTransformation
  writer: Any
  leaf_groups: list
  model_config: dict  # the model config that made the arrays (checked on resume)
  updaters: dict = dataclasses.field(default_factory=dict)
  timed: set = dataclasses.field(default_factory=set)  # P whose rounds ran in this process

  def updater(self, P_mb: int) -> updater_lib.RoundUpdater:
    if P_mb not in self.updaters:
      self.updaters[P_mb] = updater_lib.RoundUpdater(
          self.config, self.graphdef, self.tx, P_mb, self.setup.sampling, self.setup.rl, self.mesh
      )
    return self.updaters[P_mb]


def make_controller(
    config, setup: run_setup.Setup | None = None
) -> controller_lib.AdaptiveBatch | None:
  """The adaptive batch controller of ``config.batch`` (None for a fixed
  schedule), starting at ``batch.num_prompts``; with objective "time", its
  round times: measured (``time_optimal.RoundTimes``, filled as rounds are
  timed) or an accelerator's roofline (``round_time_model``)."""
  b = config.batch
  if b.schedule != "adaptive":
    return None
  round_times = None
  if b.adaptive_objective == "time":
    round_times = (
        time_optimal.RoundTimes()
        if b.adaptive_round_time == "measured"
        else round_time_model(config, setup, b.adaptive_round_time)
    )
  return controller_lib.AdaptiveBatch(
      b.rollouts_per_prompt,
      b.adaptive_min_prompts,
      b.adaptive_max_prompts,
      b.adaptive_factor,
      b.adaptive_every,
      prompts=b.num_prompts,
      hysteresis=b.adaptive_hysteresis,
      objective=b.adaptive_objective,
      round_times=round_times,
  )


def round_time_model(config, setup: run_setup.Setup, accelerator: str):
  """N -> modelled seconds per round of this run's model, task layout and
  updates per round on one ``accelerator`` (``systems.round_time``, with the
  chip's documented latency floors where it has them)."""
  dims = systems.ModelDims.from_config(setup.model)
  acc = systems.get_accelerator(accelerator)
  Tp, Tc = setup.layout.prompt_len, setup.layout.completion_len
  epochs = config.batch.num_epochs
  updates = epochs * config.batch.num_minibatches
  ov = systems.documented_overheads(dims, acc)

  @functools.cache
  def seconds(n: int) -> float:
    return systems.round_time(
        dims, acc, int(n), Tp, Tc, epochs=epochs, overheads=ov, updates=updates
    ).total_s

  return seconds


def start_run(config, workdir: str, setup: run_setup.Setup) -> tuple[Trainer, run_state.RunState]:
  """The trainer of ``workdir``'s run and its state: resumed from the last
  checkpoint, or fresh from the SFT base (built if missing)."""
  c = config
  ckpt = ckpt_lib.Checkpointer(paths.join(workdir, "checkpoints"))
  resume = ckpt.latest_step()
  model_config = setup.model.to_dict()
  if resume is not None:
    ckpt.check_model(model_config)  # before any compile or write
  mesh = sharding.make_mesh(c.mesh.data, c.mesh.fsdp, c.mesh.tensor)  # before any compile
  rules = sharding.parse_rules(c.mesh.rules)
  if c.get("hf_checkpoint"):  # no SFT: the checkpoint is the base, read into its shardings
    graphdef, base_params, _, _ = hf.load(
        c.hf_checkpoint,
        mesh,
        c.model.param_dtype,
        compute_dtype=c.model.dtype,
        rules=rules,
        max_len=c.model.max_len,
    )
    base_summary = {"hf_checkpoint": c.hf_checkpoint}
  else:
    graphdef, base_params, base_summary = sft_base(c, workdir, setup)
  base_params = precision.cast(base_params, model_lib.DTYPES[c.model.param_dtype])
  param_sh = sharding.param_shardings(base_params, mesh, rules)
  base_params = sharding.put(base_params, param_sh)
  tx = updater_lib.make_optimizer(c.optim, c.model.param_dtype)
  copy = lambda t: jax.tree.map(jnp.copy, t)  # updates donate their params
  opt_state = sharding.shard_state(tx.init(base_params), base_params, param_sh, mesh)
  state = run_state.RunState(
      params=copy(base_params),
      opt_state=opt_state,
      history=[copy(base_params) for _ in range(c.batch.staleness)],
      counters=run_state.Counters(),
      noise=noise_tracker.NoiseEMA(c.noise.ema_decay),
      noise_adam=noise_tracker.NoiseEMA(c.noise.ema_decay),
      controller=make_controller(c, setup),
      log=run_state.RunLog(),
  )
  if resume is not None:
    state = run_state.restore(ckpt, resume, state)
  # metrics are written once, by process 0 (every process computes the same rows);
  # a run with no checkpoint yet starts again at round 0 (its rows are dropped)
  first_round = state.counters.round + 1 if resume is not None else 0
  writer = (
      metrics_lib.MetricsWriter(workdir, resume_round=first_round)
      if jax.process_index() == 0
      else _NoWriter()
  )
  leaf_groups = [gradstats.param_group(p) for p in gradstats.leaf_paths(base_params)]
  trainer = Trainer(
      c,
      workdir,
      setup,
      ckpt,
      mesh,
      graphdef,
      base_params,
      base_summary,
      tx,
      writer,
      leaf_groups,
      model_config,
  )
  return trainer, state


class _NoWriter:

  def write(self, row):
    pass

  def close(self):
    pass


def evaluate(trainer: Trainer, state: run_state.RunState) -> dict:
  """Held-out eval of ``state.params`` as metrics fields: the exact expected
  pass rate (``eval_expected_pass``, by difficulty ``_d<k>``) where the task
  enumerates its answers, the sampled pass@1 (``eval_pass_rate``), and what
  each cost."""
  c, s = trainer.config, trainer.setup
  params = state.params
  if jax.process_count() > 1:  # every process evaluates a local replica, identically
    local = jax.local_devices()[0]
    params = jax.tree.map(lambda x: jax.device_put(sharding.host(x), local), params)
  row = {}
  if s.expected is not None:
    t = time.time()
    ex = s.expected(trainer.graphdef, params)
    row["eval_expected_pass"] = ex["expected_pass"]
    row.update({f"eval_expected_pass_d{d}": v for d, v in ex["by_difficulty"].items()})
    row["eval_expected_seconds"] = time.time() - t
  if c.train.eval_sampled:
    t = time.time()
    ev = rollouts.pass_rate(
        trainer.graphdef,
        params,
        s.task,
        s.tok,
        s.eval_problems,
        jax.random.key(c.train.eval_seed),
        s.layout,
        s.eval_sampling,
    )
    row["eval_pass_rate"] = ev["pass_rate"]
    row.update({f"eval_pass_rate_d{d}": v for d, v in ev["by_difficulty"].items()})
    row["eval_sampled_seconds"] = time.time() - t
  return row


def eval_score(row: dict) -> float | None:
  """The pass rate targets are judged on: exact expected where measured."""
  return row.get("eval_expected_pass", row.get("eval_pass_rate"))


def record_evaluation(state: run_state.RunState, r1: int, row: dict) -> float | None:
  """Log an evaluation's fields (``evaluate``) of round ``r1`` in the state;
  returns its score (None when nothing was evaluated)."""
  score = eval_score(row)
  if score is not None:
    state.log.evaluations.append(
        run_state.Evaluation(
            round=r1,
            rollouts=state.counters.rollouts_seen,
            score=score,
            sampled=row.get("eval_pass_rate"),
            expected="eval_expected_pass" in row,
        )
    )
  return score


def controller_signal(config, state: run_state.RunState) -> dict:
  """The adaptive controller's signal interval now
  (``controller.signal_interval`` of the trackers in ``state``)."""
  b = config.batch
  return controller_lib.signal_interval(
      b.adaptive_signal,
      state.noise.interval(b.adaptive_z),
      state.noise_adam.interval(b.adaptive_z),
      b.adaptive_b_crit_ratio,
  )


def choose_prompts(config, state: run_state.RunState, rnd: int) -> tuple[int, dict]:
  """P for round ``rnd`` -- the config's, or the adaptive controller's
  decision (``state.controller`` moves) from the signal's interval
  (``controller.signal_interval`` of the trackers) -- and the
  ``adaptive/*`` fields to log: the signal (rollouts) with its SE and
  interval, whether it is resolved, whether this round was a decision
  round, the N the signal asks for (factor x signal, before bucketing), the
  chosen P and N, the changes so far and the learning rate the configured
  rule gives at the chosen rollouts per update (before warmup)."""
  b = config.batch
  ctl = state.controller
  if ctl is None:
    return b.num_prompts, {}
  sig = controller_signal(config, state)
  P = ctl.update(rnd, sig)
  K = b.rollouts_per_prompt
  lr = config.optim.lr * lr_rules.lr_scale(
      config.optim.lr_rule, P // b.num_minibatches * K, config.optim.ref_batch
  )
  return P, {
      "adaptive/signal": sig["value"],
      "adaptive/signal_se": sig["se"],
      "adaptive/signal_lo": sig["lo"],
      "adaptive/signal_hi": sig["hi"],
      "adaptive/resolved": sig["resolved"],
      "adaptive/decision": ctl.decides(rnd),
      "adaptive/target_batch_size": ctl.target * K,
      "adaptive/prompts": P,
      "adaptive/batch_size": P * K,
      "adaptive/changes": ctl.changes,
      "adaptive/lr": lr,
  }


def update_round(
    trainer: Trainer, state: run_state.RunState, batch: dict, rnd: int, P: int, probe=None
):
  """All updates of round ``rnd`` (minibatches x epochs) in one jitted call,
  applied to ``state`` (params, optimizer state, history, ``counters.step``);
  with a ``probe`` (``probe_batch``), held-out drift before every update.

  Returns ``(rows, extras)``: one host dict of metrics per update and the
  noise moments / drift estimates that were due this round."""
  c = trainer.config
  K, M, E = c.batch.rollouts_per_prompt, c.batch.num_minibatches, c.batch.num_epochs
  P_mb = P // M
  order_rng = np.random.default_rng([c.seed, 2, rnd])
  idx = []
  for _ in range(E):
    perm = order_rng.permutation(P)
    for mbi in range(M):
      p = perm[mbi * P_mb : (mbi + 1) * P_mb]
      idx.append((p[:, None] * K + np.arange(K)[None]).reshape(-1))
  lr_base = c.optim.lr * lr_rules.lr_scale(c.optim.lr_rule, P_mb * K, c.optim.ref_batch)
  n = state.counters
  lrs = [lr_base * lr_rules.warmup(n.step + j, c.optim.warmup_steps) for j in range(len(idx))]
  if n.switch_step is not None:  # after an adaptive switch: from the old rate to the rule's
    W = c.batch.adaptive_switch_warmup
    lrs = [
        batch_switch.ramp(n.step + j, n.switch_step, n.switch_lr_from, lr, W)
        for j, lr in enumerate(lrs)
    ]
  due = lambda every: bool(every) and rnd % every == 0
  if c.batch.staleness:  # params are about to change: remember this round's start
    state.history = state.history[1:] + [jax.tree.map(jnp.copy, state.params)]
  train_state = dict(params=state.params, opt_state=state.opt_state)
  new_state, metrics, extras = trainer.updater(P_mb)(
      train_state,
      sharding.shard_batch(batch, trainer.mesh),
      np.stack(idx),
      lrs,
      c.batch.staleness == 0,
      split=due(c.noise.split_every),
      exact=due(c.noise.exact_every),
      drift=due(c.noise.drift_every),
      probe=probe,
  )
  state.params, state.opt_state = new_state["params"], new_state["opt_state"]
  metrics, extras = jax.device_get((metrics, extras))  # one read per round
  rows = [{k: v[j] for k, v in metrics.items()} | {"lr": lrs[j]} for j in range(len(idx))]
  state.counters.step += len(rows)
  state.counters.lr = lrs[-1]
  return rows, extras


def switch_batch(config, state: run_state.RunState, P_old: int, P_new: int) -> dict:
  """What a change of the adaptive batch from ``P_old`` to ``P_new`` prompts
  does to the optimizer (``batch_switch``): Adam's second moment rescaled
  for the new rollouts per update (with the raw tracker's B_noise when it
  is resolved) and the learning rate's ramp from the current rate started
  at the next update. Returns the ``adaptive/*`` fields to log."""
  b = config.batch
  M, K = b.num_minibatches, b.rollouts_per_prompt
  iv = state.noise.interval(b.adaptive_z)
  b_noise = iv["b_noise"] if iv["resolved"] else None
  scale = batch_switch.nu_scale(P_old // M * K, P_new // M * K, b_noise)
  mu_scale = math.sqrt(scale) if b.adaptive_rescale_mu else 1.0
  if b.adaptive_rescale_nu or b.adaptive_rescale_mu:
    state.opt_state = batch_switch.rescale_moments(
        state.opt_state, scale if b.adaptive_rescale_nu else 1.0, mu_scale
    )
  n = state.counters
  if n.lr is not None:
    n.switch_step, n.switch_lr_from = n.step, n.lr
  out = {"adaptive/nu_scale": scale if b.adaptive_rescale_nu else 1.0}
  return out | ({"adaptive/mu_scale": mu_scale} if b.adaptive_rescale_mu else {})


def round_time_fields(trainer: Trainer, state: run_state.RunState, P: int, seconds: float) -> dict:
  """Feed a round's measured seconds (generation + updates) to the adaptive
  controller's measured round times (``time_optimal.RoundTimes``), except
  a round at a P this process had not run yet (it compiled). Returns the
  ``adaptive/round_s_pred`` field: the seconds per round the controller
  predicts at this P (for a modelled run: its accelerator's)."""
  ctl = state.controller
  if ctl is None or ctl.round_times is None:
    return {}
  rt = ctl.round_times
  if isinstance(rt, time_optimal.RoundTimes):
    if P in trainer.timed:
      rt.record(P * trainer.config.batch.rollouts_per_prompt, seconds)
    else:
      rt.record_first(P * trainer.config.batch.rollouts_per_prompt, seconds)
  trainer.timed.add(P)
  try:
    pred = rt(P * trainer.config.batch.rollouts_per_prompt)
  except ValueError:  # nothing measured yet
    pred = None
  return {"adaptive/round_s_pred": pred, "adaptive/held_for_cost": ctl.held_for_cost}


def needs_calibration(config, state: run_state.RunState, rnd: int) -> bool:
  """Whether round ``rnd`` is the moment to calibrate the measured round
  times: a decision round of a time-objective controller whose signal is
  resolved while fewer than two batch sizes have been timed. Deferred to
  then because a calibration compiles a bucket: on a small machine that
  costs as many seconds as dozens of rounds, wasted in every run whose
  signal never resolves (docs/batch_law.md, "The time-optimal batch")."""
  ctl = state.controller
  if not (
      ctl is not None
      and isinstance(ctl.round_times, time_optimal.RoundTimes)
      and config.batch.adaptive_calibrate
      and ctl.decides(rnd)
      and len(ctl.round_times.measured()) < 2
      # a calibration compiles a bucket: worth it only if the best a neighbour bucket
      # can save -- half the time per unit progress (docs/batch_law.md) -- over the
      # training time spent so far repays that compile (time_optimal.repays)
      and time_optimal.repays(1.0, 0.5, ctl.round_times.total, ctl.round_times.compile_cost())
  ):
    return False
  return controller_signal(config, state)["resolved"]


def calibrate_round_times(trainer: Trainer, state: run_state.RunState) -> dict:
  """Time one round at each bucket of {the current one, its neighbour (the
  next bucket up, else down)} that has no measurement yet: generation + the
  round's updates on a throwaway copy of the state, run once to compile and
  once to time. Gives the measured throughput model its two points; the
  run's own state and random streams are untouched. Returns {N: seconds}."""
  c, ctl = trainer.config, state.controller
  K = c.batch.rollouts_per_prompt
  i = ctl.buckets.index(ctl.prompts)
  others = ctl.buckets[i + 1 : i + 2] or ctl.buckets[max(i - 1, 0) : i]
  todo = [P for P in [ctl.prompts] + others if P * K not in ctl.round_times.measured()]
  out = {}
  for P in todo:
    for rep in range(2):
      scratch = dataclasses.replace(
          state,
          params=jax.tree.map(jnp.copy, state.params),
          opt_state=jax.tree.map(jnp.copy, state.opt_state),
          history=[jax.tree.map(jnp.copy, h) for h in state.history],
          counters=dataclasses.replace(state.counters),
      )
      t0 = time.time()
      batch, _, _ = round_batch(
          c,
          trainer.graphdef,
          scratch.params,
          trainer.base_params,
          trainer.setup,
          0,
          P,
          trainer.mesh,
      )
      update_round(trainer, scratch, batch, 0, P)
      jax.block_until_ready(scratch.params)
      if rep:
        out[P * K] = time.time() - t0
  for n_, t in out.items():
    ctl.round_times.record(n_, t)
  trainer.timed.update(todo)
  return out


def check_finite(trainer: Trainer, state: run_state.RunState, rows: list, r1: int) -> None:
  """Count skipped (non-finite) updates; raise after too many in a row."""
  n = state.counters
  for j, m in enumerate(rows):
    if bool(m["finite"]):
      n.consecutive_nonfinite = 0
      continue
    n.consecutive_nonfinite += 1
    n.skipped_updates += 1
    if n.consecutive_nonfinite >= trainer.config.train.max_consecutive_nonfinite:
      trainer.writer.close()
      step = n.step - len(rows) + j + 1
      raise NonFiniteError(
          f"{n.consecutive_nonfinite} consecutive non-finite updates "
          f"(round {r1}, update {j + 1} of the round, optimizer step {step}: "
          f"loss={m['loss']}, grad_norm={m['grad_norm']}, update_norm={m['update_norm']}); "
          f"parameters were not changed by them; last checkpoint: round "
          f"{trainer.ckpt.latest_step()}"
      )


def _mean(rows, key):
  vals = [r[key] for r in rows if key in r and r[key] is not None]
  return float(np.mean(vals)) if vals else None


def noise_row(prefix: str, s: noise_stats.NoiseStats) -> dict:
  """Metrics fields ``prefix/{g2, trace_intra, ..., ratio}`` of one NoiseStats."""
  keys = ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio")
  row = {f"{prefix}/{k}": getattr(s, k) for k in keys}
  if s.flag:
    row[f"{prefix}/flag"] = s.flag
  return row


def update_trackers(config, state: run_state.RunState, extras: dict, P: int) -> dict:
  """Feed the round's split-estimator moments (when due) to the noise
  trackers in ``state`` -- raw gradients, and Adam's metric once Adam has
  taken a step -- and log the split estimate in ``state.log``. Returns the
  metrics fields of the round's estimates, the trackers' values and their
  intervals (``NoiseEMA.interval``: what the controller reads next round);
  empty when no split estimate was due."""
  if "split" not in extras:
    return {}
  K = config.batch.rollouts_per_prompt
  P_mb = P // config.batch.num_minibatches
  est = noise.split_estimates(gradstats.sum_leaves(extras["split"]))
  split = noise_stats.noise_stats(est, P_mb, K)
  state.log.add_split(split.trace_intra, split.trace_inter, split.g2)
  row = noise_row("noise_split", split)
  row.update(noise_row("noise_ema", state.noise.update(est, P_mb, K)))
  if extras.get("split_adam") is not None:  # Adam's metric with this update's gradient
    est = noise.split_estimates(gradstats.sum_leaves(extras["split_adam"]))
    row.update(noise_row("noise_split_adam", noise_stats.noise_stats(est, P_mb, K)))
    # the tracker starts once nu averages ~1 / (1 - b2) gradients: before that the
    # preconditioner of a coordinate is ~1 / |its few gradients| and the linearised
    # metric noise is unbounded where they nearly cancel (docs/noise.md)
    if state.counters.step >= updater_lib.adam_metric_warmup(config.optim.b2):
      row.update(noise_row("noise_ema_adam", state.noise_adam.update(est, P_mb, K)))
  for name, ema in (("noise_ema", state.noise), ("noise_ema_adam", state.noise_adam)):
    if ema.count:
      iv = ema.interval(config.batch.adaptive_z)
      row.update(
          {
              f"{name}/b_noise_se": iv["se"],
              f"{name}/b_noise_lo": iv["lo"],
              f"{name}/b_noise_hi": iv["hi"],
          }
      )
  return row


def round_row(
    config,
    counters: run_state.Counters,
    r1: int,
    P: int,
    rewards,
    gen,
    rows: list,
    extras: dict,
    leaf_groups: list,
    t_gen: float,
    t_upd: float,
) -> dict:
  """The metrics row of round ``r1`` (1-based) -- batch, rewards, updates,
  drift and the exact noise statistics that were due -- a pure function of
  its inputs (the trackers' fields come from ``update_trackers``)."""
  K = config.batch.rollouts_per_prompt
  P_mb = P // config.batch.num_minibatches
  N = P * K
  gen_tokens = float(np.asarray(gen["completion_mask"]).sum())
  row = {
      "round": r1,
      "batch_size": N,
      "rollouts_per_update": P_mb * K,
      "reward_mean": float(rewards.mean()),
      "frac_groups_mixed": float(np.mean(rewards.std(axis=1) > 0)),
      "completion_len": float(np.mean(np.asarray(gen["lengths"]))),
      "rollouts_seen": counters.rollouts_seen,
      "lr": rows[-1]["lr"],
      "num_updates": len(rows),
      "gen_seconds": t_gen,
      "update_seconds": t_upd,
      "tokens_per_s": gen_tokens / max(t_gen, 1e-9),
      "skipped_updates": counters.skipped_updates,
  }
  dual = ("clip_frac_dual",) if "clip_frac_dual" in rows[0] else ()  # dual clip on
  for k in (
      ("loss", "grad_norm", "entropy", "sampler_logp_gap", "grad_clipped") + drift.DRIFT_KEYS + dual
  ):
    row[k] = _mean(rows, k)
  held = [k for k in rows[0] if k.startswith("heldout_")]
  for k in held:
    row[k] = _mean(rows, k)
  if len(rows) > 1:
    for k in ("kappa_k1", "kappa_k3", "clip_frac_low", "clip_frac_high", "ess") + tuple(
        k
        for k in held
        if k[len("heldout_") :]
        in ("kappa_exact", "kappa_k1", "kappa_k3", "clip_frac_low", "clip_frac_high", "ess")
    ):
      row[f"{k}_by_update"] = [float(u[k]) for u in rows]
  if "exact" in extras:
    mom = extras["exact"]
    row.update(
        noise_row(
            "noise_exact",
            noise_stats.noise_stats(noise.exact_estimates(gradstats.sum_leaves(mom)), P_mb, K),
        )
    )
    for g, gm in gradstats.sum_leaves(mom, leaf_groups).items():
      est = noise.exact_estimates(gm)
      for k in ("trace_intra", "trace_inter", "g2"):
        row[f"noise_exact/{k}/{g}"] = float(est[k])
  if "drift" in extras:
    for k in ("trace_intra", "trace_inter", "g2"):
      row[f"{k}_by_update"] = [float(x) for x in extras["drift"][k]]
  return row


def log_row(trainer: Trainer, row: dict, bar) -> None:
  trainer.writer.write(row)
  ev = eval_score(row)
  bar.set_postfix(reward=f"{row['reward_mean']:.3f}", pass_rate="-" if ev is None else f"{ev:.3f}")
  if not trainer.config.train.progress:
    keys = ("round", "reward_mean", "loss", "entropy", "eval_pass_rate", "eval_expected_pass")
    print(json.dumps({k: row[k] for k in keys if k in row}), flush=True)


def checkpoint(trainer: Trainer, state: run_state.RunState) -> None:
  run_state.save(trainer.ckpt, state, trainer.model_config)


# ----------------------------------------------------------------------- loop


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Run (or resume) training in ``workdir``; returns the end-of-run summary."""
  config = ml_collections.ConfigDict(config.to_dict())  # private copy
  if config.distributed.enabled:  # before anything touches a device
    config_lib.validate(config)
    sharding.initialize_distributed(config.distributed)
  setup = run_setup.prepare(config)
  paths.makedirs(workdir)
  if config.mode == "sft":
    _, _, summary = sft.train_sft(config, setup, workdir)
    _write_summary(workdir, summary)
    return summary
  return _train_rl(config, workdir, setup)


def _train_rl(c, workdir, setup):
  t_start = time.time()
  trainer, state = start_run(c, workdir, setup)
  n = state.counters
  if n.base_pass_rate is None:
    ev = evaluate(trainer, state)
    n.base_pass_rate = record_evaluation(state, 0, ev)
    trainer.writer.write({"round": 0, "rollouts_seen": 0} | ev)
  end = n.round if n.stopped else c.train.num_rounds
  bar = tqdm.tqdm(
      range(n.round, end),
      initial=n.round,
      desc="rl",
      total=c.train.num_rounds,
      disable=not c.train.progress,
      mininterval=1.0,
  )
  for rnd in bar:
    r1 = rnd + 1
    P_before = None if state.controller is None else state.controller.prompts
    if needs_calibration(c, state, rnd):  # timed apart (calibration_seconds), not in the round
      t_cal = time.time()
      calibrate_round_times(trainer, state)
      state.log.calibration_seconds += time.time() - t_cal
    t0 = time.time()
    P, signal = choose_prompts(c, state, rnd)
    if P_before is not None and P != P_before:
      signal.update(switch_batch(c, state, P_before, P))
    behaviour = state.history[0] if c.batch.staleness else state.params
    batch, rewards, gen = round_batch(
        c, trainer.graphdef, behaviour, trainer.base_params, setup, rnd, P, trainer.mesh
    )
    probe = probe_batch(c, trainer.graphdef, behaviour, setup, rnd, trainer.mesh)
    t_gen = time.time() - t0
    rows, extras = update_round(trainer, state, batch, rnd, P, probe)
    check_finite(trainer, state, rows, r1)
    n.rollouts_seen += P * c.batch.rollouts_per_prompt
    t_upd = time.time() - t0 - t_gen
    signal.update(round_time_fields(trainer, state, P, t_gen + t_upd))
    row = round_row(c, n, r1, P, rewards, gen, rows, extras, trainer.leaf_groups, t_gen, t_upd)
    row.update(update_trackers(c, state, extras, P))
    row.update(signal)
    state.log.gen_seconds += t_gen
    state.log.update_seconds += t_upd
    score = None
    if (c.train.eval_every and r1 % c.train.eval_every == 0) or r1 == c.train.num_rounds:
      ev = evaluate(trainer, state)
      row.update(ev)
      score = record_evaluation(state, r1, ev)
    n.seconds += time.time() - t0
    log_row(trainer, row, bar)
    n.round = r1
    reached = (
        bool(c.train.stop_at_pass_rate) and score is not None and score >= c.train.stop_at_pass_rate
    )
    collapsed = (
        bool(c.train.stop_below_pass_rate)
        and score is not None
        and score < c.train.stop_below_pass_rate
    )
    n.stopped_at_target |= reached
    n.stopped_collapsed |= collapsed
    if (
        (c.train.checkpoint_every and r1 % c.train.checkpoint_every == 0)
        or r1 == c.train.num_rounds
        or reached
        or collapsed
    ):
      checkpoint(trainer, state)
    if reached or collapsed:
      break
  bar.close()
  trainer.writer.close()
  trainer.ckpt.close()
  summary = summarise(c, state, trainer.base_summary, time.time() - t_start)
  _write_summary(workdir, summary)
  return summary


def _write_summary(workdir, summary):
  if jax.process_index():  # written once, by process 0
    return
  # atomic: a kill never leaves a torn summary
  paths.write_atomic(
      paths.join(workdir, "summary.json"), json.dumps(summary, indent=2, default=float)
  )


def summarise(c, state: run_state.RunState, base_summary: dict, wall: float) -> dict:
  """The end-of-run summary, from the run's state alone."""
  n, log = state.counters, state.log
  evals = log.evaluations
  sampled = [e.sampled for e in evals if e.sampled is not None]
  summary = dict(
      base_pass_rate=n.base_pass_rate,
      final_pass_rate=evals[-1].score if evals else None,
      final_sampled_pass_rate=sampled[-1] if sampled else None,
      pass_rate_metric=(
          "eval_expected_pass" if any(e.expected for e in evals) else "eval_pass_rate"
      ),
      rounds=n.round,
      rollouts_seen=n.rollouts_seen,
      optimizer_steps=n.step,
      skipped_updates=n.skipped_updates,
      stopped_at_target=n.stopped_at_target,
      stopped_collapsed=n.stopped_collapsed,
      wall_seconds_this_call=wall,
      gen_seconds=log.gen_seconds,
      update_seconds=log.update_seconds,
      calibration_seconds=log.calibration_seconds,
      sft=base_summary,
  )
  # Noise: pool the per-round split estimates of the last half of training
  # (parameters drift across rounds, so this is a summary, not a fixed-point
  # measurement: for that use `python -m cbs_jax.measure`).
  K = c.batch.rollouts_per_prompt
  P_mb = c.batch.num_prompts // c.batch.num_minibatches
  est = log.split[len(log.split) // 2 :]
  if len(est) >= 2:
    s = noise_stats.pooled_estimates(est, P_mb, K)
    summary["noise"] = dict(
        rounds_pooled=len(est),
        K=K,
        b_intra=s.b_intra,
        b_intra_se=s.b_intra_se,
        b_inter=s.b_inter,
        b_inter_se=s.b_inter_se,
        intra_inter_ratio=s.ratio,
        intra_inter_ratio_se=s.ratio_se,
        b_noise=s.b_noise,
        b_noise_se=s.b_noise_se,
        b_noise_floor=s.b_noise_floor,
        flag=s.flag,
    )
  return summary
