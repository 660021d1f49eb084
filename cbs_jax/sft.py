"""Supervised warm start: the base policy RL starts from.

Next-token training on correct solutions in exactly the rollout layout
(left-padded prompt, completion = solution + EOS), so the base policy is the
conditional distribution the sampler draws from. Adam with linear warmup and
cosine decay; the held-out pass@1 is measured with sampled (not greedy)
decoding, the number RL will then move. ``sft.stop_at_pass_rate`` ends the
base at the first evaluation that reaches it (bases matched in pass rate).
"""

from __future__ import annotations

import dataclasses
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import tqdm

from cbs_jax import checkpoint as ckpt_lib
from cbs_jax import metrics as metrics_lib
from cbs_jax import model as model_lib
from cbs_jax import paths
from cbs_jax import rollouts
from cbs_jax import run_setup
from cbs_jax import scoring


def sft_loss(params, graphdef, batch):
  sc = scoring.score(
      graphdef,
      params,
      batch["prompt"],
      batch["prompt_mask"],
      batch["completion"],
      batch["completion_mask"],
      scoring.SamplingSpec(),
  )
  m = batch["completion_mask"]
  return -jnp.sum(sc.logprobs) / jnp.maximum(jnp.sum(m), 1.0)


def corrupt(problems, task, rng, rate: float):
  """Replace one character of a fraction ``rate`` of solutions by a random
  character of the task's alphabet: label noise, so that the base policy is
  right on average yet puts real mass on wrong answers, as a pretrained model
  does before RL (``config.sft.label_noise``)."""
  if rate <= 0:
    return problems
  out = []
  for p in problems:
    if p.solution and rng.random() < rate:
      i = int(rng.integers(len(p.solution)))
      ch = task.alphabet[int(rng.integers(len(task.alphabet)))]
      p = dataclasses.replace(p, solution=p.solution[:i] + ch + p.solution[i + 1 :])
    out.append(p)
  return out


def make_batch(tok, problems, layout):
  prompt, pmask = rollouts.encode_prompts(tok, problems, layout)
  comp, cmask = rollouts.encode_solutions(tok, problems, layout)
  return dict(prompt=prompt, prompt_mask=pmask, completion=comp, completion_mask=cmask)


def optimizer(c) -> optax.GradientTransformation:
  """SFT's optimizer from ``config.sft``: clipped Adam, warmup then cosine."""
  return optax.chain(
      optax.clip_by_global_norm(1.0),
      optax.adam(
          optax.warmup_cosine_decay_schedule(
              0.0, c.lr, c.warmup_steps, max(c.steps, c.warmup_steps + 1), c.lr * 0.1
          )
      ),
  )


def train_sft(config, setup: run_setup.Setup, workdir: str):
  """Train (or resume, or load when finished) the SFT base of ``setup.model``
  on ``setup.task`` in ``workdir``; the held-out pass@1 is sampled from
  ``setup.eval_sampling`` (the RL run's eval sampler) on ``setup.eval_problems``.

  Returns ``(graphdef, params, summary)``.
  """
  c = config.sft
  task, tok, layout, model_cfg = setup.task, setup.tok, setup.layout, setup.model
  graphdef, params = model_lib.build(model_cfg, seed=config.seed)
  ckpt = ckpt_lib.Checkpointer(paths.join(workdir, "checkpoints"))
  model_meta = model_cfg.to_dict()
  tx = optimizer(c)
  opt_state = tx.init(params)
  start = 0
  if ckpt.latest_step() is not None:
    ckpt.check_model(model_meta)
    (params, opt_state), meta = ckpt.restore(ckpt.latest_step(), (params, opt_state))
    start = meta["step"]
    if start >= c.steps or meta.get("summary", {}).get("stopped_at_pass_rate"):
      return graphdef, params, meta.get("summary", {})

  @functools.partial(jax.jit, donate_argnums=(0, 1))
  def step(params, opt_state, batch):
    loss, g = jax.value_and_grad(sft_loss)(params, graphdef, batch)
    upd, opt_state = tx.update(g, opt_state, params)
    return optax.apply_updates(params, upd), opt_state, loss

  writer = metrics_lib.MetricsWriter(workdir, resume_round=start, key="step")
  eval_key = jax.random.key(config.train.eval_seed)
  evaluate = lambda p: rollouts.pass_rate(
      graphdef, p, task, tok, setup.eval_problems, eval_key, layout, setup.eval_sampling
  )
  t0 = time.time()
  bar = tqdm.trange(
      start,
      c.steps,
      desc="sft",
      disable=not config.train.progress,
      initial=start,
      total=c.steps,
      mininterval=1.0,
  )
  loss = None
  for s in bar:
    rng = np.random.default_rng([config.seed, 7, s])
    problems = corrupt(task.sample(rng, c.batch_size), task, rng, c.label_noise)
    batch = make_batch(tok, problems, layout)
    params, opt_state, loss = step(params, opt_state, batch)
    last = s + 1 == c.steps
    do_eval = (c.eval_every and (s + 1) % c.eval_every == 0) or last
    if not (do_eval or s == start or (s + 1) % 100 == 0):
      continue
    row = {"step": s + 1, "loss": float(loss)}
    if do_eval:
      ev = evaluate(params)
      row["eval_pass_rate"] = ev["pass_rate"]
      row.update({f"eval_pass_rate_d{d}": v for d, v in ev["by_difficulty"].items()})
      bar.set_postfix(loss=f"{row['loss']:.3f}", pass_rate=f"{ev['pass_rate']:.3f}")
      summary = {
          "sft_steps": s + 1,
          "sft_loss": row["loss"],
          "base_pass_rate": ev["pass_rate"],
          "sft_seconds": time.time() - t0,
      }
      if c.stop_at_pass_rate and ev["pass_rate"] >= c.stop_at_pass_rate:
        summary["stopped_at_pass_rate"] = True  # the base is this checkpoint, never trained on
    writer.write(row)
    if do_eval:
      ckpt.save(
          s + 1, (params, opt_state), {"step": s + 1, "model": model_meta, "summary": summary}
      )
      if summary.get("stopped_at_pass_rate"):
        break
  writer.close()
  ckpt.close()
  return graphdef, params, summary
