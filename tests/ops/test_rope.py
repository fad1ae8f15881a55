import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gp_jax import ops

# The op under test, jitted as the trainer runs it: run eagerly, every primitive is compiled on its own for each new
# shape.
apply_rope = jax.jit(ops.apply_rope, static_argnames="base")


def rope_reference(x, positions, base=10000.0):
  """Loop version of the formula: pair (2t, 2t+1) at position m rotated by m * base**(-2t/d)."""
  x = np.asarray(x, np.float64)
  out = np.empty_like(x)
  d = x.shape[-1]
  for b in range(x.shape[0]):
    for l in range(x.shape[1]):
      m = positions[b][l]
      for t in range(d // 2):
        theta = m * base ** (-2 * t / d)
        c, s = math.cos(theta), math.sin(theta)
        a, bb = x[b, l, ..., 2 * t], x[b, l, ..., 2 * t + 1]
        out[b, l, ..., 2 * t] = a * c - bb * s
        out[b, l, ..., 2 * t + 1] = bb * c + a * s
  return out


@pytest.mark.parametrize("shape", [(2, 5, 8), (2, 4, 3, 6)])
def test_matches_reference_default_positions(shape):
  x = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  positions = [list(range(shape[1]))] * shape[0]
  np.testing.assert_allclose(apply_rope(jnp.asarray(x)), rope_reference(x, positions), rtol=1e-5, atol=1e-5)


def test_matches_reference_with_batch_offsets():
  x = np.random.default_rng(1).normal(size=(2, 4, 2, 8)).astype(np.float32)
  positions = np.array([[7, 8, 9, 10], [100, 101, 102, 103]])
  out = apply_rope(jnp.asarray(x), positions=jnp.asarray(positions))
  np.testing.assert_allclose(out, rope_reference(x, positions), rtol=1e-4, atol=1e-4)
  # [L] positions broadcast over the batch.
  out1 = apply_rope(jnp.asarray(x), positions=jnp.arange(4) + 5)
  np.testing.assert_allclose(out1, rope_reference(x, [[5, 6, 7, 8]] * 2), rtol=1e-5, atol=1e-5)


def test_norm_preserved():
  x = jax.random.normal(jax.random.key(0), (3, 17, 4, 16))
  np.testing.assert_allclose(jnp.linalg.norm(apply_rope(x), axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(0, 2000), n=st.integers(0, 2000), shift=st.integers(-500, 500))
def test_relative_property(m, n, shift):
  """rope(q, m) . rope(k, n) depends only on n - m."""
  rng = np.random.default_rng(m * 7 + n)
  q = rng.normal(size=(1, 1, 32)).astype(np.float32)
  k = rng.normal(size=(1, 1, 32)).astype(np.float32)

  def dot(a, b):
    rq = apply_rope(jnp.asarray(q), positions=jnp.array([a]))
    rk = apply_rope(jnp.asarray(k), positions=jnp.array([b]))
    return float(jnp.sum(rq * rk))

  m2, n2 = m + abs(shift), n + abs(shift)
  assert dot(m, n) == pytest.approx(dot(m2, n2), rel=1e-3, abs=1e-3)


def test_scores_change_with_offset():
  q = jnp.asarray(np.random.default_rng(3).normal(size=(1, 1, 32)), jnp.float32)
  dots = [float(jnp.sum(apply_rope(q, positions=jnp.array([0])) * apply_rope(q, positions=jnp.array([r]))))
          for r in range(4)]
  assert len({round(v, 4) for v in dots}) == 4


def test_bf16_keeps_dtype_and_is_close():
  x = jax.random.normal(jax.random.key(1), (2, 64, 8))
  out16 = apply_rope(x.astype(jnp.bfloat16), positions=jnp.arange(64) + 3000)
  assert out16.dtype == jnp.bfloat16
  np.testing.assert_allclose(out16.astype(jnp.float32), apply_rope(x, positions=jnp.arange(64) + 3000), atol=5e-2)


def test_long_sequences_no_position_cap():
  x = jnp.ones((1, 4096, 8))
  out = apply_rope(x)
  assert out.shape == x.shape and bool(jnp.all(jnp.isfinite(out)))


def test_rejects_odd_dim():
  with pytest.raises(ValueError, match="even"):
    apply_rope(jnp.ones((1, 2, 3)))


@pytest.mark.parametrize("shape", [(2, 5, 8), (2, 4, 3, 6)])
def test_gradient_is_the_inverse_rotation(shape):
  """d/dx sum(w * rope(x)) = R(theta)^T w = the reference rotation of w by -theta."""
  rng = np.random.default_rng(4)
  x = jnp.asarray(rng.normal(size=shape), jnp.float32)
  w = rng.normal(size=shape).astype(np.float32)
  positions = np.array([[3, 9, 0, 4, 7][: shape[1]], [1, 2, 30, 5, 6][: shape[1]]])
  grad = jax.grad(lambda x: jnp.sum(jnp.asarray(w) * apply_rope(x, positions=jnp.asarray(positions))))(x)
  np.testing.assert_allclose(grad, rope_reference(w, -positions), rtol=1e-5, atol=1e-5)


def test_gradient_through_the_angles():
  """Float positions are differentiable: d/dm of a rotated pair is the pair turned by a further 90 degrees."""
  x = np.random.default_rng(5).normal(size=(1, 3, 4)).astype(np.float32)
  positions = jnp.asarray([[0.5, 2.0, 7.25]], jnp.float32)
  d = x.shape[-1]
  inv_freq = np.array([10000.0 ** (-2 * t / d) for t in range(d // 2)])
  grad = jax.grad(lambda m: jnp.sum(apply_rope(jnp.asarray(x), positions=m)))(positions)
  expected = np.zeros((1, 3))
  for l in range(3):
    m = float(positions[0, l])
    for t in range(d // 2):
      a, b, f = x[0, l, 2 * t], x[0, l, 2 * t + 1], inv_freq[t]
      # d/dm [(a cos - b sin) + (b cos + a sin)] with angle m * f
      expected[0, l] += f * (-a * math.sin(m * f) - b * math.cos(m * f) - b * math.sin(m * f) + a * math.cos(m * f))
  np.testing.assert_allclose(grad, expected, rtol=1e-4, atol=1e-4)
