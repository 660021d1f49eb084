"""From problems to scored rollouts: encode, generate, decode, verify.

Prompts are always left-padded to the task's fixed prompt length and
completions run to a fixed ``max_new_tokens``, so every round of a run has
the same shapes and nothing recompiles.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from cbs_jax import sampling
from cbs_jax import scoring
from cbs_jax import sharding
from cbs_jax.tasks import Problem, Task, Tokenizer


@dataclasses.dataclass(frozen=True)
class Layout:
  """Fixed sequence shapes of a run: prompt length Tp, completion length Tc."""

  prompt_len: int
  completion_len: int

  @classmethod
  def for_task(cls, task: Task, max_new_tokens: int = 0) -> "Layout":
    # +1 for BOS on prompts, +1 for EOS after the longest solution.
    return cls(task.max_prompt_len + 1, max_new_tokens or task.max_completion_len + 1)

  @property
  def total(self) -> int:
    return self.prompt_len + self.completion_len


def encode_prompts(tok: Tokenizer, problems: Sequence[Problem], layout: Layout):
  """Left-padded [BOS] + prompt tokens (numpy int32 and bool mask)."""
  seqs = [[tok.bos_id] + tok.encode(p.prompt) for p in problems]
  return sampling.left_pad(seqs, layout.prompt_len, tok.pad_id)


def encode_solutions(tok: Tokenizer, problems: Sequence[Problem], layout: Layout):
  """Right-padded solution + EOS tokens and mask (the SFT targets)."""
  B, Tc = len(problems), layout.completion_len
  toks = np.full((B, Tc), tok.pad_id, np.int32)
  mask = np.zeros((B, Tc), np.float32)
  for i, p in enumerate(problems):
    s = tok.encode(p.solution)[: Tc - 1] + [tok.eos_id]
    toks[i, : len(s)] = s
    mask[i, : len(s)] = 1.0
  return toks, mask


def decode(tok: Tokenizer, tokens_BxT) -> list[str]:
  return [tok.decode(row) for row in np.asarray(tokens_BxT)]


def verify(task: Task, problems: Sequence[Problem], texts: Sequence[str]) -> np.ndarray:
  return np.array([task.verify(p, t) for p, t in zip(problems, texts)], np.float32)


def rollout(
    graphdef,
    params,
    task: Task,
    tok: Tokenizer,
    problems: Sequence[Problem],
    K: int,
    key,
    layout: Layout,
    spec: scoring.SamplingSpec,
    mesh=None,
) -> dict:
  """K samples for each problem, prompt-major (rollout b = p*K + k), from the
  distribution ``spec``.

  Returns a dict with the batch arrays (``prompt``, ``prompt_mask``,
  ``completion``, ``completion_mask``, ``logp_old``), ``rewards`` [P, K]
  (numpy) and the decoded ``texts``. With a ``mesh``, rollouts are split
  over its data axis (generation is data-parallel).
  """
  prompt, pmask = encode_prompts(tok, problems, layout)
  prompt = np.repeat(prompt, K, axis=0)
  pmask = np.repeat(pmask, K, axis=0)
  if mesh is not None:
    placed = sharding.shard_batch(dict(prompt=prompt, pmask=pmask), mesh)
    prompt, pmask = placed["prompt"], placed["pmask"]
  out = sampling.generate(
      graphdef,
      params,
      prompt,
      pmask,
      key,
      max_new_tokens=layout.completion_len,
      eos_id=tok.eos_id,
      pad_id=tok.pad_id,
      spec=spec,
  )
  texts = decode(tok, out.tokens)
  rewards = verify(task, [p for p in problems for _ in range(K)], texts)
  return dict(
      prompt=jnp.asarray(prompt),
      prompt_mask=jnp.asarray(pmask, bool),
      completion=out.tokens,
      completion_mask=out.mask,
      logp_old=out.logprobs,
      lengths=out.lengths,
      rewards=rewards.reshape(len(problems), K),
      texts=texts,
  )


def pass_rate(
    graphdef,
    params,
    task: Task,
    tok: Tokenizer,
    problems: Sequence[Problem],
    key,
    layout: Layout,
    spec: scoring.SamplingSpec,
    batch: int = 512,
) -> dict:
  """pass@1 (one sample per problem from ``spec``) overall and per difficulty bucket."""
  rewards = []
  for i in range(0, len(problems), batch):
    chunk = problems[i : i + batch]
    pad = batch - len(chunk) if len(problems) > batch else 0  # keep one shape
    r = rollout(
        graphdef,
        params,
        task,
        tok,
        list(chunk) + [chunk[-1]] * pad,
        1,
        jax.random.fold_in(key, i),
        layout,
        spec,
    )["rewards"][:, 0]
    rewards.append(r[: len(chunk)])
  rewards = np.concatenate(rewards)
  diff = np.array([p.difficulty for p in problems])
  by = {int(d): float(rewards[diff == d].mean()) for d in np.unique(diff)}
  return dict(pass_rate=float(rewards.mean()), by_difficulty=by)
