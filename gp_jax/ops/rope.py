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
  # Per channel: cos_c = cos(theta_t), sin_c = -sin(theta_t) on 2t and +sin(theta_t) on 2t + 1, so that
  # out = x * cos_c + swap_pairs(x) * sin_c (the same float ops as the pairwise formula).
  cos_T, sin_T = jnp.cos(angles_BLT), jnp.sin(angles_BLT)
  cos_C = jnp.repeat(cos_T, 2, axis=-1)
  sin_C = jnp.stack([-sin_T, sin_T], axis=-1).reshape(sin_T.shape[:-1] + (d,))
  return _rotate(x, cos_C, sin_C)


def _swap_pairs(x):
  """(x[2t], x[2t+1]) -> (x[2t+1], x[2t]) on the last axis."""
  return x.reshape(x.shape[:-1] + (x.shape[-1] // 2, 2))[..., ::-1].reshape(x.shape)


@jax.custom_vjp
def _rotate(x, cos_C, sin_C):
  x32 = x.astype(jnp.float32)
  return (x32 * cos_C + _swap_pairs(x32) * sin_C).astype(x.dtype)


def _rotate_fwd(x, cos_C, sin_C):
  return _rotate(x, cos_C, sin_C), (x, cos_C, sin_C)


def _rotate_bwd(res, g):
  # The transpose of a rotation is the rotation by -theta (autodiff would build strided pads instead).
  x, cos_C, sin_C = res
  g32, x32 = g.astype(jnp.float32), x.astype(jnp.float32)
  dx = (g32 * cos_C - _swap_pairs(g32) * sin_C).astype(x.dtype)
  return dx, _sum_to(g32 * x32, cos_C.shape), _sum_to(g32 * _swap_pairs(x32), sin_C.shape)


def _sum_to(x, shape):
  """Sums the broadcast axes of x back to `shape` (same rank)."""
  axes = tuple(a for a, (n, m) in enumerate(zip(x.shape, shape)) if m == 1 and n != 1)
  return jnp.sum(x, axis=axes, keepdims=True) if axes else x


_rotate.defvjp(_rotate_fwd, _rotate_bwd)


__all__ = ["apply_rope", "rope_angles"]
