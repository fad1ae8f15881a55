import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.ops import flat_dot_general


def linear_reference(x, w, b):
  """out[..., n] = sum_k x[..., k] w[k, n] + b[n], by loops over the leading index."""
  x2 = x.reshape(-1, x.shape[-1]).astype(np.float64)
  out = np.zeros((x2.shape[0], w.shape[1]))
  for m in range(x2.shape[0]):
    for n in range(w.shape[1]):
      out[m, n] = sum(x2[m, k] * w[k, n] for k in range(w.shape[0])) + b[n]
  return out.reshape(x.shape[:-1] + (w.shape[1],))


@pytest.mark.parametrize("shape", [(5, 4), (2, 3, 4), (2, 2, 3, 4)])
def test_linear_value_and_gradients(shape):
  rng = np.random.default_rng(0)
  layer = nnx.Linear(shape[-1], 6, dot_general=flat_dot_general, rngs=nnx.Rngs(0))
  layer.bias[...] = jnp.asarray(rng.normal(size=6), jnp.float32)
  x = rng.normal(size=shape).astype(np.float32)
  w, b = np.asarray(layer.kernel[...]), np.asarray(layer.bias[...])
  np.testing.assert_allclose(layer(jnp.asarray(x)), linear_reference(x, w, b), rtol=1e-5, atol=1e-5)

  # sum(c * (x w + b)): d/dw = x^T c, d/db = sum c, d/dx = c w^T (flattened over leading axes).
  c = rng.normal(size=shape[:-1] + (6,)).astype(np.float32)

  def loss(layer, x):
    return jnp.sum(jnp.asarray(c) * layer(x))

  grads, dx = nnx.grad(loss, argnums=(0, 1))(layer, jnp.asarray(x))
  x2, c2 = x.reshape(-1, shape[-1]).astype(np.float64), c.reshape(-1, 6).astype(np.float64)
  np.testing.assert_allclose(grads.kernel[...], x2.T @ c2, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(grads.bias[...], c2.sum(0), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(dx, (c2 @ w.T.astype(np.float64)).reshape(shape), rtol=1e-4, atol=1e-4)


def test_other_contractions_pass_through():
  rng = np.random.default_rng(1)
  a = jnp.asarray(rng.normal(size=(3, 4, 5)), jnp.float32)
  b = jnp.asarray(rng.normal(size=(3, 5, 2)), jnp.float32)
  batched = (((2,), (1,)), ((0,), (0,)))
  np.testing.assert_array_equal(flat_dot_general(a, b, batched), jax.lax.dot_general(a, b, batched))
  first_axis = (((0,), (0,)), ((), ()))
  m = jnp.asarray(rng.normal(size=(3, 7)), jnp.float32)
  np.testing.assert_array_equal(flat_dot_general(a, m, first_axis), jax.lax.dot_general(a, m, first_axis))
