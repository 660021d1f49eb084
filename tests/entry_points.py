"""The command lines of the project's entry points, checked in this process.

``absl_parse(module, args)`` parses ``args`` exactly as ``python -m module
args`` would (the module's own absl flags, ml_collections' ``--config.x.y=``
overrides loaded from the named config file, required flags, types) without
running it: the module runs as ``__main__`` with ``absl.app.run`` stopped
before it calls ``main``; the flags it defined are removed afterwards.
``argparse_parser(path)`` is the ``argparse`` parser of a script
(``experiments/*.py``, ``colab/*.py``): its ``main()`` runs until it parses.
"""

import argparse
import contextlib
import importlib
import runpy
import sys
import warnings

from absl import app
from absl import flags


class _Stop(Exception):
  """Raised instead of running an entry point, carrying what it would parse with."""

  def __init__(self, parser=None):
    super().__init__("stopped before running")
    self.parser = parser


@contextlib.contextmanager
def _stopped(monkeypatch):
  def stop_app(*args, **kwargs):
    raise _Stop()

  def stop_argparse(self, *args, **kwargs):
    raise _Stop(self)

  with monkeypatch.context() as m:
    m.setattr(app, "run", stop_app)
    m.setattr(argparse.ArgumentParser, "parse_args", stop_argparse)
    m.setattr(argparse.ArgumentParser, "parse_known_args", stop_argparse)
    with warnings.catch_warnings():  # runpy: "found in sys.modules ... prior to execution"
      warnings.simplefilter("ignore", RuntimeWarning)
      yield


def absl_parse(monkeypatch, module: str, args: list[str]):
  """``args`` parsed by ``module``'s absl flags as its command line would be;
  returns {flag name: value} of the flags the module defines. Errors are
  absl's / ml_collections' (unknown flag, unknown config field, bad value,
  missing required flag)."""
  importlib.import_module(module)  # its imports' own flags are defined once, outside
  defined_before = set(flags.FLAGS)
  try:
    with _stopped(monkeypatch):
      try:
        runpy.run_module(module, run_name="__main__", alter_sys=False)
        raise AssertionError(f"python -m {module} did not call absl.app.run")
      except _Stop:
        pass
    own = set(flags.FLAGS) - defined_before
    argv = [module, *args]
    monkeypatch.setattr(sys, "argv", argv)  # ml_collections reads overrides from sys.argv
    flags.FLAGS(argv)
    return {name: flags.FLAGS[name].value for name in own}
  finally:
    flags.FLAGS.unparse_flags()
    for name in set(flags.FLAGS) - defined_before:  # own flags and --config.* overrides
      delattr(flags.FLAGS, name)


def argparse_parser(monkeypatch, path: str) -> argparse.ArgumentParser | None:
  """The parser a script's ``main()`` builds, or None for a script without
  ``main`` (it then takes no flags). ``main`` must parse before it does
  anything else (every script here does)."""
  with _stopped(monkeypatch):
    namespace = runpy.run_path(path, run_name="cbs_jax_entry_point_check")
    if "main" not in namespace:
      return None
    monkeypatch.setattr(sys, "argv", [path])
    try:
      namespace["main"]()
    except _Stop as stop:
      return stop.parser
  raise AssertionError(f"{path}: main() returned without parsing a command line")
