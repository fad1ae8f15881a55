"""GPLinker for events (Su, 2022): an argument pointer over (event type, role) classes and two link pointers over
one encoder (flax.nnx)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from gp_jax.models.gplinker import pointer_losses
from gp_jax.models.heads import EfficientGlobalPointer, GlobalPointer
from gp_jax.models.ner import NerModel
from gp_jax.ops.events import event_hits


class EventHead(nnx.Module):
  """The argument pointer: C classes, one per (event type, role) pair (the trigger a role), over (start, end), RoPE
  from `use_rope`, the triangular mask. The head and tail link pointers: one head each, over (start of one argument,
  start of the other) and (end, end) of two arguments of one event, stored at (min, max): upper triangle with the
  diagonal (nested arguments share a start), no width limit, RoPE from `pointer_rope` (Su: none). Each pointer is
  an `EfficientGlobalPointer` (`efficient=True`, as Su) or a `GlobalPointer`.

  Loss: sparse ZLPR per pointer, summed over its heads and averaged over the batch; the mean of the three. The link
  pointers take the dense path (`pointer_loss_path`; [B, 1, L, L] is small); the argument pointer may take the
  blockwise one.
  """

  pointer_loss_path = "dense"

  def __init__(
      self,
      hidden_size: int,
      num_classes: int,
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
    self.num_classes = num_classes
    self.argument_pointer = cls(hidden_size, num_classes, use_rope=use_rope, max_span_width=max_span_width,
                                **common)
    self.head_pointer = cls(hidden_size, 1, use_rope=pointer_rope, **common)
    self.tail_pointer = cls(hidden_size, 1, use_rope=pointer_rope, **common)

  @property
  def max_span_width(self):
    return self.argument_pointer.max_span_width

  def __call__(self, hidden_BLD, span_mask_BL, *, positions=None):
    """-> (argument `[B, C, L, L]`, head `[B, 1, L, L]`, tail `[B, 1, L, L]`) float32 scores; cells outside each
    pointer's mask hold the most negative finite float."""
    return tuple(p(hidden_BLD, span_mask_BL, positions=positions)
                 for p in (self.argument_pointer, self.head_pointer, self.tail_pointer))

  def losses(self, hidden_BLD, span_mask_BL, *, argument_ids, head_ids, tail_ids, positions=None, block_size=None,
             implementation="auto"):
    """{"argument", "head", "tail"}: each pointer's sparse ZLPR, summed over its heads, averaged over the batch.

    Gold cells as flat ids `i * L + j`, -1 padded: `argument_ids` int `[B, C, K]` (start, end), `head_ids` `[B, 1, K]`
    (the two arguments' starts, i <= j), `tail_ids` `[B, 1, K]` (their ends). `block_size` (and `implementation`)
    apply to the argument pointer only.
    """
    argument, head, tail = pointer_losses((self.argument_pointer, self.head_pointer, self.tail_pointer), hidden_BLD,
                                          span_mask_BL, ids=(argument_ids, head_ids, tail_ids), positions=positions,
                                          block_size=block_size, implementation=implementation)
    return {"argument": argument, "head": head, "tail": tail}

  def loss(self, hidden_BLD, span_mask_BL, *, argument_ids, head_ids, tail_ids, positions=None, block_size=None,
           implementation="auto"):
    """The mean of the three pointers' losses (`losses`)."""
    parts = self.losses(hidden_BLD, span_mask_BL, argument_ids=argument_ids, head_ids=head_ids, tail_ids=tail_ids,
                        positions=positions, block_size=block_size, implementation=implementation)
    return (parts["argument"] + parts["head"] + parts["tail"]) / 3

  def decode_hits(self, hidden_BLD, span_mask_BL, *, positions=None, sizes: tuple[int, int, int], threshold=0.0,
                  link_threshold=None, hit_sharding=None):
    """-> (argument hits, head-link hits, tail-link hits), each (count, coords `[size, 4]`, scores `[size]`) in
    buffers of `sizes`; a count above its size means the buffer must grow. Link cells only between decoded
    arguments' starts / ends (`ops.events.event_hits`); `tasks.events.cliques.group_events` makes the events."""
    argument_BCLL, head_B1LL, tail_B1LL = self(hidden_BLD, span_mask_BL, positions=positions)
    return event_hits(
        argument_BCLL, head_B1LL, tail_B1LL, argument_mask=self.argument_pointer.cell_mask(span_mask_BL),
        link_mask=self.head_pointer.cell_mask(span_mask_BL), sizes=tuple(sizes), threshold=threshold,
        link_threshold=link_threshold, hit_sharding=hit_sharding)


class EventModel(NerModel):
  """Encoder + `EventHead` (task=events): `loss(batch)` reads `argument_ids`, `head_ids`, `tail_ids`;
  `decode_hits(batch, size=(a, h, t))` -> three hit buffers (argument, head link, tail link)."""

  def loss(self, batch, *, loss_kind: str = "sparse_zlpr", block_size: int | None = None):
    if loss_kind != "sparse_zlpr":
      raise ValueError(f"task=events trains with loss.kind 'sparse_zlpr', got {loss_kind!r}")
    return self.head.loss(self.encode(batch), batch["span_mask"], argument_ids=batch["argument_ids"],
                          head_ids=batch["head_ids"], tail_ids=batch["tail_ids"], positions=batch["positions"],
                          block_size=block_size, implementation=self.loss_implementation)

  def decode_hits(self, batch, *, size, block_size: int | None = None, threshold=0.0, hit_sharding=None):
    """Argument cells with score > threshold, link cells between decoded arguments (`EventHead.decode_hits`);
    `block_size` is not used (decoding is dense)."""
    return self.head.decode_hits(self.encode(batch), batch["span_mask"], positions=batch["positions"],
                                 sizes=tuple(size), threshold=threshold, hit_sharding=hit_sharding)


__all__ = ["EventHead", "EventModel"]
