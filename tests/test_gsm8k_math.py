"""Final-answer extraction and matching of tasks/gsm8k.py (GSM8K "#### N" and
MATH "\\boxed{...}" formats), and a fuzz check that none of it ever raises.

Expected values are written by hand (the table), and the property tests
build completions from numbers whose value they know.
"""

import random
import string

import hypothesis
import numpy as np
import pytest
from hypothesis import strategies as st

from cbs_jax.tasks import gsm8k
from cbs_jax.tasks.base import Problem


def _p(answer):
  return Problem(prompt="Q: ?\nA:", answer=answer, solution="")


@pytest.mark.parametrize(
    "completion,final",
    [
        ("so #### 42", "42"),
        ("#### $1,200 dollars", "$1,200"),
        ("#### -$5", "-$5"),
        ("the answer is \\boxed{3/4}.", "3/4"),
        ("\\boxed{\\frac{1}{2}} wait #### 7", "7"),  # the later marker wins
        ("#### 7 no: \\boxed{8}", "8"),
        ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{\\sqrt{2}}{2}"),  # nested braces
        ("\\boxed{a{b}c} then \\boxed{x^{2}}", "x^{2}"),  # the last box
        ("\\boxed 5 apples", "5"),
        ("\\fbox{12}", "12"),
        ("\\boxed{unclosed {", None),
        ("\\boxedx", None),
        ("numbers 3 then 4.5, end", "4.5"),
        ("nothing here", None),
        ("12 ####", None),
        ("", None),
        (None, None),
        (123, None),
    ],
)
def test_extract_final_answer(completion, final):
  assert gsm8k.extract_final_answer(completion) == final


@pytest.mark.parametrize(
    "text,value",
    [
        ("1,200", 1200.0),
        ("1200.0", 1200.0),
        ("-7", -7.0),
        ("$5", 5.0),
        ("-$5", -5.0),
        ("$-5", -5.0),
        ("3/4", 0.75),
        ("-3/4", -0.75),
        (".5", 0.5),
        ("1/0", None),
        ("12,00", None),
        ("abc", None),
        ("4" * 401, None),
        ("1e5", None),
        ("", None),
    ],
)
def test_parse_number(text, value):
  assert gsm8k.parse_number(text) == value


@pytest.mark.parametrize(
    "text,norm",
    [
        ("\\frac{3}{4}", "3/4"),
        ("\\dfrac{3}{4}", "3/4"),
        ("\\tfrac34", "3/4"),
        ("-\\frac{1}{2}", "-1/2"),
        ("\\$1,200", "1,200"),
        ("50\\%", "50"),
        ("90^\\circ", "90"),
        ("5 \\text{ dollars}", "5"),
        ("x = 7", "7"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("7.", "7"),
        ("\\text{yes}", "yes"),
    ],
)
def test_normalize_answer(text, norm):
  assert gsm8k.normalize_answer(text) == norm


@pytest.mark.parametrize(
    "answer,completion,reward",
    [
        ("0.75", "\\boxed{\\frac{3}{4}}", 1.0),
        ("0.75", "#### 3/4", 1.0),
        ("3/4", "\\boxed{0.75}", 1.0),
        ("1/3", "\\boxed{0.333}", 0.0),  # not "simple": 1e-6 tolerance
        ("1200", "\\boxed{1,200}", 1.0),
        ("1200", "\\boxed{\\$1200.00}", 1.0),
        ("1200", "\\boxed{1200 \\text{ muffins}}", 1.0),
        ("-7", "\\boxed{-7}", 1.0),
        ("-7", "#### -$7", 1.0),
        ("-7", "\\boxed{7}", 0.0),
        ("5", "\\boxed{x=5}", 1.0),
        ("5", "\\boxed{5} #### 6", 0.0),
        ("5", "\\boxed{unbalanced", 0.0),
        ("5", "\\boxed{1/0}", 0.0),
        ("\\frac{\\sqrt{2}}{2}", "\\boxed{\\dfrac{\\sqrt{2}}{2}}", 1.0),  # text match
        ("x^2+1", "\\boxed{x^{2}+1}", 0.0),  # no symbolic algebra
        ("1200", "#### 1,200", 1.0),  # GSM8K behaviour unchanged
        ("1200", "The answer is 1,200.", 1.0),
        ("1200", "#### 12,00", 0.0),
        ("7.5", "#### 7.5.", 1.0),
    ],
)
def test_verify_math_formats(answer, completion, reward):
  assert gsm8k.GSM8KTask().verify(_p(answer), completion) == reward


def _formats(value: int, rng: random.Random) -> str:
  """One of several ways a completion may state the integer `value`."""
  plain = f"{value:,}" if rng.random() < 0.5 else str(value)
  if value < 0 and rng.random() < 0.5:
    plain = f"-${-value:,}"
  return rng.choice(
      [
          f"#### {plain}",
          f"\\boxed{{{plain}}}",
          f"\\boxed{{{value}.0}}",
          f"so it is {plain}.",
          f"\\boxed{{\\frac{{{2 * value}}}{{2}}}}",
      ]
  )


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(
    st.integers(-(10**9), 10**9),
    st.integers(0, 2**32 - 1),
    st.text(alphabet=string.ascii_letters + " \n", max_size=30),
)
def test_stated_value_matches_exactly_its_value(value, seed, prefix):
  rng = random.Random(seed)
  text = prefix + " " + _formats(value, rng)
  task = gsm8k.GSM8KTask()
  assert task.verify(_p(str(value)), text) == 1.0
  assert task.verify(_p(str(value + 1)), text) == 0.0


_LATEX_ALPHABET = string.printable + "{}{}{}\\\\$$#/,.-" + "°٤π"
_PIECES = [
    "####",
    "\\boxed",
    "\\boxed{",
    "\\fbox",
    "{",
    "}",
    "\\frac",
    "\\dfrac{",
    "\\text{",
    "$",
    "-",
    "/",
    "/0",
    ",",
    ",000",
    ".",
    "0",
    "7",
    "9" * 50,
    "\\left(",
    "\\right)",
    "x=",
    " ",
    "\n",
    "%",
    "^\\circ",
    "e308",
    "1" * 500,
]


@hypothesis.settings(max_examples=1000, deadline=None)
@hypothesis.given(
    st.one_of(
        st.text(max_size=200),
        st.text(alphabet=_LATEX_ALPHABET, max_size=200),
        st.lists(st.sampled_from(_PIECES), max_size=40).map("".join),
    )
)
def test_fuzz_never_raises(text):
  task = gsm8k.GSM8KTask()
  final = gsm8k.extract_final_answer(text)
  assert final is None or isinstance(final, str)
  gsm8k.normalize_answer(text)
  gsm8k.answer_value(text)
  gsm8k.answers_match(text, text)
  for answer in ("1200", "0.75", "-7", "\\frac{1}{2}", text):
    assert task.verify(_p(answer), text) in (0.0, 1.0)


def test_random_and_huge_strings_never_raise():
  rng = np.random.default_rng(0)
  task = gsm8k.GSM8KTask()
  chars = list(_LATEX_ALPHABET) + _PIECES
  for i in range(300):
    n = int(rng.integers(0, 50 if i % 10 else 3000))
    text = "".join(rng.choice(chars, n))
    assert task.verify(_p("1200"), text) in (0.0, 1.0)
  for huge in (
      "\\boxed{" * 5000,
      "{" * 20000 + "\\boxed{" + "}" * 20000,
      "\\boxed{" + "\\text{" * 3000 + "5" + "}" * 3001,
      "1," * 20000,
      "#### " + "9" * 100_000,
      "\\frac{" * 2000 + "1}{2}" * 2000,
  ):
    assert task.verify(_p("5"), huge) in (0.0, 1.0)
