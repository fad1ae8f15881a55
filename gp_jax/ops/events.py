"""GPLinker for events, device half: argument hits and the two link pointers' hits in bounded buffers.

Every (event type, role) pair is a class of the argument pointer. Two arguments of one event are linked by a head
pointer cell (min(h1, h2), max(h1, h2)) over their start tokens and a tail pointer cell over their end tokens (one
head each, upper triangle with the diagonal). A link cell counts only where both its tokens start (head) or end
(tail) a decoded argument, so an untrained model keeps at most #starts^2 + #ends^2 link cells per row, never 2 L^2.
The host groups the hits into events (`gp_jax.tasks.events.cliques`).
"""

from __future__ import annotations

from gp_jax.ops.relations import relation_hits


def event_hits(argument_logits_BCLL, head_logits_B1LL, tail_logits_B1LL, *, argument_mask, link_mask,
               threshold=0.0, link_threshold=None, sizes: tuple[int, int, int], hit_sharding=None):
  """The three pointers' cells -> (argument hits, head-link hits, tail-link hits), each `ops.gather_hits`' (count,
  coords `[size, 4]`, scores `[size]`) in a buffer of `sizes` (argument, head, tail).

  Argument coords are (row, class, start, end): cells above `threshold` inside `argument_mask`. Link coords are
  (row, 0, i, j), i <= j: head cells above `link_threshold` (default `threshold`) inside `link_mask` where i and j
  both start a decoded argument of the row; tail cells where both end one. `argument_mask`, `link_mask`: bool,
  broadcastable to the logits (`span_mask`, the link pointers' without a width limit). A count above its size
  means hits were cut: decode again with a larger buffer (`ops.grown_sizes`).
  """
  if head_logits_B1LL.shape[1] != 1 or tail_logits_B1LL.shape[1] != 1:
    raise ValueError(f"event link pointers have one head each, got head {head_logits_B1LL.shape} and tail "
                     f"{tail_logits_B1LL.shape}")
  return relation_hits(argument_logits_BCLL, head_logits_B1LL, tail_logits_B1LL, entity_mask=argument_mask,
                       pointer_mask=link_mask, sizes=tuple(sizes), threshold=threshold,
                       pointer_threshold=link_threshold, hit_sharding=hit_sharding)


__all__ = ["event_hits"]
