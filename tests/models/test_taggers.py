import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

from gp_jax.data.tagging import num_tags, spans_to_tags, tags_to_spans
from gp_jax.models.taggers import CrfTagger, SoftmaxTagger, tags_to_hits

TAGGERS = [SoftmaxTagger, CrfTagger]


@functools.partial(nnx.jit, static_argnames=("size",))
def decode(model, hidden_BLD, span_mask_BL, *, size):
  return model.decode_hits(hidden_BLD, span_mask_BL, size=size)


def hit_set(count, coords, *, size):
  count = int(count)
  assert count <= size
  return {tuple(int(v) for v in c) for c in np.asarray(coords)[:count]}


def host_hits(tags_BL, *, num_types, scheme, offsets=None):
  """(b, type, start, end) from host `tags_to_spans`, shifted by `offsets`."""
  out = set()
  for b, row in enumerate(np.asarray(tags_BL)):
    off = 0 if offsets is None else int(offsets[b])
    out |= {(b, t, s + off, e + off) for s, e, t in tags_to_spans(row, num_types=num_types, scheme=scheme)}
  return out


def window_batch(rng, *, L, content, num_types, scheme):
  """Window tags (-1 outside content) and span masks for rows given as (first column, length)."""
  tags = np.full((len(content), L), -1, np.int32)
  mask = np.zeros((len(content), L), bool)
  for b, (first, n) in enumerate(content):
    spans = np.array([(s, min(n - 1, s + int(rng.integers(0, 3))), int(rng.integers(num_types)))
                      for s in range(0, n, 3) if rng.random() < 0.7], int).reshape(-1, 3)
    tags[b, first:first + n] = spans_to_tags(spans, length=n, num_types=num_types, scheme=scheme)[0]
    mask[b, first:first + n] = True
  return tags, mask


# Every model test uses B=4, L=10, D=32, H=2, so compiled functions are shared between tests.
B, L, D, H = 4, 10, 32, 2
# [CLS] at 0 (BERT) or content from 0 (char model), an empty row, a one-token row; padding after.
CONTENT = [(1, 6), (0, 10), (0, 0), (1, 1)]


@pytest.mark.parametrize("cls", TAGGERS, ids=lambda c: c.__name__)
def test_decode_handcrafted_emissions(cls):
  # BIOES here; the training test checks BIO decoding the same way.
  rng = np.random.default_rng(0)
  T = num_tags(H, "BIOES")
  tags, mask = window_batch(rng, L=L, content=CONTENT, num_types=H, scheme="BIOES")
  tagger = cls(D, H, scheme="BIOES", rngs=nnx.Rngs(0))
  tagger.dense.kernel.value = 10 * jnp.eye(D, T)
  tagger.dense.bias.value = jnp.zeros(T)
  # Outside content the hidden states say B-0: they must be ignored.
  hidden = jax.nn.one_hot(np.where(mask, tags, 1), D)
  count, coords, scores = decode(tagger, hidden, mask, size=16)
  got = hit_set(count, coords, size=16)
  want = host_hits(np.where(mask, tags, -1), num_types=H, scheme="BIOES")  # already window columns
  assert got == want and len(want) > 2
  scores = np.asarray(scores)[: int(count)]
  assert ((scores > 0.5) & (scores <= 1.0)).all()


@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
def test_device_extraction_matches_host(scheme):
  rng = np.random.default_rng(1)
  rows, cols, size = 64, 12, 512
  T = num_tags(H, scheme)
  lengths = rng.integers(0, cols + 1, size=rows)
  tags = np.where(np.arange(cols)[None] < lengths[:, None], rng.integers(-1, T, size=(rows, cols)), -1)
  tags[:8] = rng.integers(0, 3, size=(8, cols))  # O/B-0/I-0 heavy rows: long runs
  offsets = rng.integers(0, 3, size=rows).astype(np.int32)
  token_scores = rng.random(size=(rows, cols)).astype(np.float32)
  fn = jax.jit(functools.partial(tags_to_hits, scheme=scheme, size=size))
  count, coords, scores = fn(jnp.asarray(tags), offset_B=offsets, token_scores_BL=token_scores)
  want = host_hits(tags, num_types=H, scheme=scheme, offsets=offsets)
  assert hit_set(count, coords, size=size) == want
  coords, scores = np.asarray(coords), np.asarray(scores)
  for (b, _, s, e), score in zip(coords[: int(count)], scores[: int(count)]):
    off = offsets[b]
    assert score == pytest.approx(token_scores[b, s - off:e - off + 1].mean(), abs=1e-5)
  assert not coords[int(count):].any() and not scores[int(count):].any()


def test_extraction_overflow_and_hit_sharding():
  tags = np.tile(np.array([1, 2, 0, 3, 1, 0], np.int32), (8, 1))  # BIO, 2 types: 3 spans per row
  mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
  tags = jax.device_put(tags, NamedSharding(mesh, P("data")))
  fn = jax.jit(functools.partial(tags_to_hits, scheme="BIO", size=16,
                                 hit_sharding=NamedSharding(mesh, P())))
  count, coords, _ = fn(tags)
  assert int(count) == 24  # more than size: the caller retries with a larger buffer
  assert np.asarray(coords)[:3].tolist() == [[0, 0, 0, 1], [0, 1, 3, 3], [0, 0, 4, 4]]


def fit(model, hidden, mask, tags, *, steps, learning_rate):
  """`steps` Adam steps in one compiled loop -> (first loss, first gradients all finite, last loss)."""
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  tx = optax.adam(learning_rate)

  def loss_fn(params):
    return nnx.merge(graphdef, params, rest).tag_loss(hidden, mask, tags_BL=tags)

  @jax.jit
  def run(params):
    loss0, grads0 = jax.value_and_grad(loss_fn)(params)
    finite0 = jnp.all(jnp.array([jnp.isfinite(g).all() for g in jax.tree.leaves(grads0)]))

    def body(_, carry):
      params, opt_state = carry
      updates, opt_state = tx.update(jax.grad(loss_fn)(params), opt_state, params)
      return optax.apply_updates(params, updates), opt_state

    params, _ = jax.lax.fori_loop(0, steps, body, (params, tx.init(params)))
    return params, loss0, finite0, loss_fn(params)

  params, loss0, finite0, loss = run(params)
  nnx.update(model, params)
  return float(loss0), bool(finite0), float(loss)


@pytest.mark.parametrize("cls,scheme", [(SoftmaxTagger, "BIO"), (CrfTagger, "BIOES")],
                         ids=["softmax-BIO", "crf-BIOES"])
@pytest.mark.e2e  # trains a model (300 steps) until it fits
def test_training_fits_gold_tags(cls, scheme):
  # Random hidden states, fixed tags: both taggers must fit them exactly. Row 2 has no content.
  rng = np.random.default_rng(3)
  tags, mask = window_batch(rng, L=L, content=[(1, 6), (0, 10), (0, 0), (1, 8)], num_types=H, scheme=scheme)
  hidden = jnp.asarray(rng.normal(size=(B, L, D)), jnp.float32)
  tagger = cls(D, H, scheme=scheme, rngs=nnx.Rngs(4))
  loss0, finite0, loss = fit(tagger, hidden, mask, tags, steps=300, learning_rate=0.05)
  assert np.isfinite(loss0) and loss0 > 0 and finite0
  assert loss < 0.05
  count, coords, _ = decode(tagger, hidden, mask, size=16)
  want = host_hits(tags, num_types=H, scheme=scheme)
  assert hit_set(count, coords, size=16) == want and len(want) > 3
