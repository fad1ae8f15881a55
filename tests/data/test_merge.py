"""Tests for gp_jax.data.merge: window hits -> char spans, the most-central-window rule, span sets."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from gp_jax.data import merge, windows
from tests.data.fakes import TYPES, CharTok

TEXT = "abcdefghijklmnopqrstuvwxyz0123"  # 30 chars = 30 content tokens with CharTok


def long_split(entities=()):
  """One 30-token record, W = 8 content tokens, stride 4: windows start 0, 4, 8, 12, 16, 20, 22."""
  p = windows.prepare_split([{"id": "long", "text": TEXT, "entities": list(entities)}], CharTok(),
                            types=TYPES, max_len=10, stride=4)
  assert p.window_start.tolist() == [0, 4, 8, 12, 16, 20, 22]
  return p


def hit(p, w, a, b, t=0, score=1.0):
  """Hit of window w on content tokens [a, b] of the record, in window-token coordinates."""
  shift = p.num_prefix - int(p.window_start[w])
  return (w, a + shift, b + shift, t, score)


def test_edge_window_false_span_is_dropped():
  p = long_split()
  # Tokens [13, 13] lie in windows 2 (content 8..15: 5 left, 2 right) and 3 (12..19: 1 left, 6 right).
  assert merge.deciding_windows(p, record_M=np.array([0]), start_M=np.array([13]), end_M=np.array([13])).tolist() == [2]
  assert merge.merge_predictions(p, [hit(p, 3, 13, 13)]) == [[]]  # only the edge window fires
  # Predicted only by its deciding window: kept, with that window's score.
  assert merge.merge_predictions(p, [hit(p, 2, 13, 13, score=0.7)]) == [
      [{"start": 13, "end": 14, "type": "PER", "score": 0.7}]]
  both = merge.merge_predictions(p, [hit(p, 3, 13, 13, score=0.9), hit(p, 2, 13, 13, score=0.6)])
  assert both == [[{"start": 13, "end": 14, "type": "PER", "score": 0.6}]]
  # The type counts: the deciding window firing another type does not save this one.
  assert merge.merge_predictions(p, [hit(p, 3, 13, 13, t=1), hit(p, 2, 13, 13, t=0)]) == [
      [{"start": 13, "end": 14, "type": "PER", "score": 1.0}]]


def test_tie_goes_to_the_earlier_window():
  p = long_split()
  # Tokens [9, 10]: window 1 (4..11) has 5 left, 1 right; window 2 (8..15) 1 left, 5 right: both 1.
  got = merge.deciding_windows(p, record_M=np.array([0]), start_M=np.array([9]), end_M=np.array([10]))
  assert got.tolist() == [1]
  assert merge.merge_predictions(p, [hit(p, 2, 9, 10)]) == [[]]
  assert merge.merge_predictions(p, [hit(p, 1, 9, 10, score=2.0)]) == [
      [{"start": 9, "end": 11, "type": "PER", "score": 2.0}]]


def test_document_edges_count_as_unlimited_context():
  p = long_split()
  # Tokens [26, 27]: window 5 (20..27) has 0 right; window 6 (22..29) ends at the text end.
  got = merge.deciding_windows(p, record_M=np.array([0, 0]), start_M=np.array([26, 1]), end_M=np.array([27, 2]))
  assert got.tolist() == [6, 0]
  assert merge.merge_predictions(p, [hit(p, 5, 26, 27)]) == [[]]


def test_merge_keeps_the_central_window_score():
  rec = {"id": "a", "text": "abcdefghij", "entities": [{"start": 4, "end": 6, "type": "PER"}]}
  p = windows.prepare_split([rec], CharTok(), types=TYPES, max_len=8, stride=2)  # W = 6, starts 0, 2, 4
  holders = [w for w in range(p.num_windows) if len(p.window_spans(w))]
  assert holders == [0, 1, 2]
  hits = [(w, *p.window_spans(w)[0][:2].tolist(), 0, 0.5 + w) for w in holders]
  # Tokens [4, 5]: window 0 has 0 right, window 2 has 0 left, window 1 has 2 on each side.
  assert merge.merge_predictions(p, hits) == [[{"start": 4, "end": 6, "type": "PER", "score": 1.5}]]
  # Hits on specials or padding are dropped, not mapped.
  assert merge.merge_predictions(p, [(0, 0, 1, 0, 1.0), (0, 3, 7, 0, 1.0)]) == [[]]


def naive_decider(p, r, a, b):
  """The rule written out with loops over the record's windows."""
  n = int(p.token_ptr[r + 1] - p.token_ptr[r])
  best, best_ctx = None, None
  for w in range(p.num_windows):
    s, m = int(p.window_start[w]), int(p.window_content_len[w])
    if p.window_record[w] != r or not (s <= a and b < s + m):
      continue
    left = float("inf") if s == 0 else a - s
    right = float("inf") if s + m == n else s + m - 1 - b
    if best is None or min(left, right) > best_ctx:
      best, best_ctx = w, min(left, right)
  return best


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), min_size=1, max_size=3), max_len=st.integers(3, 14),
       data=st.data())
def test_merge_matches_a_naive_rule(lengths, max_len, data):
  recs = [{"id": f"r{i}", "text": "x" * n, "entities": []} for i, n in enumerate(lengths)]
  W = max_len - 2
  stride = data.draw(st.integers(1, W))
  p = windows.prepare_split(recs, CharTok(), types=TYPES, max_len=max_len, stride=stride)
  hits = []
  for w in range(p.num_windows):
    m = int(p.window_content_len[w])
    for _ in range(data.draw(st.integers(0, 6))):
      a = data.draw(st.integers(1, m))
      b = data.draw(st.integers(a, m))
      hits.append((w, a, b, data.draw(st.integers(0, 2)), float(data.draw(st.integers(0, 9)))))
  want = {}
  for w, a, b, t, sc in hits:
    r, shift = int(p.window_record[w]), int(p.window_start[w]) - 1
    if naive_decider(p, r, a + shift, b + shift) == w:
      key = (r, a + shift, b + shift + 1, TYPES[t])  # CharTok on "x" * n: char = content token
      want[key] = max(want.get(key, -1.0), sc)
  merged = merge.merge_predictions(p, hits)
  got = {(r, x["start"], x["end"], x["type"]): x["score"] for r, ents in enumerate(merged) for x in ents}
  assert got == want


def test_batch_hits_maps_rows_to_windows():
  window_index_B = np.array([5, -1, 2])
  coords = np.array([[0, 1, 2, 3], [1, 0, 1, 1], [2, 2, 4, 4], [-1, -1, -1, -1]])
  h = merge.batch_hits(window_index_B, coords, np.array([1.0, 2.0, 3.0, 0.0]))
  assert h["window"].tolist() == [5, 2] and h["type"].tolist() == [1, 2]
  assert h["start"].tolist() == [2, 4] and h["end"].tolist() == [3, 4] and h["score"].tolist() == [1.0, 3.0]
  empty = merge.concat_hits([])
  assert all(v.shape == (0,) for v in empty.values())
