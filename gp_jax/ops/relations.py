"""GPLinker decoding: entity, head and tail pointer hits on the device; triples assembled on the host.

The head pointer scores (subject start, object start) per relation type, the tail pointer (subject end, object end).
On the device, pointer cells count only where both tokens are decoded entity starts (head) or ends (tail), so an
untrained model fires at most R * (#starts^2 + #ends^2) pointer cells per row, never 2R * L^2; each buffer's count
tells the host when it must grow. The host joins the hits with dict lookups, linear in hits.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.ops.decode import gather_hits
# The one trimming of a hit buffer (and growth rule, re-exported for `gp_jax.ops`), shared with the host halves.
from gp_jax.tasks.base import grown_sizes, trimmed  # noqa: F401  pylint: disable=unused-import

# Columns of `assemble_triples`' int array.
TRIPLE_COLUMNS = ("row", "relation", "subject_type", "subject_start", "subject_end",
                  "object_type", "object_start", "object_end")


def entity_boundaries(entity_hit_BELL):
  """Bool entity hits `[B, E, L, L]` (start, end) -> (starts_BL, ends_BL): tokens where a decoded entity of any
  type starts, ends."""
  return jnp.any(entity_hit_BELL, axis=(1, 3)), jnp.any(entity_hit_BELL, axis=(1, 2))


def pointer_hit_masks(entity_hit_BELL, head_logits_BRLL, tail_logits_BRLL, *, pointer_mask, threshold):
  """Bool `[B, R, L, L]` head and tail hits: score > threshold inside `pointer_mask` (broadcastable), head cells
  (i, j) only where i and j both start a decoded entity of the row, tail cells only where both end one."""
  starts_BL, ends_BL = entity_boundaries(entity_hit_BELL)
  valid = jnp.asarray(pointer_mask, bool)
  head_cells_B1LL = (starts_BL[:, :, None] & starts_BL[:, None, :])[:, None]
  tail_cells_B1LL = (ends_BL[:, :, None] & ends_BL[:, None, :])[:, None]
  head_hit = (head_logits_BRLL > threshold) & valid & head_cells_B1LL
  tail_hit = (tail_logits_BRLL > threshold) & valid & tail_cells_B1LL
  return head_hit, tail_hit


def relation_hits(entity_logits_BELL, head_logits_BRLL, tail_logits_BRLL, *, entity_mask, pointer_mask,
                  sizes: tuple[int, int, int], threshold=0.0, pointer_threshold=None, hit_sharding=None):
  """The three pointers' cells -> (entity hits, head hits, tail hits), each `ops.gather_hits`' (count, coords
  `[size, 4]` as (row, type or relation, i, j), scores `[size]`), bounded by `sizes` (entity, head, tail).

  `entity_mask`, `pointer_mask`: bool, broadcastable to the logits (`span_mask` with and without the triangle).
  `pointer_threshold` (default `threshold`) applies to the head and tail pointers. A count above its size means
  hits were cut: decode again with a larger buffer.
  """
  if pointer_threshold is None:
    pointer_threshold = threshold
  entity_hit = (entity_logits_BELL > threshold) & jnp.asarray(entity_mask, bool)
  head_hit, tail_hit = pointer_hit_masks(entity_hit, head_logits_BRLL, tail_logits_BRLL, pointer_mask=pointer_mask,
                                         threshold=pointer_threshold)
  out = []
  for hit, logits, size in zip((entity_hit, head_hit, tail_hit), (entity_logits_BELL, head_logits_BRLL,
                                                                   tail_logits_BRLL), sizes):
    if hit_sharding is not None:
      hit = jax.lax.with_sharding_constraint(hit, hit_sharding)
    out.append(gather_hits(hit, logits, size=size))
  return tuple(out)


def assemble_triples(entity_hits, head_hits, tail_hits, *, subject_types: Collection[int] | None = None,
                     object_types: Collection[int] | None = None):
  """Hits (as `relation_hits` returns them) -> triples: int `[N, 8]` in `TRIPLE_COLUMNS` order and scores `[N]`.

  In each row, a pair (subject s, object o) of decoded entities holds relation r when (r, s.start, o.start) is a
  head hit and (r, s.end, o.end) a tail hit; its score is the smallest of the four cells (both entity cells, head,
  tail). `subject_types` / `object_types` (None: any) restrict the entity types each side may take (GPLinker's
  subject and object roles). Linear in hits: each head hit looks up the entities starting at its two tokens and
  the tail hit at their ends. Rows sorted by (row, subject, relation, object).
  """
  ent_coords, ent_scores = trimmed(entity_hits)
  head_coords, head_scores = trimmed(head_hits)
  tail_coords, tail_scores = trimmed(tail_hits)
  subject_types = None if subject_types is None else frozenset(int(t) for t in subject_types)
  object_types = None if object_types is None else frozenset(int(t) for t in object_types)
  subjects_at, objects_at = defaultdict(list), defaultdict(list)  # (row, start) -> [(type, start, end, score)]
  for (row, etype, start, end), score in zip(ent_coords.tolist(), ent_scores.tolist()):
    entity = (etype, start, end, score)
    if subject_types is None or etype in subject_types:
      subjects_at[row, start].append(entity)
    if object_types is None or etype in object_types:
      objects_at[row, start].append(entity)
  tail = {tuple(c): s for c, s in zip(tail_coords.tolist(), tail_scores.tolist())}
  triples, scores = [], []
  for (row, rel, i, j), head_score in zip(head_coords.tolist(), head_scores.tolist()):
    for s_type, s_start, s_end, s_score in subjects_at.get((row, i), ()):
      for o_type, o_start, o_end, o_score in objects_at.get((row, j), ()):
        tail_score = tail.get((row, rel, s_end, o_end))
        if tail_score is not None:
          triples.append((row, rel, s_type, s_start, s_end, o_type, o_start, o_end))
          scores.append(min(s_score, o_score, head_score, tail_score))
  triples_N8 = np.asarray(triples, np.int32).reshape(-1, len(TRIPLE_COLUMNS))
  scores_N = np.asarray(scores, np.float32)
  order = np.lexsort(triples_N8[:, [7, 6, 5, 1, 4, 3, 2, 0]].T)
  return triples_N8[order], scores_N[order]


__all__ = ["TRIPLE_COLUMNS", "entity_boundaries", "pointer_hit_masks", "relation_hits", "assemble_triples"]
