"""Integer arithmetic: prompt "{a}{op}{b}=", answer the exact result.

Example: prompt "37+9=", solution/answer "46"; prompt "3-15=", answer
"-12". Operands are non-negative, so a '-' in a prompt is always the
operator.

Sampling (choices made here):

* the operator is uniform over `ops`;
* each operand's digit count is drawn independently from
  [min_digits, max_digits] with probabilities `digit_weights` (normalised;
  None = uniform); an n-digit operand is uniform in [10^(n-1), 10^n - 1],
  and in 0..9 for n = 1;
* for '*' each drawn digit count is clipped to `mul_max_digits`
  (d -> min(d, mul_max_digits)), which keeps products short; the clipped
  mass piles on `mul_max_digits`, and where `mul_max_digits < min_digits`
  products use `mul_max_digits`-digit operands;
* difficulty = max digit count of the two operands, + 1 for '*'
  (multiplication is harder than addition at equal length);
* meta = (a, op, b) as Python ints / str.

Mixing digit counts gives prompts with very different pass rates, which is
what makes the inter-prompt gradient noise measurable.

`max_prompt_len` and `max_completion_len` are exact: they are attained by
some problem the sampler can draw (digit counts of zero weight are never
drawn and are left out of the bound). For the default task
(1-4 digits, "+-*", mul_max_digits=2): max_prompt_len = 10 ("9999+9999="),
max_completion_len = 5 ("19998" or "-9999").

verify: the completion, stripped of surrounding whitespace, must be an
optional '-' followed by ASCII digits only, with the same integer value as
the answer (so "007" counts as 7 and "-0" as 0: a choice, the value is what
is checked); anything else, or more than 64 characters, scores 0.
`accepted_completions` lists all of those variants within a length budget
(the exact expected pass rate counts every one of them).

`solution_format="steps"` (a long-completion variant for '+' and '-'): the
SFT solution works the sum out one place value of b at a time
("123+456=" -> "123+400=523;523+50=573;573+6=579;579", ~4x the tokens of
the answer alone) and verify reads the final answer after the last ';'
(the worked part is not checked, so the task is not `enumerable`: its eval
is the sampled pass rate). `max_completion_len` is then an upper bound.
`step_split` = k writes each place value as k smaller steps: the same
problems with ~k times the worked text (a length knob within one family).

Split: `problem_key` is "{a}{op}{b}" (see `base`); 1-digit problems (200
with "+-") keep ~20 for eval.
"""

from __future__ import annotations

import re

import numpy as np

from cbs_jax.tasks import base

ALLOWED_OPS = "+-*"
# Operands are drawn as int64, so 18 digits is the limit (10**18 < 2**63).
MAX_DIGITS_LIMIT = 18
_MAX_VERIFY_CHARS = 64
_INT_RE = re.compile(r"-?[0-9]+")


def _lo_hi(d: int) -> tuple[int, int]:
  """Inclusive operand range for a d-digit operand."""
  return (0 if d == 1 else 10 ** (d - 1)), 10**d - 1


FORMATS = ("answer", "steps")


def split_part(part: int, k: int) -> list[int]:
  """``part`` (a digit times a power of ten) as k addends as even as the
  place value allows, largest first, summing to ``part``: 400, k = 3 ->
  [200, 100, 100]; 7, k = 4 -> [2, 2, 2, 1]; 10, k = 2 -> [10, 0]."""
  unit = 10 ** (len(str(part)) - 1) if part else 1
  q, r = divmod(part // unit, k)
  return [(q + (i < r)) * unit for i in range(k)]


def worked_solution(a: int, op: str, b: int, split: int = 1) -> str:
  """The "steps" solution of a op b ('+' or '-'): b is added or subtracted
  one place value at a time, most significant first, each step written
  "{running}{op}{part}={new running};", then the answer. 123+456 ->
  "123+400=523;523+50=573;573+6=579;579" (zero digits of b are skipped;
  b = 0 is one step). ``split`` = k writes each place value as k steps
  (``split_part``), so the worked text grows ~k-fold at the same problem:
  k = 2, 12+34 -> "12+20=32;32+10=42;42+2=44;44+2=46;46"."""
  digits = str(b)
  parts = [int(ch) * 10 ** (len(digits) - 1 - i) for i, ch in enumerate(digits) if ch != "0"] or [0]
  parts = [q for part in parts for q in split_part(part, split)]
  out, r = [], a
  for part in parts:
    new = _apply(r, op, part)
    out.append(f"{r}{op}{part}={new};")
    r = new
  return "".join(out) + str(r)


def _apply(a: int, op: str, b: int) -> int:
  if op == "+":
    return a + b
  if op == "-":
    return a - b
  return a * b


class ArithmeticTask(base.Task):
  """`a op b =` with op in `ops` and a mix of operand lengths.

  Args:
    min_digits, max_digits: range of operand digit counts (1..18).
    ops: operator characters, a subset of "+-*" without repeats.
    digit_weights: probabilities of the digit counts min_digits..max_digits
      (length max_digits - min_digits + 1, non-negative, not all zero;
      normalised here); None = uniform.
    mul_max_digits: cap on the digit count of '*' operands.
    solution_format: "answer" (the result) or "steps" (worked, '+-' only).
    step_split: with "steps", each place value written as this many steps.
  """

  enumerable = True  # accepted_completions lists every accepted string

  def __init__(
      self,
      min_digits: int = 1,
      max_digits: int = 4,
      ops: str = "+-*",
      digit_weights=None,
      mul_max_digits: int = 2,
      solution_format: str = "answer",
      step_split: int = 1,
  ):
    self.min_digits = base.check_int("min_digits", min_digits, 1, MAX_DIGITS_LIMIT)
    self.max_digits = base.check_int("max_digits", max_digits, 1, MAX_DIGITS_LIMIT)
    if self.min_digits > self.max_digits:
      raise ValueError(f"min_digits={self.min_digits} must be <= " f"max_digits={self.max_digits}")
    self.ops = base.check_ops("ops", ops, ALLOWED_OPS)
    self.mul_max_digits = base.check_int("mul_max_digits", mul_max_digits, 1, MAX_DIGITS_LIMIT)
    self.digit_counts = np.arange(self.min_digits, self.max_digits + 1)
    self.digit_weights = self._check_weights(digit_weights)

    self.name = "arithmetic"
    if solution_format not in FORMATS:
      raise ValueError(f"solution_format={solution_format!r} is not one of " f"{list(FORMATS)}")
    if solution_format == "steps" and "*" in self.ops:
      raise ValueError(
          f"solution_format='steps' works out '+' and '-' only; " f"ops={self.ops!r} has '*'"
      )
    self.solution_format = solution_format
    self.step_split = base.check_int("step_split", step_split, 1, 64)
    if step_split != 1 and solution_format != "steps":
      raise ValueError(
          f"step_split={step_split} writes worked steps: it needs solution_format='steps', "
          f"got {solution_format!r}"
      )
    self.alphabet = "0123456789+-*=" + (";" if solution_format == "steps" else "")
    self.max_prompt_len, self.max_completion_len = self._max_lens()
    if solution_format == "steps":
      self.enumerable = False  # any worked text before the final answer is accepted
      self.max_completion_len = self._max_steps_len()

  def _check_weights(self, weights) -> np.ndarray:
    k = len(self.digit_counts)
    if weights is None:
      return np.full(k, 1.0 / k)
    try:
      w = np.asarray(weights, dtype=np.float64)
    except (TypeError, ValueError) as e:
      raise ValueError(f"digit_weights must be a sequence of numbers, " f"got {weights!r}") from e
    if w.shape != (k,):
      raise ValueError(
          f"digit_weights={weights!r} must have length " f"max_digits - min_digits + 1 = {k}"
      )
    if not np.all(np.isfinite(w)) or np.any(w < 0):
      raise ValueError(f"digit_weights={weights!r} must be finite and " "non-negative")
    if w.sum() <= 0:
      raise ValueError(f"digit_weights={weights!r} must not be all zero")
    return w / w.sum()

  def _operand_digits(self, op: str) -> list[int]:
    """Digit counts an operand of `op` can have (positive weight)."""
    ds = {int(d) for d, w in zip(self.digit_counts, self.digit_weights) if w > 0}
    if op == "*":
      ds = {min(d, self.mul_max_digits) for d in ds}
    return sorted(ds)

  def _max_lens(self) -> tuple[int, int]:
    """Exact max prompt / solution lengths over everything drawable.

    Each op is monotone in each operand, so over a box of operand values
    the extreme results sit at its corners; the longest result string is
    at one of the extremes.
    """
    max_prompt, max_sol = 0, 0
    for op in self.ops:
      ds = self._operand_digits(op)
      max_prompt = max(max_prompt, 2 * max(ds) + 2)
      for da in ds:
        for db in ds:
          for a in _lo_hi(da):
            for b in _lo_hi(db):
              max_sol = max(max_sol, len(str(_apply(a, op, b))))
    return max_prompt, max_sol

  def _max_steps_len(self) -> int:
    """An upper bound on the worked solution's length: one step per
    digit of b, each "{r}{op}{part}={r'};" with r, r' at most
    max_digits + 1 digits and a sign, then the answer."""
    w = self.max_digits + 2  # digits of any running value, with its sign
    step = w + 1 + self.max_digits + 1 + w + 1
    return self.max_digits * self.step_split * step + w

  def draw(self, rng: np.random.Generator, n: int) -> list[base.Problem]:
    n = base.check_n(n)
    op_idx = rng.integers(len(self.ops), size=n)
    digits = rng.choice(self.digit_counts, size=(n, 2), p=self.digit_weights)
    is_mul = np.array([self.ops[i] == "*" for i in op_idx], dtype=bool)
    digits = np.where(is_mul[:, None], np.minimum(digits, self.mul_max_digits), digits)
    digits = digits.astype(np.int64)
    lo = np.where(digits == 1, 0, 10 ** (digits - 1))
    operands = rng.integers(lo, 10**digits, dtype=np.int64)  # [lo, hi]
    problems = []
    for i in range(n):
      op = self.ops[op_idx[i]]
      a, b = int(operands[i, 0]), int(operands[i, 1])
      result = str(_apply(a, op, b))
      difficulty = int(digits[i].max()) + (1 if op == "*" else 0)
      solution = (
          worked_solution(a, op, b, self.step_split) if self.solution_format == "steps" else result
      )
      problems.append(
          base.Problem(
              prompt=f"{a}{op}{b}=",
              answer=result,
              solution=solution,
              difficulty=difficulty,
              meta=(a, op, b),
          )
      )
    return problems

  def problem_key(self, problem: base.Problem) -> str:
    if len(problem.meta) == 3:
      a, op, b = problem.meta
      return f"{int(a)}{op}{int(b)}"
    return problem.prompt

  def accepted_completions(self, problem: base.Problem, max_chars: int) -> list[str]:
    """Every string of at most `max_chars` characters that verifies:
    the answer's digits with any number of leading zeros, a '-' before
    a negative answer, and "-0", "-00", ... where the answer is 0
    (whitespace is not in the alphabet, so no padded variants)."""
    value = int(problem.answer)
    digits, sign = str(abs(value)), "-" if value < 0 else ""
    out = []
    for zeros in range(max_chars):
      body = "0" * zeros + digits
      for s in (sign + body,) + (("-" + body,) if value == 0 else ()):
        if len(s) <= max_chars:
          out.append(s)
    return out

  def verify(self, problem: base.Problem, completion: str) -> float:
    if not isinstance(completion, str):
      return 0.0
    if self.solution_format == "steps":  # the final answer, after the last ';'
      if len(completion) > _MAX_VERIFY_CHARS * 4:
        return 0.0
      completion = completion.rpartition(";")[2]
    text = completion.strip()
    if len(text) > _MAX_VERIFY_CHARS or not _INT_RE.fullmatch(text):
      return 0.0
    return 1.0 if int(text) == int(problem.answer) else 0.0
