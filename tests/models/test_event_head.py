"""EventHead against NumPy written from the formulas (pointer scores, the links' upper triangle with its diagonal,
the loss reduction), its decoding with the host grouping against Su's `extract_events`, and EventModel reading its
batch."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.models.events import EventHead, EventModel
from gp_jax.tasks.events.cliques import group_events
from tests.models.test_gplinker import NEG, pointer_reference, random_ids, zlpr_np
from tests.tasks.test_event_cliques import LABELS, as_set, su_events


def make_case(seed, *, B=2, L=7, D=6, C=3, d=4, **kw):
  head = EventHead(D, C, head_size=d, rngs=nnx.Rngs(seed), **kw)
  rng = np.random.default_rng(seed)
  x = rng.normal(size=(B, L, D)).astype(np.float32)
  am = np.zeros((B, L), np.int32)
  am[:, 1:L - 1] = 1
  am[1, L - 3:] = 0
  positions = (np.arange(L)[None] + 5 * np.arange(B)[:, None]).astype(np.int32)  # window offsets
  return head, x, am, positions


@pytest.mark.parametrize("efficient", [True, False])
@pytest.mark.parametrize("use_rope,pointer_rope", [(True, False), (True, True), (False, False)])
def test_pointer_scores_against_formulas(efficient, use_rope, pointer_rope):
  head, x, am, positions = make_case(0, efficient=efficient, use_rope=use_rope, pointer_rope=pointer_rope)
  arg, hd, tl = head(jnp.asarray(x), jnp.asarray(am), positions=jnp.asarray(positions))
  assert arg.shape == (2, 3, 7, 7) and hd.shape == tl.shape == (2, 1, 7, 7)
  for got, pointer, rope in ((arg, head.argument_pointer, use_rope), (hd, head.head_pointer, pointer_rope),
                             (tl, head.tail_pointer, pointer_rope)):
    want = pointer_reference(pointer, x, am, positions, efficient=efficient, rope=rope, triangular=True)
    got = np.asarray(got)
    masked = want == NEG
    assert (got[masked] == NEG).all()
    np.testing.assert_allclose(got[~masked], want[~masked], rtol=1e-4, atol=1e-5)
  # Links: upper triangle with the diagonal (nested arguments share a start), nothing below it.
  hd = np.asarray(hd)
  assert (hd[0, 0, 2, 2] > NEG) and (hd[0, 0, 1, 4] > NEG) and (hd[0, 0, 4, 1] == NEG)
  assert {"argument_pointer", "head_pointer", "tail_pointer"} <= set(nnx.state(head, nnx.Param).keys())
  assert not np.allclose(hd, np.asarray(tl))


@pytest.mark.parametrize("efficient", [True, False])
@pytest.mark.parametrize("pointer_rope", [False, True])
def test_loss_against_formulas(efficient, pointer_rope):
  """ZLPR per pointer summed over its heads, mean over the batch; the mean of the three. Gold ids anywhere: those
  below the diagonal, on [CLS] or padding count for nothing."""
  head, x, am, positions = make_case(2, efficient=efficient, pointer_rope=pointer_rope)
  B, L = am.shape
  rng = np.random.default_rng(3)
  ids = {"argument_ids": random_ids(rng, B, 3, L, 6), "head_ids": random_ids(rng, B, 1, L, 6),
         "tail_ids": random_ids(rng, B, 1, L, 6)}
  ids["head_ids"][0, 0, 0] = 3 * L + 3  # a diagonal cell of content tokens: two arguments sharing a start
  valid = am[:, :, None].astype(bool) & am[:, None, :].astype(bool) & np.triu(np.ones((L, L), bool))[None]
  parts = {}
  for name, pointer, rope in (("argument", head.argument_pointer, True), ("head", head.head_pointer, pointer_rope),
                              ("tail", head.tail_pointer, pointer_rope)):
    scores = pointer_reference(pointer, x, am, positions, efficient=efficient, rope=rope, triangular=True)
    flat = ids[f"{name}_ids"]
    gold = [[{(int(c) // L, int(c) % L) for c in flat[b, h] if c >= 0} for h in range(flat.shape[1])]
            for b in range(B)]
    parts[name] = zlpr_np(scores, gold, valid)
  args = (jnp.asarray(x), jnp.asarray(am))
  kw = {k: jnp.asarray(v) for k, v in ids.items()}
  got = head.losses(*args, positions=jnp.asarray(positions), **kw)
  assert set(got) == {"argument", "head", "tail"}
  for name in parts:
    assert float(got[name]) == pytest.approx(parts[name], rel=1e-4), name
  total = head.loss(*args, positions=jnp.asarray(positions), **kw)
  assert float(total) == pytest.approx(sum(parts.values()) / 3, rel=1e-4)
  # Gold on the diagonal of the links counts: dropping it changes the loss.
  diag = ids["head_ids"].copy()
  diag[0, 0, 0] = -1
  dropped = head.losses(*args, positions=jnp.asarray(positions), **dict(kw, head_ids=jnp.asarray(diag)))
  assert float(dropped["head"]) != pytest.approx(float(got["head"]), rel=1e-6)


def test_argument_blockwise_loss_equals_dense():
  head, x, am, positions = make_case(4, L=16)
  B, L = am.shape
  rng = np.random.default_rng(0)
  kw = dict(argument_ids=jnp.asarray(random_ids(rng, B, 3, L, 4)), head_ids=jnp.asarray(random_ids(rng, B, 1, L, 4)),
            tail_ids=jnp.asarray(random_ids(rng, B, 1, L, 4)), positions=jnp.asarray(positions))
  dense = head.losses(jnp.asarray(x), jnp.asarray(am), **kw)
  blocks = head.losses(jnp.asarray(x), jnp.asarray(am), block_size=8, implementation="xla", **kw)
  for name in dense:
    assert float(blocks[name]) == pytest.approx(float(dense[name]), rel=1e-5), name
  assert head.pointer_loss_path == "dense"


def scaled(pointer, factor):
  """Multiplies a pointer's projections by `factor` (its scores by about factor^2)."""
  for name in ("dense", "bias_dense"):
    if hasattr(pointer, name):
      lin = getattr(pointer, name)
      lin.kernel[...] = lin.kernel[...] * factor
      lin.bias[...] = lin.bias[...] * factor


@pytest.mark.parametrize("efficient,threshold", [(True, 2.5), (False, 1.5)])
def test_decode_and_group_against_su(efficient, threshold):
  """Thresholds where a few dozen arguments fire (Su's recursion is exponential) and link pointers scaled up so
  that many link: events of several arguments, shared ones among them."""
  head, x, am, positions = make_case(5, B=3, L=10, D=8, C=len(LABELS), d=4, efficient=efficient, pointer_rope=True)
  scaled(head.head_pointer, 3.0)
  scaled(head.tail_pointer, 3.0)
  args = (jnp.asarray(x), jnp.asarray(am))
  scores = [np.asarray(s) for s in head(*args, positions=jnp.asarray(positions))]
  hits = head.decode_hits(*args, positions=jnp.asarray(positions), sizes=(256, 128, 128), threshold=threshold)
  assert all(int(h[0]) <= len(h[1]) for h in hits)
  got = group_events(*hits, classes=LABELS, require_trigger=False)
  assert got.over_bound == 0
  want = su_events(*scores, am, LABELS, threshold=threshold, trigger=False)
  assert as_set(got.events) == want
  assert sum(len(e[2]) > 1 for e in want) > 10


class TinyEncoder(nnx.Module):
  def __init__(self, vocab, hidden, *, rngs):
    self.hidden_size = hidden
    self.embed = nnx.Embed(vocab, hidden, rngs=rngs)

  def __call__(self, input_ids, attention_mask, positions=None, embed_delta=None):
    return self.embed(input_ids) * attention_mask[..., None]


def test_event_model_reads_its_batch():
  rngs = nnx.Rngs(0)
  B, L, C = 2, 8, 4
  model = EventModel(TinyEncoder(20, 8, rngs=rngs), EventHead(8, C, head_size=4, rngs=rngs), ("input_ids",))
  rng = np.random.default_rng(0)
  am = np.zeros((B, L), np.int32)
  am[:, 1:6] = 1
  batch = {"input_ids": jnp.asarray(rng.integers(0, 20, size=(B, L))), "attention_mask": jnp.asarray(am),
           "span_mask": jnp.asarray(am), "positions": jnp.broadcast_to(jnp.arange(L), (B, L)),
           "argument_ids": jnp.asarray(random_ids(rng, B, C, L, 3)),
           "head_ids": jnp.asarray(random_ids(rng, B, 1, L, 3)), "tail_ids": jnp.asarray(random_ids(rng, B, 1, L, 3))}
  hidden = model.encode(batch)
  want = model.head.loss(hidden, batch["span_mask"], argument_ids=batch["argument_ids"], head_ids=batch["head_ids"],
                         tail_ids=batch["tail_ids"], positions=batch["positions"])
  assert float(model.loss(batch)) == pytest.approx(float(want))
  with pytest.raises(ValueError, match="sparse_zlpr"):
    model.loss(batch, loss_kind="zlpr")
  got = model.decode_hits(batch, size=(64, 32, 32), threshold=-0.5)
  ref = model.head.decode_hits(hidden, batch["span_mask"], positions=batch["positions"], sizes=(64, 32, 32),
                               threshold=-0.5)
  for g, r in zip(got, ref):
    for a, b in zip(g, r):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert [g[1].shape for g in got] == [(64, 4), (32, 4), (32, 4)]
