"""The package's imports flow one way: no module imports, at any depth, a
module that imports it back (a deferred import inside a function counts:
it is a cycle all the same, only hidden until the function runs), and the
package never imports the experiments or the tests.

The graph is read from the source with ``ast`` (every ``import`` and
``from ... import`` naming a ``cbs_jax`` module), independently of Python's
import machinery, so a cycle that happens not to fail at import time is
still found.
"""

import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "cbs_jax")


def modules() -> dict[str, str]:
  """Dotted module name -> file, for every module of the package."""
  out = {}
  for dirpath, _, files in os.walk(PACKAGE):
    for f in files:
      if f.endswith(".py"):
        rel = os.path.relpath(os.path.join(dirpath, f), ROOT)[: -len(".py")]
        name = rel.replace(os.sep, ".")
        out[name[: -len(".__init__")] if name.endswith(".__init__") else name] = os.path.join(
            dirpath, f
        )
  return out


def imported(source: str, known: set[str]) -> set[str]:
  """The modules of ``known`` that ``source`` imports, anywhere in it."""
  out = set()
  for node in ast.walk(ast.parse(source)):
    names = []
    if isinstance(node, ast.Import):
      names = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      # "from cbs_jax import model" names module cbs_jax.model, "from
      # cbs_jax.tasks import base" cbs_jax.tasks.base; "from cbs_jax.tasks
      # import Task" the package cbs_jax.tasks
      names = [
          f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known else node.module
          for a in node.names
      ]
    for n in names:
      if n in known:
        out.add(n)
      elif n.startswith(("experiments", "tests")):
        out.add(n)
  return out


def graph() -> dict[str, set[str]]:
  """Module -> the package's modules it imports. An import of the module's
  own package (``cbs_jax.tasks.base`` of ``cbs_jax.tasks``) is left out:
  Python runs a package's ``__init__`` before any of its modules, so that
  edge is there for every submodule, and a package's ``__init__`` gathering
  its modules' names is the one way back it may take."""
  mods = modules()
  known = set(mods)
  g = {}
  for name, path in mods.items():
    with open(path, encoding="utf-8") as f:
      deps = imported(f.read(), known)
    g[name] = {d for d in deps if d != name and not name.startswith(d + ".")}
  return g


def find_cycle(g: dict[str, set[str]]) -> list[str] | None:
  """One cycle of ``g`` as [a, b, ..., a], or None."""
  state = {}  # 1: on the current path, 2: done

  def visit(u, path):
    state[u] = 1
    path.append(u)
    for v in sorted(g.get(u, ())):
      if state.get(v) == 1:
        return path[path.index(v) :] + [v]
      if v not in state:
        found = visit(v, path)
        if found:
          return found
    path.pop()
    state[u] = 2
    return None

  for u in sorted(g):
    if u not in state:
      found = visit(u, [])
      if found:
        return found
  return None


def test_find_cycle_finds_a_deferred_cycle_and_passes_a_chain():
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
  assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  src = "import os\nfrom cbs_jax import b\n\ndef f():\n  from cbs_jax import c  # deferred\n"
  assert imported(src, {"cbs_jax.b", "cbs_jax.c", "cbs_jax.d"}) == {"cbs_jax.b", "cbs_jax.c"}
  known = {"cbs_jax.tasks", "cbs_jax.tasks.base", "cbs_jax.model"}
  src = "from cbs_jax.tasks import base\nimport cbs_jax.model as m\n"
  assert imported(src, known) == {"cbs_jax.tasks.base", "cbs_jax.model"}
  assert imported("from cbs_jax.tasks import Task\n", known) == {"cbs_jax.tasks"}


def test_the_package_graph_is_read_whole():
  g = graph()
  assert len(g) >= 40 and "cbs_jax.tasks.base" in g
  assert "cbs_jax.model" in g["cbs_jax.train"]  # a top-level import
  assert "cbs_jax.plots" in g["cbs_jax.report"]  # a deferred one


@pytest.mark.parametrize("forbidden", ["experiments", "tests"])
def test_the_package_does_not_import_experiments_or_tests(forbidden):
  bad = {m: sorted(v for v in deps if v.startswith(forbidden)) for m, deps in graph().items()}
  assert not {m: v for m, v in bad.items() if v}


def test_imports_flow_one_way():
  cycle = find_cycle(graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)
