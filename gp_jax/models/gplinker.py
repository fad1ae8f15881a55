"""GPLinker (Su, 2022): joint entity-relation extraction as three GlobalPointers over one encoder (flax.nnx)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from gp_jax.models.heads import EfficientGlobalPointer, GlobalPointer
from gp_jax.ops.relations import relation_hits


def pointer_losses(pointers, hidden_BLD, span_mask_BL, *, ids, positions=None, block_size=None,
                   implementation="auto"):
  """GPLinker's three pointers (span, head link, tail link) and their gold ids -> their sparse ZLPR, each summed over
  its heads and averaged over the batch. `block_size` and `implementation` apply to the span pointer only (the
  link pointers take the dense path)."""
  (span, head, tail), (span_ids, head_ids, tail_ids) = pointers, ids
  return (span.span_loss(hidden_BLD, span_mask_BL, span_ids=span_ids, positions=positions, block_size=block_size,
                         implementation=implementation, reduction="sum_heads"),
          head.span_loss(hidden_BLD, span_mask_BL, span_ids=head_ids, positions=positions, reduction="sum_heads"),
          tail.span_loss(hidden_BLD, span_mask_BL, span_ids=tail_ids, positions=positions, reduction="sum_heads"))


class GPLinkerHead(nnx.Module):
  """An entity pointer (E types, or subject/object roles) over (start, end), RoPE from `use_rope`, the triangular
  mask: the NER head. Per relation type a head pointer over (subject start, object start) and a tail pointer over
  (subject end, object end): no triangle (an object may precede its subject), RoPE from `pointer_rope`. Each pointer
  is an `EfficientGlobalPointer` (`efficient=True`, as Su) or a `GlobalPointer`.

  Loss: sparse ZLPR per pointer, summed over its heads and averaged over the batch; the mean of the three.
  The blockwise plan covers the upper triangle only, so the head and tail pointers always take the dense path
  (`pointer_loss_path`); the entity pointer may take the blockwise one.
  """

  pointer_loss_path = "dense"

  def __init__(
      self,
      hidden_size: int,
      num_entity_types: int,
      num_relations: int,
      *,
      head_size: int = 64,
      efficient: bool = True,
      use_rope: bool = True,
      pointer_rope: bool = False,
      max_span_width: int | None = None,
      rope_base: float = 10000.0,
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      rngs: nnx.Rngs,
  ):
    cls = EfficientGlobalPointer if efficient else GlobalPointer
    common = dict(head_size=head_size, rope_base=rope_base, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.num_entity_types = num_entity_types
    self.num_relations = num_relations
    self.entity_pointer = cls(hidden_size, num_entity_types, use_rope=use_rope, max_span_width=max_span_width,
                              **common)
    self.head_pointer = cls(hidden_size, num_relations, use_rope=pointer_rope, triangular=False, **common)
    self.tail_pointer = cls(hidden_size, num_relations, use_rope=pointer_rope, triangular=False, **common)

  def __call__(self, hidden_BLD, span_mask_BL, *, positions=None):
    """-> (entity `[B, E, L, L]`, head `[B, R, L, L]`, tail `[B, R, L, L]`) float32 scores; cells outside each
    pointer's mask hold the most negative finite float."""
    return tuple(p(hidden_BLD, span_mask_BL, positions=positions)
                 for p in (self.entity_pointer, self.head_pointer, self.tail_pointer))

  def losses(self, hidden_BLD, span_mask_BL, *, entity_ids, head_ids, tail_ids, positions=None, block_size=None,
             implementation="auto"):
    """{"entity", "head", "tail"}: each pointer's sparse ZLPR, summed over its heads, averaged over the batch.

    Gold cells as flat ids `i * L + j`, -1 padded: `entity_ids` int `[B, E, K]` (start, end), `head_ids` `[B, R, K]`
    (subject start, object start), `tail_ids` `[B, R, K]` (subject end, object end). `block_size` (and
    `implementation`) apply to the entity pointer only.
    """
    entity, head, tail = pointer_losses((self.entity_pointer, self.head_pointer, self.tail_pointer), hidden_BLD,
                                        span_mask_BL, ids=(entity_ids, head_ids, tail_ids), positions=positions,
                                        block_size=block_size, implementation=implementation)
    return {"entity": entity, "head": head, "tail": tail}

  def loss(self, hidden_BLD, span_mask_BL, *, entity_ids, head_ids, tail_ids, positions=None, block_size=None,
           implementation="auto"):
    """The mean of the three pointers' losses (`losses`)."""
    parts = self.losses(hidden_BLD, span_mask_BL, entity_ids=entity_ids, head_ids=head_ids, tail_ids=tail_ids,
                        positions=positions, block_size=block_size, implementation=implementation)
    return (parts["entity"] + parts["head"] + parts["tail"]) / 3

  def decode_hits(self, hidden_BLD, span_mask_BL, *, positions=None, sizes: tuple[int, int, int], threshold=0.0,
                  pointer_threshold=None, hit_sharding=None):
    """-> (entity hits, head hits, tail hits), each (count, coords `[size, 4]`, scores `[size]`) as
    `ops.gather_hits` gives them, in buffers of `sizes` (entity, head, tail); a count above its size means the
    buffer must grow. Head and tail cells only at decoded entity starts and ends (`ops.relation_hits`);
    `ops.assemble_triples` joins them on the host."""
    entity_BELL, head_BRLL, tail_BRLL = self(hidden_BLD, span_mask_BL, positions=positions)
    return relation_hits(
        entity_BELL, head_BRLL, tail_BRLL, entity_mask=self.entity_pointer.cell_mask(span_mask_BL),
        pointer_mask=self.head_pointer.cell_mask(span_mask_BL), sizes=tuple(sizes), threshold=threshold,
        pointer_threshold=pointer_threshold, hit_sharding=hit_sharding)


__all__ = ["GPLinkerHead", "pointer_losses"]
