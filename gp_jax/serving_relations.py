"""Moved to `gp_jax.tasks.relations.host` (the relation task's host half); this name is kept until nothing imports
it (the task object still does), then removed."""

from __future__ import annotations

from gp_jax.tasks.relations import host
from gp_jax.tasks.relations.host import (MAX_CANDIDATES_PER_ROW, TRIPLE_KEYS, assemble, bounded_rows,  # noqa: F401
                                         concat_hits, prepare, triple_columns)


def window_hits(out, *, types=(), options=None) -> dict:
  """(entity hits, head hits, tail hits, window_index) -> `host.window_hits`."""
  return host.window_hits(out[:-1], out[-1], types=types, options=options)
