"""``train_and_evaluate(config, workdir)``: the RL loop wires the pieces.

One round: draw P prompts, sample K rollouts each from the behaviour policy
(the current one, or one ``staleness`` rounds old), verify, compute
advantages, then ``num_minibatches x num_epochs`` jitted optimizer updates
over prompt-level minibatches of that round. The first update of an
on-policy round is exactly on-policy (its old log-probs are the trainer's
own, stop-gradient, so ratios are exactly 1); later updates use importance
ratios against the sampler's behaviour log-probs.

Each round's randomness (prompts, sampling keys, minibatch order) derives
from (seed, round) alone, so a run resumed from a checkpoint repeats the
uninterrupted run exactly. Noise statistics (split path every
``noise.split_every`` rounds, exact path every ``noise.exact_every``,
per-update trace_intra under drift every ``noise.drift_every``) and drift
statistics go into ``metrics.jsonl`` and TensorBoard.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from cbs_jax import batch as batch_lib
from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import config as config_lib
from cbs_jax import drift
from cbs_jax import gradstats
from cbs_jax import metrics as metrics_lib
from cbs_jax import noise
from cbs_jax import objective
from cbs_jax import rl
from cbs_jax import rollouts
from cbs_jax import sampling
from cbs_jax import scoring
from cbs_jax import sft
from cbs_jax import sharding
from cbs_jax import tasks


class NonFiniteError(FloatingPointError):
  pass


def make_optimizer(oc) -> optax.GradientTransformation:
  """Adam(W) with the learning rate as an injected hyperparameter (set per update)."""
  def make(learning_rate):
    parts = [optax.clip_by_global_norm(oc.grad_clip)] if oc.grad_clip else []
    parts.append(optax.adamw(learning_rate, b1=oc.b1, b2=oc.b2, eps=oc.eps,
                             weight_decay=oc.weight_decay))
    return optax.chain(*parts)
  return optax.inject_hyperparams(make)(learning_rate=oc.lr)


@dataclasses.dataclass
class Setup:
  """What a run needs besides its config: task, tokenizer, shapes, eval set."""
  task: tasks.Task
  tok: tasks.Tokenizer
  layout: rollouts.Layout
  eval_problems: list


def prepare(config: ml_collections.ConfigDict) -> Setup:
  """Validate the config, build the task, and fix the model's vocab size."""
  config_lib.validate(config)
  task = tasks.make_task(config.task.name, **config.task.kwargs.to_dict())
  tok = tasks.make_tokenizer(task)
  layout = rollouts.Layout.for_task(task, config.sampling.max_new_tokens)
  with config.unlocked():
    config.model.vocab_size = tok.vocab_size
  if layout.total > config.model.max_len:
    raise ValueError(f"config.model.max_len={config.model.max_len} is shorter than "
                     f"prompt ({layout.prompt_len}) + completion "
                     f"({layout.completion_len}) tokens of task {task.name!r}")
  eval_problems = task.sample(np.random.default_rng(config.train.eval_seed),
                              config.train.eval_prompts)
  return Setup(task, tok, layout, eval_problems)


def _sft_base(config, workdir, setup):
  base_dir = config.sft.base_dir
  if not os.path.isabs(base_dir):
    base_dir = os.path.join(workdir, base_dir)
  return sft.train_sft(config, base_dir, setup.task, setup.tok, setup.layout,
                       setup.eval_problems)


def _take(batch: dict, idx) -> dict:
  return {k: jnp.take(v, idx, axis=0) for k, v in batch.items()}


# teacher-forced scoring of a whole round (PPO values, KL reference), compiled once
_score = jax.jit(scoring.score, static_argnums=(0, 6, 7, 8))


def _round_batch(config, graphdef, behaviour, ref_params, setup, rnd, P=None, mesh=None):
  """Generate and score one round of P prompts (default: config.batch.num_prompts)
  x K rollouts; returns (batch arrays, rewards, gen info)."""
  P = P or config.batch.num_prompts
  K = config.batch.rollouts_per_prompt
  problems = setup.task.sample(np.random.default_rng([config.seed, 1, rnd]), P)
  key = jax.random.fold_in(jax.random.key(config.seed), rnd)
  sc = config.sampling
  out = rollouts.rollout(graphdef, behaviour, setup.task, setup.tok, problems, K, key,
                         setup.layout, sc.temperature, sc.top_k, sc.top_p, mesh)
  mask = out["completion_mask"]
  rewards = out["rewards"]
  b = dict(prompt=out["prompt"], prompt_mask=out["prompt_mask"],
           completion=out["completion"], completion_mask=mask,
           logp_old=out["logp_old"])
  zeros = jnp.zeros_like(mask)
  if config.rl.algo == "ppo":
    values = _score(graphdef, behaviour, b["prompt"], b["prompt_mask"],
                    b["completion"], mask, sc.temperature, sc.top_k, sc.top_p).values
    tok_r = rl.terminal_rewards_to_tokens(jnp.asarray(rewards.reshape(-1)), mask)
    adv, returns = rl.gae(tok_r, values, mask, config.rl.gamma, config.rl.lam)
    n = jnp.maximum(mask.sum(), 1.0)
    mu = jnp.sum(adv * mask) / n
    sd = jnp.sqrt(jnp.sum(jnp.square(adv - mu) * mask) / n)
    b.update(adv=(adv - mu) / (sd + 1e-6) * mask, returns=returns, old_values=values)
  else:
    adv = rl.compute_advantages(config.rl.advantage, jnp.asarray(rewards),
                                config.rl.adv_eps)
    b.update(adv=adv.reshape(-1)[:, None] * mask, returns=zeros, old_values=zeros)
  if config.rl.kl_beta:
    b["logp_ref"] = _score(graphdef, ref_params, b["prompt"], b["prompt_mask"],
                           b["completion"], mask, sc.temperature, sc.top_k,
                           sc.top_p).logprobs
  else:
    b["logp_ref"] = zeros
  return b, rewards, out


class Trainer:
  """Holds the jitted update functions of one run (config captured by closure)."""

  def __init__(self, config, graphdef, tx, P_mb: int):
    self.config, self.graphdef, self.tx = config, graphdef, tx
    c = config
    self.K = c.batch.rollouts_per_prompt
    self.P_mb = P_mb
    self.update_plain = jax.jit(functools.partial(self._update, split=False),
                                donate_argnums=(0,))
    self.update_split = jax.jit(functools.partial(self._update, split=True),
                                donate_argnums=(0,))
    self.exact_moments = jax.jit(functools.partial(
        gradstats.group_moments, graphdef=graphdef, P=self.P_mb, K=self.K,
        rl_cfg=c.rl, sampling_cfg=c.sampling, chunk_prompts=c.noise.chunk_prompts))

  def _update(self, state, mb, lr, *, split):
    c, graphdef = self.config, self.graphdef
    params, opt_state = state["params"], state["opt_state"]
    on_policy = mb["on_policy"][0]
    moments = None
    if split:
      loss, grads, aux, moments = gradstats.split_grads(
          params, graphdef, mb, self.P_mb, self.K, c.rl, c.sampling)
    else:
      counts = objective.counts_of(mb)
      (loss, aux), grads = jax.value_and_grad(objective.batch_loss, has_aux=True)(
          params, graphdef, mb, counts, c.rl, c.sampling)
    gnorm = optax.tree.norm(grads)
    opt_state.hyperparams["learning_rate"] = jnp.asarray(lr, jnp.float32)
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
    m = dict(loss=loss, grad_norm=gnorm, update_norm=unorm, finite=finite,
             entropy=jnp.sum(aux["entropy"]) / ntok,
             sampler_logp_gap=jnp.where(on_policy, gap, jnp.nan))
    m.update(drift.drift_stats(aux["logp_old"], aux["logp"], mask, c.rl.clip_eps_low,
                               c.rl.clip_eps_high, mb["adv"]))
    return state, m, moments


def _mean(rows, key):
  vals = [r[key] for r in rows if key in r and r[key] is not None]
  return float(np.mean(vals)) if vals else None


def _noise_row(prefix: str, s: noise.NoiseStats) -> dict:
  keys = ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio")
  row = {f"{prefix}/{k}": getattr(s, k) for k in keys}
  if s.flag:
    row[f"{prefix}/flag"] = s.flag
  return row


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Run (or resume) training in ``workdir``; returns the end-of-run summary."""
  config = ml_collections.ConfigDict(config.to_dict())  # private copy
  setup = prepare(config)
  os.makedirs(workdir, exist_ok=True)
  if config.mode == "sft":
    _, _, summary = sft.train_sft(config, workdir, setup.task, setup.tok,
                                  setup.layout, setup.eval_problems)
    _write_summary(workdir, summary)
    return summary
  return _train_rl(config, workdir, setup)


def _write_summary(workdir, summary):
  path = os.path.join(workdir, "summary.json")
  with open(path + ".tmp", "w") as f:  # atomic: a kill never leaves a torn summary
    json.dump(summary, f, indent=2, default=float)
  os.replace(path + ".tmp", path)


def _train_rl(config, workdir, setup):
  c = config
  ckpt = ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"))
  model_meta = c.model.to_dict()
  resume = ckpt.latest_step()
  if resume is not None:
    ckpt.check_model(model_meta)  # before any compile or write
  t_start = time.time()
  mesh = sharding.make_mesh(c.mesh.data, c.mesh.model)  # before anything compiles
  graphdef, base_params, base_summary = _sft_base(c, workdir, setup)
  base_params = sharding.shard_params(base_params, mesh)  # opt state and copies follow
  tx = make_optimizer(c.optim)
  K = c.batch.rollouts_per_prompt
  history_len = c.batch.staleness
  copy = lambda t: jax.tree.map(jnp.copy, t)  # updates donate their params
  state = dict(params=copy(base_params), opt_state=tx.init(base_params),
               history=[copy(base_params) for _ in range(history_len)])
  ema = noise.NoiseEMA(c.noise.ema_decay)
  meta = dict(round=0, step=0, rollouts_seen=0, consecutive_nonfinite=0,
              skipped_updates=0, base_pass_rate=None, seconds=0.0)
  if resume is not None:
    state, meta = ckpt.restore(resume, state)
    ema.load_state_dict(meta["ema"])
  start = meta["round"]
  controller = None
  if c.batch.schedule == "adaptive":
    controller = batch_lib.AdaptiveBatch(
        K, c.batch.adaptive_min_prompts, c.batch.adaptive_max_prompts,
        c.batch.adaptive_factor, c.batch.adaptive_every,
        prompts=meta.get("prompts", c.batch.num_prompts))
  trainers = {}  # one set of jitted functions per prompts-per-update bucket

  def get_trainer(P_mb):
    if P_mb not in trainers:
      trainers[P_mb] = Trainer(c, graphdef, tx, P_mb)
    return trainers[P_mb]

  writer = metrics_lib.MetricsWriter(workdir, resume_round=start + 1)
  eval_key = jax.random.key(c.train.eval_seed)
  evaluate = lambda p: rollouts.pass_rate(graphdef, p, setup.task, setup.tok,
                                          setup.eval_problems, eval_key, setup.layout,
                                          c.train.eval_temperature)
  if meta["base_pass_rate"] is None:
    meta["base_pass_rate"] = evaluate(state["params"])["pass_rate"]
    writer.write({"round": 0, "rollouts_seen": 0, "eval_pass_rate": meta["base_pass_rate"]})
  leaf_groups = [gradstats.param_group(p) for p in gradstats.leaf_paths(base_params)]
  interactive = c.train.progress
  end = start if meta.get("stopped_at_target") else c.train.num_rounds
  bar = tqdm.tqdm(range(start, end), initial=start, total=c.train.num_rounds,
                  desc="rl", disable=not interactive, mininterval=1.0)
  last_eval = None
  for rnd in bar:
    r1 = rnd + 1
    t0 = time.time()
    P = c.batch.num_prompts
    if controller is not None:
      # B_noise at the run's K from the tracker (P only enters its validation)
      P = controller.update(rnd, ema.stats(2, K).b_noise if ema.count else float("nan"))
      meta["prompts"] = P
    N = P * K
    n_update = N // c.batch.num_minibatches
    trainer = get_trainer(P // c.batch.num_minibatches)
    behaviour = state["history"][0] if history_len else state["params"]
    b, rewards, gen = _round_batch(c, graphdef, behaviour, base_params, setup, rnd, P, mesh)
    jax.block_until_ready(b["adv"])
    t_gen = time.time() - t0
    row = {"round": r1, "batch_size": N, "rollouts_per_update": n_update,
           "reward_mean": float(rewards.mean()),
           "frac_groups_mixed": float(np.mean(rewards.std(axis=1) > 0)),
           "completion_len": float(np.mean(np.asarray(gen["lengths"])))}
    # ---- updates over minibatches x epochs
    t1 = time.time()
    lr_base = c.optim.lr * batch_lib.lr_scale(c.optim.lr_rule, n_update, c.optim.ref_batch)
    order_rng = np.random.default_rng([c.seed, 2, rnd])
    upd_rows, split_stats, drift_pairs = [], None, []
    if history_len:  # params are about to change: remember this round's start
      state["history"] = state["history"][1:] + [copy(state["params"])]
    j = 0
    for epoch in range(c.batch.num_epochs):
      perm = order_rng.permutation(P)
      for mbi in range(c.batch.num_minibatches):
        prompts_idx = perm[mbi * trainer.P_mb:(mbi + 1) * trainer.P_mb]
        idx = (prompts_idx[:, None] * K + np.arange(K)[None]).reshape(-1)
        mb = sharding.shard_batch(_take(b, jnp.asarray(idx)), mesh)
        mb["on_policy"] = jnp.full((len(idx),), history_len == 0 and j == 0)
        do_split = bool(c.noise.split_every) and j == 0 and rnd % c.noise.split_every == 0
        if c.noise.exact_every and j == 0 and rnd % c.noise.exact_every == 0:
          mom = trainer.exact_moments(state["params"], batch=mb)
          tot = gradstats.sum_leaves(mom)
          st = noise.noise_stats(noise.exact_estimates(tot), trainer.P_mb, K)
          row.update(_noise_row("noise_exact", st))
          for g, gm in gradstats.sum_leaves(mom, leaf_groups).items():
            est = noise.exact_estimates(gm)
            row[f"noise_exact/trace_intra/{g}"] = float(est["trace_intra"])
            row[f"noise_exact/trace_inter/{g}"] = float(est["trace_inter"])
            row[f"noise_exact/g2/{g}"] = float(est["g2"])
        if c.noise.drift_every and rnd % c.noise.drift_every == 0:
          mom = trainer.exact_moments(state["params"], batch=mb)
          drift_pairs.append(noise.exact_estimates(gradstats.sum_leaves(mom)))
        lr = lr_base * batch_lib.warmup(meta["step"], c.optim.warmup_steps)
        update = trainer.update_split if do_split else trainer.update_plain
        new_state, m, moments = update(
            dict(params=state["params"], opt_state=state["opt_state"]), mb, lr)
        state.update(new_state)
        m["lr"] = lr
        upd_rows.append(m)  # device values: read once per round, not per update
        if moments is not None:
          split_stats = noise.split_estimates(gradstats.sum_leaves(moments))
        meta["step"] += 1
        j += 1
    upd_rows = jax.device_get(upd_rows)
    for j, m in enumerate(upd_rows):
      if bool(m["finite"]):
        meta["consecutive_nonfinite"] = 0
        continue
      meta["consecutive_nonfinite"] += 1
      meta["skipped_updates"] += 1
      if meta["consecutive_nonfinite"] >= c.train.max_consecutive_nonfinite:
        writer.close()
        step = meta["step"] - len(upd_rows) + j + 1
        raise NonFiniteError(
            f"{meta['consecutive_nonfinite']} consecutive non-finite updates "
            f"(round {r1}, update {j + 1} of the round, optimizer step {step}: "
            f"loss={m['loss']}, grad_norm={m['grad_norm']}, update_norm={m['update_norm']}); "
            f"parameters were not "
            f"changed by them; last checkpoint: round {ckpt.latest_step()}")
    t_upd = time.time() - t1
    meta["rollouts_seen"] += N
    gen_tokens = float(np.asarray(gen["completion_mask"]).sum())
    row.update(rollouts_seen=meta["rollouts_seen"], lr=upd_rows[-1]["lr"],
               num_updates=len(upd_rows), gen_seconds=t_gen, update_seconds=t_upd,
               tokens_per_s=gen_tokens / max(t_gen, 1e-9),
               skipped_updates=meta["skipped_updates"])
    for k in ("loss", "grad_norm", "entropy", "sampler_logp_gap") + drift.DRIFT_KEYS:
      row[k] = _mean(upd_rows, k)
    if len(upd_rows) > 1:
      for k in ("kappa_k1", "kappa_k3", "clip_frac_low", "clip_frac_high", "ess"):
        row[f"{k}_by_update"] = [float(u[k]) for u in upd_rows]
    if split_stats is not None:
      row.update(_noise_row("noise_split", noise.noise_stats(split_stats, trainer.P_mb, K)))
      row.update(_noise_row("noise_ema", ema.update(split_stats, trainer.P_mb, K)))
    if drift_pairs:
      row["trace_intra_by_update"] = [float(d["trace_intra"]) for d in drift_pairs]
      row["g2_by_update"] = [float(d["g2"]) for d in drift_pairs]
    if (c.train.eval_every and r1 % c.train.eval_every == 0) or r1 == c.train.num_rounds:
      ev = evaluate(state["params"])
      last_eval = ev["pass_rate"]
      row["eval_pass_rate"] = last_eval
      row.update({f"eval_pass_rate_d{d}": v for d, v in ev["by_difficulty"].items()})
    meta["seconds"] += time.time() - t0
    writer.write(row)
    bar.set_postfix(reward=f"{row['reward_mean']:.3f}",
                    pass_rate="-" if last_eval is None else f"{last_eval:.3f}")
    if not interactive:
      print(json.dumps({k: row[k] for k in ("round", "reward_mean", "loss", "entropy")
                        if k in row} | ({"eval_pass_rate": row["eval_pass_rate"]}
                                        if "eval_pass_rate" in row else {})), flush=True)
    reached = bool(c.train.stop_at_pass_rate) and "eval_pass_rate" in row and \
        row["eval_pass_rate"] >= c.train.stop_at_pass_rate
    if (c.train.checkpoint_every and r1 % c.train.checkpoint_every == 0) or \
        r1 == c.train.num_rounds or reached:
      meta["round"] = r1
      meta["ema"] = ema.state_dict()
      meta["model"] = model_meta
      ckpt.save(r1, state, meta)
    if reached:
      meta["stopped_at_target"] = True
      break
  bar.close()
  writer.close()
  ckpt.close()
  summary = _summarise(c, workdir, meta, base_summary, time.time() - t_start)
  _write_summary(workdir, summary)
  return summary


def _summarise(c, workdir, meta, base_summary, wall):
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  evals = [(r["round"], r["eval_pass_rate"]) for r in rows if "eval_pass_rate" in r]
  summary = dict(
      base_pass_rate=meta["base_pass_rate"],
      final_pass_rate=evals[-1][1] if evals else None,
      rounds=meta["round"], rollouts_seen=meta["rollouts_seen"],
      optimizer_steps=meta["step"], skipped_updates=meta["skipped_updates"],
      stopped_at_target=meta.get("stopped_at_target", False),
      wall_seconds_this_call=wall,
      gen_seconds=float(sum(r.get("gen_seconds", 0) for r in rows)),
      update_seconds=float(sum(r.get("update_seconds", 0) for r in rows)),
      sft=base_summary)
  # Noise: pool the per-round split estimates of the last half of training
  # (parameters drift across rounds, so this is a summary, not a fixed-point
  # measurement: for that use `python -m cbs_jax.measure`).
  K = c.batch.rollouts_per_prompt
  P_mb = c.batch.num_prompts // c.batch.num_minibatches
  est = [dict(trace_intra=r["noise_split/trace_intra"], trace_inter=r["noise_split/trace_inter"],
              g2=r["noise_split/g2"]) for r in rows if r.get("noise_split/g2") is not None]
  est = est[len(est) // 2:]
  if len(est) >= 2:
    s = noise.pooled_estimates(est, P_mb, K)
    summary["noise"] = dict(
        rounds_pooled=len(est), K=K, b_intra=s.b_intra, b_intra_se=s.b_intra_se,
        b_inter=s.b_inter, b_inter_se=s.b_inter_se,
        intra_inter_ratio=s.ratio, intra_inter_ratio_se=s.ratio_se,
        b_noise=s.b_noise, b_noise_se=s.b_noise_se, flag=s.flag)
  return summary
