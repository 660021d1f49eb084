"""The experiment scripts (experiments/<name>.py) loaded as modules, so a test
can call their ``main(argv)`` in its own process instead of starting a Python
(and JAX) for a command-line check. Every script only defines things at
import; its run is behind ``if __name__ == "__main__"``, and ``main(argv)``
parses ``argv`` first, exactly as the command line would."""

import functools
import importlib.util
import os
import sys

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
