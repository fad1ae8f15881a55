"""Device decoding of events (`ops.event_hits`) plus host grouping against Su's `extract_events` as plain Python:
planted overlapping events and random scores; link cells kept only between decoded arguments' starts / ends; the
bounded buffers and their counts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax.ops import span_mask
from gp_jax.ops.events import event_hits
from gp_jax.tasks.base import grown_sizes
from gp_jax.tasks.events.cliques import group_events
from tests.tasks.test_event_cliques import LABELS, PLANTED, as_set, planted_scores, su_events


def device_decode(argument, head, tail, am, *, sizes, threshold=0.0, link_threshold=None):
  am = jnp.asarray(am)
  fn = jax.jit(event_hits, static_argnames=("sizes",))
  return fn(jnp.asarray(argument), jnp.asarray(head), jnp.asarray(tail), argument_mask=span_mask(am),
            link_mask=span_mask(am), sizes=sizes, threshold=threshold, link_threshold=link_threshold)


def cells_reference(argument, head, tail, am, threshold=0.0, link_threshold=None):
  """(argument, head, tail) cells the device keeps, as sets of (row, class or 0, i, j): arguments above the
  threshold on content tokens with i <= j; head cells i <= j above the link threshold with both tokens starting a
  decoded argument of the row; tail cells with both ending one."""
  link_threshold = threshold if link_threshold is None else link_threshold
  B, C, L, _ = argument.shape
  args, heads, tails = set(), set(), set()
  for b in range(B):
    row = {(c, i, j) for c in range(C) for i in range(L) for j in range(i, L)
           if am[b, i] and am[b, j] and argument[b, c, i, j] > threshold}
    args |= {(b, *x) for x in row}
    starts, ends = {i for _, i, _ in row}, {j for _, _, j in row}
    heads |= {(b, 0, i, j) for i in starts for j in starts if i <= j and head[b, 0, i, j] > link_threshold}
    tails |= {(b, 0, i, j) for i in ends for j in ends if i <= j and tail[b, 0, i, j] > link_threshold}
  return args, heads, tails


def hit_set(hits):
  count, coords, scores = hits
  coords = np.asarray(coords)[: int(count)]
  return set(map(tuple, coords.tolist()))


def test_planted_events_through_the_device():
  argument, head, tail, am = planted_scores()
  hits = device_decode(argument, head, tail, am, sizes=(256, 256, 256))
  assert tuple(hit_set(h) for h in hits) == cells_reference(argument, head, tail, am)
  for require_trigger in (True, False):
    got = group_events(*hits, classes=LABELS, require_trigger=require_trigger)
    assert as_set(got.events) == su_events(argument, head, tail, am, LABELS, trigger=require_trigger)
  got = group_events(*hits, classes=LABELS)
  assert {e for e in as_set(got.events) if e[0] == 0} == {
      (0, t, frozenset(a)) for t, a in PLANTED if any(r == "trigger" for r, *_ in a)}
  # Scores come back from the device with the coordinates.
  count, coords, scores = hits[0]
  for (b, c, i, j), s in zip(np.asarray(coords)[: int(count)].tolist(), np.asarray(scores).tolist()):
    assert s == argument[b, c, i, j]


@pytest.mark.parametrize("seed,threshold,link_threshold", [(0, 0.0, None), (1, 0.3, None), (2, 0.0, 0.5),
                                                           (3, -0.3, 0.2)])
def test_random_scores_against_su(seed, threshold, link_threshold):
  rng = np.random.default_rng(seed)
  B, L = 3, 9
  C = len(LABELS)
  argument = (rng.normal(size=(B, C, L, L)) - 1.2).astype(np.float32)
  head = (rng.normal(size=(B, 1, L, L)) + 0.5).astype(np.float32)
  tail = (rng.normal(size=(B, 1, L, L)) + 0.5).astype(np.float32)
  am = np.zeros((B, L), np.int32)
  for b in range(B):
    am[b, 1:int(rng.integers(4, L))] = 1
  hits = device_decode(argument, head, tail, am, sizes=(B * C * L * L, B * L * L, B * L * L), threshold=threshold,
                       link_threshold=link_threshold)
  assert tuple(hit_set(h) for h in hits) == cells_reference(argument, head, tail, am, threshold, link_threshold)
  if link_threshold is None:  # Su decodes at one threshold
    for require_trigger in (True, False):
      got = group_events(*hits, classes=LABELS, require_trigger=require_trigger)
      want = su_events(argument, head, tail, am, LABELS, threshold=threshold, trigger=require_trigger)
      assert as_set(got.events) == want and len(want) > 3


def test_untrained_links_fire_only_at_decoded_boundaries():
  """Every link cell above the threshold: only the upper-triangle cells between decoded starts (ends) are kept,
  not L^2."""
  B, C, L = 2, 3, 16
  argument = np.full((B, C, L, L), -1.0, np.float32)
  argument[0, 0, 2, 4] = argument[0, 1, 2, 2] = argument[0, 2, 6, 9] = 1.0  # starts {2, 6}, ends {2, 4, 9}
  argument[1, 0, 5, 5] = 1.0
  head = np.ones((B, 1, L, L), np.float32)
  tail = np.ones((B, 1, L, L), np.float32)
  am = np.ones((B, L), np.int32)
  args, heads, tails = device_decode(argument, head, tail, am, sizes=(4, 64, 64))
  assert int(args[0]) == 4
  assert int(heads[0]) == 3 + 1  # (2, 2), (2, 6), (6, 6); (5, 5)
  assert int(tails[0]) == 6 + 1  # pairs with i <= j of {2, 4, 9}; (5, 5)
  assert hit_set(heads) == {(0, 0, 2, 2), (0, 0, 2, 6), (0, 0, 6, 6), (1, 0, 5, 5)}


def test_overflow_reported_by_count_then_full_decode():
  argument, head, tail, am = planted_scores()
  want = cells_reference(argument, head, tail, am)
  small = device_decode(argument, head, tail, am, sizes=(8, 8, 8))
  assert tuple(int(h[0]) for h in small) == tuple(len(x) for x in want)
  assert all(len(x) > 8 for x in want)
  with pytest.raises(ValueError, match="buffer"):
    group_events(*small, classes=LABELS)
  sizes = grown_sizes((8, 8, 8), [h[0] for h in small])
  grown = device_decode(argument, head, tail, am, sizes=sizes)
  assert tuple(hit_set(h) for h in grown) == want


def test_one_head_links_only():
  x = np.zeros((1, 2, 4, 4), np.float32)
  with pytest.raises(ValueError, match="one head"):
    event_hits(jnp.asarray(x), jnp.asarray(x), jnp.asarray(x[:, :1]), argument_mask=True, link_mask=True,
               sizes=(4, 4, 4))
