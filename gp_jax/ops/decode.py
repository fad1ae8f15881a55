"""Decoding: every (i, j, type) cell with score > threshold inside the mask.

Thresholding runs on device; only the hit coordinates (and scores) travel to the host.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np


def gather_hits(hit, logits, *, size: int):
  """Bool `[B, H, L, L]` hits -> (count, coords int `[size, 4]` as (b, type, start, end), scores `[size]`).

  A fixed-size buffer (jit-friendly); when `count > size` the extra hits are cut, so callers retry
  with a larger size. Unused rows hold coordinates 0 and are past `count`. Hits are in row-major
  order. Two stages: the rows (b, type, start) holding a hit, then the hits inside those rows, so
  `nonzero` never scans all B*H*L*L cells (on CPU that scan cost more than the model's forward pass).
  """
  B, H, L, M = hit.shape
  count = jnp.sum(hit, dtype=jnp.int32)
  rows_BHL = jnp.any(hit, axis=-1)
  # Every row holds >= 1 hit, so the first `size` hits lie in the first `size` rows. Symbolic shapes
  # (jax.export) cannot be compared with an int: there the buffer keeps `size` rows.
  n_rows = size if not isinstance(B * H * L, int) else min(size, B * H * L)
  b, h, i = jnp.nonzero(rows_BHL, size=n_rows, fill_value=0)
  row_ok = jnp.arange(n_rows) < jnp.sum(rows_BHL, dtype=jnp.int32)
  r, j = jnp.nonzero(hit[b, h, i] & row_ok[:, None], size=size, fill_value=0)
  ok = (jnp.arange(size) < count)[:, None]
  coords = jnp.where(ok, jnp.stack([b[r], h[r], i[r], j], axis=-1), 0)
  return count, coords, logits[coords[:, 0], coords[:, 1], coords[:, 2], coords[:, 3]]


@functools.partial(jax.jit, static_argnames=("size",))
def _hits(logits, mask, threshold, *, size: int):
  hit = (logits > threshold) & jnp.broadcast_to(jnp.asarray(mask, bool), logits.shape)
  return gather_hits(hit, logits, size=size)


def decode_hits(logits, *, mask, threshold: float = 0.0, initial_size: int | None = None):
  """Returns (coords int [N, 4] as (b, type, start, end), scores float [N]) of all hits, on host.

  The device buffer holds `initial_size` hits (default 64 per example); if more cells fire (an
  untrained model), it retries once with room for all of them. Sizes are powers of two, so only a
  handful of shapes are ever compiled.
  """
  B = logits.shape[0]
  total = int(np.prod(logits.shape))
  size = initial_size or 64 * B
  size = min(total, 1 << max(0, int(size - 1).bit_length()))
  count, coords, scores = _hits(logits, mask, jnp.float32(threshold), size=size)
  count = int(count)
  if count > size:
    size = min(total, 1 << int(count - 1).bit_length())
    count, coords, scores = _hits(logits, mask, jnp.float32(threshold), size=size)
    count = int(count)
  coords, scores = jax.device_get((coords, scores))
  return np.asarray(coords[:count]), np.asarray(scores[:count], dtype=np.float32)


__all__ = ["decode_hits", "gather_hits"]
