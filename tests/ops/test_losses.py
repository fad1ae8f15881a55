import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from gp_jax import ops

# The ops under test, jitted as the trainer runs them: run eagerly, every primitive is compiled on its own for each
# new shape.
span_mask = jax.jit(ops.span_mask, static_argnames=("max_span_width", "triangular"))
zlpr_loss = jax.jit(ops.zlpr_loss)
sparse_zlpr_loss = jax.jit(ops.sparse_zlpr_loss, static_argnames="reduction")


def zlpr_reference(logits, labels, mask):
  """Brute force: per (b, h), log(1 + sum_neg e^s) + log(1 + sum_pos e^-s) over valid cells."""
  B, H, L, _ = logits.shape
  total = 0.0
  for b in range(B):
    for h in range(H):
      neg, pos = 1.0, 1.0
      for i in range(L):
        for j in range(L):
          if not mask[b, 0, i, j]:
            continue
          s = float(logits[b, h, i, j])
          if labels[b, h, i, j]:
            pos += math.exp(-s)
          else:
            neg += math.exp(s)
      total += math.log(neg) + math.log(pos)
  return total / (B * H)


def random_case(seed, B=2, H=3, L=6, scale=3.0):
  rng = np.random.default_rng(seed)
  logits = (rng.normal(size=(B, H, L, L)) * scale).astype(np.float32)
  lengths = rng.integers(1, L + 1, size=B)
  am = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
  mask = np.asarray(span_mask(jnp.asarray(am)))
  labels = (rng.random((B, H, L, L)) < 0.15) & mask
  return logits, labels.astype(np.int32), mask


def to_span_ids(labels, K):
  B, H, L, _ = labels.shape
  ids = -np.ones((B, H, K), np.int32)
  for b in range(B):
    for h in range(H):
      flat = [i * L + j for i in range(L) for j in range(L) if labels[b, h, i, j]]
      ids[b, h, : len(flat)] = flat
  return ids


@pytest.mark.parametrize("seed", range(4))
def test_dense_matches_brute_force(seed):
  logits, labels, mask = random_case(seed)
  out = zlpr_loss(jnp.asarray(logits), labels=jnp.asarray(labels), mask=jnp.asarray(mask))
  assert float(out) == pytest.approx(zlpr_reference(logits, labels, mask), rel=1e-5)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.sampled_from([0.1, 3.0, 30.0]))
def test_sparse_equals_dense(seed, scale):
  logits, labels, mask = random_case(seed, scale=scale)
  dense = zlpr_loss(jnp.asarray(logits), labels=jnp.asarray(labels), mask=jnp.asarray(mask))
  sparse = sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(to_span_ids(labels, 40)), mask=jnp.asarray(mask))
  assert float(sparse) == pytest.approx(float(dense), rel=1e-5, abs=1e-6)


def test_masked_cells_never_contribute():
  logits, labels, mask = random_case(7)
  ref = zlpr_reference(logits, labels, mask)
  for fill in (-np.inf, np.finfo(np.float32).min, 1e30, np.inf):
    poisoned = np.where(mask, logits, fill).astype(np.float32)
    for fn, kw in ((zlpr_loss, {"labels": jnp.asarray(labels)}), (sparse_zlpr_loss, {"span_ids": jnp.asarray(to_span_ids(labels, 40))})):
      out = fn(jnp.asarray(poisoned), mask=jnp.asarray(mask), **kw)
      assert float(out) == pytest.approx(ref, rel=1e-5), (fn.__name__, fill)


def test_sparse_positive_outside_mask_ignored():
  logits, labels, mask = random_case(3)
  ids = to_span_ids(labels, 40)
  ids_extra = ids.copy()
  L = logits.shape[-1]
  ids_extra[0, 0, -1] = (L - 1) * L + 0  # lower triangle cell: masked
  a = sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(ids), mask=jnp.asarray(mask))
  b = sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(ids_extra), mask=jnp.asarray(mask))
  assert float(a) == pytest.approx(float(b), rel=1e-6)


def test_sparse_dominant_positive_is_finite_non_negative_and_exact():
  """The known failure: log(1 - e^{lse_pos - lse_all}) cancels when a positive dominates."""
  L = 8
  logits = np.full((1, 1, L, L), -10.0, np.float32)
  logits[0, 0, 1, 3] = 60.0
  labels = np.zeros_like(logits, np.int32)
  labels[0, 0, 1, 3] = 1
  mask = np.asarray(span_mask(jnp.ones((1, L), jnp.int32)))
  sparse = float(sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.array([[[1 * L + 3]]]), mask=jnp.asarray(mask)))
  ref = zlpr_reference(logits, labels, mask)
  assert math.isfinite(sparse) and sparse >= 0.0
  assert sparse == pytest.approx(ref, rel=1e-5)
  g = jax.grad(lambda x: sparse_zlpr_loss(x, span_ids=jnp.array([[[1 * L + 3]]]), mask=jnp.asarray(mask)))(jnp.asarray(logits))
  assert bool(jnp.all(jnp.isfinite(g)))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("fill", [-np.inf, "min"])
def test_gradients_finite_under_masks(dtype, fill):
  logits, labels, mask = random_case(11, scale=20.0)
  fill_value = jnp.finfo(dtype).min if fill == "min" else -jnp.inf
  x = jnp.where(jnp.asarray(mask), jnp.asarray(logits, dtype), fill_value).astype(dtype)
  for fn, kw in ((zlpr_loss, {"labels": jnp.asarray(labels)}), (sparse_zlpr_loss, {"span_ids": jnp.asarray(to_span_ids(labels, 40))})):
    loss, g = jax.value_and_grad(lambda z: fn(z, mask=jnp.asarray(mask), **kw))(x)
    assert bool(jnp.isfinite(loss))
    assert bool(jnp.all(jnp.isfinite(g.astype(jnp.float32))))
    assert float(jnp.max(jnp.abs(jnp.where(jnp.asarray(mask), 0, g.astype(jnp.float32))))) == 0.0


def test_fully_masked_rows_give_zero():
  logits = jnp.ones((2, 2, 4, 4))
  mask = span_mask(jnp.zeros((2, 4), jnp.int32))
  assert float(zlpr_loss(logits, labels=jnp.zeros((2, 2, 4, 4)), mask=mask)) == 0.0
  assert float(sparse_zlpr_loss(logits, span_ids=-jnp.ones((2, 2, 3), jnp.int32), mask=mask)) == 0.0


def test_jit_and_grad_dense_vs_sparse_gradients_agree():
  logits, labels, mask = random_case(5)
  gd = jax.jit(jax.grad(lambda x: zlpr_loss(x, labels=jnp.asarray(labels), mask=jnp.asarray(mask))))(jnp.asarray(logits))
  gs = jax.jit(jax.grad(lambda x: sparse_zlpr_loss(x, span_ids=jnp.asarray(to_span_ids(labels, 40)), mask=jnp.asarray(mask))))(jnp.asarray(logits))
  np.testing.assert_allclose(gd, gs, rtol=1e-5, atol=1e-7)
