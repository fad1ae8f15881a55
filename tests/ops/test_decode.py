import jax
import jax.numpy as jnp
import numpy as np

from gp_jax.ops import decode_hits, span_mask


def decode_spans(logits, *, mask, threshold: float = 0.0, return_scores: bool = False):
  """`decode_hits` as per-example lists (host side, for the tests): the sorted list of `(start, end, type_id)` spans (end inclusive) with score > threshold.

  Args:
    logits: `[B, H, L, L]` span scores.
    mask: bool, broadcastable to logits (`span_mask(...)`).
    threshold: decision threshold (ZLPR's is 0).
    return_scores: if True, tuples are `(start, end, type_id, score)`.
  """
  coords, scores = decode_hits(logits, mask=mask, threshold=threshold)
  out: list[list[tuple]] = [[] for _ in range(logits.shape[0])]
  order = np.lexsort((coords[:, 1], coords[:, 3], coords[:, 2], coords[:, 0])) if len(coords) else []
  for n in order:
    b, h, i, j = (int(v) for v in coords[n])
    out[b].append((i, j, h, float(scores[n])) if return_scores else (i, j, h))
  return out


def decode_reference(logits, mask, threshold):
  B, H, L, _ = logits.shape
  return [
      sorted((i, j, h) for h in range(H) for i in range(L) for j in range(L) if mask[b, 0, i, j] and logits[b, h, i, j] > threshold)
      for b in range(B)
  ]


def test_nested_example():
  L = 6
  logits = np.full((1, 2, L, L), -5.0, np.float32)
  logits[0, 0, 0, 3] = 2.0  # outer
  logits[0, 0, 1, 2] = 1.0  # nested inside, same type
  logits[0, 1, 1, 1] = 0.5  # other type, single token
  logits[0, 0, 3, 1] = 9.0  # lower triangle: masked
  logits[0, 1, 4, 5] = 9.0  # padding: masked
  mask = span_mask(jnp.array([[1, 1, 1, 1, 0, 0]]))
  assert decode_spans(jnp.asarray(logits), mask=mask) == [[(0, 3, 0), (1, 1, 1), (1, 2, 0)]]
  with_scores = decode_spans(jnp.asarray(logits), mask=mask, return_scores=True)
  assert with_scores[0][0] == (0, 3, 0, 2.0)


def test_threshold_and_random_against_reference():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(3, 2, 9, 9)).astype(np.float32)
  am = np.array([[1] * 9, [1] * 4 + [0] * 5, [0] * 9])
  mask = span_mask(jnp.asarray(am))
  for t in (0.0, 1.0):
    assert decode_spans(jnp.asarray(logits), mask=mask, threshold=t) == decode_reference(logits, np.asarray(mask), t)


def test_many_hits_untrained_model():
  """Every cell fires: the fixed-size device buffer must grow, nothing dropped."""
  logits = jnp.ones((4, 3, 40, 40))
  mask = span_mask(jnp.ones((4, 40), jnp.int32))
  out = decode_spans(logits, mask=mask)
  assert [len(x) for x in out] == [3 * 40 * 41 // 2] * 4


def test_gather_hits_matches_argwhere_order_and_truncation():
  """Two-stage gathering returns exactly the first `size` hits of a row-major scan, zeros past `count`."""
  from gp_jax.ops.decode import gather_hits

  rng = np.random.default_rng(0)
  fn = jax.jit(gather_hits, static_argnames=("size",))
  for shape in ((1, 1, 1, 1), (2, 3, 5, 5)):
    n_cells = int(np.prod(shape))
    for size in (1, 7, n_cells, 2 * n_cells):
      for density in (0.0, 0.3, 1.0):
        hit = rng.random(shape) < density
        logits = rng.normal(size=shape).astype(np.float32)
        count, coords, scores = fn(jnp.asarray(hit), jnp.asarray(logits), size=size)
        want = np.argwhere(hit)[:size]
        n = len(want)
        assert int(count) == hit.sum()
        np.testing.assert_array_equal(np.asarray(coords)[:n], want)
        assert (np.asarray(coords)[n:] == 0).all()
        np.testing.assert_array_equal(np.asarray(scores)[:n], logits[tuple(want.T)])
