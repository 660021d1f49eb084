"""Verifiable tasks and tokenizers (pure Python + numpy, no JAX).

    task = make_task("arithmetic", max_digits=3)
    tok = make_tokenizer(task)                  # CharTokenizer(task.alphabet)
    problems = task.sample(np.random.default_rng(0), 16)
    reward = task.verify(problems[0], "46")     # float in [0, 1], never raises

Registered tasks: "arithmetic" (ArithmeticTask), "countdown"
(CountdownTask), "gsm8k" (GSM8KTask).
"""

from __future__ import annotations

import inspect

from cbs_jax.tasks.arithmetic import ArithmeticTask
from cbs_jax.tasks.base import Problem, Task
from cbs_jax.tasks.countdown import CountdownTask
from cbs_jax.tasks.gsm8k import GSM8KTask
from cbs_jax.tasks.tokenizer import CharTokenizer, HFTokenizer, Tokenizer

TASKS: dict[str, type[Task]] = {
    "arithmetic": ArithmeticTask,
    "countdown": CountdownTask,
    "gsm8k": GSM8KTask,
}


def make_task(name: str, **kwargs) -> Task:
  """Builds the registered task `name` with constructor `kwargs`.

  Raises ValueError for an unknown name (listing the known ones), an
  unknown keyword (naming it and listing the accepted ones) or a bad value
  (the task's own check, naming the argument).
  """
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}; known tasks: " f"{', '.join(sorted(TASKS))}")
  cls = TASKS[name]
  accepted = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
  for key in kwargs:
    if key not in accepted:
      raise ValueError(
          f"task {name!r} has no argument {key!r}; " f"accepted: {', '.join(accepted)}"
      )
  return cls(**kwargs)


def make_tokenizer(task: Task) -> CharTokenizer:
  """The character tokenizer covering `task.alphabet`."""
  return CharTokenizer(task.alphabet)


__all__ = [
    "ArithmeticTask",
    "CharTokenizer",
    "CountdownTask",
    "GSM8KTask",
    "HFTokenizer",
    "Problem",
    "TASKS",
    "Task",
    "Tokenizer",
    "make_task",
    "make_tokenizer",
]
