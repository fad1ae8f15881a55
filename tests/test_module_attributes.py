"""Every `module.name` the repo's code reads of one of its own modules (bound by `import a.b as m` or `from a import
m`), and every name it imports from one (`from a.b import name`, in a function body too), is something that module
defines: a top-level def, class, assignment or import, or a submodule. A name that moves to another module without
its readers (launch.compile read `pretrained._parse` after it moved to models.locate) fails here, before a user
reaches the line. AST only: nothing is imported. Modules with a module-level `__getattr__` or a star import accept
any name."""

from __future__ import annotations

import ast

from tests.test_import_graph import _resolve, package_sources

IMPORTERS = ("gp_jax", "launch", "benchmarks", "experiments", "tests")
MODULE_ATTRIBUTES = {"__file__", "__name__", "__path__", "__spec__", "__dict__", "__doc__", "__package__", "__loader__"}


def top_level_names(tree: ast.Module) -> set[str] | None:
  """What a module defines at its top level (through if / try / with blocks); None when any name may exist."""
  names: set[str] = set()

  def targets(node) -> None:
    if isinstance(node, ast.Name):
      names.add(node.id)
    elif isinstance(node, (ast.Tuple, ast.List)):
      for elt in node.elts:
        targets(elt)
    elif isinstance(node, ast.Starred):
      targets(node.value)

  def block(body) -> bool:
    for node in body:
      if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        names.add(node.name)
        if node.name == "__getattr__":
          return False
      elif isinstance(node, ast.Assign):
        for t in node.targets:
          targets(t)
      elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
        targets(node.target)
      elif isinstance(node, ast.Import):
        names.update(a.asname or a.name.split(".")[0] for a in node.names)
      elif isinstance(node, ast.ImportFrom):
        if any(a.name == "*" for a in node.names):
          return False
        names.update(a.asname or a.name for a in node.names)
      elif isinstance(node, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
        inner = [*getattr(node, "body", []), *getattr(node, "orelse", []), *getattr(node, "finalbody", [])]
        inner += [n for h in getattr(node, "handlers", []) for n in h.body]
        if isinstance(node, (ast.For, ast.With)):
          for t in ([node.target] if isinstance(node, ast.For) else [i.optional_vars for i in node.items]):
            if t is not None:
              targets(t)
        if not block(inner):
          return False
    return True

  return names if block(tree.body) else None


def module_aliases(tree: ast.Module, module: str, is_init: bool, known: set[str]) -> dict[str, str]:
  """{local name: project module} for the module bindings anywhere in a file."""
  out = {}
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if a.asname and a.name in known:
          out[a.asname] = a.name
    elif isinstance(node, ast.ImportFrom):
      base = _resolve(module, is_init, node.module or "", node.level)
      for a in node.names:
        if f"{base}.{a.name}" in known:
          out[a.asname or a.name] = f"{base}.{a.name}"
  return out


def unresolved(sources: dict[str, tuple[str, bool]], importers: dict[str, tuple[str, bool]]) -> list[str]:
  """'file module:line alias.name' for each read of a name its module does not define."""
  trees = {m: ast.parse(src) for m, (src, _) in sources.items()}
  defined = {m: top_level_names(t) for m, t in trees.items()}
  known = set(sources)
  found = []
  for module, (source, is_init) in importers.items():
    tree = trees.get(module) or ast.parse(source)
    aliases = module_aliases(tree, module, is_init, known)
    for node in ast.walk(tree):
      if isinstance(node, ast.ImportFrom):  # deferred ones too: they fail only when their function runs
        base = _resolve(module, is_init, node.module or "", node.level)
        names = defined.get(base)
        for a in node.names if names is not None else ():
          if a.name != "*" and a.name not in names and f"{base}.{a.name}" not in known:
            found.append((module, node.lineno, f"from {base} import {a.name} ({base} has no {a.name})"))
      if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
        target = aliases[node.value.id]
        names = defined[target]
        if (names is not None and node.attr not in names | MODULE_ATTRIBUTES
            and f"{target}.{node.attr}" not in known):
          found.append((module, node.lineno, f"{node.value.id}.{node.attr} ({target} has no {node.attr})"))
  return [f"{module}:{line} {what}" for module, line, what in sorted(found)]


def _importer_sources() -> dict[str, tuple[str, bool]]:
  return package_sources(packages=IMPORTERS)


def test_a_moved_name_is_found():
  sources = {"pkg.locate": ("def parse_name(n):\n  return n\n\nresolve = parse_name\n", False),
             "pkg.pretrained": ("from pkg.locate import resolve\nif True:\n  X = 1\n", False),
             "pkg.lazy": ("def __getattr__(name):\n  return name\n", False),
             "pkg": ("", True), "pkg.sub": ("", True), "pkg.sub.leaf": ("", False),
             "app.compiler": ("from pkg import pretrained as p, lazy, sub\nimport pkg.locate as loc\n"
                              "p._parse('x'); p.resolve; p.X; lazy.anything; sub.leaf; loc.parse_name\n"
                              "def f():\n  from pkg.locate import _parse, parse_name\n", False)}
  assert unresolved(sources, sources) == ["app.compiler:3 p._parse (pkg.pretrained has no _parse)",
                                          "app.compiler:5 from pkg.locate import _parse (pkg.locate has no _parse)"]


def test_every_module_attribute_the_repo_reads_exists():
  sources = package_sources()
  found = unresolved(sources, _importer_sources())
  assert not found, "\n".join(found)


def test_the_importers_include_the_tests_and_experiments():
  importers = _importer_sources()
  assert {"tests.test_module_attributes", "tests.e2e.test_train", "experiments.synthetic", "launch.compiler"} <= set(
      importers)
