import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax import ops
from gp_jax.ops import blockwise_decode_hits, blockwise_zlpr_loss

# The dense references, jitted: run eagerly, every primitive is compiled on its own for each new shape.
gather_hits = jax.jit(ops.gather_hits, static_argnames="size")
span_mask = jax.jit(ops.span_mask, static_argnames=("max_span_width", "triangular"))
span_scores = jax.jit(ops.span_scores)
sparse_zlpr_loss = jax.jit(ops.sparse_zlpr_loss, static_argnames="reduction")


def make_case(seed, *, B=2, L=19, Hq=3, H=3, d=8, K=5, scale=1.5, biases=False, lengths=(19, 11)):
  """Random rotated-like q/k (+ biases), rows of different lengths, span ids with junk mixed in."""
  rng = np.random.default_rng(seed)
  q = (rng.normal(size=(B, L, Hq, d)) * scale).astype(np.float32)
  k = (rng.normal(size=(B, L, Hq, d)) * scale).astype(np.float32)
  am = (np.arange(L)[None] < np.asarray(lengths)[:, None]).astype(np.int32)
  sb = rng.normal(size=(B, H, L)).astype(np.float32) if biases else None
  eb = rng.normal(size=(B, H, L)).astype(np.float32) if biases else None
  i = rng.integers(0, L, size=(B, H, K))
  j = np.minimum(i + rng.integers(0, 6, size=(B, H, K)), L - 1)
  ids = (i * L + j).astype(np.int32)
  ids[..., -1] = -1  # padding
  ids[0, 0, 0] = 5 * L + 2  # lower triangle: ignored
  ids[1, 0, 1] = 3 * L + (L - 1)  # padding column of row 1: ignored
  return q, k, am, sb, eb, ids


def dense_logits(q, k, sb=None, eb=None):
  s = span_scores(q, k)
  if sb is not None:
    s = s + sb[..., :, None]
  if eb is not None:
    s = s + eb[..., None, :]
  return s


def dense_loss(q, k, sb, eb, *, span_ids, attention_mask, max_span_width=None):
  mask = span_mask(attention_mask, max_span_width=max_span_width)
  logits = jnp.where(mask, dense_logits(q, k, sb, eb), -jnp.inf)
  return sparse_zlpr_loss(logits, span_ids=span_ids, mask=mask)


def zlpr_brute_force(q, k, sb, eb, am, ids, W=None):
  """The ZLPR formula, cell by cell: log(1 + sum_neg e^s) + log(1 + sum_pos e^-s), mean over B*H."""
  B, L, Hq, d = q.shape
  H = ids.shape[1]
  total = 0.0
  for b in range(B):
    for h in range(H):
      gold = {int(x) for x in ids[b, h] if x >= 0}
      neg, pos = 1.0, 1.0
      for i in range(L):
        for j in range(i, L):
          if not (am[b, i] and am[b, j]) or (W is not None and j - i >= W):
            continue
          hq = h if Hq == H else 0
          s = float(np.dot(q[b, i, hq].astype(np.float64), k[b, j, hq])) / math.sqrt(d)
          s += (sb[b, h, i] if sb is not None else 0.0) + (eb[b, h, j] if eb is not None else 0.0)
          if i * L + j in gold:
            pos += math.exp(-s)
          else:
            neg += math.exp(s)
      total += math.log(neg) + math.log(pos)
  return total / (B * H)


@pytest.mark.parametrize("shared,W", [(False, None), (True, 3)])
def test_matches_numpy_brute_force(shared, W):
  q, k, am, sb, eb, ids = make_case(0, L=7, Hq=1 if shared else 2, H=2, d=4, K=3, biases=shared, lengths=(7, 4))
  out = jax.jit(lambda q, k, sb, eb: blockwise_zlpr_loss(
      q, k, span_ids=ids, attention_mask=am, start_bias_BHL=sb, end_bias_BHL=eb, max_span_width=W, block_size=3,
  ))(q, k, sb, eb)
  assert float(out) == pytest.approx(zlpr_brute_force(q, k, sb, eb, am, ids, W), rel=1e-5)


CASES = [
    # (shared q/k with per-type biases (EGP), max_span_width, block_size)
    (False, None, 8),  # 19 = 2 * 8 + 3: a ragged last block
    (False, 5, 4),  # banded window
    (True, None, 5),
    (True, 12, 4),  # wide band: upper-triangle tiles restricted to the band
    (False, None, 64),  # one block larger than L
]


@pytest.mark.parametrize("shared,W,block_size", CASES)
def test_value_and_gradients_equal_dense(shared, W, block_size):
  q, k, am, sb, eb, ids = make_case(1, Hq=1 if shared else 3, biases=shared)
  args = [jnp.asarray(x) for x in (q, k)] + ([jnp.asarray(sb), jnp.asarray(eb)] if shared else [None, None])
  kw = dict(span_ids=jnp.asarray(ids), attention_mask=jnp.asarray(am), max_span_width=W)
  argnums = (0, 1, 2, 3) if shared else (0, 1)

  def blockwise(q, k, sb, eb):
    return blockwise_zlpr_loss(q, k, start_bias_BHL=sb, end_bias_BHL=eb, block_size=block_size, **kw)

  ref, ref_g = jax.jit(jax.value_and_grad(lambda *a: dense_loss(*a, **kw), argnums))(*args)
  out, out_g = jax.jit(jax.value_and_grad(blockwise, argnums))(*args)
  assert float(out) == pytest.approx(float(ref), rel=1e-5)
  for g, r in zip(out_g, ref_g):
    np.testing.assert_allclose(g, r, rtol=1e-5, atol=1e-6)


def test_dominant_positive_is_finite_non_negative_and_exact():
  """A gold cell at +50 dominating everything: the negatives must drop it exactly, not by subtraction."""
  L, d = 10, 4
  q = np.zeros((1, L, 1, d), np.float32)
  k = np.zeros((1, L, 1, d), np.float32)
  q[0, 2, 0, 0], k[0, 6, 0, 0] = 10.0, 10.0  # s(2, 6) = 100 / 2 = 50
  ids = np.array([[[2 * L + 6, -1]]], np.int32)
  am = np.ones((1, L), np.int32)
  kw = dict(span_ids=jnp.asarray(ids), attention_mask=jnp.asarray(am))
  out, g = jax.jit(jax.value_and_grad(lambda q, k: blockwise_zlpr_loss(q, k, block_size=4, **kw), (0, 1)))(q, k)
  ref, ref_g = jax.jit(jax.value_and_grad(lambda q, k: dense_loss(q, k, None, None, **kw), (0, 1)))(q, k)
  assert math.isfinite(float(out)) and float(out) >= 0.0
  assert float(out) == pytest.approx(float(ref), rel=1e-5)
  assert float(out) == pytest.approx(zlpr_brute_force(q, k, None, None, am, ids), rel=1e-5)
  for a, b in zip(g, ref_g):
    assert bool(jnp.all(jnp.isfinite(a)))
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def test_bfloat16_close_to_dense():
  q, k, am, sb, eb, ids = make_case(2, Hq=1, biases=True)
  q, k = jnp.asarray(q, jnp.bfloat16), jnp.asarray(k, jnp.bfloat16)
  kw = dict(span_ids=jnp.asarray(ids), attention_mask=jnp.asarray(am), max_span_width=6)
  f = jax.jit(jax.value_and_grad(lambda q, k: blockwise_zlpr_loss(q, k, start_bias_BHL=sb, end_bias_BHL=eb, block_size=4, **kw), (0, 1)))
  r = jax.jit(jax.value_and_grad(lambda q, k: dense_loss(q, k, sb, eb, **kw), (0, 1)))
  (out, g), (ref, ref_g) = f(q, k), r(q, k)
  assert g[0].dtype == jnp.bfloat16
  assert float(out) == pytest.approx(float(ref), rel=1e-2)
  for a, b in zip(g, ref_g):
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=5e-2, atol=5e-2)


def test_no_quadratic_buffer():
  """Neither the loss nor its gradient materialises anything of B*H*L*L elements (jaxpr avals)."""
  B, L, H, d = 1, 256, 2, 8
  q = jnp.ones((B, L, H, d))
  ids = -jnp.ones((B, H, 2), jnp.int32)

  def loss(q, k):
    return blockwise_zlpr_loss(q, k, span_ids=ids, attention_mask=jnp.ones((B, L)), block_size=32)

  jaxpr = jax.make_jaxpr(jax.grad(loss, (0, 1)))(q, q)

  def sizes(jaxpr):
    for eqn in jaxpr.eqns:
      for v in eqn.outvars:
        yield int(np.prod(v.aval.shape)) if hasattr(v.aval, "shape") else 0
      for sub in jax.core.jaxprs_in_params(eqn.params):
        yield from sizes(sub)

  assert max(sizes(jaxpr.jaxpr)) < B * H * L * L // 4


@pytest.mark.parametrize("shared,W", [(False, None), (True, 4)])
def test_decode_equals_dense_hits(shared, W):
  q, k, am, sb, eb, _ = make_case(3, Hq=1 if shared else 3, biases=shared)
  sb = None if sb is None else jnp.asarray(sb)
  eb = None if eb is None else jnp.asarray(eb)
  logits = dense_logits(jnp.asarray(q), jnp.asarray(k), sb, eb)
  decode = jax.jit(lambda threshold: blockwise_decode_hits(
      q, k, attention_mask=am, start_bias_BHL=sb, end_bias_BHL=eb, max_span_width=W, block_size=4,
      size=1024, threshold=threshold,
  ))
  for threshold in (0.0, 1.5):
    hit = (logits > threshold) & span_mask(am, max_span_width=W)
    n, coords, scores = gather_hits(hit, logits, size=1024)
    m, coords2, scores2 = decode(threshold)
    assert 0 < int(n) == int(m) < 1024
    dense_set = {tuple(c) for c in np.asarray(coords[: int(n)]).tolist()}
    assert {tuple(c) for c in np.asarray(coords2[: int(m)]).tolist()} == dense_set
    np.testing.assert_array_equal(coords2[: int(m)], coords[: int(n)])  # same order too
    np.testing.assert_allclose(scores2[: int(m)], scores[: int(n)], rtol=1e-5, atol=1e-6)


def test_decode_overflow_reports_full_count_and_sharding_constraint():
  q, k, am, _, _, _ = make_case(4)
  logits = span_scores(jnp.asarray(q), jnp.asarray(k))
  hit = (logits > 0) & span_mask(am)
  n, coords, _ = gather_hits(hit, logits, size=8)
  mesh = jax.make_mesh((len(jax.devices()),), ("data",))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  fn = jax.jit(lambda q, k, am: blockwise_decode_hits(q, k, attention_mask=am, block_size=8, size=8, hit_sharding=replicated))
  m, coords2, _ = fn(q, k, am)
  assert int(m) == int(n) > 8
  assert {tuple(c) for c in np.asarray(coords2).tolist()} <= {tuple(c) for c in np.argwhere(np.asarray(hit)).tolist()}
