"""ops.gelu against NumPy written from the formula (math.erf): values, the gradient x -> Phi(x) + x phi(x) and its
central differences, the dtype kept, and jax.nn.gelu(approximate=False), the function it stands in for."""

import math

import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.ops.gelu import gelu

_erf = np.vectorize(math.erf)


def gelu_reference(x):
  x = np.asarray(x, np.float64)
  return x * 0.5 * (1 + _erf(x / math.sqrt(2)))


def gelu_grad_reference(x):
  x = np.asarray(x, np.float64)
  return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-x * x / 2) / math.sqrt(2 * math.pi)


X = np.concatenate([np.linspace(-8, 8, 161), np.random.default_rng(0).normal(size=200) * 3])


def test_values_and_gradient_are_the_formula():
  x = jnp.asarray(X, jnp.float32)
  np.testing.assert_allclose(np.asarray(gelu(x)), gelu_reference(X), rtol=1e-6, atol=1e-6)
  got = jax.grad(lambda v: jnp.sum(gelu(v)))(x)
  np.testing.assert_allclose(np.asarray(got), gelu_grad_reference(X), rtol=1e-5, atol=1e-6)
  h = 1e-6
  numeric = (gelu_reference(X + h) - gelu_reference(X - h)) / (2 * h)
  np.testing.assert_allclose(gelu_grad_reference(X), numeric, rtol=1e-6, atol=1e-8)


def test_dtype_and_jax_gelu():
  for dtype, tol in ((jnp.float32, 1e-6), (jnp.bfloat16, 1e-2)):
    x = jnp.asarray(X, dtype)
    y = gelu(x)
    assert y.dtype == dtype and jax.grad(lambda v: jnp.sum(gelu(v).astype(jnp.float32)))(x).dtype == dtype
    ref = jax.nn.gelu(x, approximate=False)
    np.testing.assert_allclose(np.asarray(y, np.float32), np.asarray(ref, np.float32), rtol=tol, atol=tol)
    g = jax.grad(lambda v: jnp.sum(gelu(v).astype(jnp.float32)))(x)
    g_ref = jax.grad(lambda v: jnp.sum(jax.nn.gelu(v, approximate=False).astype(jnp.float32)))(x)
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(g_ref, np.float32), rtol=tol, atol=2 * tol)
