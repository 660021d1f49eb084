"""Tests for cbs_jax.tasks: tasks, verifiers, tokenizers, registry.

Reference values come from independent computations: Python's own integer
arithmetic, an `ast`-based Fraction evaluator for countdown solutions,
brute-force enumeration for the length bounds, hand-written cases for the
parsing rules.
"""

import ast
import collections
import fractions
import itertools
import json
import math
import string
import sys

import hypothesis
from hypothesis import strategies as st
import numpy as np
import pytest

from cbs_jax import tasks
from cbs_jax.tasks import (
    ArithmeticTask,
    CharTokenizer,
    CountdownTask,
    GSM8KTask,
    HFTokenizer,
    Problem,
    make_task,
    make_tokenizer,
)
from cbs_jax.tasks import arithmetic as arithmetic_lib
from cbs_jax.tasks import countdown as countdown_lib

ALL_TASKS = ("arithmetic", "countdown", "gsm8k")
# Characters outside ASCII: accents, CJK, emoji, zero-width and no-break
# spaces, U+FFFD, NUL/DEL, Arabic-Indic digits (int() accepts those, the
# verifiers must not), a lone surrogate.
EXOTIC = (
    "éüñ中文日本😀🚀\u200b\u00a0\ufffd\x00\x7f"
    "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669"
    "\U0001F600\ud800\u2212"
)
PRINTABLE = string.printable


def _rand_text(rng, chars, lo, hi):
  k = int(rng.integers(lo, hi + 1))
  idx = rng.integers(len(chars), size=k)
  return "".join(chars[i] for i in idx)


def _mutate(rng, text, chars):
  """1-3 random insertions / deletions / replacements."""
  text = list(text)
  for _ in range(int(rng.integers(1, 4))):
    kind = rng.integers(3)
    pos = int(rng.integers(len(text) + 1))
    ch = chars[rng.integers(len(chars))]
    if kind == 0 or not text:
      text.insert(pos, ch)
    elif kind == 1:
      del text[min(pos, len(text) - 1)]
    else:
      text[min(pos, len(text) - 1)] = ch
  return "".join(text)


def _huge_strings(rng, alphabet):
  """Strings of 10k+ characters, of several kinds."""
  out = [
      "9" * 15000,
      "-" + "1" * 12000,
      "(" * 12000,
      ")" * 12000,
      "(" * 6000 + "1" + ")" * 6000,
      "1+" * 6000 + "1",
      "1,000" * 3000,
      "#### " * 3000 + "7",
      "😀" * 10000,
      " " * 20000,
      "\n" * 10000 + "46",
  ]
  for _ in range(10):
    out.append(_rand_text(rng, alphabet, 10_000, 20_000))
    out.append(_rand_text(rng, PRINTABLE, 10_000, 20_000))
  return out


def fuzz_strings(seed, alphabet, solutions, n=10_000):
  """n seeded strings mixing every kind of junk a model could emit."""
  rng = np.random.default_rng(seed)
  out = [
      "",
      " ",
      "\n",
      "\t\n ",
      "-",
      "--1",
      "+1",
      "()",
      "(",
      ")",
      "####",
      "#### ",
      "1e5",
      "nan",
      "inf",
      "1,2,3",
      "0x1F",
      "١٢",
  ]
  out += _huge_strings(rng, alphabet)
  while len(out) < n:
    kind = rng.integers(7)
    if kind == 0:
      out.append(_rand_text(rng, PRINTABLE, 0, 80))
    elif kind == 1:
      out.append(_rand_text(rng, alphabet, 0, 40))
    elif kind == 2:
      sol = solutions[rng.integers(len(solutions))]
      out.append(_mutate(rng, sol, alphabet))
    elif kind == 3:
      out.append(_rand_text(rng, EXOTIC + alphabet[:20], 0, 40))
    elif kind == 4:
      d = int(rng.integers(1, 3000))
      inner = _rand_text(rng, "0123456789+-*/", 0, 5)
      close = int(rng.integers(0, d + 2))
      out.append("(" * d + inner + ")" * close)
    elif kind == 5:
      num = rng.choice(["-", ""]) + str(rng.integers(0, 10**9))
      if rng.integers(2):
        num += "." + str(rng.integers(0, 1000))
      out.append(rng.choice(["#### ", "", "x = ", "####"]) + num)
    else:
      sol = solutions[rng.integers(len(solutions))]
      out.append(
          rng.choice([" ", "\n", "", "  "]) + sol + rng.choice([" ", "\n", "", sol, "=", "."])
      )
  return out[:n]


# ----------------------------------------------------------------------------
# Tokenizers.


def test_char_tokenizer_ids_and_round_trip():
  tok = CharTokenizer("abca\n")
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == (0, 1, 2)
  assert tok.vocab_size == 3 + 4  # 'a' deduplicated
  assert tok.encode("abc\n") == [3, 4, 5, 6]
  assert tok.decode(tok.encode("cab\na")) == "cab\na"
  for name in ALL_TASKS:
    task = make_task(name)
    tok = make_tokenizer(task)
    assert isinstance(tok, CharTokenizer)
    assert tok.vocab_size == 3 + len(set(task.alphabet))
    for p in task.sample(np.random.default_rng(0), 200):
      for text in (p.prompt, p.solution, p.prompt + p.solution):
        ids = tok.encode(text)
        assert all(3 <= i < tok.vocab_size for i in ids)
        assert tok.decode([tok.bos_id] + ids + [tok.eos_id]) == text


def test_char_tokenizer_encode_error_names_char_and_index():
  tok = CharTokenizer("ab")
  with pytest.raises(ValueError, match=r"'z' at index 2"):
    tok.encode("abz")
  with pytest.raises(ValueError, match="alphabet"):
    CharTokenizer("")


def test_char_tokenizer_decode_skips_stops_and_never_raises():
  tok = CharTokenizer("ab")
  assert tok.decode([1, 3, 0, 4, 2, 3, 4]) == "ab"  # bos/pad skipped
  assert tok.decode(np.array([3, 999, -1, 4, 2])) == "a\ufffd\ufffdb"
  assert tok.decode([3, None, "junk", 4.0, 2**80]) == "a\ufffd\ufffdb\ufffd"
  assert tok.decode([]) == "" and tok.decode(None) == ""
  rng = np.random.default_rng(0)
  for _ in range(200):
    ids = rng.integers(-10, tok.vocab_size + 10, size=rng.integers(0, 50))
    text = tok.decode(ids)
    assert set(text) <= set("ab\ufffd")
    if tok.eos_id in ids:
      assert len(text) <= int(np.argmax(ids == tok.eos_id))


def test_hf_tokenizer_missing_package_hint(monkeypatch):
  monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
  with pytest.raises(ImportError, match=r"pip install cbs_jax\[hf\]"):
    HFTokenizer("tokenizer.json")


def _tiny_hf_tokenizer():
  hf = pytest.importorskip("tokenizers")
  vocab = {
      "<pad>": 0,
      "<bos>": 1,
      "<eos>": 2,
      "<unk>": 3,
      "two": 4,
      "plus": 5,
      "three": 6,
      "is": 7,
      "five": 8,
  }
  tok = hf.Tokenizer(hf.models.WordLevel(vocab, unk_token="<unk>"))
  tok.pre_tokenizer = hf.pre_tokenizers.Whitespace()
  return tok


def test_hf_tokenizer_round_trip_and_decode(tmp_path):
  raw = _tiny_hf_tokenizer()
  path = tmp_path / "tokenizer.json"
  raw.save(str(path))
  for source in (raw, str(path), path):
    tok = HFTokenizer(source)
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.vocab_size) == (0, 1, 2, 9)
    ids = tok.encode("two plus three is five")
    assert ids == [4, 5, 6, 7, 8]
    assert tok.decode([1] + ids + [2, 4]) == "two plus three is five"
    assert tok.decode([4, 0, 5]) == "two plus"
    assert tok.decode([4, 99, -3, 6]) == "two\ufffd\ufffdthree"
    assert tok.decode([None, 2]) == "\ufffd"
  with pytest.raises(ValueError, match="eos_token"):
    HFTokenizer(raw, eos_token="</s>")
  with pytest.raises(ValueError, match="tokenizer"):
    HFTokenizer(123)


# ----------------------------------------------------------------------------
# Registry and constructor checks.


def test_make_task_registry_errors():
  for name in ALL_TASKS:
    assert isinstance(make_task(name), tasks.Task)
    assert make_task(name).name == name
  assert make_task("arithmetic", max_digits=2).max_digits == 2
  with pytest.raises(ValueError) as e:
    make_task("sudoku")
  assert all(n in str(e.value) for n in ALL_TASKS)
  with pytest.raises(ValueError, match="max_digitz"):
    make_task("arithmetic", max_digitz=3)
  with pytest.raises(ValueError, match="num_numbers"):
    make_task("countdown", num_numbers=9)


@pytest.mark.parametrize(
    "cls,kwargs,arg",
    [
        (ArithmeticTask, dict(min_digits=3, max_digits=2), "min_digits"),
        (ArithmeticTask, dict(min_digits=0), "min_digits"),
        (ArithmeticTask, dict(min_digits=1.5), "min_digits"),
        (ArithmeticTask, dict(min_digits=True), "min_digits"),
        (ArithmeticTask, dict(max_digits=19), "max_digits"),
        (ArithmeticTask, dict(ops="+/"), "ops"),
        (ArithmeticTask, dict(ops=""), "ops"),
        (ArithmeticTask, dict(ops="++"), "ops"),
        (ArithmeticTask, dict(digit_weights=[1, 2]), "digit_weights"),
        (ArithmeticTask, dict(digit_weights=[1, -1, 1, 1]), "digit_weights"),
        (ArithmeticTask, dict(digit_weights=[0, 0, 0, 0]), "digit_weights"),
        (ArithmeticTask, dict(digit_weights=[1, math.nan, 1, 1]), "digit_weights"),
        (ArithmeticTask, dict(digit_weights="abcd"), "digit_weights"),
        (ArithmeticTask, dict(mul_max_digits=0), "mul_max_digits"),
        (CountdownTask, dict(num_numbers=1), "num_numbers"),
        (CountdownTask, dict(num_numbers=7), "num_numbers"),
        (CountdownTask, dict(max_number=0), "max_number"),
        (CountdownTask, dict(ops="+^"), "ops"),
        (CountdownTask, dict(ops="-", max_number=1), "ops"),  # unsolvable
        (GSM8KTask, dict(path="/nonexistent/gsm8k.jsonl"), "path"),
    ],
)
def test_bad_constructor_args_name_the_argument(cls, kwargs, arg):
  with pytest.raises(ValueError, match=arg):
    cls(**kwargs)


@pytest.mark.parametrize("name", ALL_TASKS)
def test_sample_count_checked_and_zero_ok(name):
  task = make_task(name)
  assert task.sample(np.random.default_rng(0), 0) == []
  for bad in (-1, 2.0, "3"):
    with pytest.raises(ValueError, match="n must"):
      task.sample(np.random.default_rng(0), bad)


# ----------------------------------------------------------------------------
# Sampling: determinism, bounds.


@pytest.mark.parametrize("name", ALL_TASKS)
def test_sampling_deterministic_and_within_bounds(name):
  task = make_task(name)
  a = task.sample(np.random.default_rng(7), 500)
  b = task.sample(np.random.default_rng(7), 500)
  c = task.sample(np.random.default_rng(8), 500)
  assert a == b
  assert a != c
  assert all(isinstance(p, Problem) for p in a)
  alphabet = set(task.alphabet)
  for p in a + c:
    assert len(p.prompt) <= task.max_prompt_len
    assert len(p.solution) <= task.max_completion_len
    assert set(p.prompt) <= alphabet and set(p.solution) <= alphabet
    hash(p)  # meta is hashable
  if name != "gsm8k":  # the default bounds are reached in 1,000 draws
    assert max(len(p.prompt) for p in a + c) == task.max_prompt_len
    assert max(len(p.solution) for p in a + c) == task.max_completion_len


def test_arithmetic_default_lengths():
  task = ArithmeticTask()
  assert (task.max_prompt_len, task.max_completion_len) == (10, 5)


def _brute_arith_lengths(op_digits):
  """Max prompt / result lengths by enumerating every operand pair."""
  max_p = max_s = 0
  for op, digits in op_digits.items():
    values = [v for d in digits for v in range(0 if d == 1 else 10 ** (d - 1), 10**d)]
    max_p = max(max_p, 2 * len(str(max(values))) + 2)
    for a in values:
      for b in values:
        r = a + b if op == "+" else a - b if op == "-" else a * b
        max_s = max(max_s, len(str(r)))
  return max_p, max_s


@pytest.mark.parametrize(
    "kwargs,op_digits",
    [
        (dict(min_digits=1, max_digits=2, mul_max_digits=1), {"+": [1, 2], "-": [1, 2], "*": [1]}),
        (
            dict(min_digits=1, max_digits=2, digit_weights=[0, 1], mul_max_digits=1),
            {"+": [2], "-": [2], "*": [1]},
        ),
        (dict(min_digits=2, max_digits=2, ops="-"), {"-": [2]}),
        (dict(min_digits=1, max_digits=2, ops="*", mul_max_digits=2), {"*": [1, 2]}),
        (dict(min_digits=1, max_digits=2, ops="+", digit_weights=[1, 0]), {"+": [1]}),
    ],
)
def test_arithmetic_length_bounds_exact(kwargs, op_digits):
  task = ArithmeticTask(**kwargs)
  assert (task.max_prompt_len, task.max_completion_len) == (_brute_arith_lengths(op_digits))


def test_arithmetic_digit_mix_honoured():
  weights = [0.6, 0.3, 0.1]
  task = ArithmeticTask(min_digits=1, max_digits=3, ops="+-", digit_weights=weights)
  problems = task.sample(np.random.default_rng(0), 5000)
  lengths = [len(str(x)) for p in problems for x in (p.meta[0], p.meta[2])]
  freq = np.bincount(lengths, minlength=4)[1:] / len(lengths)
  # 10,000 operands: a frequency's std is <= sqrt(.25/1e4) = 0.005, so
  # 0.03 is a 6-sigma bound.
  np.testing.assert_allclose(freq, weights, atol=0.03)
  for p in problems:
    assert p.difficulty == max(len(str(p.meta[0])), len(str(p.meta[2])))
  # Operators are uniform.
  ops = collections.Counter(p.meta[1] for p in problems)
  assert abs(ops["+"] / 5000 - 0.5) < 0.03


def test_arithmetic_mul_cap_and_difficulty():
  task = ArithmeticTask(min_digits=3, max_digits=4, ops="+*", mul_max_digits=2)
  for p in task.sample(np.random.default_rng(1), 2000):
    a, op, b = p.meta
    assert p.prompt == f"{a}{op}{b}="
    if op == "*":
      assert 10 <= a <= 99 and 10 <= b <= 99
      assert p.difficulty == 3
    else:
      assert 100 <= min(a, b) and max(a, b) <= 9999
      assert p.difficulty == max(len(str(a)), len(str(b)))


def _all_values(numbers, ops):
  """Every value reachable using all of `numbers` with positive-integer
  intermediates (brute force over subsets)."""
  numbers = tuple(numbers)
  if len(numbers) == 1:
    return {numbers[0]}
  values = set()
  idx = range(len(numbers))
  for r in range(1, len(numbers)):
    for left in itertools.combinations(idx, r):
      right = [i for i in idx if i not in left]
      for a in _all_values([numbers[i] for i in left], ops):
        for b in _all_values([numbers[i] for i in right], ops):
          for op in ops:
            v = {"+": a + b, "-": a - b, "*": a * b, "/": a // b if a % b == 0 else 0}[op]
            if v > 0:
              values.add(v)
  return values


@pytest.mark.parametrize("n,max_number", [(2, 5), (3, 4), (4, 3), (3, 1)])
def test_countdown_max_target_matches_brute_force(n, max_number):
  for k in range(1, 5):
    for ops in itertools.combinations("+-*/", k):
      ops = "".join(ops)
      best = 0
      for nums in itertools.combinations_with_replacement(range(1, max_number + 1), n):
        best = max([best, *_all_values(nums, ops)])
      if best == 0:
        with pytest.raises(ValueError, match="ops"):
          CountdownTask(n, max_number, ops)
        continue
      task = CountdownTask(n, max_number, ops)
      assert task.max_target == best, (n, max_number, ops)


# ----------------------------------------------------------------------------
# Right answers give 1, wrong ones 0.


def test_arithmetic_verify():
  task = ArithmeticTask()
  p = Problem(prompt="3-15=", answer="-12", solution="-12")
  for good in ("-12", " -12\n", "-012"):
    assert task.verify(p, good) == 1.0
  for bad in (
      "12",
      "-13",
      "- 12",
      "-12=",
      "-12.0",
      "−12",
      "--12",
      "",
      "-1 2",
      "x",
      "-12 -12",
      "-\u0661\u0662",
      "-" + "0" * 100 + "12",
  ):  # over 64 chars
    assert task.verify(p, bad) == 0.0, bad
  for p in task.sample(np.random.default_rng(3), 1000):
    a, op, b = p.meta
    want = a + b if op == "+" else a - b if op == "-" else a * b
    assert p.answer == p.solution == str(want)
    assert task.verify(p, p.solution) == 1.0
    assert task.verify(p, str(want + 1)) == 0.0


def _fraction_eval(expr, numbers):
  """Independent evaluator for generated solutions: Python's ast, exact
  fractions; asserts every intermediate is a positive integer and that
  the literals are exactly the given numbers."""
  literals = []

  def ev(node):
    if isinstance(node, ast.Constant):
      literals.append(node.value)
      return fractions.Fraction(node.value)
    assert isinstance(node, ast.BinOp)
    a, b = ev(node.left), ev(node.right)
    v = {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b, ast.Div: a / b if b else None}[
        type(node.op)
    ]
    assert v is not None and v > 0 and v.denominator == 1, expr
    return v

  value = ev(ast.parse(expr, mode="eval").body)
  assert sorted(literals) == sorted(numbers), expr
  return value


def test_countdown_solutions_reach_target():
  task = CountdownTask()
  for p in task.sample(np.random.default_rng(4), 1000):
    numbers, target = p.meta
    assert len(numbers) == 3 and all(1 <= x <= 20 for x in numbers)
    assert p.prompt == ",".join(map(str, numbers)) + f">{target}:"
    assert p.answer == str(target)
    assert _fraction_eval(p.solution, numbers) == target
    assert task.verify(p, p.solution) == 1.0
  for kwargs in (
      dict(num_numbers=6, max_number=50),
      dict(ops="-/"),
      dict(num_numbers=5, ops="/"),
      dict(num_numbers=2),
  ):
    task = CountdownTask(**kwargs)
    for p in task.sample(np.random.default_rng(5), 100):
      assert _fraction_eval(p.solution, p.meta[0]) == p.meta[1]
      assert task.verify(p, p.solution) == 1.0


def _cd(numbers, target):
  return Problem(
      prompt=",".join(map(str, numbers)) + f">{target}:",
      answer=str(target),
      solution="",
      meta=(tuple(numbers), target),
  )


@pytest.mark.parametrize(
    "numbers,target,completion,reward",
    [
        ((2, 3, 4), 20, "(2+3)*4", 1.0),
        ((2, 3, 4), 20, "2+3*4", 0.0),  # precedence: that is 14
        ((2, 3, 4), 14, "2+3*4", 1.0),
        ((2, 3, 4), 14, "(2+3)*4", 0.0),
        ((2, 3, 4), 20, " ( 2 + 3 ) * 4 \n", 1.0),
        ((2, 3, 4), 20, "4*(3+2)", 1.0),
        ((2, 3, 4), 20, "((2+3))*4", 1.0),
        ((2, 3, 4), 5, "2+3", 1.0),  # not every number must be used
        ((2, 3, 4), 20, "5*4", 0.0),  # 5 not given
        ((2, 3, 4), 8, "4+4", 0.0),  # 4 given once, used twice
        ((4, 4, 3), 8, "4+4", 1.0),  # given twice
        ((4, 4, 3), 12, "4+4+4", 0.0),
        ((2, 2, 3), 3, "3/(2-2)", 0.0),  # division by zero
        ((2, 2, 3), 3, "3+(2-2)", 1.0),  # a zero intermediate is fine
        ((3, 2, 4), 6, "3/2*4", 1.0),  # exact fractions in between
        ((3, 2, 4), 6, "4*3/2", 1.0),
        ((3, 2), 1, "3/2", 0.0),  # 1.5, no truncation
        ((7, 2), 3, "7/2", 0.0),
        ((2, 3), 1, "3-2", 1.0),
        ((7, 3, 2), 2, "7-3-2", 1.0),  # left associative
        ((7, 3, 2), 6, "7-3-2", 0.0),
        ((8, 4, 2), 1, "8/4/2", 1.0),
        ((8, 4, 2), 4, "8/4/2", 0.0),
        ((2, 3), 1, "-2+3", 0.0),  # unary minus
        ((2, 3), 1, "3+-2", 0.0),
        ((2, 3), 1, "3-(-2)", 0.0),
        ((2, 3), 1, "+3-2", 0.0),  # unary plus
        ((2, 3), 5, "2+3=5", 0.0),  # trailing text
        ((2, 3), 5, "2+3)", 0.0),
        ((2, 3), 5, "(2+3", 0.0),
        ((2, 3), 5, "2 3", 0.0),
        ((2, 3), 5, "2++3", 0.0),
        ((2, 3), 5, "", 0.0),
        ((2, 3), 5, "2+03", 1.0),  # literals compare by value
        ((2, 3), 5, "2.0+3", 0.0),
        ((2, 3), 5, "2+٣", 0.0),  # non-ASCII digit
        ((2, 3), 6, "2x3", 0.0),
        ((20, 3), 20, "(" * 10 + "20" + ")" * 10, 1.0),
        ((20, 3), 20, "(" * 40 + "20" + ")" * 40, 0.0),  # deeper than 32
        ((2, 3), 5, "2" + " " * 250 + "+3", 0.0),  # over 200 chars
    ],
)
def test_countdown_rules(numbers, target, completion, reward):
  problem = _cd(numbers, target)
  assert CountdownTask().verify(problem, completion) == reward
  # Without meta, the numbers and target are read from the prompt.
  bare = Problem(prompt=problem.prompt, answer="", solution="")
  assert CountdownTask().verify(bare, completion) == reward


def test_countdown_unreadable_problem_scores_zero():
  bad = Problem(prompt="no numbers here", answer="", solution="")
  assert CountdownTask().verify(bad, "1+1") == 0.0


def test_gsm8k_committed_examples():
  task = GSM8KTask()
  assert len(task.problems) >= 6
  answers = {p.answer for p in task.problems}
  assert "1200" in answers  # from "#### 1,200"
  assert any(a.startswith("-") or "." in a for a in answers)
  assert task.max_prompt_len == max(len(p.prompt) for p in task.problems)
  assert task.max_completion_len == max(len(p.solution) for p in task.problems)
  assert task.alphabet == "".join(c for c in string.printable if c not in "\x0b\x0c\r")
  with open(tasks.gsm8k.DEFAULT_PATH) as f:
    rows = [json.loads(line) for line in f]
  for p, row in zip(task.problems, rows):
    assert p.prompt == f"Q: {row['question']}\nA:"
    assert p.solution == row["answer"]
    assert "#### " in p.solution
    assert task.verify(p, p.solution) == 1.0
    assert task.verify(p, p.solution + "\n") == 1.0
    assert task.verify(p, f"#### {float(p.answer) + 1}") == 0.0
  # The generator draws every example, uniformly-ish, with replacement;
  # each split draws its own examples only, and both splits are non-empty.
  drawn = task.draw(np.random.default_rng(0), 7000)
  counts = collections.Counter(p.meta[0] for p in drawn)
  assert len(counts) == len(task.problems)
  assert min(counts.values()) > 0.8 * 7000 / len(task.problems)
  train = {p.meta[0] for p in task.sample(np.random.default_rng(1), 2000)}
  held = {p.meta[0] for p in task.sample(np.random.default_rng(2), 500, "eval")}
  assert train and held and not train & held
  assert train | held == set(range(len(task.problems)))


def _gsm(answer):
  return Problem(prompt="Q: ?\nA:", answer=answer, solution="")


@pytest.mark.parametrize(
    "answer,completion,reward",
    [
        ("1200", "#### 1,200", 1.0),
        ("1200", "so 40*30 = 1200\n#### 1200", 1.0),
        ("1200", "The answer is 1,200.", 1.0),  # no ####: the last number
        ("1200", "#### 5 oops, I mean #### 1,200", 1.0),  # the last ####
        ("1200", "#### $1,200 dollars", 1.0),
        ("1200", "#### 1,201", 0.0),
        ("1200", "#### 12,00", 0.0),  # not a thousands group
        ("1200", "1200 is wrong, it is 7", 0.0),
        ("1200", "1200 ####", 0.0),  # nothing after ####
        ("1200", "#### 1200.0000001", 1.0),  # within 1e-6
        ("1200", "#### 1200.01", 0.0),
        ("1200", "", 0.0),
        ("7.5", "#### 7.50", 1.0),
        ("7.5", "#### 7.5.", 1.0),
        ("7.5", "#### 7", 0.0),
        ("-7", "it fell to -7 degrees", 1.0),
        ("-7", "#### 7", 0.0),
        ("1234567", "#### 1,234,567", 1.0),
        ("42", "#### ٤٢", 0.0),  # non-ASCII digits
        ("42", "#### " + "4" * 400, 0.0),  # overflows a float
    ],
)
def test_gsm8k_answer_parsing(answer, completion, reward):
  assert GSM8KTask().verify(_gsm(answer), completion) == reward


def _write_jsonl(path, rows):
  path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
  return path


GOOD_ROW = {"question": "1+1?", "answer": "1+1=2\n#### 2"}


@pytest.mark.parametrize(
    "bad_row,match",
    [
        ({"question": "1+1?"}, r"line 2: missing field 'answer'"),
        ({"answer": "#### 2"}, r"line 2: missing field 'question'"),
        ({"question": 3, "answer": "#### 2"}, r"line 2: field 'question'"),
        ({"question": "1+1?", "answer": "two"}, r"line 2: field 'answer'"),
        ({"question": "1+1?", "answer": "#### two"}, r"line 2: field 'answer'"),
        ("{not json", r"line 2: invalid JSON"),
        ("[1, 2]", r"line 2: expected a JSON object"),
    ],
)
def test_gsm8k_malformed_line(tmp_path, bad_row, match):
  path = _write_jsonl(tmp_path / "bad.jsonl", [GOOD_ROW, bad_row])
  with pytest.raises(ValueError, match=match) as e:
    GSM8KTask(path)
  assert "bad.jsonl" in str(e.value)


def test_gsm8k_custom_file(tmp_path):
  with pytest.raises(ValueError, match="no examples"):
    GSM8KTask(_write_jsonl(tmp_path / "empty.jsonl", []))
  rows = [GOOD_ROW, {"question": "Price in €?", "answer": "#### 1,000.5"}]
  task = GSM8KTask(_write_jsonl(tmp_path / "x.jsonl", rows))
  assert [p.answer for p in task.problems] == ["2", "1000.5"]
  assert [p.difficulty for p in task.problems] == [1, 0]
  assert task.alphabet.endswith("€")
  tok = make_tokenizer(task)
  for p in task.problems:
    assert tok.decode(tok.encode(p.prompt + p.solution)) == (p.prompt + p.solution)
    assert task.verify(p, p.solution) == 1.0


# ----------------------------------------------------------------------------
# Fuzzing: verifiers never raise and stay in [0, 1].


@pytest.mark.parametrize("name", ALL_TASKS)
def test_verify_fuzz_never_raises(name):
  task = make_task(name)
  problems = task.sample(np.random.default_rng(0), 64)
  strings = fuzz_strings(ALL_TASKS.index(name), task.alphabet, [p.solution for p in problems])
  assert len(strings) >= 10_000
  assert sum(len(s) >= 10_000 for s in strings) >= 20
  rewards = []
  for i, s in enumerate(strings):
    r = task.verify(problems[i % len(problems)], s)
    assert isinstance(r, float) and 0.0 <= r <= 1.0, (s[:80], r)
    rewards.append(r)
  assert 0 < sum(rewards) < len(rewards)  # both outcomes occur
  for junk in (None, 46, 4.6, b"46", ["46"], object()):
    assert task.verify(problems[0], junk) == 0.0


_HYP = hypothesis.settings(max_examples=150, deadline=None, derandomize=True, database=None)


@_HYP
@hypothesis.given(
    st.one_of(
        st.text(max_size=60),
        st.integers(-(10**9), 10**9).map(str),
        st.from_regex(r"\s*-?[0-9]{1,12}\s*", fullmatch=True),
    )
)
def test_arithmetic_verify_property(completion):
  p = Problem(prompt="3-15=", answer="-12", solution="-12")
  r = ArithmeticTask().verify(p, completion)
  text = completion.strip()
  ascii_int = (
      text.lstrip("-").isascii()
      and text.lstrip("-").isdigit()
      and text.count("-") <= 1
      and not text.startswith("--")
  )
  assert r == (1.0 if ascii_int and int(text) == -12 else 0.0)


def _expr_trees(numbers):
  """Hypothesis strategy: (text, value or None) of random expressions over
  literals drawn from `numbers` (possibly reused) and 1..30."""
  leaf = st.sampled_from(list(numbers) + list(range(1, 31))).map(
      lambda x: (str(x), fractions.Fraction(x), (x,))
  )

  def combine(children):
    def build(args):
      (ta, va, la), op, (tb, vb, lb) = args
      if va is None or vb is None or (op == "/" and vb == 0):
        value = None
      else:
        value = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
      return f"({ta}){op}({tb})", value, la + lb

    return st.tuples(children, st.sampled_from("+-*/"), children).map(build)

  return st.recursive(leaf, combine, max_leaves=6)


@_HYP
@hypothesis.given(_expr_trees((2, 3, 4, 7)), st.integers(1, 100))
def test_countdown_verify_property(tree, target):
  text, value, literals = tree
  p = _cd((2, 3, 4, 7), target)
  allowed = collections.Counter((2, 3, 4, 7))
  used = collections.Counter(literals)
  ok = value is not None and value == target and all(c <= allowed[x] for x, c in used.items())
  assert CountdownTask().verify(p, text) == (1.0 if ok else 0.0)
  # Its value is exactly the tree's value, where defined.
  result = countdown_lib.evaluate(text)
  assert (result is None) == (value is None)
  if value is not None:
    assert result[0] == value
    assert sorted(result[1]) == sorted(literals)


@_HYP
@hypothesis.given(
    st.one_of(
        st.text(max_size=80),
        st.tuples(
            st.text(alphabet=string.ascii_letters + " \n", max_size=20),
            st.integers(-(10**7), 10**7),
        ).map(lambda t: (f"{t[0]}#### {t[1]:,}", t[1])),
        st.decimals(-1000, 1000, places=3).map(lambda d: (f"#### {d}", d)),
    )
)
def test_gsm8k_verify_property(case):
  task = GSM8KTask()
  p = _gsm("1200")
  if isinstance(case, str):
    r = task.verify(p, case)
    assert r in (0.0, 1.0)
    if "1200" not in case and "1,200" not in case:
      assert r == 0.0
  else:
    text, number = case
    assert task.verify(p, text) == (1.0 if number == 1200 else 0.0)
    assert task.verify(_gsm(str(number)), text) == 1.0


def test_split_part_is_k_even_addends_of_one_place_value():
  assert arithmetic_lib.split_part(400, 3) == [200, 100, 100]
  assert arithmetic_lib.split_part(7, 4) == [2, 2, 2, 1]
  for part in [d * 10**e for d in range(1, 10) for e in range(4)]:
    for k in (1, 2, 3, 8):
      got = arithmetic_lib.split_part(part, k)
      assert len(got) == k and sum(got) == part and got == sorted(got, reverse=True)
      assert max(got) - min(got) <= 10 ** (len(str(part)) - 1)
  # the worked text grows ~k-fold at the same problems
  lens = {}
  for k in (1, 2, 4, 8):
    task = ArithmeticTask(
        min_digits=2, max_digits=2, ops="+-", solution_format="steps", step_split=k
    )
    lens[k] = np.mean([len(p.solution) for p in task.sample(np.random.default_rng(0), 500)])
  assert 1.7 < lens[2] / lens[1] < 2.1 and 6.0 < lens[8] / lens[1] < 8.5  # + the answer


@pytest.mark.parametrize("split", [1, 3])
def test_arithmetic_worked_steps_format(split):
  task = ArithmeticTask(
      min_digits=1, max_digits=3, ops="+-", solution_format="steps", step_split=split
  )
  assert not task.enumerable and ";" in task.alphabet
  problems = task.sample(np.random.default_rng(0), 3000)
  for p in problems:
    a, op, b = p.meta
    assert task.verify(p, p.solution) == 1.0
    assert len(p.solution) <= task.max_completion_len
    steps = p.solution.split(";")
    running = a
    for step in steps[:-1]:  # each step is right arithmetic, chained
      lhs, rhs = step.split("=")
      x, part = (lhs[: lhs.index(op, 1)], lhs[lhs.index(op, 1) + 1 :])
      assert int(x) == running
      running = int(x) + int(part) if op == "+" else int(x) - int(part)
      assert int(rhs) == running
    assert int(steps[-1]) == running == int(p.answer)
  # only the final answer is checked; a wrong one fails
  p = problems[0]
  assert task.verify(p, "anything;" + p.answer) == 1.0
  assert task.verify(p, p.solution + "1") == 0.0
  assert np.mean([len(p.solution) for p in problems]) > 4 * np.mean(
      [len(p.answer) for p in problems]
  )
  with pytest.raises(ValueError, match="solution_format"):
    ArithmeticTask(solution_format="essay")
  with pytest.raises(ValueError, match="step_split"):
    ArithmeticTask(ops="+-", step_split=2)  # answer format has no steps
  with pytest.raises(ValueError, match="'\\*'"):
    ArithmeticTask(ops="+*", solution_format="steps")
