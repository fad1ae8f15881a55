"""Expands an experiment's get_sweep() into runs: (name, workdir, command line)."""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shlex
import sys


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  workdir: str
  argv: tuple[str, ...]

  @property
  def command(self) -> str:
    return shlex.join(self.argv)


def load_module(path: str):
  spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
  module = importlib.util.module_from_spec(spec)
  repo = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if repo not in sys.path:
    sys.path.insert(0, repo)
  spec.loader.exec_module(module)
  return module


def _slug(overrides: dict) -> str:
  parts = []
  for k, v in overrides.items():
    key = k.split(".")[-1]
    parts.append(f"{key}={v}")
  return ",".join(parts) or "base"


def expand(config_spec: str, workdir_root: str, *, extra: list[str] = (), python: str = sys.executable) -> list[Run]:
  """`config_spec` is "path.py" or "path.py:arg"; one Run per get_sweep() entry (one run if it is empty)."""
  path, _, arg = config_spec.partition(":")
  module = load_module(path)
  sweep = module.get_sweep() if hasattr(module, "get_sweep") else []
  runs = []
  for overrides in sweep or [{}]:
    name = _slug(overrides)
    workdir = os.path.join(workdir_root, name)
    argv = [python, "-m", "gp_jax.main", f"--config={config_spec}", f"--workdir={workdir}"]
    argv += [f"--{k}={v}" for k, v in overrides.items()]
    argv += list(extra)
    runs.append(Run(name, workdir, tuple(argv)))
  return runs
