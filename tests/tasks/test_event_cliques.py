"""Host grouping of event hits against Su's `extract_events` (bojone/GPLinker duee_v1.py; the same code in
bert4torch's task_event_extraction_gplinker.py), copied below as plain Python: cliques of the link graph per event
type, shared triggers, one argument in two events, nested arguments, same-type events side by side, events
without a trigger, the bound on arguments per type."""

import itertools
from itertools import groupby

import numpy as np
import pytest

from gp_jax.tasks.events.cliques import (Argument, class_pairs, group_events, maximal_cliques,
                                         MAX_ARGUMENTS_PER_TYPE)

# --- Su's decoding, as in duee_v1.py (only the model call and the text mapping left out) ---------------------------


class DedupList(list):
  def append(self, x):
    if x not in self:
      super(DedupList, self).append(x)


def neighbors(host, argus, links):
  results = [host]
  for argu in argus:
    if host[2:] + argu[2:] in links:
      results.append(argu)
  return list(sorted(results))


def clique_search(argus, links):
  Argus = DedupList()
  for i1, (_, _, h1, t1) in enumerate(argus):
    for i2, (_, _, h2, t2) in enumerate(argus):
      if i2 > i1:
        if (h1, t1, h2, t2) not in links:
          Argus.append(neighbors(argus[i1], argus, links))
          Argus.append(neighbors(argus[i2], argus, links))
  if Argus:
    results = DedupList()
    for A in Argus:
      for a in clique_search(A, links):
        results.append(a)
    return results
  else:
    return [list(sorted(argus))]


def su_extract_events(argument_CLL, head_LL, tail_LL, am_L, labels, *, threshold=0.0, trigger=True):
  """Su's `extract_events` on one row's scores: arguments are the cells above the threshold on content tokens with
  start <= end (Su masks [CLS], [SEP] and the lower triangle); links between arguments whose head-pair and tail-pair
  cells are above it; events the cliques of each event type's arguments; without a trigger dropped when
  `trigger`. -> list of events, each a sorted list of (type, role, start, end)."""
  argus = set()
  for l, h, t in zip(*np.where(argument_CLL > threshold)):
    if am_L[h] and am_L[t] and h <= t:
      argus.add(labels[l] + (int(h), int(t)))
  links = set()
  for i1, (_, _, h1, t1) in enumerate(argus):
    for i2, (_, _, h2, t2) in enumerate(argus):
      if i2 > i1:
        if head_LL[min(h1, h2), max(h1, h2)] > threshold:
          if tail_LL[min(t1, t2), max(t1, t2)] > threshold:
            links.add((h1, t1, h2, t2))
            links.add((h2, t2, h1, t1))
  events = []
  for _, sub_argus in groupby(sorted(argus), key=lambda s: s[0]):
    for event in clique_search(list(sub_argus), links):
      events.append(list(event))
      if trigger and all([argu[1] != "trigger" for argu in event]):
        events.pop()
  return events


def su_events(argument, head, tail, am, labels, **kw):
  """Su's events of every row -> {(row, type, frozenset of (role, start, end))}."""
  out = set()
  for b in range(argument.shape[0]):
    for event in su_extract_events(argument[b], head[b, 0], tail[b, 0], am[b], labels, **kw):
      out.add((b, event[0][0], frozenset(a[1:] for a in event)))
  return out


def as_set(events):
  out = {(e.row, e.type, frozenset(a[:3] for a in e.arguments)) for e in events}
  assert len(out) == len(events)  # no event twice
  return out


def hits_of(argument, head, tail, am, threshold=0.0):
  """Hit buffers as `ops.events.event_hits` fills them, built in NumPy: argument cells above the threshold on
  content tokens, start <= end; link cells (i <= j) above it where both tokens start (head) or end (tail) a decoded
  argument."""
  B, C, L, _ = argument.shape
  content = am[:, :, None].astype(bool) & am[:, None, :].astype(bool) & np.triu(np.ones((L, L), bool))
  arg_hit = (argument > threshold) & content[:, None]
  starts, ends = arg_hit.any(axis=(1, 3)), arg_hit.any(axis=(1, 2))
  head_hit = (head > threshold) & (content & starts[:, :, None] & starts[:, None, :])[:, None]
  tail_hit = (tail > threshold) & (content & ends[:, :, None] & ends[:, None, :])[:, None]

  def buffer(hit, scores):
    coords = np.argwhere(hit).astype(np.int32)
    return len(coords), coords, scores[tuple(coords.T)].astype(np.float32)

  return buffer(arg_hit, argument), buffer(head_hit, head), buffer(tail_hit, tail)


# --- cliques -------------------------------------------------------------------------------------------------------

def graph_links(n, edges):
  """Su's link set for arguments 0..n-1 at distinct spans (k, k)."""
  links = set()
  for a, b in edges:
    links.add((a, a, b, b))
    links.add((b, b, a, a))
  return links


@pytest.mark.parametrize("seed", range(4))
def test_maximal_cliques_equal_su_clique_search(seed):
  """On random graphs (several densities and sizes), the bitmask enumeration gives Su's set of events."""
  rng = np.random.default_rng(seed)
  for _ in range(40):
    n = int(rng.integers(1, 9))
    p = float(rng.choice([0.2, 0.5, 0.8, 0.95]))
    edges = [(a, b) for a in range(n) for b in range(a + 1, n) if rng.random() < p]
    adjacency = [0] * n
    for a, b in edges:
      adjacency[a] |= 1 << b
      adjacency[b] |= 1 << a
    got = {frozenset(k for k in range(n) if m >> k & 1) for m in maximal_cliques(adjacency)}
    argus = [("E", "r", k, k) for k in range(n)]
    want = {frozenset(a[2] for a in c) for c in clique_search(argus, graph_links(n, edges))}
    assert got == want, (n, edges)
    assert len(maximal_cliques(adjacency)) == len(got)
  assert maximal_cliques([]) == []


def test_maximal_cliques_known_graphs():
  # A path 0-1-2 and an isolated 3: {0, 1}, {1, 2}, {3}.
  assert sorted(maximal_cliques([0b010, 0b101, 0b010, 0])) == sorted([0b0011, 0b0110, 0b1000])
  # Complete multipartite K(3,3,3) (Moon-Moser): 3^3 maximal cliques, one node from each part.
  adj = [sum(1 << u for u in range(9) if u // 3 != v // 3) for v in range(9)]
  assert len(maximal_cliques(adj)) == 27


def test_class_pairs():
  assert class_pairs(["Adverse_event.trigger", "Adverse_event.Treatment.Drug", ("A", "x")]) == (
      ("Adverse_event", "trigger"), ("Adverse_event", "Treatment.Drug"), ("A", "x"))
  with pytest.raises(ValueError, match="EventType.role"):
    class_pairs(["trigger"])


# --- planted events ------------------------------------------------------------------------------------------------

LABELS = [("A", "trigger"), ("A", "agent"), ("A", "patient"), ("A", "time"), ("B", "trigger"), ("B", "agent")]
CLASS = {x: c for c, x in enumerate(LABELS)}

# Events as (type, [(role, start, end)]), in one row of L = 18 (content tokens 1..16).
PLANTED = [
    ("A", [("trigger", 1, 1), ("agent", 2, 3)]),  # a shared trigger: (1, 1) in two events
    ("A", [("trigger", 1, 1), ("agent", 5, 6)]),
    ("A", [("trigger", 8, 8), ("patient", 9, 10), ("agent", 9, 9), ("time", 14, 15)]),  # nested (9, 9) in (9, 10)
    ("A", [("trigger", 12, 12), ("patient", 13, 13), ("agent", 13, 13), ("time", 14, 15)]),  # side by side; (14, 15)
    # in two events; (13, 13) with two roles of one event
    ("B", [("trigger", 4, 4), ("agent", 2, 3)]),  # (2, 3) also an argument of an event of another type
    ("B", [("agent", 16, 16)]),  # no trigger
]


def planted_scores(B=2, L=18, seed=0):
  """Row 0: the planted events (argument cells 2.0 + k / 100, link cells 3.0 + k / 100), the rest -3. Row 1 random."""
  rng = np.random.default_rng(seed)
  C = len(LABELS)
  argument = np.full((B, C, L, L), -3.0, np.float32)
  head = np.full((B, 1, L, L), -3.0, np.float32)
  tail = np.full((B, 1, L, L), -3.0, np.float32)
  am = np.zeros((B, L), np.int32)
  am[:, 1:17] = 1
  k = 0
  for etype, args in PLANTED:
    for role, s, e in args:
      argument[0, CLASS[etype, role], s, e] = 2.0 + k / 100
      k += 1
    for (_, h1, t1), (_, h2, t2) in itertools.combinations(args, 2):
      head[0, 0, min(h1, h2), max(h1, h2)] = 3.0 + k / 100
      tail[0, 0, min(t1, t2), max(t1, t2)] = 3.5 + k / 100
      k += 1
  argument[1] = rng.normal(size=(C, L, L)) - 2.0
  head[1, 0] = rng.normal(size=(L, L)) + 0.3
  tail[1, 0] = rng.normal(size=(L, L)) + 0.3
  return argument, head, tail, am


@pytest.mark.parametrize("require_trigger", [True, False])
def test_planted_events_against_su(require_trigger):
  argument, head, tail, am = planted_scores()
  hits = hits_of(argument, head, tail, am)
  got = group_events(*hits, classes=LABELS, require_trigger=require_trigger)
  want = su_events(argument, head, tail, am, LABELS, trigger=require_trigger)
  assert as_set(got.events) == want
  planted = {(0, t, frozenset(a)) for t, a in PLANTED
             if not require_trigger or any(r == "trigger" for r, *_ in a)}
  assert {e for e in want if e[0] == 0} == planted
  assert sum(e[0] == 1 for e in want) >= 3  # the random row gives events too
  assert got.over_bound == got.over_bound_arguments == 0
  if require_trigger:
    untriggered = su_events(argument, head, tail, am, LABELS, trigger=False) - want
    assert got.triggerless == len(untriggered) > 0
  else:
    assert got.triggerless == 0


def test_event_scores_and_arguments():
  """An event's score is the smallest of its arguments' cells and of its pairs' head and tail cells; arguments keep
  their own cells and come sorted by (role, start, end); events by (row, type, arguments)."""
  argument, head, tail, am = planted_scores()
  got = group_events(*hits_of(argument, head, tail, am), classes=[f"{t}.{r}" for t, r in LABELS])
  for e in got.events:
    want = min(float(argument[e.row, CLASS[e.type, a.role], a.start, a.end]) for a in e.arguments)
    for a, b in itertools.combinations(e.arguments, 2):
      want = min(want, float(head[e.row, 0, min(a.start, b.start), max(a.start, b.start)]),
                 float(tail[e.row, 0, min(a.end, b.end), max(a.end, b.end)]))
    assert e.score == pytest.approx(want)
    for a in e.arguments:
      assert isinstance(a, Argument) and a.score == pytest.approx(float(argument[e.row, CLASS[e.type, a.role],
                                                                                  a.start, a.end]))
    assert list(e.arguments) == sorted(e.arguments)
  keys = [(e.row, e.type, [a[:3] for a in e.arguments]) for e in got.events]
  assert keys == sorted(keys)
  # Row 0's events score their smallest argument cell (every argument cell is below every link cell).
  row0 = [e for e in got.events if e.row == 0]
  assert len(row0) == 5
  assert all(e.score == min(a.score for a in e.arguments) < 3.0 for e in row0)


@pytest.mark.parametrize("seed", range(6))
def test_random_scores_against_su(seed):
  """Random scores over three rows: many arguments per type, links at several densities."""
  rng = np.random.default_rng(seed)
  B, L = 3, 9
  C = len(LABELS)
  argument = (rng.normal(size=(B, C, L, L)) - 1.0).astype(np.float32)
  head = (rng.normal(size=(B, 1, L, L)) + rng.choice([-0.5, 0.3, 1.0])).astype(np.float32)
  tail = (rng.normal(size=(B, 1, L, L)) + rng.choice([-0.5, 0.3, 1.0])).astype(np.float32)
  am = np.zeros((B, L), np.int32)
  for b in range(B):
    am[b, 1:int(rng.integers(4, L))] = 1
  threshold = float(rng.choice([0.0, 0.4]))
  hits = hits_of(argument, head, tail, am, threshold)
  for require_trigger in (True, False):
    got = group_events(*hits, classes=LABELS, require_trigger=require_trigger)
    want = su_events(argument, head, tail, am, LABELS, threshold=threshold, trigger=require_trigger)
    assert as_set(got.events) == want
    assert len(want) > 0


def test_bound_on_arguments_per_type():
  """A (row, type) group with more arguments than the bound gives no events and is counted; other groups and rows
  are decoded as without the bound."""
  argument, head, tail, am = planted_scores()
  hits = hits_of(argument, head, tail, am)
  coords = hits[0][1]
  sizes = {(r, LABELS[c][0]): 0 for r, c, _, _ in coords.tolist()}
  for r, c, _, _ in coords.tolist():
    sizes[r, LABELS[c][0]] += 1
  assert sizes[0, "A"] == 10 and sizes[0, "B"] == 3
  bound = 9
  over = {k: n for k, n in sizes.items() if n > bound}
  assert (0, "A") in over and (0, "B") not in over
  full = group_events(*hits, classes=LABELS, max_arguments_per_type=100)
  got = group_events(*hits, classes=LABELS, max_arguments_per_type=bound)
  assert got.over_bound == len(over) and got.over_bound_arguments == sum(over.values())
  assert as_set(got.events) == {e for e in as_set(full.events) if (e[0], e[1]) not in over}
  assert MAX_ARGUMENTS_PER_TYPE >= 16


def test_errors_and_empty():
  argument, head, tail, am = planted_scores()
  hits = hits_of(argument, head, tail, am)
  with pytest.raises(ValueError, match="classes name 5"):
    group_events(*hits, classes=LABELS[:5])
  count, coords, scores = hits[1]
  with pytest.raises(ValueError, match="buffer"):
    group_events(hits[0], (count, coords[:4], scores[:4]), hits[2], classes=LABELS)
  empty = (0, np.zeros((8, 4), np.int32), np.zeros(8, np.float32))
  got = group_events(empty, empty, empty, classes=LABELS)
  assert got.events == [] and got.triggerless == got.over_bound == 0
