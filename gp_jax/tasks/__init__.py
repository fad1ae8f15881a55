"""The task registry (docs/tasks.md): the one place that knows the task names.

Adding a task = one folder `gp_jax/tasks/<name>/` + its name in `NAMES`. Nothing is imported eagerly (no flax here:
serving imports the registry to reach a task's host half).
"""

from __future__ import annotations

import importlib

NAMES = ("entities", "relations", "events")
DEFAULT = NAMES[0]  # the task of a workdir's config.json or a folder's manifest written before tasks (none named)


def _checked(name: str) -> str:
  if name not in NAMES:
    raise ValueError(f"task must be one of {NAMES}, got {name!r}")
  return name


def get(name: str):
  """The task class of `name` (`gp_jax.tasks.<name>.TASK`)."""
  return importlib.import_module(f"gp_jax.tasks.{_checked(name)}").TASK


def of(spec):
  """The task object of a run spec (`factory.RunSpec`): the one constructor."""
  return get(spec.task).from_spec(spec)


def host(name: str):
  """The host half of task `name` (`gp_jax.tasks.<name>.host`: numpy, gp_jax.data and gp_jax.ops only)."""
  return importlib.import_module(f"gp_jax.tasks.{_checked(name)}.host")


__all__ = ["NAMES", "DEFAULT", "get", "of", "host"]
