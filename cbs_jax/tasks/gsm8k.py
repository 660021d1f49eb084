"""GSM8K-format word problems, read from a jsonl file.

Each line is `{"question": ..., "answer": "...worked steps...\\n#### 42"}`
(the format of the GSM8K release). The default file,
`cbs_jax/tasks/data/gsm8k_examples.jsonl`, holds a handful of original
problems written for this repository (for tests and smoke runs; point
`path` at the real GSM8K split for experiments).

Problem fields (choices made here):

* prompt = "Q: {question}\\nA:";
* solution = the answer text verbatim, "#### N" kept (no leading space is
  added, so a correct completion reads "A:She makes ...");
* answer = N normalised: surrounding whitespace and thousands commas
  removed ("1,200" -> "1200"); N must be a number (optional '-', digits
  with optional comma groups, optional decimals);
* difficulty = number of non-empty reasoning lines before "####";
* meta = (index of the example in the file,).

`sample` draws examples of one split uniformly with replacement. The split
hashes the question (see `base`); a file too small for the hash to hold an
example out still holds one out (the one with the smallest hash) and trains
on the rest, so a smoke run on the committed lines has a disjoint eval.
Point `path` at a GSM8K file and the same rule splits it; answers are free
text, so the task is not `enumerable` (the sampled pass rate is its eval).

verify (GSM8K and MATH answer formats): the final answer is taken from
whichever marker comes last in the completion:

* "####": the first number after the last "####" (none after it -> 0);
* "\\boxed{...}" / "\\fbox{...}": the content of the last one, braces
  matched (nested braces kept; unbalanced -> 0); "\\boxed 5" also works;
* no marker: the last number in the completion.

A number is `-?[0-9]+(,[0-9]{3})*(\\.[0-9]+)?`, a leading-dot decimal
(".5"), or a simple fraction "a/b" of such numbers; an optional "$" may sit
before it (after a '-' or not). Boxed content is normalised before it is
read: "\\dfrac"/"\\tfrac"/"\\frac{a}{b}" (and "\\frac34") -> a/b, "\\text{..}"
/ "\\mathrm{..}" unwrapped, "$", "\\%", "%", "\\left", "\\right", degree
signs, thin spaces and all whitespace dropped, a trailing "." dropped, a
leading "x=" dropped, trailing unit words ("5 dollars") dropped.
Two answers match if both read as numbers within 1e-6 (absolute; so "1,200"
= "1200.0" and "3/4" = "0.75", but "0.333" != "1/3"), else if their
normalised texts are equal (MATH-style expression answers). Numbers that
overflow a float, zero denominators and over-long digit strings read as no
number (reward 0). verify never raises, whatever the completion.

alphabet = printable ASCII without '\\x0b', '\\x0c', '\\r' (so '\\n' and '\\t'
are in), plus, sorted, any other character the loaded file's prompts or
solutions contain (none for the committed file), so that
`CharTokenizer(task.alphabet)` encodes every prompt and solution.
max_prompt_len / max_completion_len are exact maxima over the loaded file.
"""

from __future__ import annotations

import json
import math
import os
import re
import string

import numpy as np

from cbs_jax.tasks import base

DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "data", "gsm8k_examples.jsonl")
BASE_ALPHABET = "".join(c for c in string.printable if c not in "\x0b\x0c\r")
ANSWER_MARK = "####"
_NUM = r"-?[0-9]+(?:,[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?"
_NUM_RE = re.compile(_NUM)


_UNSIGNED = r"(?:[0-9]+(?:,[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?|(?<![0-9])\.[0-9]+)"
# sign, optional "$" (either side of the sign), number, optional "/ number"
_TOKEN_RE = re.compile(
    r"(-?)\$?(-?)(" + _UNSIGNED + r"(?:/" + _UNSIGNED + r"(?![0-9]|[.,][0-9]))?)"
)
_BOXED_MARKS = ("\\boxed", "\\fbox")
_MAX_DIGITS = 400  # longer digit strings read as no number (no float holds them)


def _unsigned_value(text: str) -> float | None:
  if len(text) > _MAX_DIGITS:
    return None
  try:
    value = float(text.replace(",", ""))
  except (ValueError, OverflowError):
    return None
  return value if math.isfinite(value) else None


def parse_number(text: str) -> float | None:
  """Float value of one number token ("1,200" -> 1200.0, "-$5" -> -5.0,
  "3/4" -> 0.75); None if `text` is not exactly one number or is not
  finite (zero denominators included)."""
  if not isinstance(text, str):
    return None
  match = _TOKEN_RE.fullmatch(text.strip())
  return _token_value(match) if match else None


def _token_value(match) -> float | None:
  negative = bool(match.group(1) or match.group(2))
  num, _, den = match.group(3).partition("/")
  value = _unsigned_value(num)
  if den:
    d = _unsigned_value(den)
    if value is None or not d:
      return None
    value = value / d
  if value is None or not math.isfinite(value):
    return None
  return -value if negative else value


def _boxed_content(text: str, start: int) -> str | None:
  """Content of the box whose command ends at `start`: "{...}" with nested
  braces matched (None if unbalanced), or " token" for "\\boxed 5"."""
  i = start
  while i < len(text) and text[i] == " ":
    i += 1
  if i < len(text) and text[i] == "{":
    depth = 0
    for j in range(i, len(text)):
      if text[j] == "{":
        depth += 1
      elif text[j] == "}":
        depth -= 1
        if depth == 0:
          return text[i + 1 : j]
    return None
  if i == start:  # e.g. "\boxedx": not a box
    return None
  match = re.match(r"[^\s$]+", text[i:])
  return match.group() if match else None


def extract_final_answer(completion: str) -> str | None:
  """The text of the final answer a completion commits to (see the module
  docstring): a number token after "####", a box's content, or the last
  number; None where there is none."""
  if not isinstance(completion, str):
    return None
  mark = completion.rfind(ANSWER_MARK)
  box, box_end = -1, -1
  for cmd in _BOXED_MARKS:
    k = completion.rfind(cmd)
    if k > box:
      box, box_end = k, k + len(cmd)
  if box > mark:
    return _boxed_content(completion, box_end)
  if mark >= 0:
    match = _TOKEN_RE.search(completion, mark + len(ANSWER_MARK))
    return match.group() if match else None
  match = None
  for match in _TOKEN_RE.finditer(completion):
    pass
  return match.group() if match else None


def _unwrap(text: str, command: str) -> str:
  """Replaces each `command{X}` by X (innermost first; unbalanced left)."""
  pattern = re.compile(re.escape(command) + r"\{([^{}]*)\}")
  for _ in range(len(text)):
    text, n = pattern.subn(r"\1", text)
    if not n:
      break
  return text


def normalize_answer(text: str) -> str:
  """Canonical text of a final answer (LaTeX fractions to a/b, wrappers,
  units, spaces and "$" removed; see the module docstring)."""
  if not isinstance(text, str):
    return ""
  s = text
  for cmd in ("\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox"):
    s = _unwrap(s, cmd)
  for old in ("\\dfrac", "\\tfrac"):
    s = s.replace(old, "\\frac")
  s = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"(\1)/(\2)", s)
  s = re.sub(r"\\frac([0-9])([0-9])", r"\1/\2", s)
  for old in (
      "\\left",
      "\\right",
      "\\!",
      "\\,",
      "\\;",
      "\\:",
      "\\ ",
      "\\$",
      "$",
      "\\%",
      "%",
      "^\\circ",
      "^{\\circ}",
      "\\circ",
      "°",
  ):
    s = s.replace(old, "")
  s = re.sub(r"\s+", " ", s).strip()
  s = re.sub(r"^[A-Za-z]\s*=\s*", "", s)  # "x = 5" -> "5"
  s = re.sub(r"(?<=[0-9.])\s*[A-Za-z][A-Za-z .]*$", "", s)  # "5 dollars" -> "5"
  s = s.replace(" ", "").rstrip(".")
  s = re.sub(r"\((-?" + _UNSIGNED + r")\)", r"\1", s)  # "(3)/(4)" -> "3/4"
  return s


def answer_value(text: str) -> float | None:
  """Numeric value of a final answer's text, or None if it is not a
  number (after `normalize_answer`)."""
  return parse_number(normalize_answer(text))


def answers_match(predicted: str | None, reference: str | None) -> bool:
  """Whether two final answers agree: numerically within 1e-6 where both
  are numbers, else by normalised text. Never raises."""
  if not isinstance(predicted, str) or not isinstance(reference, str):
    return False
  a, b = answer_value(predicted), answer_value(reference)
  if a is not None and b is not None:
    return abs(a - b) <= 1e-6
  if a is not None or b is not None:
    return False
  na, nb = normalize_answer(predicted), normalize_answer(reference)
  return bool(na) and na == nb


def extract_answer(completion: str) -> float | None:
  """The number a completion commits to (see the module docstring), or
  None where its final answer is missing or not a number."""
  final = extract_final_answer(completion)
  return None if final is None else answer_value(final)


def load_examples(path: str) -> list[tuple[str, str]]:
  """(question, answer) pairs of a GSM8K jsonl file, validated.

  Raises ValueError naming the file, the line number and the problem
  (bad JSON, missing or non-string field, no "#### N" in the answer).
  """
  examples = []
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      where = f"{path}, line {lineno}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{where}: invalid JSON ({e})") from e
      if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
      for field in ("question", "answer"):
        if field not in row:
          raise ValueError(f"{where}: missing field {field!r}")
        if not isinstance(row[field], str):
          raise ValueError(f"{where}: field {field!r} must be a " "string")
      answer = row["answer"]
      mark = answer.rfind(ANSWER_MARK)
      final = answer[mark + len(ANSWER_MARK) :].strip()
      if mark < 0 or not _NUM_RE.fullmatch(final):
        raise ValueError(
            f"{where}: field 'answer' must end with " f"'#### N', N a number; got {final!r}"
        )
      examples.append((row["question"], answer))
  if not examples:
    raise ValueError(f"{path}: no examples")
  return examples


class GSM8KTask(base.Task):
  """Grade-school word problems in GSM8K format.

  Args:
    path: a GSM8K-format jsonl file; None = the committed examples.
  """

  def __init__(self, path: str | None = None):
    if path is not None and not isinstance(path, (str, os.PathLike)):
      raise ValueError(f"path must be a file path or None, got {path!r}")
    self.path = DEFAULT_PATH if path is None else os.fspath(path)
    if not os.path.isfile(self.path):
      raise ValueError(f"path={self.path!r} is not a file")
    self.problems = []
    for index, (question, answer_text) in enumerate(load_examples(self.path)):
      mark = answer_text.rfind(ANSWER_MARK)
      final = answer_text[mark + len(ANSWER_MARK) :].strip()
      steps = [ln for ln in answer_text[:mark].splitlines() if ln.strip()]
      self.problems.append(
          base.Problem(
              prompt=f"Q: {question}\nA:",
              answer=final.replace(",", ""),
              solution=answer_text,
              difficulty=len(steps),
              meta=(index,),
          )
      )

    self.name = "gsm8k"
    extra = {c for p in self.problems for c in p.prompt + p.solution}
    extra -= set(BASE_ALPHABET)
    self.alphabet = BASE_ALPHABET + "".join(sorted(extra))
    self.max_prompt_len = max(len(p.prompt) for p in self.problems)
    self.max_completion_len = max(len(p.solution) for p in self.problems)

    # the split: a stable hash of the question; a file too small for the
    # hash to give both parts an example still holds one out (the
    # question with the smallest hash) and trains on the rest
    frac = [base.stable_fraction(f"{self.name}|{self.problem_key(p)}") for p in self.problems]
    order = sorted(range(len(frac)), key=frac.__getitem__)
    held = {i for i in order if frac[i] < base.EVAL_FRACTION} or {order[0]}
    if len(held) == len(order):
      held.discard(order[-1])
    self._split = ["eval" if i in held else "train" for i in range(len(self.problems))]
    if len(self.problems) < 2:
      raise ValueError(
          f"{self.path}: needs at least 2 examples (one held out "
          f"for eval), got {len(self.problems)}"
      )

  def token_lengths(self, tok) -> tuple[int, int]:
    """(longest prompt, longest solution) of the loaded file in `tok`'s
    tokens: the layout of a run with a subword tokenizer (an HF
    checkpoint's), where `max_prompt_len` / `max_completion_len` count
    characters."""
    return (
        max(len(tok.encode(p.prompt)) for p in self.problems),
        max(len(tok.encode(p.solution)) for p in self.problems),
    )

  def problem_key(self, problem: base.Problem) -> str:
    return problem.prompt

  def split_of(self, problem: base.Problem) -> str:
    if (
        problem.meta
        and 0 <= problem.meta[0] < len(self._split)
        and self.problems[problem.meta[0]] == problem
    ):
      return self._split[problem.meta[0]]
    return super().split_of(problem)

  def draw(self, rng: np.random.Generator, n: int) -> list[base.Problem]:
    n = base.check_n(n)
    return [self.problems[i] for i in rng.integers(len(self.problems), size=n)]

  def sample(self, rng: np.random.Generator, n: int, split: str = "train") -> list[base.Problem]:
    """Uniform with replacement over the examples of `split`."""
    n = base.check_n(n)
    if split not in base.SPLITS:
      raise ValueError(f"split={split!r} is not one of {list(base.SPLITS)}")
    pool = [p for p, sp in zip(self.problems, self._split) if sp == split]
    return [pool[i] for i in rng.integers(len(pool), size=n)]

  def verify(self, problem: base.Problem, completion: str) -> float:
    final = extract_final_answer(completion)
    return 1.0 if answers_match(final, problem.answer) else 0.0
