"""GPLinkerHead against NumPy written from the formulas (pointer scores, masks, RoPE, the loss reduction), its
decoding against Su's loops, and a tiny model that learns a synthetic relation set."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gp_jax.models.gplinker import GPLinkerHead
from gp_jax.ops import assemble_triples
from tests.ops.test_relations import su_decode

NEG = np.finfo(np.float32).min


def rope_np(x, pos):
  """RoPE on interleaved pairs (x[2t], x[2t+1]) by pos * 10000^(-2t/d)."""
  d = x.shape[-1]
  out = x.copy()
  for t in range(d // 2):
    th = pos * 10000.0 ** (-2 * t / d)
    a, b = x[..., 2 * t].copy(), x[..., 2 * t + 1].copy()
    out[..., 2 * t] = a * math.cos(th) - b * math.sin(th)
    out[..., 2 * t + 1] = b * math.cos(th) + a * math.sin(th)
  return out


def pointer_reference(pointer, x_BLD, am_BL, positions_BL, *, efficient, rope, triangular):
  """Scores `[B, H, L, L]` from the pointer's parameters, float64; cells outside the mask hold NEG."""
  W, b = np.asarray(pointer.dense.kernel[...], np.float64), np.asarray(pointer.dense.bias[...], np.float64)
  B, L, _ = x_BLD.shape
  d = pointer.head_size
  H = pointer.num_types
  out = np.full((B, H, L, L), NEG, np.float64)
  for bb in range(B):
    p = x_BLD[bb].astype(np.float64) @ W + b
    if efficient:
      W2 = np.asarray(pointer.bias_dense.kernel[...], np.float64)
      b2 = np.asarray(pointer.bias_dense.bias[...], np.float64)
      bias = (p @ W2 + b2) / 2  # [L, 2H]: channel 2h + 1 on the start, 2h on the end
      qs = [p[:, 0::2]] * H
      ks = [p[:, 1::2]] * H
    else:
      proj = p.reshape(L, H, 2 * d)
      qs = [proj[:, h, :d] for h in range(H)]
      ks = [proj[:, h, d:] for h in range(H)]
    for h in range(H):
      for i in range(L):
        for j in range(L):
          if not (am_BL[bb, i] and am_BL[bb, j]) or (triangular and j < i):
            continue
          q, k = qs[h][i], ks[h][j]
          if rope:
            q, k = rope_np(q, positions_BL[bb, i]), rope_np(k, positions_BL[bb, j])
          s = float(q @ k) / math.sqrt(d)
          if efficient:
            s += bias[i, 2 * h + 1] + bias[j, 2 * h]
          out[bb, h, i, j] = s
  return out


# The head's forward pass and losses, jitted as the trainer runs them: run eagerly, every op compiles on its own.
_forward = nnx.jit(lambda head, x, am, kw: head(x, am, **kw))
_losses = nnx.jit(lambda head, x, am, kw: head.losses(x, am, **kw))
_loss = nnx.jit(lambda head, x, am, kw: head.loss(x, am, **kw))


def make_case(seed, *, B=2, L=7, D=6, E=2, R=3, d=4, **kw):
  head = GPLinkerHead(D, E, R, head_size=d, rngs=nnx.Rngs(seed), **kw)
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
  ent, hd, tl = _forward(head, jnp.asarray(x), jnp.asarray(am), {"positions": jnp.asarray(positions)})
  assert ent.shape == (2, 2, 7, 7) and hd.shape == tl.shape == (2, 3, 7, 7)
  cases = ((ent, head.entity_pointer, use_rope, True), (hd, head.head_pointer, pointer_rope, False),
           (tl, head.tail_pointer, pointer_rope, False))
  for got, pointer, rope, tri in cases:
    want = pointer_reference(pointer, x, am, positions, efficient=efficient, rope=rope, triangular=tri)
    got = np.asarray(got)
    masked = want == NEG
    assert (got[masked] == NEG).all()
    np.testing.assert_allclose(got[~masked], want[~masked], rtol=1e-4, atol=1e-5)
  # Head and tail pointers score the lower triangle (an object before its subject); the entity pointer does not.
  assert (np.asarray(hd)[0, :, 3, 1] > NEG).all() and (np.asarray(ent)[0, :, 3, 1] == NEG).all()


def test_pointers_are_separate_parameters():
  head, x, am, positions = make_case(1)
  _, hd, tl = _forward(head, jnp.asarray(x), jnp.asarray(am), {})
  assert not np.allclose(np.asarray(hd), np.asarray(tl))
  assert {"entity_pointer", "head_pointer", "tail_pointer"} <= set(nnx.state(head, nnx.Param).keys())


def zlpr_np(scores, gold, valid):
  """Per head: log(1 + sum_{valid, not gold} e^s) + log(1 + sum_{valid, gold} e^-s); summed over heads, mean over
  the batch. `gold[b][h]` is a set of (i, j)."""
  B, H = scores.shape[:2]
  total = 0.0
  for b in range(B):
    for h in range(H):
      cells = np.argwhere(valid[b])
      neg = sum(math.exp(scores[b, h, i, j]) for i, j in cells if (i, j) not in gold[b][h])
      pos = sum(math.exp(-scores[b, h, i, j]) for i, j in cells if (i, j) in gold[b][h])
      total += math.log1p(neg) + math.log1p(pos)
  return total / B


def random_ids(rng, B, H, L, K):
  """Flat ids `[B, H, K]` anywhere in the square, -1 padded, some rows empty."""
  ids = -np.ones((B, H, K), np.int32)
  for b in range(B):
    for h in range(H):
      n = int(rng.integers(0, K + 1))
      ids[b, h, :n] = rng.choice(L * L, size=n, replace=False)
  return ids


@pytest.mark.parametrize("efficient", [True, False])
@pytest.mark.parametrize("pointer_rope", [False, True])
def test_loss_against_formulas(efficient, pointer_rope):
  """Sum over heads, mean over the batch, the mean of the three pointers; gold ids anywhere (lower triangle, on
  [CLS] or padding: those count only where the pointer's mask holds them)."""
  head, x, am, positions = make_case(2, efficient=efficient, pointer_rope=pointer_rope)
  B, L = am.shape
  rng = np.random.default_rng(3)
  ids = {"entity_ids": random_ids(rng, B, 2, L, 6), "head_ids": random_ids(rng, B, 3, L, 6),
         "tail_ids": random_ids(rng, B, 3, L, 6)}
  content = am[:, :, None].astype(bool) & am[:, None, :].astype(bool)
  tri = np.triu(np.ones((L, L), bool))[None]
  parts = {}
  for name, pointer, rope, valid in (("entity", head.entity_pointer, True, content & tri),
                                     ("head", head.head_pointer, pointer_rope, content),
                                     ("tail", head.tail_pointer, pointer_rope, content)):
    scores = pointer_reference(pointer, x, am, positions, efficient=efficient, rope=rope, triangular=name == "entity")
    flat = ids[f"{name}_ids"]
    gold = [[{(int(c) // L, int(c) % L) for c in flat[b, h] if c >= 0} for h in range(flat.shape[1])]
            for b in range(B)]
    parts[name] = zlpr_np(scores, gold, valid)
  args = (jnp.asarray(x), jnp.asarray(am))
  kw = {k: jnp.asarray(v) for k, v in ids.items()}
  got = _losses(head, *args, {"positions": jnp.asarray(positions), **kw})
  for name in parts:
    assert float(got[name]) == pytest.approx(parts[name], rel=1e-4), name
  total = _loss(head, *args, {"positions": jnp.asarray(positions), **kw})
  assert float(total) == pytest.approx(sum(parts.values()) / 3, rel=1e-4)
  # The lower-triangle gold cells of the pointers count: dropping them changes the loss.
  lower = {k: np.where((v >= 0) & (v // L > v % L), -1, v) for k, v in ids.items() if k != "entity_ids"}
  assert any((lower[k] != ids[k]).any() for k in lower)
  dropped = _losses(head, *args, {"positions": jnp.asarray(positions), "entity_ids": kw["entity_ids"],
                                  **{k: jnp.asarray(v) for k, v in lower.items()}})
  assert float(dropped["head"]) != pytest.approx(float(got["head"]), rel=1e-6)


def test_entity_blockwise_loss_equals_dense_and_pointers_refuse_blocks():
  head, x, am, positions = make_case(4, L=16)
  B, L = am.shape
  rng = np.random.default_rng(0)
  kw = dict(entity_ids=jnp.asarray(random_ids(rng, B, 2, L, 4)), head_ids=jnp.asarray(random_ids(rng, B, 3, L, 4)),
            tail_ids=jnp.asarray(random_ids(rng, B, 3, L, 4)), positions=jnp.asarray(positions))
  dense = nnx.jit(lambda h, x, am, kw: h.losses(x, am, **kw))(head, jnp.asarray(x), jnp.asarray(am), kw)  # one program
  blocks = nnx.jit(lambda h, x, am, kw: h.losses(x, am, block_size=8, implementation="xla", **kw))(
      head, jnp.asarray(x), jnp.asarray(am), kw)
  for name in dense:
    assert float(blocks[name]) == pytest.approx(float(dense[name]), rel=1e-5), name
  with pytest.raises(ValueError, match="upper triangle"):
    head.head_pointer.span_loss(jnp.asarray(x), jnp.asarray(am), span_ids=kw["head_ids"], block_size=8)
  assert head.pointer_loss_path == "dense"


@pytest.mark.parametrize("efficient", [True, False])
def test_decode_hits_against_su_loops(efficient):
  head, x, am, positions = make_case(5, B=3, L=10, D=8, E=2, R=4, d=4, efficient=efficient, pointer_rope=True)
  x *= 3  # scores of both signs, many hits
  args = (jnp.asarray(x), jnp.asarray(am), jnp.asarray(positions))
  # jitted: op by op, every op compiles on its own
  scores = [np.asarray(s) for s in nnx.jit(lambda h, x, am, pos: h(x, am, positions=pos))(head, *args)]
  hits = nnx.jit(lambda h, x, am, pos: h.decode_hits(x, am, positions=pos, sizes=(512, 2048, 2048), threshold=0.1))(
      head, *args)
  assert all(int(h[0]) <= len(h[1]) for h in hits)
  got = assemble_triples(*hits, subject_types={0}, object_types={1})
  want = su_decode(*scores, am, threshold=0.1, subject_types={0}, object_types={1})
  assert len(want) > 0
  assert {tuple(t): float(s) for t, s in zip(got[0].tolist(), got[1].tolist())} == want


# --- a tiny model that learns a synthetic relation set ------------------------------------------------------------

PAD, CLS, SEP = 0, 1, 2
FILLERS = range(3, 8)
N_SUBJ = N_OBJ = 4
SUBJ_START, SUBJ_END, OBJ_START, OBJ_END = 8, 12, 16, 20  # + entity id
VOCAB = 24
# Relations of (subject x, object y): BY_SUBJECT[x] | BY_OBJECT[y]. Subject 3 always holds two relations to an
# object (entity-pair overlap); a sentence with two objects gives single-entity overlap.
BY_SUBJECT = ({0}, {1}, {2}, {0, 2})
BY_OBJECT = (set(), {3}, set(), {1})
R = 4


def synthetic_batch(rng, B, L=16, K=8):
  """Sentences of [CLS] content [SEP] padding; 1-2 subjects and 1-2 objects, each two tokens (start, end) naming the
  entity. Every (subject, object) pair in a sentence holds its relations. -> (tokens, span mask, ids, gold triples
  {(row, r, 0, sh, se, 1, oh, oe)})."""
  tokens = np.zeros((B, L), np.int32)
  am = np.zeros((B, L), np.int32)
  ids = {k: -np.ones((B, n, K), np.int32) for k, n in (("entity_ids", 2), ("head_ids", R), ("tail_ids", R))}
  gold = set()
  for b in range(B):
    n = int(rng.integers(10, L - 1))
    tokens[b, 0], tokens[b, n + 1] = CLS, SEP
    tokens[b, 1:n + 1] = rng.choice(list(FILLERS), size=n)
    am[b, 1:n + 1] = 1
    kinds = [0] * int(rng.integers(1, 3)) + [1] * int(rng.integers(1, 3))
    starts = sorted(rng.choice(np.arange(1, n + 1, 2)[: n // 2], size=len(kinds), replace=False))
    rng.shuffle(kinds)
    subjects, objects = [], []
    for kind, s in zip(kinds, starts):
      e = int(rng.integers(0, N_SUBJ))
      first, last = (SUBJ_START, SUBJ_END) if kind == 0 else (OBJ_START, OBJ_END)
      tokens[b, s], tokens[b, s + 1] = first + e, last + e
      (subjects if kind == 0 else objects).append((e, int(s), int(s) + 1))
    ent = [[(sh * L + se) for _, sh, se in subjects], [(oh * L + oe) for _, oh, oe in objects]]
    heads, tails = [[] for _ in range(R)], [[] for _ in range(R)]
    for x, sh, se in subjects:
      for y, oh, oe in objects:
        for r in BY_SUBJECT[x] | BY_OBJECT[y]:
          heads[r].append(sh * L + oh)
          tails[r].append(se * L + oe)
          gold.add((b, r, 0, sh, se, 1, oh, oe))
    for name, rows in (("entity_ids", ent), ("head_ids", heads), ("tail_ids", tails)):
      for h, cells in enumerate(rows):
        ids[name][b, h, : len(cells)] = cells
  return tokens, am, ids, gold


class TinyLinker(nnx.Module):
  def __init__(self, *, efficient, rngs):
    self.embed = nnx.Embed(VOCAB, 32, rngs=rngs)
    self.head = GPLinkerHead(32, 2, R, head_size=16, efficient=efficient, rngs=rngs)


def triple_f1(pred, gold):
  tp = len(pred & gold)
  return 2 * tp / (len(pred) + len(gold)) if pred or gold else 1.0


@pytest.mark.e2e  # trains a model until it learns
@pytest.mark.parametrize("efficient", [True, False])
def test_tiny_model_learns_synthetic_relations(efficient):
  """Random embeddings + the head learn subject/object roles, entity-pair and single-entity overlaps: triple F1 1.0
  on fresh sentences."""
  model = TinyLinker(efficient=efficient, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(model, nnx.Param)
  tx = optax.adam(1e-2)
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
    return m.head.decode_hits(m.embed(tokens), am, sizes=(512, 1024, 1024))

  rng = np.random.default_rng(0)
  first = None
  for _ in range(300):
    tokens, am, ids, _ = synthetic_batch(rng, 32)
    params, opt_state, loss = step(params, opt_state, tokens, am, ids)
    first = float(loss) if first is None else first
  tokens, am, _, gold = synthetic_batch(np.random.default_rng(123), 128)
  hits = decode(params, tokens, am)
  triples, _ = assemble_triples(*hits, subject_types={0}, object_types={1})
  pred = set(map(tuple, triples.tolist()))
  assert float(loss) < first / 10
  pairs = [(t[0], t[3], t[6]) for t in gold]
  assert len(pairs) > len(set(pairs))  # entity-pair overlap: one pair, two relations
  objects_of = {}
  for row, _, _, sh, _, _, oh, _ in gold:
    objects_of.setdefault((row, sh), set()).add(oh)
  assert max(map(len, objects_of.values())) > 1  # single-entity overlap: one subject, two objects
  assert triple_f1(pred, gold) == 1.0
