"""Events as spans plus links: event classes, as_span_records, and the per-window link table against a plain-Python
construction of Su's rule (duee_v1.py: every pair i1 < i2 of one event's arguments, in windows holding it whole)."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest

from gp_jax.data import events as ev
from gp_jax.data import windows
from tests.data.fakes import CharTok


def event(kind, trigger, *args):
  return {"type": kind, "trigger": None if trigger is None else {"start": trigger[0], "end": trigger[1]},
          "arguments": [{"start": s, "end": e, "role": r} for s, e, r in args]}


def rec(rid, text, *events):
  return {"id": rid, "text": text, "entities": [], "events": list(events)}


# --- classes ------------------------------------------------------------------------------------------------------


def test_event_classes_union_and_types(caplog):
  train = [rec("a", "xyz", event("A", (0, 1), (1, 2, "r1"))), {"id": "n", "text": "q", "entities": []}]
  dev = [rec("b", "xyz", event("B", None, (0, 2, "r2")), event("A", (0, 1), (2, 3, "r3")))]
  test = [rec("c", "xyz", event("A", (0, 1)))]
  with caplog.at_level(logging.WARNING):
    classes = ev.event_classes(train=train, dev=dev, test=test)
  assert classes == ("A:r1", "A:r3", "A:trigger", "B:r2")  # B has no trigger: no "B:trigger"
  assert "absent from train" in caplog.text and "'B:r2': ['dev']" in caplog.text
  assert ev.event_types(train=train, dev=dev, test=[]) == ("A", "B")
  assert ev.split_class("A:Treatment.Drug") == ("A", "Treatment.Drug") and ev.event_class("A", "x") == "A:x"
  with pytest.raises(ValueError, match="not an event class"):
    ev.split_class("trigger")
  assert ev.has_events(dev) and not ev.has_events(train[1:])


# --- as_span_records ----------------------------------------------------------------------------------------------

TEXT = "insulin-induced lipoatrophy and rash"


def test_as_span_records_dedupes_shared_keeps_nested():
  e1 = event("AE", (8, 15), (0, 7, "Treatment"), (0, 7, "Treatment.Drug"), (16, 27, "Effect"))
  e2 = event("AE", (8, 15), (0, 7, "Treatment"), (32, 36, "Effect"))  # same trigger and treatment as e1
  e3 = event("PT", None, (0, 15, "Cause"), (0, 7, "Cause.Drug"))  # nests over e1's spans
  records = [dict(rec("s", TEXT, e1, e2, e3), entities=[{"start": 0, "end": 1, "type": "OLD"}])]
  before = copy.deepcopy(records)
  classes = ev.event_classes(train=records, dev=[], test=[])
  out = ev.as_span_records(records, classes)
  assert records == before  # input unchanged
  want = sorted({(0, 7, "AE:Treatment"), (0, 7, "AE:Treatment.Drug"), (8, 15, "AE:trigger"), (16, 27, "AE:Effect"),
                 (32, 36, "AE:Effect"), (0, 15, "PT:Cause"), (0, 7, "PT:Cause.Drug")})
  assert [(e["start"], e["end"], e["type"]) for e in out[0]["entities"]] == want
  idx = {k: i for i, k in enumerate(want)}
  assert out[0]["events"][0]["entities"] == [idx[(8, 15, "AE:trigger")], idx[(0, 7, "AE:Treatment")],
                                             idx[(0, 7, "AE:Treatment.Drug")], idx[(16, 27, "AE:Effect")]]
  assert out[0]["events"][1]["entities"] == [idx[(8, 15, "AE:trigger")], idx[(0, 7, "AE:Treatment")],
                                             idx[(32, 36, "AE:Effect")]]
  assert out[0]["events"][2]["entities"] == [idx[(0, 15, "PT:Cause")], idx[(0, 7, "PT:Cause.Drug")]]
  for e_out, e_in in zip(out[0]["events"], records[0]["events"]):  # char-level fields kept for the metric
    assert {k: v for k, v in e_out.items() if k != "entities"} == e_in
  unlabelled = {"id": "u", "text": TEXT, "entities": []}
  assert ev.as_span_records([unlabelled], classes) == [unlabelled]
  with pytest.raises(ValueError, match=r"event classes \['AE:Effect'\], not among"):
    ev.as_span_records(records, [c for c in classes if c != "AE:Effect"])


# --- the link table -----------------------------------------------------------------------------------------------


def reference_links(records, tok, p, *, max_span_width=None):
  """Per window: the set of link rows, from the char-level events, written from Su's loop; and (kept, dropped)."""
  want = [set() for _ in range(p.num_windows)]
  held_events = set()
  n_events = 0
  for r, record in enumerate(records):
    offsets = tok.encode(record["text"]).offsets.tolist()
    first = {a: t for t, (a, b) in reversed(list(enumerate(offsets)))}
    last = {b: t for t, (a, b) in enumerate(offsets)}
    for k, e in enumerate(record["events"]):
      n_events += 1
      spans = ([(e["trigger"]["start"], e["trigger"]["end"], "trigger")] if e["trigger"] else [])
      spans += [(a["start"], a["end"], a["role"]) for a in e["arguments"]]
      toks = []
      for s, t, role in dict.fromkeys(spans):
        if s in first and t in last and first[s] <= last[t]:
          if max_span_width is None or last[t] - first[s] + 1 <= max_span_width:
            toks.append((first[s], last[t]))
      for w in range(p.num_windows):
        if p.window_record[w] != r or not toks:
          continue
        ws, n = int(p.window_start[w]), int(p.window_content_len[w])
        if all(ws <= h and t < ws + n for h, t in toks):
          held_events.add((r, k))
          P = p.num_prefix
          for i1 in range(len(toks)):
            for i2 in range(len(toks)):
              if i2 > i1:
                (h1, t1), (h2, t2) = toks[i1], toks[i2]
                want[w].add((min(h1, h2) - ws + P, max(h1, h2) - ws + P, min(t1, t2) - ws + P, max(t1, t2) - ws + P))
  return [sorted(x) for x in want], len(held_events), n_events - len(held_events)


def table_for(records, *, max_len, stride, max_span_width=None, specials=True):
  classes = ev.event_classes(train=records, dev=[], test=[])
  spans = ev.as_span_records(records, classes)
  tok = CharTok(specials)
  p = windows.prepare_split(spans, tok, types=classes, max_len=max_len, stride=stride, max_span_width=max_span_width)
  return ev.event_table(p, spans), p, tok


def check_against_reference(records, **kw):
  table, p, tok = table_for(records, **kw)
  want, kept, dropped = reference_links(records, tok, p, max_span_width=kw.get("max_span_width"))
  got = [[tuple(row) for row in table.window_links(w).tolist()] for w in range(p.num_windows)]
  assert got == want
  assert (table.kept, table.dropped, table.events) == (kept, dropped, kept + dropped)
  assert table.links_Q4.dtype == np.int32 and table.ptr.dtype == np.int64 and table.num_windows == p.num_windows
  q = table.links_Q4
  assert (q[:, 0] <= q[:, 1]).all() and (q[:, 2] <= q[:, 3]).all()
  return table, p


def test_event_table_hand_made_overlaps_and_a_cut_event():
  # CharTok: one token per non-space character. Record 0 fits one window: two events share the trigger "t" and the
  # argument "dd"; "dd" also nests in "ddee"; one span has two roles (a diagonal head cell and tail cell).
  text0 = "t dd ee"  # tokens: t=0 d=1 d=2 e=3 e=4
  e1 = event("A", (0, 1), (2, 4, "x"), (2, 4, "y"), (2, 7, "z"))
  e2 = event("A", (0, 1), (2, 4, "x"), (5, 7, "w"))
  # Record 1 is cut into windows of 6 content tokens (starts 0, 2, 4): e3 fits two of them, e4 spans tokens 0..9
  # (dropped, counted).
  text1 = "abcdefghij"
  e3 = event("B", (2, 3), (4, 6, "x"))
  e4 = event("B", (0, 1), (9, 10, "x"))
  records = [rec("r0", text0, e1, e2), rec("r1", text1, e3, e4)]
  table, p = check_against_reference(records, max_len=8, stride=2)
  assert p.num_windows == 4 and p.window_start.tolist() == [0, 0, 2, 4]
  assert (table.events, table.kept, table.dropped, table.partial) == (4, 3, 1, 0)
  P = 1
  rows0 = {tuple(r) for r in table.window_links(0).tolist()}
  # e1: trigger (0, 0), x and y on (1, 2), z on (1, 4); e2: trigger, x, w on (3, 4).
  t, x, z, w = (0, 0), (1, 2), (1, 4), (3, 4)

  def pair(a, b):
    return (min(a[0], b[0]) + P, max(a[0], b[0]) + P, min(a[1], b[1]) + P, max(a[1], b[1]) + P)

  assert rows0 == {pair(t, x), pair(x, x), pair(x, z), pair(t, z), pair(t, w), pair(x, w)}
  assert pair(x, x) == (2, 2, 3, 3)  # the two roles on one span: diagonal cells
  # e3 (trigger token 2, x tokens 4..5) in windows 1 (start 0) and 2 (start 2), not in window 3 (start 4).
  assert table.window_links(1).tolist() == [[2 + P, 4 + P, 2 + P, 5 + P]]
  assert table.window_links(2).tolist() == [[0 + P, 2 + P, 0 + P, 3 + P]]
  assert table.window_links(3).tolist() == []
  assert table.stats == {"events": 4, "events_kept": 3, "events_dropped": 1, "events_partial": 0, "event_links": 8}


def test_event_table_random_against_reference():
  rng = np.random.default_rng(0)
  records = []
  for r in range(40):
    n = int(rng.integers(1, 30))
    text = "".join(rng.choice(list("abcd "), size=n))
    evs = []
    for _ in range(int(rng.integers(0, 4))):
      spans = []
      for _ in range(int(rng.integers(1, 5))):
        a = int(rng.integers(0, n))
        spans.append((a, int(rng.integers(a + 1, min(n, a + 6) + 1))))
      trig = spans[0] if rng.random() < 0.8 else None
      roles = ["r" + str(int(rng.integers(0, 3))) for _ in spans[1:]]
      kind = "E" + str(int(rng.integers(0, 2)))
      evs.append(event(kind, trig, *[(a, b, ro) for (a, b), ro in zip(spans[1:], roles)]))
    evs = [e for e in evs if e["trigger"] or e["arguments"]]
    records.append(rec(f"r{r}", text, *evs))
  for max_len, stride, width in ((6, 2, None), (9, None, 3), (40, None, None)):
    table, _ = check_against_reference(records, max_len=max_len, stride=stride, max_span_width=width)
    assert table.events == sum(len(r["events"]) for r in records)
  assert table.dropped < table.events  # the last setting holds most events whole


def test_event_table_counts_misaligned_arguments_as_partial():
  # WordTok-like bounds with CharTok: a span starting on a space is misaligned (no token starts there).
  records = [rec("r", "ab cd", event("A", (0, 1), (2, 5, "x"), (3, 5, "y")))]
  table, p = check_against_reference(records, max_len=10, stride=None)
  assert (table.partial, table.kept, table.dropped) == (1, 1, 0)
  assert table.window_links(0).tolist() == [[1, 3, 1, 4]]  # trigger (0, 0) with y (2, 3), P = 1


def test_event_table_needs_span_records():
  records = [rec("r", "ab", event("A", (0, 1)))]
  tok = CharTok()
  p = windows.prepare_split(records, tok, types=("A:trigger",), max_len=8)
  with pytest.raises(ValueError, match="as_span_records"):
    ev.event_table(p, records)
  with pytest.raises(ValueError, match="pass the records"):
    ev.event_table(p, records + records)
