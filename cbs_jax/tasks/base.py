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
"""
from __future__ import annotations

import abc
import dataclasses

import numpy as np


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

    @abc.abstractmethod
    def sample(self, rng: np.random.Generator, n: int) -> list[Problem]:
        """Draws `n` problems; deterministic given the state of `rng`."""

    @abc.abstractmethod
    def verify(self, problem: Problem, completion: str) -> float:
        """Reward in [0, 1] for `completion`; never raises."""

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, "
                f"max_prompt_len={self.max_prompt_len}, "
                f"max_completion_len={self.max_completion_len})")


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
        raise ValueError(f"{name} must be a non-empty string drawn from "
                         f"{allowed!r}, got {ops!r}")
    for ch in ops:
        if ch not in allowed:
            raise ValueError(f"{name}={ops!r}: unknown operator {ch!r}; "
                             f"allowed: {allowed!r}")
    if len(set(ops)) != len(ops):
        raise ValueError(f"{name}={ops!r}: repeated operator")
    return ops
