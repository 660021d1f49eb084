"""``prepare(config) -> Setup``: what a run derives from its config, once.

``prepare`` validates the config and builds everything the run needs besides
it: the task and its tokenizer, the model config with that tokenizer's
vocabulary, the rollout layout, the held-out eval set, the frozen settings
of sampling (rollouts and evaluation) and of the RL objective, and the exact
expected-pass evaluator where the task enumerates its answers. The config
itself is never written to: everything derived lives in the ``Setup``.
"""

from __future__ import annotations

import dataclasses

import ml_collections
import numpy as np

from cbs_jax import config as config_lib
from cbs_jax import evaluation
from cbs_jax import hf
from cbs_jax import rl
from cbs_jax import rollouts
from cbs_jax import scoring
from cbs_jax import tasks


@dataclasses.dataclass(frozen=True)
class Setup:
  """What a run derives from its config (``prepare``).

  Attributes:
    model: ``config.model`` with the tokenizer's ``vocab_size`` (locked).
    task, tok, layout: the task, its tokenizer, prompt / completion lengths.
    eval_problems: the held-out eval set (the task's eval split).
    sampling: the distribution rollouts sample from (and score under).
    eval_sampling: the distribution the sampled pass@1 is drawn from.
    rl: the RL objective's settings.
    expected: the exact expected-pass evaluator, or None where the task
      does not enumerate its answers (or ``train.eval_expected`` is off).
  """

  model: ml_collections.ConfigDict
  task: tasks.Task
  tok: tasks.Tokenizer
  layout: rollouts.Layout
  eval_problems: list
  sampling: scoring.SamplingSpec
  eval_sampling: scoring.SamplingSpec
  rl: rl.RLSpec
  expected: evaluation.ExpectedPass | None = None


def prepare(config: ml_collections.ConfigDict) -> Setup:
  """Validate ``config`` and derive its ``Setup`` (``config`` is left as it was)."""
  config_lib.validate(config)
  task = tasks.make_task(config.task.name, **config.task.kwargs.to_dict())
  hf_dir = config.get("hf_checkpoint") or ""
  if hf_dir:  # a Hugging Face checkpoint: its tokenizer, its vocabulary, lengths in tokens
    vocab = hf.run_model_config(config.model, hf_dir).vocab_size
    tok = hf.load_tokenizer(hf_dir, vocab)
    if tok is None:
      raise ValueError(f"config.hf_checkpoint={hf_dir!r} has no tokenizer.json")
    lens = (
        task.token_lengths(tok)
        if hasattr(task, "token_lengths")
        else (task.max_prompt_len, task.max_completion_len)
    )
    layout = rollouts.Layout(lens[0] + 1, config.sampling.max_new_tokens or lens[1] + 1)
  else:
    tok = tasks.make_tokenizer(task)
    layout = rollouts.Layout.for_task(task, config.sampling.max_new_tokens)
    vocab = tok.vocab_size
  model = ml_collections.ConfigDict(config.model.to_dict())
  model.vocab_size = vocab
  model.lock()
  # never PAD/BOS inside a completion -- but EOS, where a checkpoint's pad/bos is its EOS
  suppress = (
      tuple(i for i in (tok.pad_id, tok.bos_id) if i != tok.eos_id)
      if config.sampling.suppress_special
      else ()
  )
  spec = scoring.SamplingSpec.from_config(config.sampling, suppress)
  # pass@1 as sampled at the eval temperature, without top-k / top-p
  eval_spec = scoring.SamplingSpec(config.train.eval_temperature, suppress_ids=suppress)
  if layout.total > config.model.max_len:
    raise ValueError(
        f"config.model.max_len={config.model.max_len} is shorter than "
        f"prompt ({layout.prompt_len}) + completion "
        f"({layout.completion_len}) tokens of task {task.name!r}"
    )
  # held out by construction: the task's eval split, never drawn for SFT or RL
  eval_problems = task.sample(
      np.random.default_rng(config.train.eval_seed), config.train.eval_prompts, split="eval"
  )
  expected = None
  if config.train.eval_expected and task.enumerable:
    expected = evaluation.ExpectedPass(task, tok, eval_problems, layout, eval_spec)
  return Setup(
      model,
      task,
      tok,
      layout,
      eval_problems,
      spec,
      eval_spec,
      rl.RLSpec.from_config(config.rl),
      expected,
  )
