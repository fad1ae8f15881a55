"""Rotary position embedding (RoPE) on interleaved channel pairs."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def rope_angles(positions, dim: int, *, base: float = 10000.0):
  """Angles m * base**(-2t/dim), float32, shape positions.shape + (dim // 2,)."""
  inv_freq_T = base ** (-jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
  return jnp.asarray(positions, jnp.float32)[..., None] * inv_freq_T


def apply_rope(x, *, positions=None, base: float = 10000.0):
  """Rotates each channel pair (x[2t], x[2t+1]) by the angle m * base**(-2t/d).

  Args:
    x: `[B, L, H, d]` or `[B, L, d]`, d even.
    positions: `[B, L]` or `[L]` token positions; default 0..L-1. Offsets (sliding windows) are fine:
      scores only see differences of positions.
    base: RoPE base.

  Returns:
    Array of x's shape and dtype. Angles and the rotation are computed in float32.
  """
  if x.ndim not in (3, 4):
    raise ValueError(f"apply_rope expects [B, L, d] or [B, L, H, d], got shape {x.shape}")
  d = x.shape[-1]
  if d % 2:
    raise ValueError(f"apply_rope needs an even last dimension, got {d}")
  length = x.shape[1]
  if positions is None:
    positions = jnp.arange(length)
  positions = jnp.asarray(positions)
  if positions.ndim == 1:
    positions = positions[None, :]
  angles_BLT = rope_angles(positions, d, base=base)
  if x.ndim == 4:
    angles_BLT = angles_BLT[:, :, None, :]
  cos, sin = jnp.cos(angles_BLT), jnp.sin(angles_BLT)
  x32 = x.astype(jnp.float32)
  x_even, x_odd = x32[..., 0::2], x32[..., 1::2]
  rot_even = x_even * cos - x_odd * sin
  rot_odd = x_odd * cos + x_even * sin
  out = jnp.stack([rot_even, rot_odd], axis=-1).reshape(x.shape)
  return out.astype(x.dtype)


__all__ = ["apply_rope", "rope_angles"]
del jax
