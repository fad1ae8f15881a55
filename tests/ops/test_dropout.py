"""ops.dropout: the hash bits against a NumPy lowbias32 written from its formula, drop rates and independence
(binomial and chi-square bounds), both bit sources, the train/eval switch, the gradient, the source switch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax import runtime
from gp_jax.ops import dropout as dropout_lib


def lowbias32_reference(h):
  """Wellons' lowbias32: h ^= h >> 16; h *= 0x7feb352d; h ^= h >> 15; h *= 0x846ca68b; h ^= h >> 16 (mod 2^32)."""
  h = np.asarray(h, np.uint64)
  m = np.uint64(0xFFFFFFFF)
  h ^= h >> np.uint64(16)
  h = (h * np.uint64(0x7FEB352D)) & m
  h ^= h >> np.uint64(15)
  h = (h * np.uint64(0x846CA68B)) & m
  h ^= h >> np.uint64(16)
  return h


def test_lowbias32_known_values():
  # The reference and the op against a second route: Python ints masked to 32 bits.
  def by_ints(h):
    h ^= h >> 16
    h = (h * 0x7FEB352D) & 0xFFFFFFFF
    h ^= h >> 15
    h = (h * 0x846CA68B) & 0xFFFFFFFF
    return h ^ (h >> 16)

  xs = np.array([0, 1, 2, 0xFFFFFFFF, 0x12345678, 0x80000000], np.uint32)
  want = np.array([by_ints(int(x)) for x in xs], np.uint64)
  np.testing.assert_array_equal(lowbias32_reference(xs), want)
  np.testing.assert_array_equal(np.asarray(dropout_lib.lowbias32(jnp.asarray(xs))).astype(np.uint64), want)


def test_hash_mask_is_the_formula():
  key = jax.random.key(7)
  shape, rate = (3, 5, 17), 0.3
  k = np.asarray(jax.random.bits(key, (2,), jnp.uint32)).astype(np.uint64)
  i = np.arange(np.prod(shape), dtype=np.uint64)
  u = lowbias32_reference(lowbias32_reference((i + k[0]) & np.uint64(0xFFFFFFFF)) ^ k[1])
  want = (u >= round(rate * 2 ** 32)).reshape(shape)
  got = np.asarray(dropout_lib.hash_keep_mask(key, shape, rate))
  np.testing.assert_array_equal(got, want)
  assert 0 < got.sum() < got.size


def _chi2_2x2(a, b):
  """Pearson chi-square of the 2x2 table of two boolean arrays (independence: ~chi2(1), 99.99% below 15.1)."""
  table = np.array([[np.sum(a & b), np.sum(a & ~b)], [np.sum(~a & b), np.sum(~a & ~b)]], np.float64)
  expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
  return float(np.sum((table - expected) ** 2 / expected))


@pytest.mark.parametrize("bits", ["hash", "threefry"])
@pytest.mark.parametrize("rate", [0.1, 0.5, 0.9])
def test_drop_rate_and_independence(bits, rate):
  shape = (8, 256, 256)
  k1, k2 = jax.random.split(jax.random.key(3))
  keep = np.asarray(dropout_lib.keep_mask(k1, shape, rate, bits))
  other = np.asarray(dropout_lib.keep_mask(k2, shape, rate, bits))
  n = keep.size
  resolution = 2 ** 32 if bits == "hash" else 2 ** 16
  p_drop = round(rate * resolution) / resolution
  sigma = np.sqrt(n * p_drop * (1 - p_drop))
  assert abs((n - keep.sum()) - n * p_drop) < 5 * sigma
  # Neighbours along each axis, far-apart flat indices, and another key's mask are independent.
  assert _chi2_2x2(keep[..., 1:], keep[..., :-1]) < 15.1
  assert _chi2_2x2(keep[:, 1:], keep[:, :-1]) < 15.1
  assert _chi2_2x2(keep[1:], keep[:-1]) < 15.1
  assert _chi2_2x2(keep, other) < 15.1
  assert not np.array_equal(keep, other)


def test_hash_bits_are_balanced():
  key = jax.random.key(11)
  k = jax.random.bits(key, (2,), jnp.uint32)
  i = jax.lax.iota(jnp.uint32, 1 << 20)
  u = np.asarray(dropout_lib.lowbias32(dropout_lib.lowbias32(i + k[0]) ^ k[1]))
  ones = np.array([np.mean((u >> b) & 1) for b in range(32)])
  assert np.all(np.abs(ones - 0.5) < 5 * 0.5 / np.sqrt(u.size)), ones


@pytest.mark.parametrize("bits", ["hash", "threefry"])
def test_dropout_module_semantics(bits):
  x = jnp.asarray(np.random.default_rng(0).uniform(1.0, 2.0, (4, 33, 7)), jnp.float32)
  module = nnx.Dropout(0.25, rngs=nnx.Rngs(dropout=5))
  a = np.asarray(dropout_lib.dropout(module, x, bits))
  b = np.asarray(dropout_lib.dropout(module, x, bits))
  assert not np.array_equal(a, b)  # the stream advances
  kept = a != 0
  np.testing.assert_allclose(a[kept], np.asarray(x)[kept] / 0.75, rtol=1e-6)
  # Reproducible: the same stream state gives the same mask.
  again = nnx.Dropout(0.25, rngs=nnx.Rngs(dropout=5))
  np.testing.assert_array_equal(np.asarray(dropout_lib.dropout(again, x, bits)), a)
  # Gradient through `dropout` itself, same stream state: the mask over (1 - rate).
  g = jax.grad(lambda v: jnp.sum(dropout_lib.dropout(nnx.Dropout(0.25, rngs=nnx.Rngs(dropout=5)), v, bits)))(x)
  np.testing.assert_allclose(np.asarray(g), kept / 0.75, rtol=1e-6)
  module.eval()
  np.testing.assert_array_equal(np.asarray(dropout_lib.dropout(module, x, bits)), np.asarray(x))
  ones = nnx.Dropout(1.0, rngs=nnx.Rngs(dropout=0))
  assert not np.asarray(dropout_lib.dropout(ones, x, bits)).any()
  zero = nnx.Dropout(0.0, rngs=nnx.Rngs(dropout=0))
  np.testing.assert_array_equal(np.asarray(dropout_lib.dropout(zero, x, bits)), np.asarray(x))


def test_source_switch(monkeypatch):
  monkeypatch.delenv("GP_JAX_DROPOUT_BITS", raising=False)
  assert runtime.dropout_bits() == ("hash" if jax.default_backend() == "cpu" else "threefry")
  for value in ("hash", "threefry", " Threefry "):
    monkeypatch.setenv("GP_JAX_DROPOUT_BITS", value)
    assert runtime.dropout_bits() == value.strip().lower()
  monkeypatch.setenv("GP_JAX_DROPOUT_BITS", "philox")
  with pytest.raises(ValueError, match="GP_JAX_DROPOUT_BITS must be one of auto, hash, threefry; got 'philox'"):
    runtime.dropout_bits()
  # The source decides the mask: same key, different bits.
  key = jax.random.key(0)
  assert not np.array_equal(np.asarray(dropout_lib.keep_mask(key, (64, 64), 0.5, "hash")),
                            np.asarray(dropout_lib.keep_mask(key, (64, 64), 0.5, "threefry")))


@pytest.mark.parametrize("bits", ["hash", "threefry"])
def test_mask_does_not_depend_on_the_mesh(bits):
  # The same key gives the same mask whether the array is whole or split across devices (batch and feature axes).
  x = jnp.asarray(np.random.default_rng(1).uniform(1.0, 2.0, (8, 16, 24)), jnp.float32)
  key = jax.random.key(4)
  apply = jax.jit(lambda v: jax.lax.select(dropout_lib.keep_mask(key, v.shape, 0.3, bits), v, jnp.zeros_like(v)))
  whole = np.asarray(apply(x))
  mesh = jax.make_mesh((4, 2), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  spec = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("data", None, "model"))
  split = apply(jax.device_put(x, spec))
  assert len(split.sharding.device_set) == 8
  np.testing.assert_array_equal(np.asarray(split), whole)


def test_mask_from_given_words_is_the_formula():
  # `hash_keep_mask` is `hash_keep_mask_from_words` of its key's two words; given words follow the same formula.
  shape, rate = (4, 9, 13), 0.2
  key = jax.random.key(9)
  words = jax.random.bits(key, (2,), jnp.uint32)
  np.testing.assert_array_equal(np.asarray(dropout_lib.hash_keep_mask_from_words(words, shape, rate)),
                                np.asarray(dropout_lib.hash_keep_mask(key, shape, rate)))
  k = np.array([0x12345678, 0x9ABCDEF0], np.uint64)
  i = np.arange(np.prod(shape), dtype=np.uint64)
  want = (lowbias32_reference(lowbias32_reference((i + k[0]) & np.uint64(0xFFFFFFFF)) ^ k[1])
          >= round(rate * 2 ** 32)).reshape(shape)
  got = dropout_lib.hash_keep_mask_from_words(jnp.asarray(k.astype(np.uint32)), shape, rate)
  np.testing.assert_array_equal(np.asarray(got), want)


def test_dropout_with_words_leaves_the_stream_alone():
  x = jnp.asarray(np.random.default_rng(2).uniform(1.0, 2.0, (6, 40)), jnp.float32)
  module = nnx.Dropout(0.3, rngs=nnx.Rngs(dropout=1))
  words = dropout_lib.dropout_words(module, 5)  # one draw of the stream for five masks
  assert words.shape == (5, 2) and words.dtype == jnp.uint32 and len({tuple(w) for w in np.asarray(words)}) == 5
  count = int(module.rngs.count.value)
  a = np.asarray(dropout_lib.dropout(module, x, "hash", words=words[0]))
  assert int(module.rngs.count.value) == count
  keep = np.asarray(dropout_lib.hash_keep_mask_from_words(words[0], x.shape, 0.3))
  np.testing.assert_allclose(a, np.where(keep, np.asarray(x) / 0.7, 0.0), rtol=1e-6)
  assert not np.array_equal(a, np.asarray(dropout_lib.dropout(module, x, "hash", words=words[1])))
  g = jax.grad(lambda v: jnp.sum(dropout_lib.dropout(module, v, "hash", words=words[0])))(x)
  np.testing.assert_allclose(np.asarray(g), keep / 0.7, rtol=1e-6)
  module.eval()
  np.testing.assert_array_equal(np.asarray(dropout_lib.dropout(module, x, "hash", words=words[0])), np.asarray(x))
