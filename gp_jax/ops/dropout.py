"""Dropout for the BERT encoder (the scratch encoder keeps `nnx.Dropout`): `dropout(module, x)` is `module(x)` for an
`nnx.Dropout` (same rate, RNG stream, train/eval switch, kept values scaled by 1 / (1 - rate)) with the mask
drawn from one of two bit sources:

- "hash": per call, two key words from one threefry draw of the module's stream (or given: `dropout_words` draws
  every mask's words of a step at once); per element,
  `lowbias32(lowbias32(i + k0) ^ k1)` of its flat index i (two rounds of Wellons' lowbias32 integer hash), a
  32-bit uniform; dropped when below round(rate * 2^32). Ten integer ops per element, so XLA fuses the mask
  into the ops around it, where a threefry mask costs a whole Threefry-2x32 call, 20 rounds, per element
  (measurements: docs/design.md, "Process settings").
- "threefry": `jax.random.bits` (JAX's PRNG, whatever implementation the key has), 16 bits per draw.
  Drop probability round(rate * 2^16) / 2^16 (0.1 -> 0.100006).

The BERT encoder passes `model.dropout_bits` as resolved for its target (`runtime.resolve_dropout_bits`: threefry on
TPU, hash elsewhere, GP_JAX_DROPOUT_BITS overriding); without it `runtime.dropout_bits()` resolves at trace time.
Arrays of 2^32 elements or more always use threefry.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import runtime

LOWBIAS32 = (0x7FEB352D, 0x846CA68B)


def lowbias32(h: jax.Array) -> jax.Array:
  """Wellons' lowbias32 finaliser on uint32: xorshift 16, multiply, xorshift 15, multiply, xorshift 16."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(LOWBIAS32[0])
  h = h ^ (h >> 15)
  h = h * jnp.uint32(LOWBIAS32[1])
  return h ^ (h >> 16)


def hash_keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """bool mask of `shape`, True with probability 1 - round(rate * 2^32) / 2^32, from the hash source."""
  return hash_keep_mask_from_words(jax.random.bits(key, (2,), jnp.uint32), shape, rate)


def hash_keep_mask_from_words(k: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """`hash_keep_mask` with its two key words `k` (uint32 [2]) given: words drawn for many masks at once cost one
  threefry call instead of one per mask (`dropout_words`)."""
  i = jax.lax.iota(jnp.uint32, math.prod(shape)).reshape(shape)
  u = lowbias32(lowbias32(i + k[0]) ^ k[1])
  return u >= jnp.uint32(min(round(rate * 2 ** 32), 2 ** 32 - 1))


def threefry_keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> jax.Array:
  """bool mask of `shape`, True with probability 1 - round(rate * 2^16) / 2^16, two draws per 32-bit word."""
  n = math.prod(shape)
  words = jax.random.bits(key, ((n + 1) // 2,), jnp.uint32)
  u16 = jax.lax.bitcast_convert_type(words, jnp.uint16).reshape(-1)
  u16 = (u16 if 2 * words.shape[0] == n else u16[:n]).reshape(shape)
  return u16 >= jnp.uint16(min(round(rate * 65536), 65535))


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float, bits: str | None = None) -> jax.Array:
  """The mask `dropout` applies; `bits` as `runtime.dropout_bits()` when None."""
  bits = bits or runtime.dropout_bits()
  if bits == "hash" and math.prod(shape) < 2 ** 32:
    return hash_keep_mask(key, shape, rate)
  return threefry_keep_mask(key, shape, rate)


def dropout(module: nnx.Dropout, x: jax.Array, bits: str | None = None, *, words: jax.Array | None = None
            ) -> jax.Array:
  """`module(x)` with the mask from `keep_mask` (the module's rate, stream and deterministic flag); with `words`
  (uint32 [2], from `dropout_words`) the hash mask of those key words, the module's stream left alone."""
  rate = float(module.rate)
  if module.deterministic or rate == 0.0:
    return x
  if rate == 1.0:
    return jnp.zeros_like(x)
  if words is not None and math.prod(x.shape) < 2 ** 32:
    keep = hash_keep_mask_from_words(words, x.shape, rate)
  else:
    keep = keep_mask(module.rngs(), x.shape, rate, bits)
  return jax.lax.select(keep, x / jnp.asarray(1.0 - rate, x.dtype), jnp.zeros_like(x))


def dropout_words(module: nnx.Dropout, n: int) -> jax.Array:
  """uint32 [n, 2]: the key words of n hash masks from one draw of `module`'s stream (one threefry call where n calls
  of `dropout` would make n: on a GPU each is a handful of scalar kernels)."""
  return jax.random.bits(module.rngs(), (n, 2), jnp.uint32)
