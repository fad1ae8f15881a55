"""models.layers.embed / embed_prefix: nnx.Embed's values, gradients as NumPy sums, no bf16 scatter."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.models import layers


def _module(rows: int, dtype) -> nnx.Embed:
  return nnx.Embed(rows, 8, dtype=dtype, embedding_init=nnx.initializers.normal(1.0), rngs=nnx.Rngs(0))


@pytest.mark.parametrize("rows", [2, layers.ONE_HOT_MAX_ROWS, 40])  # one-hot path, its edge, gather path
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_values_and_gradient(rows, dtype):
  m = _module(rows, dtype)
  ids = np.random.default_rng(rows).integers(0, rows, size=(3, 7)).astype(np.int32)
  out = layers.embed(m, jnp.asarray(ids))
  assert out.dtype == dtype
  np.testing.assert_array_equal(np.asarray(out, np.float32), np.asarray(m(jnp.asarray(ids)), np.float32))
  g = np.random.default_rng(1).standard_normal((3, 7, 8)).astype(np.float32)
  graphdef, state = nnx.split(m)

  def loss(state):
    return jnp.sum(layers.embed(nnx.merge(graphdef, state), jnp.asarray(ids)).astype(jnp.float32) * g)

  grad = jax.grad(loss)(state)["embedding"].value
  assert grad.dtype == jnp.float32
  expected = np.zeros((rows, 8))
  np.add.at(expected, ids.reshape(-1), g.reshape(-1, 8).astype(np.float64))
  tol = 1e-5 if dtype == jnp.float32 else 3e-2  # bf16: the cotangent is rounded to bf16 first
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=tol, atol=tol * 4)


def test_prefix_is_the_first_rows():
  m = _module(12, jnp.float32)
  np.testing.assert_array_equal(np.asarray(layers.embed_prefix(m, 5))[0], np.asarray(m(jnp.arange(5))))


def test_bf16_backward_has_no_bf16_scatter():
  """A BERT-shaped embedding sum in bf16: the word table's gradient is an f32 scatter-add, the token-type table's a
  matmul (its bf16 scatter took 24 ms of a 28 ms step on an H200)."""
  word, types = _module(100, jnp.bfloat16), _module(2, jnp.bfloat16)
  ids = jnp.zeros((4, 16), jnp.int32)

  def loss(w, t, ids):
    return jnp.sum((layers.embed(w, ids) + layers.embed(t, ids)).astype(jnp.float32))

  gw, sw = nnx.split(word)
  gt, st = nnx.split(types)
  text = jax.jit(jax.grad(lambda a, b, ids: loss(nnx.merge(gw, a), nnx.merge(gt, b), ids), argnums=(0, 1))).lower(
      sw, st, ids).as_text()
  scatters = re.findall(r"stablehlo.scatter.*?->\s*tensor<([0-9x]+)x(\w+)>", text, flags=re.S)
  assert scatters == [("100x8", "f32")], scatters  # the word table's, in f32; none into the 2-row table
