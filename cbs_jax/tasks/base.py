"""The task interface: a `Problem` record and the abstract `Task`.

A task draws problems (`sample`) and scores a model's completion for one
(`verify`). Everything here is pure Python + numpy: no JAX, so the reward
side can run on the host while the accelerator decodes.

Contract every task keeps (the rest of the code relies on it):

* `alphabet` holds every character any prompt or solution can contain, so a
  `CharTokenizer(task.alphabet)` can encode all of them.
* `max_prompt_len` / `max_completion_len` bound the character length of
  every prompt / solution the task can draw (each task documents how tight
  the bound is); the sampler budgets `max_completion_len` plus a small slack.
* `verify(problem, completion)` returns a float in [0, 1] and never raises,
  whatever the completion: empty, huge, random text, non-ASCII, or not a
  string at all (anything that is not a `str` scores 0).

Held out by construction. Every problem has a canonical identity
(`problem_key`: arithmetic's (a, op, b), countdown's sorted numbers and
target, GSM8K's question); a stable hash of it puts the problem in the
"eval" part (a fraction `EVAL_FRACTION` of the problem space, at every
difficulty) or the "train" part. `sample(rng, n, split)` draws from the
task's generator (`draw`) and keeps the problems of the asked split
(rejection sampling: each split keeps the generator's distribution,
difficulty mix included, conditioned on the hash). SFT and RL draw "train",
the held-out eval draws "eval", so no eval problem is ever trained on, at
any seed. Small difficulty levels are split like the rest: 1-digit
addition/subtraction (200 problems) keeps ~20 of them for eval, and an eval
set of hundreds of prompts repeats those few (sampled with replacement, as
every split is); that is counted, not hidden (`tests/test_tasks.py`).

Exact evaluation. A task whose accepted completions can be listed sets
`enumerable = True` and implements `accepted_completions(problem,
max_chars)`: every string of at most `max_chars` characters, over the
characters of `alphabet`, that `verify` scores 1.0. The exact expected
pass rate (`cbs_jax.evaluation`) sums the policy's probability of each.
"""

from __future__ import annotations

import abc
import dataclasses
import hashlib

import numpy as np

SPLITS = ("train", "eval")
EVAL_FRACTION = 0.1  # share of every task's problem space held out for evaluation
_HASH_BUCKETS = 10_000
_MAX_REJECTIONS = 1_000  # draws per requested problem before a split is declared empty


def stable_fraction(key: str) -> float:
  """A number in [0, 1) fixed by ``key`` alone (blake2b; not Python's
  salted ``hash``), the same on every machine and run."""
  digest = hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest()
  return (int.from_bytes(digest, "big") % _HASH_BUCKETS) / _HASH_BUCKETS


@dataclasses.dataclass(frozen=True)
class Problem:
  """One drawn problem.

  Attributes:
    prompt: text fed to the model; ends with the separator the model
      answers after ("=" for arithmetic, ":" for countdown, "A:" for GSM8K).
    answer: canonical final answer as text (e.g. "46", "-7", "1200").
    solution: the full SFT target completion (what a correct model writes,
      without EOS); `task.verify(problem, problem.solution) == 1.0`.
    difficulty: task-specific difficulty bucket, for per-prompt analysis.
    meta: optional hashable extras (e.g. countdown numbers and target).
  """

  prompt: str
  answer: str
  solution: str
  difficulty: int = 0
  meta: tuple = ()


class Task(abc.ABC):
  """A verifiable task: draws `Problem`s and scores completions in [0, 1].

  Subclasses set the instance attributes `name`, `alphabet`,
  `max_prompt_len` and `max_completion_len` in their constructor.
  """

  name: str
  alphabet: str
  max_prompt_len: int
  max_completion_len: int
  enumerable: bool = False  # accepted_completions lists every accepted string

  @abc.abstractmethod
  def draw(self, rng: np.random.Generator, n: int) -> list[Problem]:
    """Draws `n` problems from the whole problem space (both splits);
    deterministic given the state of `rng`."""

  def problem_key(self, problem: Problem) -> str:
    """The problem's canonical identity (what the split hashes); two
    prompts of the same problem share it. Default: the prompt."""
    return problem.prompt

  def split_of(self, problem: Problem) -> str:
    """ "eval" or "train": a fixed function of `problem_key`."""
    key = f"{self.name}|{self.problem_key(problem)}"
    return "eval" if stable_fraction(key) < EVAL_FRACTION else "train"

  def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> list[Problem]:
    """Draws `n` problems of `split` ("train": SFT and RL; "eval": the
    held-out evaluation); deterministic given the state of `rng`.

    Raises ValueError for an unknown split, RuntimeError naming the task
    and split when the generator yields none of that split.
    """
    n = check_n(n)
    if split not in SPLITS:
      raise ValueError(f"split={split!r} is not one of {list(SPLITS)}")
    out: list[Problem] = []
    drawn = 0
    while len(out) < n:
      chunk = self.draw(rng, max(n - len(out), 16))
      drawn += len(chunk)
      out.extend(p for p in chunk if self.split_of(p) == split)
      if not out and drawn > _MAX_REJECTIONS * max(n, 16):
        raise RuntimeError(f"task {self.name!r}: no {split!r} problem in " f"{drawn} draws")
    return out[:n]

  def accepted_completions(self, problem: Problem, max_chars: int) -> list[str]:
    """Every string of at most `max_chars` characters of `alphabet` that
    `verify` scores 1.0 (tasks with `enumerable = True`)."""
    raise NotImplementedError(f"task {self.name!r} cannot enumerate its accepted completions")

  @abc.abstractmethod
  def verify(self, problem: Problem, completion: str) -> float:
    """Reward in [0, 1] for `completion`; never raises."""

  def __repr__(self) -> str:
    return (
        f"{type(self).__name__}(name={self.name!r}, "
        f"max_prompt_len={self.max_prompt_len}, "
        f"max_completion_len={self.max_completion_len})"
    )


# Argument checks shared by the tasks; every message names the argument.


def check_n(n) -> int:
  """Validates a sample count."""
  if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
    raise ValueError(f"n must be a non-negative int, got {n!r}")
  return int(n)


def check_int(name: str, value, lo: int, hi: int | None = None) -> int:
  """Validates an int constructor argument lying in [lo, hi]."""
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
    raise ValueError(f"{name} must be an int, got {value!r}")
  value = int(value)
  if value < lo or (hi is not None and value > hi):
    bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    raise ValueError(f"{name} must be {bound}, got {value}")
  return value


def check_ops(name: str, ops, allowed: str) -> str:
  """Validates an operator string (non-empty, known chars, no repeats)."""
  if not isinstance(ops, str) or not ops:
    raise ValueError(f"{name} must be a non-empty string drawn from " f"{allowed!r}, got {ops!r}")
  for ch in ops:
    if ch not in allowed:
      raise ValueError(f"{name}={ops!r}: unknown operator {ch!r}; " f"allowed: {allowed!r}")
  if len(set(ops)) != len(ops):
    raise ValueError(f"{name}={ops!r}: repeated operator")
  return ops
