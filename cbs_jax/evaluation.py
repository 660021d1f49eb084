"""Held-out evaluation without sampling noise: the exact expected pass rate.

For a task whose accepted completions can be enumerated
(``task.accepted_completions(problem, max_chars)``: every string the
verifier scores 1.0), the probability that the policy's sampler emits an
accepted completion is a finite sum computed by teacher forcing:

    E[pass@1](problem) = sum_{s accepted} P_policy(tokens(s))

where ``tokens(s)`` is the string's tokens followed by EOS when it is shorter
than the completion budget Tc, and the string's Tc tokens alone (no EOS)
when it fills the budget: the sampler stops at Tc and the verifier reads
all of it. Probabilities are those of the distribution the sampler draws
from (temperature / top-k / top-p processed, special tokens other than EOS
suppressed: ``scoring.process_logits``), so this is exactly the expectation
of the sampled pass@1 -- with no sampling noise: a 512-prompt sampled eval
has SE ~0.02, this has none.

Every accepted variant the task enumerates is counted (arithmetic: leading
zeros and "-0"; see each task's ``accepted_completions``). The sequences of
all problems are flattened into fixed-size chunks and scored by one jitted
function; ``ExpectedPass`` builds the token arrays once per eval set.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import rollouts
from cbs_jax import scoring
from cbs_jax.tasks import Problem, Task, Tokenizer


class ExpectedPass:
  """Exact E[pass@1] of a fixed problem set; call with (graphdef, params).

  Args:
    task, tok, problems, layout: the eval set and its encoding.
    spec: the eval sampler's distribution (``scoring.SamplingSpec``); must
      be the sampler's.
    chunk: rows per jitted scoring call (the last chunk is padded).

  Raises ValueError naming the task when it cannot enumerate its answers.
  """

  def __init__(
      self,
      task: Task,
      tok: Tokenizer,
      problems: Sequence[Problem],
      layout: rollouts.Layout,
      spec: scoring.SamplingSpec,
      chunk: int = 1024,
  ):
    if not getattr(task, "enumerable", False):
      raise ValueError(
          f"task {task.name!r} cannot enumerate its accepted completions: "
          "eval_expected_pass is unavailable (use the sampled pass rate, "
          "config.train.eval_expected=False)"
      )
    Tc = layout.completion_len
    owner, comps = [], []
    for i, p in enumerate(problems):
      for s in task.accepted_completions(p, Tc):
        if task.verify(p, s) != 1.0:  # cheap guard: a subclass changed the verifier
          raise ValueError(
              f"task {task.name!r} enumerates {s!r} for prompt {p.prompt!r}, "
              "which its verifier rejects: set enumerable = False"
          )
        ids = tok.encode(s)
        if len(ids) < Tc:
          ids = ids + [tok.eos_id]
        elif len(ids) > Tc:
          continue
        owner.append(i)
        comps.append(ids)
    self.num_problems = len(problems)
    self.num_sequences = len(comps)
    self.difficulty = np.array([p.difficulty for p in problems])
    self.owner = np.asarray(owner, np.int64)
    prompt, pmask = rollouts.encode_prompts(tok, problems, layout)
    R = max(1, -(-len(comps) // chunk)) * chunk
    comp = np.full((R, Tc), tok.pad_id, np.int32)
    cmask = np.zeros((R, Tc), np.float32)
    for r, ids in enumerate(comps):
      comp[r, : len(ids)] = ids
      cmask[r, : len(ids)] = 1.0
    rows = np.zeros(R, np.int64)
    rows[: len(owner)] = owner
    self._prompt, self._pmask = prompt[rows], pmask[rows]
    self._comp, self._cmask, self.chunk = comp, cmask, chunk
    self._fn = jax.jit(
        lambda gd, p, pr, pm, c, cm: jnp.sum(
            scoring.score(gd, p, pr, pm, c, cm, spec).logprobs, axis=-1
        ),
        static_argnums=(0,),
    )

  def sequence_logprobs(self, graphdef, params) -> np.ndarray:
    """log P(sequence) of every enumerated accepted sequence (problem order)."""
    out = []
    for i in range(0, len(self._comp), self.chunk):
      sl = slice(i, i + self.chunk)
      out.append(
          self._fn(
              graphdef, params, self._prompt[sl], self._pmask[sl], self._comp[sl], self._cmask[sl]
          )
      )
    return np.concatenate(jax.device_get(out))[: self.num_sequences]

  def per_problem(self, graphdef, params) -> np.ndarray:
    """E[pass@1] of each problem (the sum of its accepted sequences' probabilities)."""
    lp = self.sequence_logprobs(graphdef, params).astype(np.float64)
    return np.bincount(self.owner, weights=np.exp(lp), minlength=self.num_problems)

  def __call__(self, graphdef, params) -> dict:
    """``{"expected_pass": mean over problems, "by_difficulty": {d: mean}}``."""
    p = self.per_problem(graphdef, params)
    by = {int(d): float(p[self.difficulty == d].mean()) for d in np.unique(self.difficulty)}
    return dict(expected_pass=float(p.mean()), by_difficulty=by)
