"""EventHead against NumPy written from the formulas (pointer scores, the links' upper triangle with its diagonal,
the loss reduction), its decoding with the host grouping against Su's `extract_events`, and EventModel reading its
batch."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gp_jax.models.events import EventHead, EventModel
from gp_jax.tasks.events.cliques import group_events
from gp_jax.tasks.events.targets import event_links
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


def jitted(module, fn, *args):
  """`fn(module, *args)` as one compiled program (eager ops would compile one by one)."""
  graphdef, state = nnx.split(module)
  return jax.jit(lambda state, *args: fn(nnx.merge(graphdef, state), *args))(state, *args)


@pytest.mark.parametrize("efficient", [True, False])
@pytest.mark.parametrize("use_rope,pointer_rope", [(True, False), (True, True), (False, False)])
def test_pointer_scores_against_formulas(efficient, use_rope, pointer_rope):
  head, x, am, positions = make_case(0, efficient=efficient, use_rope=use_rope, pointer_rope=pointer_rope)
  arg, hd, tl = jitted(head, lambda h, x, am, p: h(x, am, positions=p), jnp.asarray(x), jnp.asarray(am),
                       jnp.asarray(positions))
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
  diag = ids["head_ids"].copy()
  diag[0, 0, 0] = -1

  def run(h, x, am, positions, kw, diag):
    return (h.losses(x, am, positions=positions, **kw), h.loss(x, am, positions=positions, **kw),
            h.losses(x, am, positions=positions, **dict(kw, head_ids=diag)))

  got, total, dropped = jitted(head, run, *args, jnp.asarray(positions), kw, jnp.asarray(diag))
  assert set(got) == {"argument", "head", "tail"}
  for name in parts:
    assert float(got[name]) == pytest.approx(parts[name], rel=1e-4), name
  assert float(total) == pytest.approx(sum(parts.values()) / 3, rel=1e-4)
  # Gold on the diagonal of the links counts: dropping it changes the loss.
  assert float(dropped["head"]) != pytest.approx(float(got["head"]), rel=1e-6)


def test_argument_blockwise_loss_equals_dense():
  head, x, am, positions = make_case(4, L=16)
  B, L = am.shape
  rng = np.random.default_rng(0)
  kw = dict(argument_ids=jnp.asarray(random_ids(rng, B, 3, L, 4)), head_ids=jnp.asarray(random_ids(rng, B, 1, L, 4)),
            tail_ids=jnp.asarray(random_ids(rng, B, 1, L, 4)), positions=jnp.asarray(positions))
  dense, blocks = jitted(head, lambda h, x, am, kw: (h.losses(x, am, **kw), h.losses(
      x, am, block_size=8, implementation="xla", **kw)), jnp.asarray(x), jnp.asarray(am), kw)
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
  scores, hits = jitted(head, lambda h, x, am, p: (h(x, am, positions=p), h.decode_hits(
      x, am, positions=p, sizes=(256, 128, 128), threshold=threshold)), *args, jnp.asarray(positions))
  scores = [np.asarray(s) for s in scores]
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
  def run(m, batch):
    hidden = m.encode(batch)
    want = m.head.loss(hidden, batch["span_mask"], argument_ids=batch["argument_ids"], head_ids=batch["head_ids"],
                       tail_ids=batch["tail_ids"], positions=batch["positions"])
    ref = m.head.decode_hits(hidden, batch["span_mask"], positions=batch["positions"], sizes=(64, 32, 32),
                             threshold=-0.5)
    return m.loss(batch), want, m.decode_hits(batch, size=(64, 32, 32), threshold=-0.5), ref

  loss, want, got, ref = jitted(model, run, batch)
  assert float(loss) == pytest.approx(float(want))
  with pytest.raises(ValueError, match="sparse_zlpr"):
    model.loss(batch, loss_kind="zlpr")
  for g, r in zip(got, ref):
    for a, b in zip(g, r):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert int(got[0][0]) > 0
  assert [g[1].shape for g in got] == [(64, 4), (32, 4), (32, 4)]



# --- a tiny model that learns synthetic overlapping events ---------------------------------------------------------

TYPES, ROLES, SLOTS = ("A", "B"), ("trigger", "agent", "patient"), 3  # slot 2: shared by both events of a sentence
CLASSES = tuple((t, r) for t in TYPES for r in ROLES + ("part",))  # part: one token nested in an agent
CLASS_OF = {x: c for c, x in enumerate(CLASSES)}
VOCAB = 2 + len(TYPES) * len(ROLES) * SLOTS * 2  # 0 [CLS] / [SEP], 1 filler


def token(t, r, slot, end):
  """The first (end=0) or last (end=1) token of an argument of type t, role r, event slot."""
  return 2 + ((t * len(ROLES) + r) * SLOTS + slot) * 2 + end


def synthetic_events(rng, B, L=14):
  """Sentences of one or two events; an argument is two tokens naming (type, role, slot); an agent's first token is
  also a "part" argument (nested, same start). Two events of one type share their trigger or their patient (slot 2,
  one argument in two events); two of different types sit side by side. -> (tokens, span mask, targets as
  EventHead.loss takes them, gold {(row, type, frozenset of (role, start, end))})."""
  tokens = np.ones((B, L), np.int32)
  tokens[:, 0] = tokens[:, L - 1] = 0
  am = np.zeros((B, L), np.int32)
  am[:, 1:L - 1] = 1
  ids = {"argument_ids": -np.ones((B, len(CLASSES), L), np.int32), "head_ids": -np.ones((B, 1, L), np.int32),
         "tail_ids": -np.ones((B, 1, L), np.int32)}
  gold = set()
  for b in range(B):
    types_ = [int(rng.integers(2))]
    if rng.random() < 0.7:
      types_.append(types_[0] if rng.random() < 0.6 else 1 - types_[0])
    same = len(types_) == 2 and types_[0] == types_[1]
    shared = int(rng.choice([0, 2])) if same else None  # the role both events hold: trigger or patient
    free = list(rng.permutation(np.arange(1, L - 2, 2)))
    placed, events = {}, []
    for e, t in enumerate(types_):
      args = []
      for r in (0, 1, 2) if shared == 2 or rng.random() < 0.6 else (0, 1):
        slot = 2 if r == shared else e
        if (t, r, slot) not in placed:
          s = int(free.pop())
          tokens[b, s], tokens[b, s + 1] = token(t, r, slot, 0), token(t, r, slot, 1)
          placed[t, r, slot] = s
        s = placed[t, r, slot]
        args.append((ROLES[r], s, s + 1))
        if r == 1:
          args.append(("part", s, s))
      events.append(args)
      gold.add((b, TYPES[t], frozenset(args)))
    cells = [set() for _ in CLASSES]
    for t, args in zip(types_, events):
      for role, s, e in args:
        cells[CLASS_OF[TYPES[t], role]].add(s * L + e)
    for c, xs in enumerate(cells):
      ids["argument_ids"][b, c, : len(xs)] = sorted(xs)
    q = event_links([[(s, e) for _, s, e in args] for args in events])
    for name, i, j in (("head_ids", 0, 1), ("tail_ids", 2, 3)):
      xs = sorted({int(x) * L + int(y) for x, y in q[:, [i, j]].tolist()})
      ids[name][b, 0, : len(xs)] = xs
  return tokens, am, ids, gold


class TinyEventModel(nnx.Module):
  def __init__(self, *, rngs):
    self.embed = nnx.Embed(VOCAB, 32, rngs=rngs)
    self.head = EventHead(32, len(CLASSES), head_size=16, rngs=rngs)


def test_tiny_model_learns_overlapping_events():
  """Random embeddings + the head learn shared triggers, a patient shared by two events, nested arguments and events
  side by side: event-level F1 1.0 on fresh sentences."""
  model = TinyEventModel(rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = optax.adam(2e-2)
  opt_state = tx.init(params)

  def loss_fn(params, tokens, am, ids):
    m = nnx.merge(graphdef, params)
    return m.head.loss(m.embed(tokens), am, **ids)

  @jax.jit
  def step(params, opt_state, tokens, am, ids):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, am, ids)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  @jax.jit
  def decode(params, tokens, am):
    m = nnx.merge(graphdef, params)
    return m.head.decode_hits(m.embed(tokens), am, sizes=(1024, 1024, 1024))

  rng = np.random.default_rng(0)
  first = None
  for _ in range(120):
    tokens, am, ids, _ = synthetic_events(rng, 32)
    params, opt_state, loss = step(params, opt_state, tokens, am, ids)
    first = float(loss) if first is None else first
  tokens, am, _, gold = synthetic_events(np.random.default_rng(123), 64)
  got = group_events(*decode(params, tokens, am), classes=CLASSES)
  assert float(loss) < first / 10
  assert got.over_bound == 0
  kinds = {"shared trigger": 0, "shared patient": 0, "side by side": 0}
  for row in range(64):
    events = [e for e in gold if e[0] == row]
    if len(events) == 2 and events[0][1] == events[1][1]:
      both = events[0][2] & events[1][2]
      kinds["shared trigger" if any(a[0] == "trigger" for a in both) else "shared patient"] += 1
    elif len(events) == 2:
      kinds["side by side"] += 1
  assert min(kinds.values()) > 3, kinds
  assert as_set(got.events) == gold
