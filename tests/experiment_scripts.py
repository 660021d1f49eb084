"""The experiment scripts (experiments/<name>.py) loaded as modules, so a test
can call their ``main(argv)`` in its own process instead of starting a Python
(and JAX) for a command-line check. Every script only defines things at
import; its run is behind ``if __name__ == "__main__"``, and ``main(argv)``
parses ``argv`` first, exactly as the command line would.

``run`` is the command line in this process: a new interpreter imports JAX
and the project again before the script does anything, which was a large
part of the suite's study chains and most of its ``--replot`` checks."""

import contextlib
import functools
import importlib.util
import io
import os
import sys

from absl import logging

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@functools.cache
def load(name: str):
  """experiments/<name>.py as the module ``experiments_<name>`` (loaded once)."""
  path = os.path.join(ROOT, "experiments", f"{name}.py")
  spec = importlib.util.spec_from_file_location(f"experiments_{name}", path)
  module = importlib.util.module_from_spec(spec)
  sys.modules[spec.name] = module  # what dataclasses and pickling look up
  spec.loader.exec_module(module)
  return module


def run(name: str, argv: list[str], cwd: str) -> tuple[int, str, str]:
  """``python experiments/<name>.py *argv`` run from ``cwd``, in this process:
  ``(exit code, stdout, stderr)``. An exception the script does not turn
  into an exit propagates (its traceback is the test's failure). The working
  directory and absl's verbosity (the studies lower it) are restored."""
  out, err = io.StringIO(), io.StringIO()
  here, verbosity = os.getcwd(), logging.get_verbosity()
  code = 0
  try:
    os.chdir(cwd)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
      load(name).main(list(argv))
  except SystemExit as e:
    code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    if isinstance(e.code, str):
      err.write(e.code + "\n")
  finally:
    os.chdir(here)
    logging.set_verbosity(verbosity)
  return code, out.getvalue(), err.getvalue()
