"""Held out by construction, and the accepted sets the exact eval sums over.

Independent checks: the split is checked on 100k fresh training draws (not
on the hash that defines it), and each task's `accepted_completions` is
compared with a brute-force scan of every string over the task's alphabet.
"""

import collections
import itertools

import numpy as np
import pytest

from cbs_jax.tasks import ArithmeticTask, CountdownTask, GSM8KTask, Problem, base, make_task

TASKS = {
    "arithmetic": lambda: ArithmeticTask(min_digits=1, max_digits=3, ops="+-"),
    "arithmetic_mul": lambda: ArithmeticTask(min_digits=1, max_digits=2, ops="+-*"),
    "countdown": lambda: CountdownTask(num_numbers=3, max_number=20),
    "gsm8k": GSM8KTask,
}
TRAIN_DRAWS = {
    "arithmetic": 100_000,
    "arithmetic_mul": 100_000,
    "countdown": 100_000,
    "gsm8k": 100_000,
}


@pytest.mark.parametrize("name", sorted(TASKS))
def test_eval_split_never_drawn_for_training(name):
  task = TASKS[name]()
  held = task.sample(np.random.default_rng(12345), 2000, split="eval")
  held_keys = {task.problem_key(p) for p in held}
  train = task.sample(np.random.default_rng(0), TRAIN_DRAWS[name])
  train_keys = {task.problem_key(p) for p in train}
  assert held_keys and not held_keys & train_keys
  # the prompts themselves, too (countdown: the same numbers in another order
  # are the same problem, so its keys are the stricter test)
  assert not {p.prompt for p in held} & {p.prompt for p in train}
  # every difficulty level the training draws reach is in the eval split
  # (the committed GSM8K file has 7 examples: one is held out, see gsm8k.py)
  if name != "gsm8k":
    assert {p.difficulty for p in train} == {p.difficulty for p in held}


def test_small_difficulty_level_is_split_and_counted():
  """1-digit +/- has 200 problems: ~10% are held out, the rest trained on."""
  task = ArithmeticTask(min_digits=1, max_digits=1, ops="+-")
  every = [
      Problem(f"{a}{op}{b}=", "", "", 1, (a, op, b))
      for a in range(10)
      for b in range(10)
      for op in "+-"
  ]
  parts = collections.Counter(task.split_of(p) for p in every)
  assert parts["eval"] + parts["train"] == 200
  assert 8 <= parts["eval"] <= 35, parts  # binomial(200, 0.1): mean 20, sd 4.2
  drawn = {task.problem_key(p) for p in task.sample(np.random.default_rng(1), 5000)}
  assert len(drawn) == parts["train"]  # all of the train part is reachable


def test_split_is_a_fixed_function_of_the_problem():
  task = CountdownTask()
  p = task.draw(np.random.default_rng(3), 1)[0]
  numbers, target = p.meta
  shuffled = Problem(
      ",".join(map(str, numbers[::-1])) + f">{target}:",
      p.answer,
      "",
      p.difficulty,
      (tuple(numbers[::-1]), target),
  )
  assert task.split_of(shuffled) == task.split_of(p)
  assert base.stable_fraction("x") == base.stable_fraction("x")
  with pytest.raises(ValueError, match="split"):
    task.sample(np.random.default_rng(0), 3, split="test")


def _brute_force(task, problem, max_chars):
  out = set()
  for n in range(1, max_chars + 1):
    for chars in itertools.product(task.alphabet, repeat=n):
      s = "".join(chars)
      if task.verify(problem, s) == 1.0:
        out.add(s)
  return out


@pytest.mark.parametrize(
    "a,op,b,max_chars", [(7, "-", 9, 4), (0, "+", 0, 3), (5, "*", 8, 4), (3, "+", 4, 3)]
)
def test_arithmetic_accepted_set_is_every_accepted_string(a, op, b, max_chars):
  task = ArithmeticTask(min_digits=1, max_digits=1, ops="+-*")
  ans = {"+": a + b, "-": a - b, "*": a * b}[op]
  p = Problem(f"{a}{op}{b}=", str(ans), str(ans), 1, (a, op, b))
  got = task.accepted_completions(p, max_chars)
  assert len(got) == len(set(got))
  assert set(got) == _brute_force(task, p, max_chars)


@pytest.mark.parametrize(
    "numbers,target,max_chars", [((2, 3, 4), 6, 4), ((1, 1, 2), 2, 4), ((12, 3, 5), 4, 4)]
)
def test_countdown_accepted_set_is_every_accepted_string(numbers, target, max_chars):
  task = CountdownTask(num_numbers=3, max_number=20)
  p = Problem(",".join(map(str, numbers)) + f">{target}:", str(target), "", 3, (numbers, target))
  got = task.accepted_completions(p, max_chars)
  assert len(got) == len(set(got))
  assert set(got) == _brute_force(task, p, max_chars)


def test_countdown_accepted_set_at_full_length_verifies_and_holds_the_solution():
  task = CountdownTask(num_numbers=3, max_number=20)
  for p in task.sample(np.random.default_rng(5), 5):
    got = task.accepted_completions(p, task.max_completion_len + 1)
    assert p.solution in got
    assert all(task.verify(p, s) == 1.0 for s in got)
    assert all(set(s) <= set(task.alphabet) for s in got)


def test_tasks_without_an_accepted_set_say_so():
  task = make_task("gsm8k")
  assert not task.enumerable
  with pytest.raises(NotImplementedError, match="gsm8k"):
    task.accepted_completions(task.problems[0], 10)
