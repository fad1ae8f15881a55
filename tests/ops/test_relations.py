"""GPLinker ops against plain references: the non-triangular mask, the per-pointer loss reduction, device decoding
plus host assembly against Su's decoding loops, and the bounded hit buffers."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax import ops
from gp_jax.ops import TRIPLE_COLUMNS, assemble_triples, relation_hits

# The masks and the loss, jitted as the trainer runs them: run eagerly, every op compiles on its own for each shape.
span_mask = jax.jit(ops.span_mask, static_argnames=("max_span_width", "triangular"))
sparse_zlpr_loss = jax.jit(ops.sparse_zlpr_loss, static_argnames="reduction")
from gp_jax.tasks.base import grown_sizes


def content_mask(rng, B, L):
  """[B, L] {0,1}: token 0 is [CLS], then 2..L-1 content tokens, then [SEP] and padding."""
  lengths = rng.integers(2, L, size=B)
  pos = np.arange(L)[None]
  return ((pos >= 1) & (pos <= lengths[:, None])).astype(np.int32)


# --- masks ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("width", [None, 3])
def test_span_mask_without_triangle(width):
  rng = np.random.default_rng(0)
  am = content_mask(rng, 3, 7)
  out = np.asarray(span_mask(jnp.asarray(am), max_span_width=width, triangular=False))
  tri = np.asarray(span_mask(jnp.asarray(am), max_span_width=width))
  assert out.shape == tri.shape == (3, 1, 7, 7)
  for b in range(3):
    for i in range(7):
      for j in range(7):
        both = bool(am[b, i] and am[b, j])
        near = width is None or abs(j - i) < width
        assert out[b, 0, i, j] == (both and near)
        assert tri[b, 0, i, j] == (both and near and i <= j)


# --- loss reduction ------------------------------------------------------------------------------------------------

def zlpr_sum_heads_reference(logits, pos_cells, valid):
  """Per (b, h): log(1 + sum_{valid, not gold} e^s) + log(1 + sum_{valid, gold} e^-s); summed over h, mean over b."""
  B, H, L, _ = logits.shape
  total = 0.0
  for b in range(B):
    for h in range(H):
      neg, pos = 1.0, 1.0
      for i in range(L):
        for j in range(L):
          if not valid[b, i, j]:
            continue
          s = float(logits[b, h, i, j])
          if (i, j) in pos_cells[b][h]:
            pos += math.exp(-s)
          else:
            neg += math.exp(s)
      total += math.log(neg) + math.log(pos)
  return total / B


@pytest.mark.parametrize("seed", range(3))
def test_sparse_zlpr_sum_heads(seed):
  rng = np.random.default_rng(seed)
  B, H, L, K = 3, 4, 6, 5
  logits = (rng.normal(size=(B, H, L, L)) * 3).astype(np.float32)
  am = content_mask(rng, B, L)
  valid = am[:, :, None].astype(bool) & am[:, None, :].astype(bool)  # no triangle
  ids = -np.ones((B, H, K), np.int32)
  pos_cells = [[set() for _ in range(H)] for _ in range(B)]
  for b in range(B):
    for h in range(H):
      n = rng.integers(0, K + 1)
      cells = rng.choice(L * L, size=n, replace=False)
      ids[b, h, :n] = cells
      pos_cells[b][h] = {(c // L, c % L) for c in cells if valid[b, c // L, c % L]}  # outside the mask: ignored
  mask = span_mask(jnp.asarray(am), triangular=False)
  out = sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(ids), mask=mask, reduction="sum_heads")
  assert float(out) == pytest.approx(zlpr_sum_heads_reference(logits, pos_cells, valid), rel=1e-5)
  mean = sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(ids), mask=mask)
  assert float(mean) == pytest.approx(zlpr_sum_heads_reference(logits, pos_cells, valid) / H, rel=1e-5)
  with pytest.raises(ValueError, match="reduction"):
    sparse_zlpr_loss(jnp.asarray(logits), span_ids=jnp.asarray(ids), mask=mask, reduction="sum")


# --- decoding ------------------------------------------------------------------------------------------------------

def su_decode(entity, head, tail, am, *, threshold=0.0, pointer_threshold=None, subject_types=None,
              object_types=None):
  """Su's GPLinker decoding, as plain loops: entities = cells above the threshold (i <= j, content tokens); for
  every (subject, object) pair, the relations r with head[r, sh, oh] and tail[r, st, ot] above the threshold.
  -> {(row, r, s_type, sh, st, o_type, oh, ot): score}, the score the smallest of the four cells."""
  pointer_threshold = threshold if pointer_threshold is None else pointer_threshold
  B, E, L, _ = entity.shape
  R = head.shape[1]
  triples = {}
  for b in range(B):
    entities = [(t, i, j) for t in range(E) for i in range(L) for j in range(i, L)
                if am[b, i] and am[b, j] and entity[b, t, i, j] > threshold]
    subjects = [e for e in entities if subject_types is None or e[0] in subject_types]
    objects = [e for e in entities if object_types is None or e[0] in object_types]
    for st_, sh, se in subjects:
      for ot_, oh, oe in objects:
        for r in range(R):
          if head[b, r, sh, oh] > pointer_threshold and tail[b, r, se, oe] > pointer_threshold:
            triples[b, r, st_, sh, se, ot_, oh, oe] = min(
                float(entity[b, st_, sh, se]), float(entity[b, ot_, oh, oe]), float(head[b, r, sh, oh]),
                float(tail[b, r, se, oe]))
  return triples


def device_decode(entity, head, tail, am, *, sizes, threshold=0.0, pointer_threshold=None):
  am = jnp.asarray(am)
  fn = jax.jit(relation_hits, static_argnames=("sizes",))
  return fn(jnp.asarray(entity), jnp.asarray(head), jnp.asarray(tail), entity_mask=span_mask(am),
            pointer_mask=span_mask(am, triangular=False), sizes=sizes, threshold=threshold,
            pointer_threshold=pointer_threshold)


def as_dict(triples, scores):
  assert triples.shape[1] == len(TRIPLE_COLUMNS)
  out = {tuple(t): float(s) for t, s in zip(triples.tolist(), scores.tolist())}
  assert len(out) == len(triples)  # no duplicates
  return out


def plant(entity, head, tail, b, subject, obj, relations, value=2.0):
  """Makes (subject, r, object) a gold-like triple: both entity cells and the head/tail cells above 0."""
  (s_type, sh, se), (o_type, oh, oe) = subject, obj
  entity[b, s_type, sh, se] = value
  entity[b, o_type, oh, oe] = value + 0.5
  for r in relations:
    head[b, r, sh, oh] = value + 1.0
    tail[b, r, se, oe] = value + 1.5


def planted_case():
  """Row 0 quiet except planted triples with entity-pair overlap (two relations between one pair), single-entity
  overlap (one subject, two objects; one object, two subjects), an object before its subject, and nested entities
  sharing a start. Row 1 random scores, dense in hits."""
  rng = np.random.default_rng(7)
  B, E, R, L = 2, 2, 3, 12
  entity = np.full((B, E, L, L), -3.0, np.float32)
  head = np.full((B, R, L, L), -3.0, np.float32)
  tail = np.full((B, R, L, L), -3.0, np.float32)
  am = np.zeros((B, L), np.int32)
  am[:, 1:11] = 1
  plant(entity, head, tail, 0, (0, 1, 2), (1, 5, 5), [0, 2])  # EPO: two relations, one pair
  plant(entity, head, tail, 0, (0, 1, 2), (1, 7, 9), [1])  # SEO: the same subject, a second object
  plant(entity, head, tail, 0, (0, 8, 8), (1, 5, 5), [1])  # SEO: the first object, a second subject
  plant(entity, head, tail, 0, (0, 8, 10), (1, 3, 4), [2])  # object before subject; subject nested with (8, 8)
  # An object-role entity as the subject of another object: a triple only when roles are not enforced.
  head[0, 0, 5, 7], tail[0, 0, 5, 9] = 3.0, 3.5
  # A head cell whose tail cell is missing, and a tail without head: no triple.
  entity[0, 0, 3, 3] = 1.0
  head[0, 0, 3, 7] = 1.0
  tail[0, 1, 4, 9] = 1.0
  entity[1] = rng.normal(size=(E, L, L)) - 1.0
  head[1] = rng.normal(size=(R, L, L))
  tail[1] = rng.normal(size=(R, L, L))
  expected_row0 = {
      (0, 0, 0, 1, 2, 1, 5, 5), (0, 2, 0, 1, 2, 1, 5, 5), (0, 1, 0, 1, 2, 1, 7, 9), (0, 1, 0, 8, 8, 1, 5, 5),
      (0, 2, 0, 8, 10, 1, 3, 4)}
  return entity, head, tail, am, expected_row0


@pytest.mark.parametrize("roles", [False, True])
def test_planted_overlaps_against_su_loops(roles):
  entity, head, tail, am, expected_row0 = planted_case()
  kw = dict(subject_types={0}, object_types={1}) if roles else {}
  hits = device_decode(entity, head, tail, am, sizes=(1024, 4096, 4096))
  triples, scores = assemble_triples(*hits, **kw)
  got = as_dict(triples, scores)
  want = su_decode(entity, head, tail, am, **kw)
  assert got == want
  row0 = {t for t in got if t[0] == 0}
  assert row0 == (expected_row0 if roles else expected_row0 | {(0, 0, 1, 5, 5, 1, 7, 9)})
  assert sum(t[0] == 1 for t in got) > 10  # the random row decodes many triples
  # Scores: the smallest of the four cells (planted: the subject entity cell, 2.0).
  assert all(got[t] == pytest.approx(2.0) for t in expected_row0)
  # Sorted by (row, subject, relation, object).
  keys = [(t[0], t[2], t[3], t[4], t[1], t[5], t[6], t[7]) for t in triples.tolist()]
  assert keys == sorted(keys)


@pytest.mark.parametrize("seed,threshold,pointer_threshold", [(0, 0.0, None), (1, 0.5, None), (2, 0.0, 1.0),
                                                              (3, -0.5, 0.3)])
def test_random_scores_against_su_loops(seed, threshold, pointer_threshold):
  rng = np.random.default_rng(seed)
  B, E, R, L = 3, 3, 4, 9
  entity = (rng.normal(size=(B, E, L, L)) - 1.0).astype(np.float32)
  head = rng.normal(size=(B, R, L, L)).astype(np.float32)
  tail = rng.normal(size=(B, R, L, L)).astype(np.float32)
  am = content_mask(rng, B, L)
  hits = device_decode(entity, head, tail, am, sizes=(B * E * L * L, B * R * L * L, B * R * L * L),
                       threshold=threshold, pointer_threshold=pointer_threshold)
  kw = dict(subject_types={0, 2}, object_types={1, 2})
  for types in ({}, kw):
    triples, scores = assemble_triples(*hits, **types)
    want = su_decode(entity, head, tail, am, threshold=threshold, pointer_threshold=pointer_threshold, **types)
    assert as_dict(triples, scores) == want
    assert len(want) > 0


def cells_reference(entity, head, tail, am, threshold=0.0):
  """How many entity, head and tail cells the device keeps: entity cells above the threshold; head cells above it
  whose row and column both start a decoded entity; tail cells whose both tokens end one."""
  B, E, L, _ = entity.shape
  n_ent = n_head = n_tail = 0
  for b in range(B):
    ents = [(i, j) for t in range(E) for i in range(L) for j in range(i, L)
            if am[b, i] and am[b, j] and entity[b, t, i, j] > threshold]
    n_ent += len(ents)
    starts, ends = {i for i, _ in ents}, {j for _, j in ents}
    n_head += sum(int(head[b, r, i, j] > threshold) for r in range(head.shape[1]) for i in starts for j in starts)
    n_tail += sum(int(tail[b, r, i, j] > threshold) for r in range(tail.shape[1]) for i in ends for j in ends)
  return n_ent, n_head, n_tail


def test_overflow_reported_by_count_then_full_decode():
  entity, head, tail, am, _ = planted_case()
  counts = cells_reference(entity, head, tail, am)
  assert all(c > 8 for c in counts)
  small = device_decode(entity, head, tail, am, sizes=(8, 8, 8))
  assert tuple(int(h[0]) for h in small) == counts  # every count exceeds its buffer of 8
  for h in small:
    assert h[1].shape == (8, 4) and h[2].shape == (8,)
  with pytest.raises(ValueError, match="buffer"):
    assemble_triples(*small)
  # Grown to the counts (as the host does), the buffers hold every hit.
  sizes = grown_sizes((8, 8, 8), [h[0] for h in small])
  assert all(c <= s < 2 * c and s & (s - 1) == 0 for c, s in zip(counts, sizes))
  assert grown_sizes((8, 1 << 20, 8), counts)[1] == 1 << 20  # a buffer large enough stays
  grown = device_decode(entity, head, tail, am, sizes=sizes)
  assert tuple(int(h[0]) for h in grown) == counts
  assert as_dict(*assemble_triples(*grown)) == su_decode(entity, head, tail, am)


def test_untrained_pointers_fire_only_at_decoded_boundaries():
  """Every pointer cell above the threshold (an untrained model): only R * (#starts^2 + #ends^2) cells per row are
  kept, not 2R * L^2."""
  B, E, R, L = 2, 2, 5, 16
  entity = np.full((B, E, L, L), -1.0, np.float32)
  entity[0, 0, 2, 4] = entity[0, 1, 2, 2] = entity[0, 1, 6, 9] = 1.0  # starts {2, 6}, ends {2, 4, 9}
  entity[1, 0, 5, 5] = 1.0  # start {5}, end {5}
  head = np.ones((B, R, L, L), np.float32)
  tail = np.ones((B, R, L, L), np.float32)
  am = np.ones((B, L), np.int32)
  ent, head_hits, tail_hits = device_decode(entity, head, tail, am, sizes=(4, 64, 64))
  assert int(ent[0]) == 4
  assert int(head_hits[0]) == R * (2 ** 2 + 1 ** 2)
  assert int(tail_hits[0]) == R * (3 ** 2 + 1 ** 2)
  assert (int(ent[0]), int(head_hits[0]), int(tail_hits[0])) == cells_reference(entity, head, tail, am)
  coords = np.asarray(head_hits[1])[: int(head_hits[0])]
  assert set(map(tuple, coords[coords[:, 0] == 0][:, 2:].tolist())) == {(2, 2), (2, 6), (6, 2), (6, 6)}
  # Every entity pair x relation is a triple: 3 x 3 pairs in row 0, 1 in row 1.
  triples, _ = assemble_triples(ent, head_hits, tail_hits)
  assert len(triples) == R * (9 + 1)


def test_no_hits():
  B, E, R, L = 2, 2, 3, 6
  entity = np.full((B, E, L, L), -1.0, np.float32)
  head = np.ones((B, R, L, L), np.float32)
  tail = np.ones((B, R, L, L), np.float32)
  hits = device_decode(entity, head, tail, np.ones((B, L), np.int32), sizes=(4, 4, 4))
  assert [int(h[0]) for h in hits] == [0, 0, 0]
  triples, scores = assemble_triples(*hits)
  assert triples.shape == (0, 8) and scores.shape == (0,)
