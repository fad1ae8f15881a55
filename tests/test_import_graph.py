"""The import graph of the repo's top-level packages, read from their source (AST only, nothing imported): the
package gp_jax imports neither the launcher nor the benchmarks, the launcher does not import the benchmarks nor the
benchmarks the launcher, and no import cycle joins the top-level packages. Import statements count at any depth (a
deferred import inside a function is still a dependency), as do `importlib.import_module` / `__import__` of a
literal name."""

from __future__ import annotations

import ast
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("gp_jax", "launch", "benchmarks", "experiments")
# (importer, imported): top-level packages that must not depend on each other in that direction
FORBIDDEN = (("gp_jax", "launch"), ("gp_jax", "benchmarks"), ("launch", "benchmarks"), ("benchmarks", "launch"))
IMPORT_FUNCTIONS = ("import_module", "__import__")


def package_sources(repo: pathlib.Path = REPO, packages: tuple[str, ...] = PACKAGES) -> dict[str, tuple[str, bool]]:
  """{module name: (source, is a package __init__)} of every .py file under the top-level packages."""
  out = {}
  for package in packages:
    for path in sorted((repo / package).rglob("*.py")):
      parts = list(path.relative_to(repo).with_suffix("").parts)
      is_init = parts[-1] == "__init__"
      out[".".join(parts[:-1] if is_init else parts)] = (path.read_text(encoding="utf-8"), is_init)
  return out


def _resolve(module: str, is_init: bool, name: str, level: int) -> str:
  """An import's absolute module name: relative ones (`level` dots) against the importing module's package."""
  if not level:
    return name
  package = module.split(".") if is_init else module.split(".")[:-1]
  base = package[:len(package) - (level - 1)]
  return ".".join(base + ([name] if name else []))


def _literal_import(node: ast.Call) -> str | None:
  """The literal module name of `importlib.import_module("x")`, `import_module("x")` or `__import__("x")`."""
  func = node.func
  name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
  if name not in IMPORT_FUNCTIONS or not node.args:
    return None
  arg = node.args[0]
  return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def imports(source: str, module: str, *, is_init: bool = False) -> set[str]:
  """Absolute names of what a module imports anywhere in its source (for `from X import y`: X and X.y)."""
  out = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      out.update(alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom):
      base = _resolve(module, is_init, node.module or "", node.level)
      out.add(base)
      out.update(f"{base}.{alias.name}" if base else alias.name for alias in node.names)
    elif isinstance(node, ast.Call):
      name = _literal_import(node)
      if name:
        package = next((kw.value.value for kw in node.keywords if kw.arg == "package"
                        and isinstance(kw.value, ast.Constant)), None)
        if name.startswith(".") and package:
          level = len(name) - len(name.lstrip("."))
          name = _resolve(package, True, name.lstrip("."), level)
        out.add(name)
  return {n for n in out if n}


def package_graph(sources: dict[str, tuple[str, bool]]) -> dict[str, dict[str, set[str]]]:
  """{importer package: {imported package: the importing modules}} between distinct top-level packages."""
  graph: dict[str, dict[str, set[str]]] = {p: {} for p in PACKAGES}
  for module, (source, is_init) in sources.items():
    top = module.split(".")[0]
    for name in imports(source, module, is_init=is_init):
      target = name.split(".")[0]
      if target in PACKAGES and target != top:
        graph[top].setdefault(target, set()).add(module)
  return graph


def forbidden_edges(graph) -> list[str]:
  """'importer -> imported (modules)' for each forbidden dependency present."""
  return [f"{a} -> {b} ({', '.join(sorted(graph[a][b]))})" for a, b in FORBIDDEN if b in graph.get(a, {})]


def cycles(graph) -> list[list[str]]:
  """The import cycles among the packages, each once (from its least package name)."""
  found = []

  def walk(path: list[str]) -> None:
    for nxt in sorted(graph.get(path[-1], {})):
      if nxt == path[0]:
        found.append(path + [nxt])
      elif nxt not in path and nxt > path[0]:
        walk(path + [nxt])

  for start in sorted(graph):
    walk([start])
  return found


def test_relative_and_dynamic_imports_are_resolved():
  source = ("import os\nfrom . import sibling\nfrom ..other import thing\n\ndef f():\n  import launch.sweep\n"
            "  importlib.import_module('benchmarks.inputs')\n  __import__('experiments')\n"
            "  importlib.import_module('.x', package='gp_jax.data')\n  importlib.import_module(name)\n")
  got = imports(source, "gp_jax.data.batching")
  assert {"os", "gp_jax.data.sibling", "gp_jax.other.thing", "launch.sweep", "benchmarks.inputs", "experiments",
          "gp_jax.data.x"} <= got
  assert "gp_jax.data.sibling" in imports("from . import sibling\n", "gp_jax.data", is_init=True)
  graph = package_graph({"gp_jax.data.batching": (source, False)})
  assert forbidden_edges(graph) == ["gp_jax -> launch (gp_jax.data.batching)",
                                    "gp_jax -> benchmarks (gp_jax.data.batching)"]
  assert cycles({"a": {"b": {"a.m"}}, "b": {"c": {"b.m"}}, "c": {"a": {"c.m"}}}) == [["a", "b", "c", "a"]]


def test_the_package_launcher_and_benchmarks_import_in_one_direction():
  graph = package_graph(package_sources())
  assert not forbidden_edges(graph), forbidden_edges(graph)
  assert not cycles(graph), cycles(graph)


# Modules allowed to change sys.path, and why: none of them to import an experiment file.
SYS_PATH_EDITS = {"launch.accelerators": "the GPU compiler plugin's folder in the user cache (--install_gpu_compiler)"}


def sys_path_edits(sources: dict[str, tuple[str, bool]]) -> list[str]:
  """'module:line' of every call that changes sys.path (insert, append, extend, remove, assignment)."""
  out = []
  for module, (source, _) in sources.items():
    for node in ast.walk(ast.parse(source)):
      target = None
      if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        target = node.func.value
      elif isinstance(node, (ast.Assign, ast.AugAssign)):
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target
      if target is not None and ast.unparse(target) == "sys.path":
        out.append((module, node.lineno))
  return [f"{m}:{line}" for m, line in sorted(out)]


def test_experiment_files_are_loaded_without_editing_sys_path():
  """Experiment files are imported in one place (gp_jax.configs.args.load_experiment), from their path: no module of
  the package, the launcher or the benchmarks puts the repository on sys.path."""
  assert sys_path_edits({"m": ("import sys\nsys.path.insert(0, 'x')\nsys.path += ['y']\nprint(sys.path)\n", False)}) \
      == ["m:2", "m:3"]
  edits = [e for e in sys_path_edits(package_sources()) if e.split(":")[0] not in SYS_PATH_EDITS]
  assert not edits, edits


# What an exported folder's reader (gp_jax.serving, `predict --exported`) may import at import time: no flax, orbax
# or ml_collections (docs/serving.md). It reaches each task through the registry's host half.
FOLDER_READER_BLOCKED = ("flax", "orbax", "ml_collections")


def import_time_imports(source: str, module: str, *, is_init: bool = False) -> set[str]:
  """`imports`, but only the statements run when the module is imported: its body and the if / try / with blocks
  there, not function bodies (deferred imports)."""
  tree = ast.parse(source)
  stack, kept = list(tree.body), []
  while stack:
    node = stack.pop()
    if isinstance(node, (ast.Import, ast.ImportFrom)):
      kept.append(node)
    elif isinstance(node, (ast.If, ast.Try, ast.With, ast.ClassDef)):
      for field in ("body", "orelse", "finalbody", "handlers"):
        stack.extend(getattr(node, field, ()) or ())
    elif isinstance(node, ast.ExceptHandler):
      stack.extend(node.body)
  return imports(ast.unparse(ast.Module(body=kept, type_ignores=[])), module, is_init=is_init)


def import_closure(roots, sources: dict[str, tuple[str, bool]]) -> dict[str, str]:
  """{third-party top-level package: the first repo module found importing it} over everything importing `roots`
  runs (parent packages' __init__ included)."""
  seen, out, todo = set(), {}, list(roots)
  while todo:
    module = todo.pop()
    parts = module.split(".")
    for k in range(1, len(parts) + 1):  # importing a.b.c runs a, a.b and a.b.c
      name = ".".join(parts[:k])
      if name in seen or name not in sources:
        continue
      seen.add(name)
      source, is_init = sources[name]
      for imported in import_time_imports(source, name, is_init=is_init):
        top = imported.split(".")[0]
        if top in PACKAGES:
          todo.append(imported)
        else:
          out.setdefault(top, name)
  return out


def test_import_time_imports_skip_function_bodies():
  source = "import os\ntry:\n  import yaml\nexcept ImportError:\n  pass\n\ndef f():\n  import flax\n"
  assert import_time_imports(source, "m") == {"os", "yaml"}
  sources = {"gp_jax": ("", True), "gp_jax.a": ("from gp_jax import b\n", False), "gp_jax.b": ("import flax\n", False)}
  assert import_closure(["gp_jax.a"], sources) == {"flax": "gp_jax.b"}


def test_an_exported_folders_reader_imports_no_flax_orbax_ml_collections():
  """gp_jax.serving and every task's host half (`tasks.host(name)` for name in `tasks.NAMES`), with what importing
  them runs: the task packages' __init__ included."""
  sources = package_sources()
  registry = ast.parse(sources["gp_jax.tasks"][0])
  names = next(ast.literal_eval(node.value) for node in registry.body
               if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "NAMES" for t in node.targets))
  roots = ["gp_jax.serving", *(f"gp_jax.tasks.{name}.host" for name in names)]
  assert all(r in sources for r in roots), roots
  found = import_closure(roots, sources)
  assert not {k: v for k, v in found.items() if k in FOLDER_READER_BLOCKED}, found
  assert "jax" in found and "numpy" in found  # the closure does reach the third-party imports
