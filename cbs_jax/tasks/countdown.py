"""Countdown: combine the given numbers with + - * / to hit a target.

Prompt "3,5,7>22:" (the numbers in draw order, comma-separated, '>', the
target, ':'); solution "(3*5)+7"; answer "22"; meta = (numbers, target)
with numbers a tuple of ints; difficulty = num_numbers.

Sampling (choices made here). `num_numbers` ints are drawn uniformly from
[1, max_number]; then, starting from a pool of leaves, two pool entries are
merged num_numbers - 1 times: the operator is drawn uniformly among those
ops of `ops` that have at least one valid ordered pair in the pool, and the
pair uniformly among the ordered pairs valid for it. Valid means the result
is a positive integer (a - b needs a > b; a / b needs b | a). If no op has
a valid pair (a dead end), the whole draw -- numbers included -- is
discarded and redone. So every problem uses all its numbers and is solvable
by construction, and the target is the tree's value. Choosing the op before
the pair keeps '-' and '/' frequent instead of letting the always-valid '+'
and '*' dominate. The one configuration that can never be completed
(ops="-" with max_number=1: every subtraction gives 0) is rejected by the
constructor.

The solution fully parenthesises every non-leaf operand ("(3*5)+7",
"(a+b)*(c+d)"): no precedence knowledge is needed to read it, and it
evaluates to the target under the usual precedence.

Length bounds: max_completion_len = n*L + (n-1) + 2*(n-2) with L the digit
count of max_number (n leaves, n-1 operators, parentheses around the n-2
non-root inner nodes); max_prompt_len = n*L + (n-1) + 1 + T + 1 with T the
digit count of the largest reachable target (`_max_target`, exact). Both
are upper bounds, attained when ops contains '+' or '*' (the all-max_number
draw then reaches both); for ops within "-/" they may not be attained.

verify: the completion (surrounding whitespace stripped, at most 200
characters, nesting at most 32 deep) is parsed by a recursive-descent
parser: non-negative integer literals, binary + - * / with the usual
precedence and left associativity, parentheses, spaces/tabs. No unary
minus (or plus), no '=', no trailing text. It is evaluated exactly with
fractions.Fraction (non-integer intermediates are allowed; division by zero
scores 0). The multiset of literals must be a sub-multiset of the given
numbers (not every number must be used: a choice, as in the usual Countdown
rules); literals compare by value, so "07" is 7. Reward 1.0 iff the value
equals the target, else 0.0. The numbers and target come from
`problem.meta`, or, where a Problem was rebuilt without meta, from its
prompt.
"""

from __future__ import annotations

import collections
import fractions
import functools
import re

import numpy as np

from cbs_jax.tasks import base

ALLOWED_OPS = "+-*/"
MIN_NUMBERS, MAX_NUMBERS = 2, 6
MAX_VERIFY_CHARS = 200
MAX_DEPTH = 32
_MAX_DRAWS = 100_000
_PROMPT_RE = re.compile(r"([0-9]{1,7}(?:,[0-9]{1,7})*)>([0-9]{1,60}):")


def _combine(a: int, op: str, b: int) -> int | None:
  """a op b if it is a positive integer, else None."""
  if op == "+":
    return a + b
  if op == "*":
    return a * b
  if op == "-":
    return a - b if a > b else None
  return a // b if a % b == 0 else None


def _max_target(n: int, max_number: int, ops: str) -> int:
  """Largest target of any valid tree over n leaves in [1, max_number];
  0 where no valid tree exists."""
  if "+" in ops or "*" in ops:
    # Subtrees use disjoint leaves, so they are independent, and + and *
    # increase in both operands: best[k] = max over splits. '/' can only
    # reach best[i] (dividing by a subtree worth 1) and '-' less than
    # best[i], both below what '+' or '*' give, so they are left out.
    best = [0, max_number]
    for k in range(2, n + 1):
      cands = []
      for i in range(1, k):
        if "+" in ops:
          cands.append(best[i] + best[k - i])
        if "*" in ops:
          cands.append(best[i] * best[k - i])
      best.append(max(cands))
    return best[n]
  # Within "-/" every value stays in [1, max_number] (both ops shrink).
  if "/" in ops:
    # max_number / (1/1/.../1) reaches the ceiling.
    return max_number
  # '-' alone: max_number - (a subtree worth 1, e.g. 2-(2-(...(2-1))))
  # is the best; with max_number == 1 every subtraction gives 0.
  return max_number - 1 if max_number >= 2 else 0


class _ParseError(Exception):
  pass


class _Parser:
  """Recursive descent over: expr := term (('+'|'-') term)*,
  term := factor (('*'|'/') factor)*, factor := INT | '(' expr ')'.

  Raises _ParseError on any syntax error, nesting deeper than MAX_DEPTH,
  or division by zero; records the integer literals it reads.
  """

  def __init__(self, text: str):
    self.text = text
    self.pos = 0
    self.depth = 0
    self.literals: list[int] = []

  def _skip(self):
    while self.pos < len(self.text) and self.text[self.pos] in " \t":
      self.pos += 1

  def _peek(self) -> str:
    self._skip()
    return self.text[self.pos] if self.pos < len(self.text) else ""

  def parse(self) -> fractions.Fraction:
    value = self._expr()
    if self._peek():
      raise _ParseError("trailing text")
    return value

  def _expr(self) -> fractions.Fraction:
    value = self._term()
    while (op := self._peek()) in ("+", "-"):
      self.pos += 1
      rhs = self._term()
      value = value + rhs if op == "+" else value - rhs
    return value

  def _term(self) -> fractions.Fraction:
    value = self._factor()
    while (op := self._peek()) in ("*", "/"):
      self.pos += 1
      rhs = self._factor()
      if op == "*":
        value = value * rhs
      elif rhs == 0:
        raise _ParseError("division by zero")
      else:
        value = value / rhs
    return value

  def _factor(self) -> fractions.Fraction:
    ch = self._peek()
    if ch == "(":
      self.depth += 1
      if self.depth > MAX_DEPTH:
        raise _ParseError("nesting too deep")
      self.pos += 1
      value = self._expr()
      if self._peek() != ")":
        raise _ParseError("missing ')'")
      self.pos += 1
      self.depth -= 1
      return value
    start = self.pos
    text = self.text
    while self.pos < len(text) and text[self.pos] in "0123456789":
      self.pos += 1
    if self.pos == start:
      raise _ParseError("expected a number or '('")
    literal = int(self.text[start : self.pos])
    self.literals.append(literal)
    return fractions.Fraction(literal)


def evaluate(expression: str) -> tuple[fractions.Fraction, list[int]] | None:
  """(exact value, integer literals) of a countdown expression, or None
  where it does not parse, is too long/deep, or divides by zero."""
  if not isinstance(expression, str):
    return None
  text = expression.strip()
  if len(text) > MAX_VERIFY_CHARS:
    return None
  parser = _Parser(text)
  try:
    value = parser.parse()
  except _ParseError:
    return None
  return value, parser.literals


def _numbers_and_target(problem: base.Problem):
  """(numbers, target) from `problem.meta`, or parsed from a prompt
  "3,5,7>22:" where meta is missing; None if neither works."""
  meta = problem.meta
  if (
      isinstance(meta, tuple)
      and len(meta) == 2
      and isinstance(meta[0], tuple)
      and isinstance(meta[1], int)
  ):
    return meta
  match = _PROMPT_RE.fullmatch(problem.prompt)
  if match is None:
    return None
  numbers = tuple(int(x) for x in match.group(1).split(","))
  return numbers, int(match.group(2))


def enumerate_expressions(numbers, target: int, max_chars: int) -> list[str]:
  """Every string of at most `max_chars` characters over digits, "+-*/"
  and parentheses that `evaluate`s to `target` using a sub-multiset of
  `numbers` as literals: any operand order and parenthesisation (redundant
  parentheses included), literals with leading zeros ("07" is 7). Built
  bottom-up from the grammar `verify` parses (expr := term (+|- term)*,
  term := factor (*|/ factor)*, factor := literal | "(" expr ")"), so it
  is exactly the set `verify` accepts over this alphabet (no whitespace:
  it is not in the task's alphabet). Sorted; duplicates removed."""
  nums = tuple(sorted(int(x) for x in numbers))
  literals = {x: ["0" * z + str(x) for z in range(max_chars - len(str(x)) + 1)] for x in set(nums)}

  def without(rem, x):
    i = rem.index(x)
    return rem[:i] + rem[i + 1 :]

  # each entry: (text, exact value, literals still unused)
  @functools.lru_cache(maxsize=None)
  def factor(rem, budget):
    out = [
        (s, fractions.Fraction(x), without(rem, x))
        for x in set(rem)
        for s in literals[x]
        if len(s) <= budget
    ]
    if budget >= 3:
      out += [("(" + s + ")", v, r) for s, v, r in expr(rem, budget - 2)]
    return tuple(out)

  def _mul(v, op, v2):
    if op == "*":
      return v * v2
    return None if v2 == 0 else v / v2

  def _add(v, op, v2):
    return v + v2 if op == "+" else v - v2

  @functools.lru_cache(maxsize=None)
  def term(rem, budget):
    return _chain(factor(rem, budget), factor, "*/", _mul, budget)

  @functools.lru_cache(maxsize=None)
  def expr(rem, budget):
    return _chain(term(rem, budget), term, "+-", _add, budget)

  def _chain(first, operand, ops, apply, budget):
    out, frontier = list(first), list(first)
    while frontier:
      new = []
      for s, v, r in frontier:
        room = budget - len(s) - 1
        if room <= 0 or not r:
          continue
        for op in ops:
          for s2, v2, r2 in operand(r, room):
            value = apply(v, op, v2)
            if value is not None:
              new.append((s + op + s2, value, r2))
      out += new
      frontier = new
    return tuple(out)

  return sorted({s for s, v, _ in expr(nums, max_chars) if v == target})


class CountdownTask(base.Task):
  """Reach a target from `num_numbers` numbers with the operators `ops`.

  Args:
    num_numbers: how many numbers are given (2..6); all are used by the
      reference solution.
    max_number: numbers are drawn uniformly from [1, max_number].
    ops: operator characters, a subset of "+-*/" without repeats.
  """

  enumerable = True  # accepted_completions lists every accepted string

  def __init__(self, num_numbers: int = 3, max_number: int = 20, ops: str = "+-*/"):
    self.num_numbers = base.check_int("num_numbers", num_numbers, MIN_NUMBERS, MAX_NUMBERS)
    self.max_number = base.check_int("max_number", max_number, 1, 10**6)
    self.ops = base.check_ops("ops", ops, ALLOWED_OPS)
    self.max_target = _max_target(self.num_numbers, self.max_number, self.ops)
    if self.max_target == 0:
      raise ValueError(
          f"ops={self.ops!r} cannot combine num_numbers="
          f"{self.num_numbers} numbers in [1, max_number="
          f"{self.max_number}] with positive integer intermediates"
      )

    self.name = "countdown"
    # no whitespace: prompts and solutions have none, and a policy that
    # cannot emit it has a finite accepted set (accepted_completions)
    self.alphabet = "0123456789+-*/(),>:"
    n, digits = self.num_numbers, len(str(self.max_number))
    numbers_len = n * digits + (n - 1)
    self.max_prompt_len = numbers_len + 1 + len(str(self.max_target)) + 1
    self.max_completion_len = numbers_len + 2 * (n - 2)

  def _draw_one(self, rng: np.random.Generator):
    """(numbers, target, solution), or None at a dead end."""
    numbers = [int(x) for x in rng.integers(1, self.max_number + 1, size=self.num_numbers)]
    # Pool entries: (value, text, is_leaf).
    pool = [(x, str(x), True) for x in numbers]
    while len(pool) > 1:
      valid = {op: [] for op in self.ops}
      for i, (a, _, _) in enumerate(pool):
        for j, (b, _, _) in enumerate(pool):
          if i != j:
            for op in self.ops:
              if _combine(a, op, b) is not None:
                valid[op].append((i, j))
      live = [op for op in self.ops if valid[op]]
      if not live:
        return None
      op = live[rng.integers(len(live))]
      i, j = valid[op][rng.integers(len(valid[op]))]
      (a, ta, la), (b, tb, lb) = pool[i], pool[j]
      ta = ta if la else f"({ta})"
      tb = tb if lb else f"({tb})"
      merged = (_combine(a, op, b), f"{ta}{op}{tb}", False)
      pool = [p for k, p in enumerate(pool) if k not in (i, j)]
      pool.append(merged)
    return numbers, pool[0][0], pool[0][1]

  def draw(self, rng: np.random.Generator, n: int) -> list[base.Problem]:
    n = base.check_n(n)
    problems = []
    for _ in range(n):
      for _ in range(_MAX_DRAWS):
        draw = self._draw_one(rng)
        if draw is not None:
          break
      else:  # Feasible configs essentially never get here.
        raise RuntimeError(f"{self!r}: no valid problem in {_MAX_DRAWS} draws")
      numbers, target, solution = draw
      problems.append(
          base.Problem(
              prompt=",".join(map(str, numbers)) + f">{target}:",
              answer=str(target),
              solution=solution,
              difficulty=self.num_numbers,
              meta=(tuple(numbers), target),
          )
      )
    return problems

  def problem_key(self, problem: base.Problem) -> str:
    given = _numbers_and_target(problem)
    if given is None:
      return problem.prompt
    numbers, target = given
    return f"{sorted(numbers)}>{target}"  # draw order does not make a new problem

  def accepted_completions(self, problem: base.Problem, max_chars: int) -> list[str]:
    given = _numbers_and_target(problem)
    if given is None:
      return []
    return enumerate_expressions(given[0], given[1], max_chars)

  def verify(self, problem: base.Problem, completion: str) -> float:
    given = _numbers_and_target(problem)
    result = evaluate(completion)
    if given is None or result is None:
      return 0.0
    value, literals = result
    numbers, target = given
    available = collections.Counter(numbers)
    used = collections.Counter(literals)
    if any(used[x] > available[x] for x in used):
      return 0.0
    return 1.0 if value == target else 0.0
