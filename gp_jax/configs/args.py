"""Parses config args like "quick,head=efficient,lr=1e-3" into typed fields, and loads experiment files.

`load_experiment` is the one place an experiment file is imported (launch's sweeps, the `--config` flag of
`define_config_file`, the override-key check, benchmarks): from its path, without touching sys.path.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys

import ml_collections
from absl import flags
from ml_collections import config_flags

from gp_jax.errors import UserError


def _coerce(value: str, default):
  if isinstance(default, bool):
    low = value.lower()
    if low in ("1", "true", "yes", "on", ""):
      return True
    if low in ("0", "false", "no", "off"):
      return False
    raise UserError(f"expected a boolean, got {value!r}")
  if isinstance(default, int):
    return int(value)
  if isinstance(default, float):
    return float(value)
  return value


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """"a,b=2" -> {a: True, b: 2}, typed by `defaults`; unknown keys are an error listing the known ones."""
  out = dict(defaults)
  for item in filter(None, (s.strip() for s in (arg or "").split(","))):
    key, eq, value = item.partition("=")
    if key not in defaults:
      raise UserError(f"unknown config arg {key!r}; known: {', '.join(sorted(defaults))}")
    try:
      out[key] = _coerce(value if eq else "true", defaults[key])
    except ValueError as e:
      raise UserError(f"config arg {item!r}: {e}") from None
  return ml_collections.ConfigDict(out)


# ----------------------------------------------------------------------------- experiment files


def _package(folder: str) -> str | None:
  """The package an experiment file's folder is (a folder holding __init__.py whose name is an identifier), imported
  from that folder under its own name, so `from experiments import x` in a file there finds its sibling from any
  working directory; None for a plain folder."""
  name = os.path.basename(folder)
  if not name.isidentifier() or not os.path.isfile(os.path.join(folder, "__init__.py")):
    return None
  loaded = sys.modules.get(name)
  if loaded is not None:
    paths = {os.path.realpath(p) for p in getattr(loaded, "__path__", [])}
    if os.path.realpath(folder) in paths:
      return name
    raise UserError(f"experiment folder {folder} is package {name!r}, but another {name!r} is imported already "
                    f"(from {', '.join(sorted(paths)) or getattr(loaded, '__file__', '?')}); rename one of them")
  spec = importlib.util.spec_from_file_location(name, os.path.join(folder, "__init__.py"),
                                                submodule_search_locations=[folder])
  module = importlib.util.module_from_spec(spec)
  sys.modules[name] = module
  try:
    spec.loader.exec_module(module)
  except BaseException:
    del sys.modules[name]
    raise
  return name


def load_experiment(path: str):
  """The experiment module at `path`. A file in a package folder (experiments/ holds __init__.py) is imported as a
  member of that package, once per process as `import` does, so it may import its siblings (`from experiments
  import rope_ablation`); any other file is executed afresh as a module of its own. A missing file is a
  UserError."""
  path = os.path.abspath(os.path.expanduser(path))
  if not os.path.isfile(path):
    raise UserError(f"no experiment file {path}: --config takes a Python file with get_config(arg), e.g. "
                    "experiments/synthetic.py:quick")
  stem = os.path.splitext(os.path.basename(path))[0]
  package = _package(os.path.dirname(path)) if path.endswith(".py") else None  # siblings importable either way
  if package and stem.isidentifier():
    return importlib.import_module(f"{package}.{stem}")
  spec = importlib.util.spec_from_file_location(f"_gp_jax_experiment_{stem}", path)
  if spec is None:
    raise UserError(f"experiment file {path} is not a Python file (.py)")
  module = importlib.util.module_from_spec(spec)
  with open(path, "rb") as f:  # from the source, never a cached .pyc (one per second and size would be reused)
    code = compile(f.read(), path, "exec", dont_inherit=True)
  exec(code, module.__dict__)  # pylint: disable=exec-used
  return module


def build_config(spec: str):
  """get_config of the experiment `spec`: "path.py" calls get_config(), "path.py:arg" get_config(arg), as
  ml_collections' --config flag does."""
  path, colon, arg = spec.partition(":")
  module = load_experiment(path)
  if not hasattr(module, "get_config"):
    raise UserError(f"experiment file {path} has no get_config(arg)")
  return module.get_config(*([arg] if colon else []))


class _ExperimentFileParser(flags.ArgumentParser):
  """The `--config=FILE[:ARG]` parser of `define_config_file`: `build_config`, locked when asked."""

  def __init__(self, lock_config: bool):
    self.lock_config = lock_config

  def parse(self, argument):
    config = build_config(argument)
    if self.lock_config and callable(getattr(config, "lock", None)):
      config.lock()
    return config

  def flag_type(self):
    return "config object"


def define_config_file(name: str, help_string: str, *, flag_values=flags.FLAGS, lock_config: bool = True,
                       sys_argv=None) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file` (`--NAME=FILE[:ARG]`, `--NAME.key=value` overrides) with the file loaded by
  `load_experiment`; a UserError from loading or get_config reaches the caller in the flag error's chain."""
  holder = config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values, lock_config=lock_config,
                                           sys_argv=sys_argv)
  flag_values[name].parser = _ExperimentFileParser(lock_config)
  return holder


def _flat_keys(c, prefix=""):
  for k, v in c.items():
    yield prefix + k
    if isinstance(v, ml_collections.ConfigDict):
      yield from _flat_keys(v, prefix + k + ".")


def check_override_keys(argv) -> str | None:
  """The first `--config.KEY=...` of argv whose KEY the config lacks, as one line naming the closest keys."""
  spec = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
  if spec is None:
    return None
  config = build_config(spec)
  keys = list(_flat_keys(config))
  for a in argv:
    if a.startswith("--config.") and "=" in a:
      key = a[len("--config."):].split("=", 1)[0]
      if key not in keys:
        close = difflib.get_close_matches(key, keys, n=3, cutoff=0.6)
        hint = f"; closest: {', '.join(close)}" if close else ""
        return f"unknown config key {key!r} in {a!r}{hint}"
  return None
