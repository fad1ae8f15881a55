"""Span scores and span masks for GlobalPointer."""

from __future__ import annotations

import math

import jax.numpy as jnp
from jax import lax


def span_scores(q, k):
  """`[B, L, H, d]` x2 -> `[B, H, L, L]` with s[b,h,i,j] = q[b,i,h] . k[b,j,h] / sqrt(d), float32."""
  if q.shape != k.shape or q.ndim != 4:
    raise ValueError(f"span_scores expects q, k of equal shape [B, L, H, d], got {q.shape} and {k.shape}")
  d = q.shape[-1]
  s_BHLL = jnp.einsum("bihd,bjhd->bhij", q, k, preferred_element_type=jnp.float32)
  return s_BHLL / math.sqrt(d)


def span_mask(attention_mask, *, max_span_width: int | None = None, triangular: bool = True):
  """`[B, L]` {0,1} -> bool `[B, 1, L, L]`: i <= j, both tokens valid, and j - i < max_span_width.

  `triangular=False` (GPLinker's head and tail pointers, where an object may precede its subject): every cell whose
  row and column tokens are valid, and |j - i| < max_span_width.
  """
  valid_BL = jnp.asarray(attention_mask).astype(bool)
  if not triangular and max_span_width is None:
    return (valid_BL[:, :, None] & valid_BL[:, None, :])[:, None]
  length = valid_BL.shape[-1]
  i = lax.broadcasted_iota(jnp.int32, (length, length), 0)  # also for a symbolic length (jax.export)
  j = lax.broadcasted_iota(jnp.int32, (length, length), 1)
  if triangular:
    allowed_LL = j >= i
    if max_span_width is not None:
      allowed_LL &= (j - i) < max_span_width
  else:
    allowed_LL = jnp.abs(j - i) < max_span_width
  mask_BLL = valid_BL[:, :, None] & valid_BL[:, None, :] & allowed_LL
  return mask_BLL[:, None]


def masked_fill_value(dtype):
  """The value written into masked cells: the dtype's most negative finite number (no 1e12)."""
  return jnp.finfo(dtype).min


__all__ = ["span_scores", "span_mask", "masked_fill_value"]
