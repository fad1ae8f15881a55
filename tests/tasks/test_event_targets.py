"""Event link targets against Su's label loops (duee_v1.py's data generator): head and tail cells of every pair of
arguments of one event, deduplicated per window, -1 padded, the overflow beyond K = LINK_SLOTS * L counted."""

import types

import numpy as np
import pytest

from gp_jax.tasks.events.targets import LINK_SLOTS, event_links, event_targets, target_shapes


def su_link_labels(events):
  """Su's loop: for every event (a list of (label, start, end)) and every pair i1 < i2 of its arguments, the cells
  (min starts, max starts) and (min ends, max ends). -> (head_labels, tail_labels) sets."""
  head_labels, tail_labels = set(), set()
  for e in events:
    for i1, (_, h1, t1) in enumerate(e):
      for i2, (_, h2, t2) in enumerate(e):
        if i2 > i1:
          head_labels.add((min(h1, h2), max(h1, h2)))
          tail_labels.add((min(t1, t2), max(t1, t2)))
  return head_labels, tail_labels


def random_events(rng, L, n_events):
  """Events of one window: nested arguments (a shared start), an argument repeated across events, two roles on one
  span, random spans."""
  events = []
  pool = []
  for _ in range(n_events):
    e = []
    for _ in range(int(rng.integers(1, 5))):
      if pool and rng.random() < 0.3:
        e.append(pool[int(rng.integers(len(pool)))])  # an argument of another event
        continue
      s = int(rng.integers(1, L - 1))
      t = int(rng.integers(s, min(L - 1, s + 4)))
      e.append((int(rng.integers(0, 5)), s, t))
      if rng.random() < 0.2 and t > s:
        e.append((int(rng.integers(0, 5)), s, s))  # nested, same start
      if rng.random() < 0.1:
        e.append((int(rng.integers(0, 5)), s, t))  # the same span, another role
    pool.extend(e)
    events.append(e)
  return events


def table_of(windows, rng):
  """An EventTable-like value: links per window from `event_links`, rows shuffled and some repeated (the targets
  dedupe them)."""
  rows, ptr = [], [0]
  for events in windows:
    q = event_links([[(s, t) for _, s, t in e] for e in events])
    if len(q):
      q = np.concatenate([q, q[rng.integers(0, len(q), size=len(q) // 3)]])
      q = q[rng.permutation(len(q))]
    rows.append(q)
    ptr.append(ptr[-1] + len(q))
  return types.SimpleNamespace(ptr=np.asarray(ptr, np.int64),
                               links_Q4=np.concatenate(rows).astype(np.int32).reshape(-1, 4))


def test_event_links_are_su_pairs():
  rng = np.random.default_rng(0)
  for _ in range(20):
    events = random_events(rng, 12, int(rng.integers(0, 4)))
    q = event_links([[(s, t) for _, s, t in e] for e in events])
    want = []
    for e in events:
      for i1, (_, h1, t1) in enumerate(e):
        for i2, (_, h2, t2) in enumerate(e):
          if i2 > i1:
            want.append((min(h1, h2), max(h1, h2), min(t1, t2), max(t1, t2)))
    assert sorted(map(tuple, q.tolist())) == sorted(want)
    assert q.dtype == np.int32 and q.shape == (len(want), 4)


@pytest.mark.parametrize("seed", range(3))
def test_targets_against_su_loops(seed):
  rng = np.random.default_rng(seed)
  L, N, B = 16, 7, 4
  windows = [random_events(rng, L, int(rng.integers(0, 4))) for _ in range(N)]
  p = types.SimpleNamespace(name="dev", table=table_of(windows, rng))
  w = np.asarray([5, 0, 3], np.int64)
  rows = np.asarray([3, 0, 1], np.int64)  # row 2 holds no window
  span_ids = np.full((B, 5, L), -1, np.int32)
  out, dropped = event_targets(p, rows, w, span_ids, L)
  K = LINK_SLOTS * L
  want_dropped = sum(max(0, len(cells) - K) for x in w for cells in su_link_labels(windows[x]))
  assert dropped == want_dropped
  assert out["argument_ids"] is span_ids
  assert set(out) == {"argument_ids", "head_ids", "tail_ids"}
  for name in ("head_ids", "tail_ids"):
    assert out[name].shape == (B, 1, K) and out[name].dtype == np.int32
  assert (out["head_ids"][2] == -1).all() and (out["tail_ids"][2] == -1).all()
  for r, win in zip(rows, w):
    heads, tails = su_link_labels(windows[win])
    for name, cells in (("head_ids", heads), ("tail_ids", tails)):
      ids = out[name][r, 0]
      n = int((ids >= 0).sum())
      assert (ids[:n] >= 0).all() and (ids[n:] == -1).all()  # -1 padded at the end
      assert len(set(ids[:n].tolist())) == n  # one id per cell
      got = {(int(i) // L, int(i) % L) for i in ids[:n]}
      assert got == cells if len(cells) <= K else (len(got) == K and got <= cells)
  assert any(len(su_link_labels(windows[x])[0]) for x in w)  # the case holds links
  # The table as an argument (before PreparedSplit carries one).
  again, _ = event_targets(types.SimpleNamespace(name="dev"), rows, w, span_ids, L, table=p.table)
  assert all((again[k] == out[k]).all() for k in out)


def test_overflow_beyond_k_is_counted():
  """A window with more distinct head cells than K = LINK_SLOTS * L keeps K of them and counts the rest."""
  L = 8
  K = LINK_SLOTS * L
  spans = [(s, t) for s in range(8) for t in range(s, min(s + 3, 8))]  # one event of 21 arguments
  windows = [[[(0, s, t) for s, t in spans]]]
  heads, tails = su_link_labels(windows[0])
  assert len(heads) > K and len(tails) > K
  p = types.SimpleNamespace(name="train", table=table_of(windows, np.random.default_rng(0)))
  out, dropped = event_targets(p, np.asarray([0]), np.asarray([0]), np.full((1, 1, L), -1, np.int32), L)
  assert dropped == (len(heads) - K) + (len(tails) - K)
  for name, cells in (("head_ids", heads), ("tail_ids", tails)):
    got = {(int(i) // L, int(i) % L) for i in out[name][0, 0]}
    assert len(got) == K and got <= cells


def test_bad_tables_refused():
  L = 6
  span_ids = np.full((1, 1, L), -1, np.int32)
  with pytest.raises(ValueError, match="without an event table"):
    event_targets(types.SimpleNamespace(name="dev", table=None), np.asarray([0]), np.asarray([0]), span_ids, L)
  bad = types.SimpleNamespace(ptr=np.asarray([0, 1]), links_Q4=np.asarray([[3, 2, 1, 1]], np.int32))
  with pytest.raises(ValueError, match="head_a <= head_b"):
    event_targets(types.SimpleNamespace(name="dev"), np.asarray([0]), np.asarray([0]), span_ids, L, table=bad)


def test_target_shapes():
  assert target_shapes(num_classes=5, batch=2, length=16) == {
      "argument_ids": (2, 5, 16), "head_ids": (2, 1, 4 * 16), "tail_ids": (2, 1, 4 * 16)}
  assert LINK_SLOTS == 4
