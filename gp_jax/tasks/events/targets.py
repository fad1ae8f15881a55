"""The event task's batch targets as flat ids, -1 padded (never dense [B, C, L, L]): the argument pointer's are the
batch's `span_ids` (K = L), the two link pointers' hold K = LINK_SLOTS * L ids each (one head holds the links of every
event in the window: an event of n arguments gives n (n - 1) / 2, so L slots drop gold links in short, crowded
sentences, about 2% of PHEE's train windows; 4 L holds them all there).

`argument_ids [B, C, K]`: the argument classes' (start, end) cells, the batch's `span_ids` (the classes are the
split's span types). `head_ids [B, 1, K]`: a * L + b for the start tokens (a <= b) of every pair of distinct
arguments of one event; `tail_ids [B, 1, K]` the same for their end tokens (Su's `head_labels` / `tail_labels`:
upper triangle, diagonal included). One id per cell: pairs that share a cell give it once.

NumPy only (no flax).
"""

from __future__ import annotations

import numpy as np

from gp_jax.data.windows import _ranges


def event_links(events) -> np.ndarray:
  """Events of one window as lists of (start, end) token spans -> the window's rows of `links_Q4` (head_a, head_b,
  tail_a, tail_b), one per pair of distinct arguments of one event (Su's loop over i1 < i2), a <= b. For tests and
  table builders; `event_targets` dedupes the cells."""
  rows = []
  for spans in events:
    for k, (h1, t1) in enumerate(spans):
      for h2, t2 in spans[k + 1:]:
        rows.append((min(h1, h2), max(h1, h2), min(t1, t2), max(t1, t2)))
  return np.asarray(rows, np.int32).reshape(-1, 4)


LINK_SLOTS = 4  # link ids per window token: K = LINK_SLOTS * L for the head and tail pointers


def event_targets(p, rows: np.ndarray, w: np.ndarray, span_ids_BHK: np.ndarray, L: int, *,
                  table=None) -> tuple[dict, int]:
  """The event batch's targets for the batch rows `rows` holding windows `w` (`data.batching._Assembler`) ->
  ({"argument_ids", "head_ids", "tail_ids"}, ids dropped beyond K = LINK_SLOTS * L in one window's link pointer).

  `table` (default `p.table`, the split's `data.events.EventTable`): `ptr` int64 [N + 1] (link rows per window),
  `links_Q4` int [Q, 4] (head_a, head_b, tail_a, tail_b) in window tokens, head_a <= head_b, tail_a <= tail_b.
  """
  table = getattr(p, "table", None) if table is None else table
  if table is None:
    raise ValueError(f"{getattr(p, 'name', 'split')} was prepared without an event table (prepare it with the "
                     f"event task)")
  B = span_ids_BHK.shape[0]
  rows, w = np.asarray(rows, np.int64), np.asarray(w, np.int64)
  ptr = np.asarray(table.ptr, np.int64)
  n = ptr[w + 1] - ptr[w]
  q = np.asarray(table.links_Q4, np.int64)[_ranges(ptr[w], n)].reshape(-1, 4)
  if q.size and (q.min() < 0 or q.max() >= L or (q[:, 0] > q[:, 1]).any() or (q[:, 2] > q[:, 3]).any()):
    raise ValueError(f"event links must be window tokens in [0, {L}) with head_a <= head_b and tail_a <= tail_b "
                     f"(data.events builds them so)")
  row = np.repeat(rows, n)
  K = LINK_SLOTS * L
  out, over = {"argument_ids": span_ids_BHK}, 0
  for name, a, b in (("head_ids", 0, 1), ("tail_ids", 2, 3)):
    key = np.unique(np.stack([row, q[:, a] * L + q[:, b]], 1).reshape(-1, 2), axis=0)
    rank = np.arange(key.shape[0]) - np.searchsorted(key[:, 0], key[:, 0], side="left")
    keep = rank < K
    ids = np.full((B, 1, K), -1, np.int32)
    ids[key[keep, 0], 0, rank[keep]] = key[keep, 1]
    out[name] = ids
    over += int((~keep).sum())
  return out, over


def target_shapes(*, num_classes: int, batch: int, length: int) -> dict[str, tuple]:
  """The training batch's target arrays (aot): argument ids per class, one head and one tail pointer."""
  return {"argument_ids": (batch, num_classes, length), "head_ids": (batch, 1, LINK_SLOTS * length),
          "tail_ids": (batch, 1, LINK_SLOTS * length)}


__all__ = ["LINK_SLOTS", "event_targets", "event_links", "target_shapes"]
