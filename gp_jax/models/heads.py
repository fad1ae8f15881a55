"""GlobalPointer span heads (flax.nnx)."""

from __future__ import annotations

import functools
import logging
import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import PartitionSpec as P

from gp_jax import ops
from gp_jax.sharding import BATCH_AXES
from gp_jax.models.layers import linear


def _mask_logits(logits_BHLL, mask_B1LL):
  return jnp.where(mask_B1LL, logits_BHLL, ops.masked_fill_value(logits_BHLL.dtype))


def _batch_sharded(loss, inputs):
  """`loss(**inputs)` (a mean over the batch) per batch shard under `jax.shard_map` over the context mesh's batch
  axes, the shard means averaged again: Pallas kernels are not auto-partitioned. No mesh set, or a batch that does
  not split evenly: one call on the whole batch."""
  mesh = jax.sharding.get_abstract_mesh()
  axes = tuple(a for a in BATCH_AXES if a in mesh.axis_names)
  shards = math.prod(mesh.shape[a] for a in axes)
  inputs = {name: x for name, x in inputs.items() if x is not None}
  if shards <= 1 or inputs["q_BLHD"].shape[0] % shards:
    if mesh.empty and jax.device_count() > 1:  # correct, but a Mosaic kernel then is not split by batch
      logging.getLogger(__name__).warning("Pallas span loss on %d devices without a context mesh (jax.set_mesh, "
                                          "steps.under_mesh): not batch-sharded",
                                          jax.device_count())
    return loss(**inputs)
  spec = P(axes)
  per_shard = lambda x: jax.lax.pmean(loss(**x), axes)  # noqa: E731  equal shards: the mean of their means
  # check_vma=False: pallas_call outputs carry no varying-axes type.
  return jax.shard_map(per_shard, mesh=mesh, in_specs=({n: spec for n in inputs},), out_specs=P(),
                       check_vma=False)(inputs)


class _SpanHead(nnx.Module):
  """Settings and methods shared by both heads; each head defines `project` (q, k, optional biases)."""

  def _setup(self, num_types, head_size, use_rope, max_span_width, rope_base, triangular):
    if head_size % 2:
      raise ValueError(f"head_size must be even for RoPE, got {head_size}")
    self.num_types = num_types
    self.head_size = head_size
    self.use_rope = use_rope
    self.max_span_width = max_span_width
    self.rope_base = rope_base
    self.triangular = triangular  # False: every (i, j) cell of valid tokens (GPLinker's head and tail pointers)

  def cell_mask(self, attention_mask_BL):
    """bool `[B, 1, L, L]`: the cells this head scores (`ops.span_mask` with its width and triangle)."""
    return ops.span_mask(attention_mask_BL, max_span_width=self.max_span_width, triangular=self.triangular)

  def _check_blockwise(self, block_size):
    if block_size is not None and not self.triangular:
      raise ValueError("the blockwise plan covers the upper triangle only: a head with triangular=False takes the "
                       "dense path (block_size=None)")

  def _rope(self, x, positions):
    return ops.apply_rope(x, positions=positions, base=self.rope_base) if self.use_rope else x

  def project(self, hidden_BLD, *, positions=None):
    """-> (q_BLHD, k_BLHD, start_bias_BHL | None, end_bias_BHL | None); q, k rotated, H or 1 heads."""
    raise NotImplementedError

  def __call__(self, hidden_BLD, attention_mask_BL, *, positions=None):
    q_BLHD, k_BLHD, start_bias_BHL, end_bias_BHL = self.project(hidden_BLD, positions=positions)
    logits_BHLL = ops.span_scores(q_BLHD, k_BLHD)
    if start_bias_BHL is not None:
      logits_BHLL = logits_BHLL + start_bias_BHL[..., :, None]
    if end_bias_BHL is not None:
      logits_BHLL = logits_BHLL + end_bias_BHL[..., None, :]
    return _mask_logits(logits_BHLL, self.cell_mask(attention_mask_BL))

  def span_loss(self, hidden_BLD, attention_mask_BL, *, span_ids, positions=None, block_size=None,
                implementation="auto", reduction="mean"):
    """Sparse ZLPR loss (mean over B*H); `span_ids` int `[B, H, K]` flat `i * L + j`, -1 padded.

    `block_size=None`: dense `[B, H, L, L]` logits. An int: `ops.blockwise_zlpr_loss` (banded when
    `max_span_width` is set), same value without the score tensor, computed by `implementation`; the Pallas
    kernel runs under `jax.shard_map` over the batch axes of the context mesh (`jax.set_mesh`) when there is one.
    `reduction="sum_heads"`: summed over the H types, averaged over the batch (GPLinker).
    """
    self._check_blockwise(block_size)
    if block_size is None:
      mask_B1LL = self.cell_mask(attention_mask_BL)
      logits_BHLL = self(hidden_BLD, attention_mask_BL, positions=positions)
      return ops.sparse_zlpr_loss(logits_BHLL, span_ids=span_ids, mask=mask_B1LL, reduction=reduction)
    if reduction not in ("mean", "sum_heads"):
      raise ValueError(f"reduction must be 'mean' or 'sum_heads', got {reduction!r}")
    q_BLHD, k_BLHD, start_bias_BHL, end_bias_BHL = self.project(hidden_BLD, positions=positions)
    loss = functools.partial(ops.blockwise_zlpr_loss, max_span_width=self.max_span_width, block_size=block_size,
                             implementation=implementation)
    inputs = dict(q_BLHD=q_BLHD, k_BLHD=k_BLHD, span_ids=span_ids, attention_mask=attention_mask_BL,
                  start_bias_BHL=start_bias_BHL, end_bias_BHL=end_bias_BHL)
    mean = _batch_sharded(loss, inputs) if implementation == "pallas" else loss(**inputs)
    return mean * self.num_types if reduction == "sum_heads" else mean

  def decode_hits(
      self, hidden_BLD, attention_mask_BL, *, positions=None, size: int, block_size=None, threshold=0.0,
      hit_sharding=None,
  ):
    """Cells with score > threshold in the span mask -> `ops.gather_hits` format (count, coords, scores).

    `block_size=None`: from dense logits; an int: `ops.blockwise_decode_hits`. `count` may exceed `size`.
    """
    self._check_blockwise(block_size)
    if block_size is None:
      logits_BHLL = self(hidden_BLD, attention_mask_BL, positions=positions)
      hit = (logits_BHLL > threshold) & self.cell_mask(attention_mask_BL)
      if hit_sharding is not None:
        hit = jax.lax.with_sharding_constraint(hit, hit_sharding)
      return ops.gather_hits(hit, logits_BHLL, size=size)
    q_BLHD, k_BLHD, start_bias_BHL, end_bias_BHL = self.project(hidden_BLD, positions=positions)
    return ops.blockwise_decode_hits(
        q_BLHD, k_BLHD, attention_mask=attention_mask_BL, start_bias_BHL=start_bias_BHL,
        end_bias_BHL=end_bias_BHL, max_span_width=self.max_span_width, block_size=block_size, size=size,
        threshold=threshold, hit_sharding=hit_sharding,
    )


class GlobalPointer(_SpanHead):
  """Per-type q/k projections, RoPE, scaled dot-product span scores.

  One Dense `hidden_size -> num_types * 2 * head_size` (+bias); for type h the channels
  `[h, :head_size]` are q and `[h, head_size:]` are k. Parameters: `hidden*2*H*d + 2*H*d`.
  Logits are float32; cells outside the span mask hold the most negative finite float.
  """

  def __init__(
      self,
      hidden_size: int,
      num_types: int,
      *,
      head_size: int = 64,
      use_rope: bool = True,
      max_span_width: int | None = None,
      rope_base: float = 10000.0,
      triangular: bool = True,
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      rngs: nnx.Rngs,
  ):
    self._setup(num_types, head_size, use_rope, max_span_width, rope_base, triangular)
    self.dense = linear(hidden_size, num_types * 2 * head_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def project(self, hidden_BLD, *, positions=None):
    B, L, _ = hidden_BLD.shape
    qk_BLHE = self.dense(hidden_BLD).reshape(B, L, self.num_types, 2 * self.head_size)
    q_BLHD, k_BLHD = qk_BLHE[..., : self.head_size], qk_BLHE[..., self.head_size :]
    return self._rope(q_BLHD, positions), self._rope(k_BLHD, positions), None, None


class EfficientGlobalPointer(_SpanHead):
  """One shared q/k projection plus per-type start/end biases (Su, "Efficient GlobalPointer").

  Dense `hidden -> 2*d` gives p; q = p[..., 0::2], k = p[..., 1::2] (RoPE on both). A Dense
  `2*d -> 2*H` on p (before RoPE), halved, gives per-type biases: channels `1::2` on the start
  position i, channels `0::2` on the end position j. Parameters: `hidden*2*d + 2*d + 2*d*2*H + 2*H`.
  """

  def __init__(
      self,
      hidden_size: int,
      num_types: int,
      *,
      head_size: int = 64,
      use_rope: bool = True,
      max_span_width: int | None = None,
      rope_base: float = 10000.0,
      triangular: bool = True,
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      rngs: nnx.Rngs,
  ):
    self._setup(num_types, head_size, use_rope, max_span_width, rope_base, triangular)
    self.dense = linear(hidden_size, 2 * head_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.bias_dense = linear(2 * head_size, 2 * num_types, dtype=dtype, param_dtype=param_dtype, rngs=rngs)

  def project(self, hidden_BLD, *, positions=None):
    """q, k `[B, L, 1, d]` (one shared head) and `[B, H, L]` start/end biases."""
    p_BLE = self.dense(hidden_BLD)
    q_BLD, k_BLD = p_BLE[..., 0::2], p_BLE[..., 1::2]
    q_BLD, k_BLD = self._rope(q_BLD, positions), self._rope(k_BLD, positions)
    bias_B2HL = jnp.swapaxes(self.bias_dense(p_BLE), 1, 2).astype(jnp.float32) / 2
    return q_BLD[:, :, None], k_BLD[:, :, None], bias_B2HL[:, 1::2], bias_B2HL[:, 0::2]


HEADS = {"standard": GlobalPointer, "efficient": EfficientGlobalPointer}

__all__ = ["GlobalPointer", "EfficientGlobalPointer", "HEADS"]
