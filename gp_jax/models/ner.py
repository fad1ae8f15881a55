"""Encoder + head: the NER model (built from a config by `gp_jax.factory.build_model`)."""

from __future__ import annotations

import inspect

import jax.numpy as jnp
from flax import nnx

from gp_jax.errors import UserError
from gp_jax.ops import span_mask, zlpr_loss

LOSS_KINDS = ("sparse_zlpr", "zlpr")  # loss.kind


class NerModel(nnx.Module):
  """Token encoder followed by a head. The head interface used by training and evaluation:

  `loss(batch)` -> scalar, and `decode_hits(batch, size=...)` -> hits in `ops.gather_hits` format
  ((count, coords [size, 4] as (row, type, start, end), scores [size])), so nothing outside the
  model assumes `[B, H, L, L]` logits. Span heads also give those logits through `__call__`.
  """

  def __init__(self, encoder: nnx.Module, head: nnx.Module, feature_names: tuple[str, ...], *,
               loss_implementation: str = "auto"):
    self.encoder = encoder
    self.head = head
    self.feature_names = tuple(feature_names)
    self.loss_implementation = loss_implementation  # blockwise span loss: 'auto', 'xla' or 'pallas'
    params = inspect.signature(type(encoder).__call__).parameters
    self._encoder_takes_positions = "positions" in params

  def encode(self, batch):
    """batch["embed_delta"] (optional, [B, L, encoder.embed_width]) is added to the encoder's word-embedding
    output (adversarial training, `gp_jax.steps`)."""
    kwargs = {name: batch[name] for name in self.feature_names}
    if self._encoder_takes_positions:
      kwargs["positions"] = batch["positions"]
    if "embed_delta" in batch:
      kwargs["embed_delta"] = batch["embed_delta"]
    return self.encoder(attention_mask=batch["attention_mask"], **kwargs)

  def __call__(self, batch):
    """Span heads: logits [B, H, L, L]; taggers: emissions [B, L, T]."""
    return self.head(self.encode(batch), batch["span_mask"], positions=batch["positions"])

  @property
  def is_tagger(self) -> bool:
    return hasattr(self.head, "tag_loss")

  def loss(self, batch, *, loss_kind: str = "sparse_zlpr", block_size: int | None = None):
    hidden_BLD = self.encode(batch)
    if self.is_tagger:
      return self.head.tag_loss(hidden_BLD, batch["span_mask"], tags_BL=batch["tags"])
    if loss_kind == "sparse_zlpr":
      return self.head.span_loss(hidden_BLD, batch["span_mask"], span_ids=batch["span_ids"],
                                 positions=batch["positions"], block_size=block_size,
                                 implementation=self.loss_implementation)
    if loss_kind == "zlpr":
      logits_BHLL = self.head(hidden_BLD, batch["span_mask"], positions=batch["positions"])
      return zlpr_loss(logits_BHLL, labels=dense_labels(batch["span_ids"], logits_BHLL.shape),
                       mask=span_mask(batch["span_mask"], max_span_width=self.head.max_span_width))
    raise UserError(f"loss.kind must be one of {LOSS_KINDS}, got {loss_kind!r}")

  def decode_hits(self, batch, *, size: int, block_size: int | None = None, threshold=0.0, hit_sharding=None):
    """Span heads keep cells with score > threshold; taggers ignore it."""
    return self.head.decode_hits(self.encode(batch), batch["span_mask"], positions=batch["positions"], size=size,
                                 block_size=block_size, threshold=threshold, hit_sharding=hit_sharding)


def dense_labels(span_ids_BHK, shape):
  """Flat positive ids `[B, H, K]` (-1 padded) -> {0, 1} labels of `shape` `[B, H, L, L]`."""
  B, H, L, _ = shape
  ids = span_ids_BHK
  labels = jnp.zeros((B, H, L * L), jnp.int32)
  labels = labels.at[jnp.arange(B)[:, None, None], jnp.arange(H)[None, :, None],
                     jnp.where(ids >= 0, ids, L * L)].set(1, mode="drop")
  return labels.reshape(shape)


class RelationModel(NerModel):
  """Encoder + `GPLinkerHead` (task=relations): `loss(batch)` reads `entity_ids`, `head_ids`, `tail_ids`;
  `decode_hits(batch, size=(e, h, t))` -> three hit buffers (entity, head, tail)."""

  def loss(self, batch, *, loss_kind: str = "sparse_zlpr", block_size: int | None = None):
    if loss_kind != "sparse_zlpr":
      raise ValueError(f"task=relations trains with loss.kind 'sparse_zlpr', got {loss_kind!r}")
    return self.head.loss(self.encode(batch), batch["span_mask"], entity_ids=batch["entity_ids"],
                          head_ids=batch["head_ids"], tail_ids=batch["tail_ids"], positions=batch["positions"],
                          block_size=block_size, implementation=self.loss_implementation)

  def decode_hits(self, batch, *, size, block_size: int | None = None, threshold=0.0, hit_sharding=None):
    """Entity cells with score > threshold, pointer cells at decoded entity starts / ends (`GPLinkerHead`)."""
    return self.head.decode_hits(self.encode(batch), batch["span_mask"], positions=batch["positions"],
                                 sizes=tuple(size), threshold=threshold, hit_sharding=hit_sharding)
