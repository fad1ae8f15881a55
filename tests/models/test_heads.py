import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.models import EfficientGlobalPointer, GlobalPointer
from gp_jax.ops import sparse_zlpr_loss, span_mask


def n_params(module):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


@nnx.jit
def _apply(head, x, am, positions=None):
  """The head's forward as one program (eager, each op compiles on its own)."""
  return head(x, am, positions=positions)


def rope_np(x, pos):
  d = x.shape[-1]
  out = x.copy()
  for t in range(d // 2):
    th = pos * 10000.0 ** (-2 * t / d)
    a, b = x[..., 2 * t].copy(), x[..., 2 * t + 1].copy()
    out[..., 2 * t] = a * math.cos(th) - b * math.sin(th)
    out[..., 2 * t + 1] = b * math.cos(th) + a * math.sin(th)
  return out


@pytest.mark.parametrize("D,H,d", [(768, 100, 64), (32, 3, 8)])
def test_parameter_counts(D, H, d):
  # Abstract modules (shapes only): counting needs no 768 x 12800 random kernel.
  gp = nnx.eval_shape(lambda: GlobalPointer(D, H, head_size=d, rngs=nnx.Rngs(0)))
  egp = nnx.eval_shape(lambda: EfficientGlobalPointer(D, H, head_size=d, rngs=nnx.Rngs(0)))
  assert n_params(gp) == D * 2 * H * d + 2 * H * d
  assert n_params(egp) == D * 2 * d + 2 * d + 2 * d * 2 * H + 2 * H


@pytest.mark.parametrize("use_rope", [True, False])
def test_global_pointer_reference(use_rope):
  D, H, d, L = 6, 2, 4, 5
  head = GlobalPointer(D, H, head_size=d, use_rope=use_rope, rngs=nnx.Rngs(1))
  x = np.random.default_rng(0).normal(size=(1, L, D)).astype(np.float32)
  am = np.array([[1, 1, 1, 1, 0]])
  out = np.asarray(_apply(head, jnp.asarray(x), jnp.asarray(am)))
  W, bias = np.asarray(head.dense.kernel[...]), np.asarray(head.dense.bias[...])
  proj = (x[0] @ W + bias).reshape(L, H, 2 * d)
  for h in range(H):
    for i in range(L):
      for j in range(L):
        q, k = proj[i, h, :d], proj[j, h, d:]
        if use_rope:
          q, k = rope_np(q, i), rope_np(k, j)
        valid = i <= j and am[0, i] and am[0, j]
        if valid:
          assert out[0, h, i, j] == pytest.approx(float(q @ k) / math.sqrt(d), rel=1e-4, abs=1e-5)
        else:
          assert out[0, h, i, j] == np.finfo(np.float32).min


def test_efficient_global_pointer_reference():
  D, H, d, L = 6, 3, 4, 4
  head = EfficientGlobalPointer(D, H, head_size=d, rngs=nnx.Rngs(2))
  x = np.random.default_rng(1).normal(size=(1, L, D)).astype(np.float32)
  am = np.ones((1, L), np.int32)
  out = np.asarray(_apply(head, jnp.asarray(x), jnp.asarray(am)))
  W, b = np.asarray(head.dense.kernel[...]), np.asarray(head.dense.bias[...])
  W2, b2 = np.asarray(head.bias_dense.kernel[...]), np.asarray(head.bias_dense.bias[...])
  p = x[0] @ W + b  # [L, 2d]
  bias = (p @ W2 + b2) / 2  # [L, 2H]
  for h in range(H):
    for i in range(L):
      for j in range(i, L):
        q, k = rope_np(p[i, 0::2], i), rope_np(p[j, 1::2], j)
        expected = float(q @ k) / math.sqrt(d) + bias[i, 2 * h + 1] + bias[j, 2 * h]
        assert out[0, h, i, j] == pytest.approx(expected, rel=1e-4, abs=1e-5)


def test_rope_makes_scores_translation_invariant():
  """With RoPE, shifting positions leaves scores unchanged; with absolute info removed, that is all the head sees."""
  head = GlobalPointer(8, 2, head_size=8, rngs=nnx.Rngs(3))
  x = jax.random.normal(jax.random.key(0), (1, 6, 8))
  am = jnp.ones((1, 6), jnp.int32)
  a = _apply(head, x, am, positions=jnp.arange(6))
  b = _apply(head, x, am, positions=jnp.arange(6) + 37)
  np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [GlobalPointer, EfficientGlobalPointer])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_loss_gradients_finite_with_padding(cls, dtype):
  head = cls(16, 3, head_size=8, dtype=dtype, rngs=nnx.Rngs(0))
  x = (jax.random.normal(jax.random.key(1), (2, 7, 16)) * 30).astype(dtype)
  am = jnp.array([[1] * 7, [1] * 3 + [0] * 4])
  span_ids = jnp.array([[[0 * 7 + 2, -1], [3 * 7 + 3, -1], [-1, -1]], [[1 * 7 + 2, -1], [-1, -1], [0, 5 * 7 + 6]]])
  graphdef, params = nnx.split(head)

  def loss_fn(p):
    logits = nnx.merge(graphdef, p)(x, am)
    return sparse_zlpr_loss(logits, span_ids=span_ids, mask=span_mask(am))

  loss, grads = jax.jit(jax.value_and_grad(loss_fn))(params)  # one program: op by op compiles each op on its own
  assert bool(jnp.isfinite(loss))
  assert all(bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in jax.tree.leaves(grads))
  assert jax.jit(lambda p: nnx.merge(graphdef, p)(x, am))(params).dtype == jnp.float32


def test_max_span_width():
  head = GlobalPointer(8, 1, head_size=4, max_span_width=2, rngs=nnx.Rngs(0))
  out = np.asarray(_apply(head, jnp.ones((1, 5, 8)), jnp.ones((1, 5), jnp.int32)))
  assert out[0, 0, 1, 2] > np.finfo(np.float32).min and out[0, 0, 1, 3] == np.finfo(np.float32).min


def head_case(cls, *, use_rope=True, max_span_width=None, dtype=jnp.float32, L=13):
  head = cls(16, 3, head_size=8, use_rope=use_rope, max_span_width=max_span_width, dtype=dtype, rngs=nnx.Rngs(4))
  x = (jax.random.normal(jax.random.key(5), (2, L, 16)) * 2).astype(dtype)
  am = jnp.array([[1] * L, [1] * 8 + [0] * (L - 8)])
  ids = np.array([[[0 * L + 2, 4 * L + 4, -1], [3 * L + 5, -1, -1], [-1, -1, -1]],
                  [[1 * L + 2, 7 * L + 9, -1], [2 * L + 1, -1, -1], [0, 5 * L + 7, 6 * L + 6]]], np.int32)
  return head, x, am, jnp.asarray(ids)


@pytest.mark.parametrize(
    "cls,use_rope,max_span_width",
    [(GlobalPointer, True, None), (GlobalPointer, False, 4), (EfficientGlobalPointer, True, 4), (EfficientGlobalPointer, False, None)],
)
def test_span_loss_blockwise_equals_dense(cls, use_rope, max_span_width):
  head, x, am, ids = head_case(cls, use_rope=use_rope, max_span_width=max_span_width)
  graphdef, params = nnx.split(head)
  pos = jnp.arange(x.shape[1]) + 3

  def loss(p, block_size):
    return nnx.merge(graphdef, p).span_loss(x, am, span_ids=ids, positions=pos, block_size=block_size)

  ref, ref_g = jax.jit(jax.value_and_grad(lambda p: loss(p, None)))(params)
  out, out_g = jax.jit(jax.value_and_grad(lambda p: loss(p, 4)))(params)
  # The dense path is the documented expression (up to jit's float reassociation).
  mask = span_mask(am, max_span_width=max_span_width)
  documented = jax.jit(lambda p: sparse_zlpr_loss(nnx.merge(graphdef, p)(x, am, positions=pos), span_ids=ids, mask=mask))
  assert float(ref) == pytest.approx(float(documented(params)), rel=1e-6)
  assert float(out) == pytest.approx(float(ref), rel=1e-5)
  for g, r in zip(jax.tree.leaves(out_g), jax.tree.leaves(ref_g)):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cls", [GlobalPointer, EfficientGlobalPointer])
def test_span_loss_bfloat16_close(cls):
  head, x, am, ids = head_case(cls, dtype=jnp.bfloat16)
  fn = jax.jit(lambda b: head.span_loss(x, am, span_ids=ids, block_size=b), static_argnums=0)
  assert float(fn(4)) == pytest.approx(float(fn(None)), rel=2e-2)


@pytest.mark.parametrize("cls,max_span_width", [(GlobalPointer, None), (EfficientGlobalPointer, 3)])
def test_decode_hits_blockwise_equals_dense(cls, max_span_width):
  head, x, am, _ = head_case(cls, max_span_width=max_span_width)
  fn = jax.jit(lambda b: head.decode_hits(x, am, size=512, block_size=b, threshold=0.1), static_argnums=0)
  (n, coords, scores), (m, coords2, scores2) = fn(None), fn(4)
  assert 0 < int(n) == int(m) < 512
  assert {tuple(c) for c in np.asarray(coords2[: int(m)]).tolist()} == {tuple(c) for c in np.asarray(coords[: int(n)]).tolist()}
  np.testing.assert_allclose(scores2[: int(m)], scores[: int(n)], rtol=1e-5, atol=1e-5)
  logits = _apply(head, x, am)
  c = np.asarray(coords[: int(n)])
  assert bool(jnp.all(logits[c[:, 0], c[:, 1], c[:, 2], c[:, 3]] > 0.1))
