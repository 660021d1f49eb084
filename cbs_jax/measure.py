"""Precise gradient-noise measurement of a policy at fixed parameters.

    python -m cbs_jax.measure --config=configs/default.py --workdir=runs/default \\
        --prompts=64 --rollouts=16 --batches=24

Loads the latest RL checkpoint of the workdir (or the SFT base when there is
none, or ``--round``), draws M fresh P x K rollout batches from that policy
(prompts and keys disjoint from training's), computes each batch's exact
per-rollout moments (and the split estimator, as a cross-check), pools the M
unbiased per-batch estimates and reports jackknife standard errors.
B_intra, B_inter and B_noise are reported only where |G|^2 is significantly
positive (> 2 SE); otherwise they are flagged.

One rollout, one gradient: the per-rollout gradient g_i = N grad L_i must
not depend on the other rollouts of the batch except through its own
group. The training default ``token_mean`` divides by the batch's token
count, and PPO whitens advantages over the whole batch; both couple every
rollout to every other. A measurement therefore uses ``--aggregation``
(default ``seq_mean_token_sum_norm``: each token weighs 1 / (N Tc), a
constant) and no batch-wide whitening (``rl.adv_whiten=False``). Pass
``--aggregation=train`` to measure the run's own objective instead.

Advantages are group-normalised (GRPO), so rollouts of one prompt are
exchangeable, not independent: the estimates are unbiased for the batch's
own K (see noise.py), and B_noise(K') for another K' is an extrapolation.

The optimizer's view: where the checkpoint has Adam moments, the same
estimators are also evaluated on gradients scaled by Adam's metric
1 / (sqrt(nu_hat) + eps) (``adam`` in the output): the noise scale of the
preconditioned update direction, which is what the sqrt rule is about.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import tqdm
from absl import app
from absl import flags
from absl import logging
from ml_collections import config_flags

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import gradstats
from cbs_jax import noise
from cbs_jax import noise_stats
from cbs_jax import paths
from cbs_jax import rl
from cbs_jax import run_setup
from cbs_jax import sft
from cbs_jax import train
from cbs_jax import updater as updater_lib

ROUND_OFFSET = 1_000_000  # measurement batches use rounds >= this: disjoint from training


def load_policy(
    config, workdir: str, setup, round_: int | None = None, with_opt_state: bool = False
):
  """(graphdef, params, round) from the RL checkpoint, or the SFT base
  (round 0); with ``with_opt_state`` also the optimizer state (None for the
  SFT base)."""
  ckpt_dir = paths.join(workdir, "checkpoints")
  ckpt = ckpt_lib.Checkpointer(ckpt_dir) if paths.isdir(ckpt_dir) else None
  step = round_ if round_ is not None else (ckpt.latest_step() if ckpt else None)
  graphdef, params, _ = train.sft_base(config, workdir, setup)
  if step is None or step == 0:
    return (graphdef, params, 0) + ((None,) if with_opt_state else ())
  ckpt.check_model(setup.model.to_dict(), step)
  tx = updater_lib.make_optimizer(config.optim)
  like = dict(params=params, opt_state=tx.init(params), history=[params] * config.batch.staleness)
  state, _ = ckpt.restore(step, like)
  return (graphdef, state["params"], step) + ((state["opt_state"],) if with_opt_state else ())


def measurement_config(config, P: int, K: int, aggregation: str = "seq_mean_token_sum_norm"):
  """The run's config with the measurement batch shape and a per-rollout
  normaliser (``aggregation``; "train" keeps the run's) and no batch-wide
  advantage whitening."""
  c = config.copy_and_resolve_references()
  with c.unlocked():
    c.batch.num_prompts, c.batch.rollouts_per_prompt = P, K
    c.batch.num_minibatches = 1
    if aggregation != "train":
      c.rl.aggregation = aggregation
    c.rl.adv_whiten = False
  return c


def measure(
    config,
    graphdef,
    params,
    setup,
    P: int,
    K: int,
    M: int,
    chunk_prompts: int = 4,
    progress: bool = True,
    aggregation: str = "seq_mean_token_sum_norm",
    opt_state=None,
    by_difficulty: bool = False,
) -> dict:
  """Pool M batches at fixed params; returns exact, split and per-group
  stats, and with an ``opt_state`` holding Adam moments also ``adam``: the
  exact estimates in Adam's preconditioned metric (``gradstats.adam_metric``).
  ``by_difficulty`` adds ``inter_by_difficulty``: each prompt difficulty's
  contribution to tr Sigma_inter (``noise.inter_by_group``; mean and SE over
  the batches, the contributions of a batch summing to its trace_inter)."""
  if M < 2:
    raise ValueError(f"batches={M}: pooling needs at least 2 batches")
  c = measurement_config(config, P, K, aggregation)
  setup = dataclasses.replace(setup, rl=rl.RLSpec.from_config(c.rl))  # the measurement's
  chunk_prompts = math.gcd(chunk_prompts, P)  # a speed/memory knob: any divisor of P
  groups = 1 + max(p.difficulty for p in setup.eval_problems) if by_difficulty else 0
  exact_fn = jax.jit(
      functools.partial(
          gradstats.group_moments,
          graphdef=graphdef,
          P=P,
          K=K,
          rl_spec=setup.rl,
          sampling_spec=setup.sampling,
          chunk_prompts=chunk_prompts,
          num_groups=groups,
      )
  )
  split_fn = jax.jit(
      lambda p, b: gradstats.split_grads(p, graphdef, b, P, K, setup.rl, setup.sampling)[3]
  )
  metric = (
      None
      if opt_state is None
      else gradstats.adam_metric(opt_state, config.optim.b2, config.optim.eps)
  )
  if metric is not None and int(jax.device_get(gradstats.adam_state(opt_state).count)) == 0:
    metric = None  # no Adam step taken yet: no metric to speak of
  leaf_groups = [gradstats.param_group(p) for p in gradstats.leaf_paths(params)]
  exact, split, leaf_stats, rewards, adam, by_diff = [], [], {}, [], [], []
  lengths = []
  for i in tqdm.trange(M, desc="measure", disable=not progress):
    b, r, gen = train.round_batch(c, graphdef, params, params, setup, ROUND_OFFSET + i)
    b["on_policy"] = np.ones((P * K,), bool)
    rewards.append(float(r.mean()))
    lengths.append(float(np.mean(np.asarray(gen["lengths"]))))
    if by_difficulty:
      labels = np.minimum(gen["difficulty"], groups - 1)
      mom, gram = exact_fn(params, batch=b, prompt_groups=labels)
      inter = noise.inter_by_group(gradstats.sum_leaves(mom), labels, jnp.sum(gram, axis=0))
      by_diff.append({k: np.asarray(v) for k, v in inter.items()})
    else:
      mom = exact_fn(params, batch=b)
    exact.append(noise.exact_estimates(gradstats.sum_leaves(mom)))
    for g, gm in gradstats.sum_leaves(mom, leaf_groups).items():
      leaf_stats.setdefault(g, []).append(noise.exact_estimates(gm))
    split.append(noise.split_estimates(gradstats.sum_leaves(split_fn(params, b))))
    if metric is not None:
      adam.append(
          noise.exact_estimates(gradstats.sum_leaves(exact_fn(params, batch=b, metric=metric)))
      )
  to_np = lambda ests: [{k: float(v) for k, v in e.items()} for e in ests]
  res = dict(
      P=P,
      K=K,
      M=M,
      reward_mean=float(np.mean(rewards)),
      completion_len=float(np.mean(lengths)),  # mean completion tokens of the measured rollouts
      aggregation=c.rl.aggregation,
      exact=noise_stats.pooled_estimates(to_np(exact), P, K),
      split=noise_stats.pooled_estimates(to_np(split), P, K),
      groups={g: noise_stats.pooled_estimates(to_np(v), P, K) for g, v in leaf_stats.items()},
  )
  if by_diff:
    contrib = np.stack([d["contribution"] for d in by_diff])  # [M, G]
    count = np.stack([d["count"] for d in by_diff]).sum(0)
    res["inter_by_difficulty"] = {
        int(g): dict(
            contribution=float(contrib[:, g].mean()),
            se=float(contrib[:, g].std(ddof=1) / np.sqrt(M)),
            prompts=int(count[g]),
        )
        for g in range(contrib.shape[1])
        if count[g] > 0
    }
  if adam:
    res["adam"] = noise_stats.pooled_estimates(to_np(adam), P, K)
  return res


def sft_base_and_measure(config, workdir: str, P: int, K: int, M: int) -> dict:
  """A sweep run (``sweep.run_sweep``'s ``run_fn``): train (or load) the SFT
  base of ``config`` in ``workdir``, measure its noise at fixed parameters
  (``measure``, M batches of P x K rollouts) and write the SFT summary with
  the measurement (``to_json``) as ``summary.json``, which marks the run
  finished. Returns that summary."""
  setup = run_setup.prepare(config)
  graphdef, params, sft_summary = sft.train_sft(config, setup, workdir)
  res = measure(config, graphdef, params, setup, P, K, M, chunk_prompts=min(4, P), progress=False)
  summary = dict(sft_summary, **to_json(res))
  paths.write_atomic(
      paths.join(workdir, "summary.json"), json.dumps(summary, indent=1, default=float)
  )
  return summary


def format_table(res: dict) -> str:
  s = res["exact"]
  lines = [
      f"P={res['P']} K={res['K']} batches={res['M']} "
      f"(rollouts pooled: {res['P'] * res['K'] * res['M']}) reward_mean={res['reward_mean']:.3f}",
      f"{'quantity':<24}{'exact':>14}{'+-SE':>12}{'split':>14}{'+-SE':>12}",
  ]
  for k in ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio"):
    e, sp = res["exact"], res["split"]
    lines.append(
        f"{k:<24}{getattr(e, k):>14.5g}{getattr(e, k + '_se'):>12.3g}"
        f"{getattr(sp, k):>14.5g}{getattr(sp, k + '_se'):>12.3g}"
    )
  if s.flag:
    lines.append(f"flag: {s.flag}")
  if "adam" in res:
    a = res["adam"]
    lines.append("in Adam's preconditioned metric (exact):")
    for k in ("g2", "trace_intra", "trace_inter", "b_intra", "b_inter", "b_noise", "ratio"):
      lines.append(f"  {k:<22}{getattr(a, k):>14.5g}{getattr(a, k + '_se'):>12.3g}")
  lines.append("by parameter group (exact): trace_intra, trace_inter, g2")
  for g, st in res["groups"].items():
    lines.append(f"  {g:<12}{st.trace_intra:>12.4g} {st.trace_inter:>12.4g} {st.g2:>12.4g}")
  return "\n".join(lines)


def to_json(res: dict) -> dict:
  out = {k: v for k, v in res.items() if k not in ("exact", "split", "groups", "adam")}
  out["exact"] = dataclasses.asdict(res["exact"])
  if "adam" in res:
    out["adam"] = dataclasses.asdict(res["adam"])
  out["split"] = dataclasses.asdict(res["split"])
  out["groups"] = {g: dataclasses.asdict(s) for g, s in res["groups"].items()}
  return out


def _define_flags():
  """Command-line flags (defined only when run as a program)."""
  config_flags.DEFINE_config_file("config", None, "Config of the run.", lock_config=True)
  flags.DEFINE_string("workdir", None, "Run directory holding the checkpoint.")
  flags.DEFINE_integer("round", None, "Checkpoint round (default: latest; 0: SFT base).")
  flags.DEFINE_integer("prompts", 64, "P prompts per batch.")
  flags.DEFINE_integer("rollouts", 16, "K rollouts per prompt.")
  flags.DEFINE_integer("batches", 16, "M batches pooled.")
  flags.DEFINE_integer("chunk_prompts", 4, "Prompts per vmap chunk (divides P).")
  flags.DEFINE_string(
      "aggregation",
      "seq_mean_token_sum_norm",
      "Loss normaliser of the measurement ('train' = the run's own).",
  )
  flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  F = flags.FLAGS
  if not F["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  config = F.config
  setup = run_setup.prepare(config)
  graphdef, params, rnd, opt_state = load_policy(
      config, F.workdir, setup, F.round, with_opt_state=True
  )
  print(f"policy: {F.workdir} round {rnd}")
  res = measure(
      config,
      graphdef,
      params,
      setup,
      F.prompts,
      F.rollouts,
      F.batches,
      F.chunk_prompts,
      aggregation=F.aggregation,
      opt_state=opt_state,
  )
  print(format_table(res))
  path = paths.join(F.workdir, f"measure_round{rnd}_P{res['P']}_K{res['K']}.json")
  paths.write_atomic(path, json.dumps(to_json(res), indent=1, default=float))
  print(f"wrote {path}")


if __name__ == "__main__":
  _define_flags()
  app.run(main)
