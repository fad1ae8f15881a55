import math

import jax.numpy as jnp
import numpy as np
from hypothesis import given, settings, strategies as st

from gp_jax.ops import span_mask, span_scores


def test_span_scores_reference():
  rng = np.random.default_rng(0)
  B, L, H, d = 2, 5, 3, 8
  q = rng.normal(size=(B, L, H, d)).astype(np.float32)
  k = rng.normal(size=(B, L, H, d)).astype(np.float32)
  ref = np.zeros((B, H, L, L))
  for b in range(B):
    for h in range(H):
      for i in range(L):
        for j in range(L):
          ref[b, h, i, j] = sum(float(q[b, i, h, t]) * float(k[b, j, h, t]) for t in range(d)) / math.sqrt(d)
  out = span_scores(jnp.asarray(q), jnp.asarray(k))
  assert out.shape == (B, H, L, L) and out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 7), min_size=1, max_size=3),
    width=st.one_of(st.none(), st.integers(1, 8)),
)
def test_span_mask_reference(lengths, width):
  L = 7
  am = np.array([[1] * n + [0] * (L - n) for n in lengths])
  out = np.asarray(span_mask(jnp.asarray(am), max_span_width=width))
  assert out.shape == (len(lengths), 1, L, L) and out.dtype == bool
  for b in range(len(lengths)):
    for i in range(L):
      for j in range(L):
        expected = i <= j and am[b, i] == 1 and am[b, j] == 1 and (width is None or j - i < width)
        assert out[b, 0, i, j] == expected


def test_span_mask_holes():
  """A mask with interior zeros (e.g. [CLS] excluded) masks rows and columns of those tokens."""
  am = jnp.array([[0, 1, 1, 0, 1, 0]])
  out = np.asarray(span_mask(am))[0, 0]
  assert out[1, 2] and out[1, 4] and out[4, 4]
  assert not out[0, 1] and not out[1, 3] and not out[3, 4] and not out[2, 1]
