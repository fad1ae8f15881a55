"""What differs between tasks, one object per task (docs/tasks.md): `get(name)` is the one place a task is chosen.

The shared path (train.py, steps, aot, evaluate, predict) calls the object; none of them branch on its name.
"""

from __future__ import annotations

from gp_jax.tasks.entities import EntityTask
from gp_jax.tasks.relations import RelationTask

TASKS = {"entities": EntityTask, "relations": RelationTask}
NAMES = tuple(TASKS)


def get(name: str, **options):
  """The task object of `name` ("entities" | "relations"); `options` as its class takes them (relations: match)."""
  if name not in TASKS:
    raise ValueError(f"task must be one of {NAMES}, got {name!r}")
  return TASKS[name](**options)


def of(spec):
  """The task of a run spec (`factory.RunSpec`)."""
  return get(spec.task, **({"match": spec.triple_match} if spec.task == "relations" else {}))


__all__ = ["TASKS", "NAMES", "get", "of", "EntityTask", "RelationTask"]
