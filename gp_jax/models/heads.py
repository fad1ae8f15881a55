"""GlobalPointer span heads (flax.nnx)."""

from __future__ import annotations

import jax.numpy as jnp
from flax import nnx

from gp_jax import ops


def _mask_logits(logits_BHLL, mask_BL, max_span_width):
  mask_B1LL = ops.span_mask(mask_BL, max_span_width=max_span_width)
  return jnp.where(mask_B1LL, logits_BHLL, ops.masked_fill_value(logits_BHLL.dtype))


class _SpanHead(nnx.Module):
  """Settings shared by both heads."""

  def _setup(self, num_types, head_size, use_rope, max_span_width, rope_base):
    if head_size % 2:
      raise ValueError(f"head_size must be even for RoPE, got {head_size}")
    self.num_types = num_types
    self.head_size = head_size
    self.use_rope = use_rope
    self.max_span_width = max_span_width
    self.rope_base = rope_base

  def _rope(self, x, positions):
    return ops.apply_rope(x, positions=positions, base=self.rope_base) if self.use_rope else x


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
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      rngs: nnx.Rngs,
  ):
    self._setup(num_types, head_size, use_rope, max_span_width, rope_base)
    self.dense = nnx.Linear(
        hidden_size, num_types * 2 * head_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )

  def __call__(self, hidden_BLD, attention_mask_BL, *, positions=None):
    B, L, _ = hidden_BLD.shape
    qk_BLHE = self.dense(hidden_BLD).reshape(B, L, self.num_types, 2 * self.head_size)
    q_BLHD, k_BLHD = qk_BLHE[..., : self.head_size], qk_BLHE[..., self.head_size :]
    q_BLHD, k_BLHD = self._rope(q_BLHD, positions), self._rope(k_BLHD, positions)
    logits_BHLL = ops.span_scores(q_BLHD, k_BLHD)
    return _mask_logits(logits_BHLL, attention_mask_BL, self.max_span_width)


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
      dtype=jnp.float32,
      param_dtype=jnp.float32,
      rngs: nnx.Rngs,
  ):
    self._setup(num_types, head_size, use_rope, max_span_width, rope_base)
    self.dense = nnx.Linear(hidden_size, 2 * head_size, dtype=dtype, param_dtype=param_dtype, rngs=rngs)
    self.bias_dense = nnx.Linear(
        2 * head_size, 2 * num_types, dtype=dtype, param_dtype=param_dtype, rngs=rngs
    )

  def __call__(self, hidden_BLD, attention_mask_BL, *, positions=None):
    p_BLE = self.dense(hidden_BLD)
    q_BLD, k_BLD = p_BLE[..., 0::2], p_BLE[..., 1::2]
    q_BLD, k_BLD = self._rope(q_BLD, positions), self._rope(k_BLD, positions)
    shared_B1LL = ops.span_scores(q_BLD[:, :, None], k_BLD[:, :, None])
    bias_B2HL = jnp.swapaxes(self.bias_dense(p_BLE), 1, 2).astype(jnp.float32) / 2
    end_bias_BH1L = bias_B2HL[:, 0::2, None, :]
    start_bias_BHL1 = bias_B2HL[:, 1::2, :, None]
    logits_BHLL = shared_B1LL + start_bias_BHL1 + end_bias_BH1L
    return _mask_logits(logits_BHLL, attention_mask_BL, self.max_span_width)


HEADS = {"standard": GlobalPointer, "efficient": EfficientGlobalPointer}

__all__ = ["GlobalPointer", "EfficientGlobalPointer", "HEADS"]
