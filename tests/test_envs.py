"""The suite's compile level (tests/envs.py, tests/conftest.py): every test
process compiles at XLA optimization level 0, and ``call_at_default_level``
runs a function in a child at the default level and returns its value."""

import os

import envs


def xla_flags() -> str:
  """The XLA flags this process's backend starts with."""
  return os.environ.get("XLA_FLAGS", "")


def test_the_suite_compiles_at_level_0_and_a_child_at_the_default():
  assert envs.QUICK_COMPILE in xla_flags().split()
  assert "optimization_level" not in envs.call_at_default_level(xla_flags)


def add(a: int, b: list) -> dict:
  return dict(total=a + sum(b), pid=os.getpid())


def test_call_at_default_level_passes_arguments_and_returns_the_value():
  got = envs.call_at_default_level(add, 2, [3, 4])
  assert got["total"] == 9 and got["pid"] != os.getpid()
