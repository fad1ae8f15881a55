"""ops.layer_norm against NumPy written from the formula: values (float32 and bfloat16 output), the gradients of x,
scale and bias against central differences of the NumPy function in float64, and flax's nnx.LayerNorm (the module
it stands in for)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.ops.layer_norm import layer_norm

EPS = 1e-12


def ln_reference(x, scale, bias, eps=EPS):
  """(x - mean) / sqrt(var + eps) * scale + bias over the last axis, var the mean squared deviation, float64."""
  x = np.asarray(x, np.float64)
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * np.asarray(scale, np.float64) + np.asarray(bias, np.float64)


def _inputs(rng, shape=(3, 5, 8)):
  x = rng.normal(size=shape) * 2 + 0.5
  return x, 1 + 0.3 * rng.normal(size=shape[-1:]), 0.2 * rng.normal(size=shape[-1:])


def test_values_are_the_formula():
  x, s, b = _inputs(np.random.default_rng(0))
  got = layer_norm(jnp.asarray(x, jnp.float32), jnp.asarray(s, jnp.float32), jnp.asarray(b, jnp.float32), EPS,
                   jnp.float32)
  assert got.dtype == jnp.float32
  np.testing.assert_allclose(np.asarray(got), ln_reference(x, s, b), rtol=1e-5, atol=1e-5)
  half = layer_norm(jnp.asarray(x, jnp.bfloat16), jnp.asarray(s, jnp.float32), jnp.asarray(b, jnp.float32), EPS,
                    jnp.bfloat16)
  assert half.dtype == jnp.bfloat16
  want = ln_reference(np.asarray(jnp.asarray(x, jnp.bfloat16), np.float64), s, b)
  np.testing.assert_allclose(np.asarray(half, np.float64), want, rtol=1e-2, atol=1e-2)


def _numeric_grad(f, arr, h=1e-6):
  g = np.zeros_like(arr)
  for i in np.ndindex(arr.shape):
    up, down = arr.copy(), arr.copy()
    up[i] += h
    down[i] -= h
    g[i] = (f(up) - f(down)) / (2 * h)
  return g


def test_gradients_are_central_differences_of_the_formula():
  rng = np.random.default_rng(1)
  x, s, b = _inputs(rng, (2, 3, 6))
  w = rng.normal(size=x.shape)  # loss = sum(w * ln(x))
  loss = lambda x_, s_, b_: float(np.sum(w * ln_reference(x_, s_, b_)))  # noqa: E731
  want = (_numeric_grad(lambda a: loss(a, s, b), x), _numeric_grad(lambda a: loss(x, a, b), s),
          _numeric_grad(lambda a: loss(x, s, a), b))
  f32 = lambda a: jnp.asarray(a, jnp.float32)  # noqa: E731
  got = jax.grad(lambda x_, s_, b_: jnp.sum(f32(w) * layer_norm(x_, s_, b_, EPS, jnp.float32)), argnums=(0, 1, 2))(
      f32(x), f32(s), f32(b))
  for g, n in zip(got, want):
    np.testing.assert_allclose(np.asarray(g), n, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_matches_nnx_layer_norm_and_its_gradients(dtype):
  rng = np.random.default_rng(2)
  x, s, b = _inputs(rng, (4, 7, 16))
  module = nnx.LayerNorm(16, epsilon=EPS, use_fast_variance=False, dtype=dtype, param_dtype=jnp.float32,
                         rngs=nnx.Rngs(0))
  module.scale.value, module.bias.value = jnp.asarray(s, jnp.float32), jnp.asarray(b, jnp.float32)
  xj, w = jnp.asarray(x, dtype), jnp.asarray(rng.normal(size=x.shape), jnp.float32)
  np.testing.assert_array_equal(np.asarray(layer_norm(xj, module.scale.value, module.bias.value, EPS, dtype)),
                                np.asarray(module(xj)))

  graphdef, state = nnx.split(module)
  ref = lambda x_, st: jnp.sum(nnx.merge(graphdef, st, copy=True)(x_).astype(jnp.float32) * w)  # noqa: E731
  want_x, want_state = jax.grad(ref, argnums=(0, 1))(xj, state)
  want = (want_x, want_state["scale"][...], want_state["bias"][...])
  args = (xj, module.scale.value, module.bias.value)
  got = jax.grad(lambda *a: jnp.sum(layer_norm(*a, EPS, dtype).astype(jnp.float32) * w), argnums=(0, 1, 2))(*args)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for g, r in zip(got, want):
    assert g.dtype == r.dtype
    scale = float(np.max(np.abs(np.asarray(r, np.float32))))
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), rtol=0, atol=tol * scale)
