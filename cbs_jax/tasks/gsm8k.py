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

`sample` draws examples uniformly with replacement.

verify: take the first number after the last "####" in the completion if
there is a "####" (none after it -> 0), else the last number in the
completion; numbers match `-?[0-9]+(,[0-9]{3})*(\\.[0-9]+)?`. The reward is
1.0 if it is within 1e-6 (absolute) of the answer, else 0.0; numbers that
overflow a float score 0.

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

DEFAULT_PATH = os.path.join(os.path.dirname(__file__), "data",
                            "gsm8k_examples.jsonl")
BASE_ALPHABET = "".join(c for c in string.printable if c not in "\x0b\x0c\r")
ANSWER_MARK = "####"
_NUM = r"-?[0-9]+(?:,[0-9]{3}(?![0-9]))*(?:\.[0-9]+)?"
_NUM_RE = re.compile(_NUM)


def parse_number(text: str) -> float | None:
    """Float value of a number token ("1,200" -> 1200.0); None if it is not
    one or is not finite."""
    try:
        value = float(text.replace(",", ""))
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def extract_answer(completion: str) -> float | None:
    """The number a completion commits to (see the module docstring)."""
    if not isinstance(completion, str):
        return None
    mark = completion.rfind(ANSWER_MARK)
    if mark >= 0:
        match = _NUM_RE.search(completion, mark + len(ANSWER_MARK))
    else:
        match = None
        for match in _NUM_RE.finditer(completion):
            pass
    return parse_number(match.group()) if match else None


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
                    raise ValueError(f"{where}: field {field!r} must be a "
                                     "string")
            answer = row["answer"]
            mark = answer.rfind(ANSWER_MARK)
            final = answer[mark + len(ANSWER_MARK):].strip()
            if mark < 0 or not _NUM_RE.fullmatch(final):
                raise ValueError(f"{where}: field 'answer' must end with "
                                 f"'#### N', N a number; got {final!r}")
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
        for index, (question, answer_text) in enumerate(
                load_examples(self.path)):
            mark = answer_text.rfind(ANSWER_MARK)
            final = answer_text[mark + len(ANSWER_MARK):].strip()
            steps = [ln for ln in answer_text[:mark].splitlines()
                     if ln.strip()]
            self.problems.append(base.Problem(
                prompt=f"Q: {question}\nA:", answer=final.replace(",", ""),
                solution=answer_text, difficulty=len(steps), meta=(index,)))

        self.name = "gsm8k"
        extra = {c for p in self.problems for c in p.prompt + p.solution}
        extra -= set(BASE_ALPHABET)
        self.alphabet = BASE_ALPHABET + "".join(sorted(extra))
        self.max_prompt_len = max(len(p.prompt) for p in self.problems)
        self.max_completion_len = max(len(p.solution) for p in self.problems)

    def sample(self, rng: np.random.Generator, n: int) -> list[base.Problem]:
        n = base.check_n(n)
        return [self.problems[i]
                for i in rng.integers(len(self.problems), size=n)]

    def verify(self, problem: base.Problem, completion: str) -> float:
        got = extract_answer(completion)
        want = parse_number(problem.answer)
        if got is None or want is None:
            return 0.0
        return 1.0 if abs(got - want) <= 1e-6 else 0.0
