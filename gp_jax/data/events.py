"""Events as entity-like spans plus links between them (GPLinker for events: Su's duee_v1.py, kexue.fm/archives/8926).

Every (event type, role) pair is one class of the span pointer, written "type:role" (`event_class`), the trigger
being the role "trigger": `event_classes` is their union over the labelled splits. `as_span_records` turns event
records (types.py) into entity form: the record's entities become the unique (start, end, class) spans of all its
events, and each event lists its spans by index ("entities", trigger first), its char-level fields kept for the
metric. `windows.prepare_split` then places the spans like any entities, and `event_table` lists per window the link
targets of the events the window holds whole.

NumPy only (no flax), like the rest of gp_jax.data.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence

import numpy as np

from gp_jax.data.jsonl import TRIGGER
from gp_jax.data.types import Entity, Event, Record
from gp_jax.data.windows import MISALIGNED, TOO_LONG, PreparedSplit

log = logging.getLogger(__name__)

__all__ = ["TRIGGER", "EventTable", "as_span_records", "event_class", "event_classes", "event_table", "event_types",
           "has_events", "split_class"]


def event_class(event_type: str, role: str) -> str:
  """The span class of a role of an event type: "type:role" (event types hold no ":", jsonl.py checks)."""
  return f"{event_type}:{role}"


def split_class(name: str) -> tuple[str, str]:
  """"type:role" -> (type, role), the inverse of `event_class`."""
  event_type, sep, role = name.partition(":")
  if not sep:
    raise ValueError(f"{name!r} is not an event class: expected 'type:role'")
  return event_type, role


def _roles(event: Event) -> Iterable[str]:
  if event.get("trigger") is not None:
    yield TRIGGER
  for a in event["arguments"]:
    yield a["role"]


def has_events(records: Iterable[Record]) -> bool:
  """Whether any record carries "events" (an event corpus or an events jsonl)."""
  return any("events" in r for r in records)


def _union(kind: str, splits: dict[str, Sequence[Record]], names_of) -> tuple[str, ...]:
  """Sorted union of `names_of(record)` over the splits; warns about names train lacks."""
  seen = {split: {n for r in recs for n in names_of(r)} for split, recs in splits.items()}
  names = tuple(sorted(set().union(*seen.values())))
  missing = {n: [s for s in splits if s != "train" and n in seen[s]] for n in names if n not in seen["train"]}
  if missing:
    log.warning("%s absent from train (never trained, their F1 is 0): %s", kind, missing)
  return names


def event_classes(*, train: Sequence[Record], dev: Sequence[Record], test: Sequence[Record]) -> tuple[str, ...]:
  """The "type:role" classes seen in the labelled splits' events (triggers as "type:trigger"), sorted."""
  return _union("Event classes", {"train": train, "dev": dev, "test": test},
                lambda r: (event_class(e["type"], role) for e in r.get("events", ()) for role in _roles(e)))


def event_types(*, train: Sequence[Record], dev: Sequence[Record], test: Sequence[Record]) -> tuple[str, ...]:
  """The event types seen in the labelled splits, sorted."""
  return _union("Event types", {"train": train, "dev": dev, "test": test},
                lambda r: (e["type"] for e in r.get("events", ())))


def as_span_records(records: Iterable[Record], classes: Sequence[str]) -> list[Record]:
  """Event records -> the same records in entity form (new dicts; the input is not changed).

  entities: the unique (start, end, "type:role") spans of all the record's events, triggers included, sorted; so
  an argument shared by two events is one entity and nested arguments stay two. Each event gains "entities": the
  indices of its trigger and arguments, trigger first, each once; a record without "events" (unlabelled) gets no
  entities and stays without "events". Entities the record held before are replaced
  (counted in the log): the event task's pointer classes are the event classes. A class not in `classes` is a
  ValueError, as `windows.prepare_split` treats an unknown entity type.
  """
  known = set(classes)
  out, replaced = [], 0
  for r, rec in enumerate(records):
    spans = []
    for e in rec.get("events", ()):
      trig = e.get("trigger")
      if trig is not None:
        spans.append((trig["start"], trig["end"], event_class(e["type"], TRIGGER)))
      spans.extend((a["start"], a["end"], event_class(e["type"], a["role"])) for a in e["arguments"])
    unknown = sorted({c for _, _, c in spans} - known)
    if unknown:
      raise ValueError(f"record {rec.get('id', r)!r} has event classes {unknown}, not among the {len(known)} "
                       "classes given (event_classes over the labelled splits)")
    keys = sorted(set(spans))
    index = {k: i for i, k in enumerate(keys)}
    events, k = [], 0
    for e in rec.get("events", ()):
      n = (e.get("trigger") is not None) + len(e["arguments"])
      events.append(dict(e, entities=list(dict.fromkeys(index[s] for s in spans[k:k + n]))))
      k += n
    replaced += len(rec.get("entities", ()))
    out.append(dict(rec, entities=[Entity(start=a, end=b, type=c) for a, b, c in keys],
                    **({"events": events} if "events" in rec else {})))  # an unlabelled record stays one
  if replaced:
    log.info("as_span_records: %d entities of %d event records replaced by their events' spans", replaced, len(out))
  return out


@dataclasses.dataclass(frozen=True)
class EventTable:
  """The link targets of every window of a PreparedSplit, and what became of the split's gold events.

  Every event is kept (some window holds all its arguments) or dropped; `partial` counts events (of either kind)
  with an argument that no window can hold as a target (misaligned, or wider than max_span_width), left out of the
  links as Su's generator leaves an argument whose bounds are not token bounds.
  """

  ptr: np.ndarray  # int64 [N + 1] rows of links_Q4 per window
  # (head_a, head_b, tail_a, tail_b) in window tokens: the starts and the (inclusive) ends of two arguments of one
  # event, head_a <= head_b, tail_a <= tail_b; unique and sorted within a window.
  links_Q4: np.ndarray  # int32 [Q, 4]
  events: int  # gold events of the split
  kept: int  # held whole by at least one window
  dropped: int  # held whole by no window (split by window bounds, or no argument a target): counted, not trained
  partial: int

  @property
  def num_windows(self) -> int:
    return int(self.ptr.shape[0]) - 1

  @property
  def stats(self) -> dict[str, int]:
    """The counts, for a split's stats (`PreparedSplit.all_stats`)."""
    return {"events": self.events, "events_kept": self.kept, "events_dropped": self.dropped,
            "events_partial": self.partial, "event_links": int(self.links_Q4.shape[0])}

  def window_links(self, w: int) -> np.ndarray:
    """int32 [q, 4] link rows of window w."""
    return self.links_Q4[self.ptr[w]:self.ptr[w + 1]]


def _ptr(counts) -> np.ndarray:
  ptr = np.zeros(len(counts) + 1, np.int64)
  np.cumsum(counts, out=ptr[1:])
  return ptr


def _repeat_ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
  """Concatenation of arange(s, s + n) for each (s, n); int64."""
  lens = np.asarray(lens, np.int64)
  if not lens.sum():
    return np.zeros(0, np.int64)
  ends = np.cumsum(lens)
  return np.repeat(np.asarray(starts, np.int64) - (ends - lens), lens) + np.arange(int(ends[-1]), dtype=np.int64)


def event_table(prepared: PreparedSplit, records: Sequence[Record]) -> EventTable:
  """The link targets per window of `prepared` = `windows.prepare_split(records, ...)` of span records
  (`as_span_records`), from its public fields.

  A window holds an event when it holds all the event's arguments (trigger included) that are targets; it then gets
  one row per pair of distinct arguments of the event: (min(h1, h2), max(h1, h2), min(t1, t2), max(t1, t2)) of their
  start tokens h and end tokens t. This is Su's rule (duee_v1.py `data_generator`: `for i1, i2 ... if i2 > i1` over
  the event's arguments): an argument never pairs with itself, while two arguments on the same tokens (a role and a
  sub-role on one span) give diagonal cells. An event that no window holds whole is counted in `dropped`, not cut.
  """
  ev_record, members = _event_members(prepared, records)
  G = len(ev_record)
  status = prepared.entity_status
  placed = [[m for m in ms if status[m] not in (MISALIGNED, TOO_LONG)] for ms in members]
  partial = sum(len(p) < len(ms) for p, ms in zip(placed, members))
  pair_e, pair_w = _windows_holding(prepared, placed, ev_record)
  kept = int(np.unique(pair_e).size)
  key = _link_rows(prepared, placed, pair_e, pair_w)
  N = prepared.num_windows
  table = EventTable(ptr=_ptr(np.bincount(key[:, 0], minlength=N)), links_Q4=key[:, 1:].astype(np.int32),
                     events=G, kept=kept, dropped=G - kept, partial=partial)
  log.info("event_table %s: %d events: %d kept, %d dropped (no window holds all their arguments), %d with an "
           "argument left out (misaligned or too long); %d link rows in %d windows", prepared.name, G, kept,
           G - kept, partial, key.shape[0], N)
  return table


def _event_members(prepared: PreparedSplit, records: Sequence[Record]) -> tuple[list[int], list[list[int]]]:
  """Per event of `records`: its record and its distinct arguments as rows of the split's entity table; records
  that are not the ones the split was prepared from, or not in span form, are refused."""
  counts = [len(r["entities"]) for r in records]
  if len(records) != prepared.num_records or sum(counts) != prepared.entity_record.shape[0]:
    raise ValueError(f"{prepared.name}: {len(records)} records with {sum(counts)} entities, but the split was "
                     f"prepared from {prepared.num_records} records with {prepared.entity_record.shape[0]} entities: "
                     "pass the records prepare_split was given")
  first = _ptr(counts)
  ev_record, members = [], []
  for r, rec in enumerate(records):
    for k, e in enumerate(rec.get("events", ())):
      if "entities" not in e:
        raise ValueError(f"{prepared.name}: record {rec.get('id', r)!r} event #{k} lists no entities: turn the "
                         "records into span form with as_span_records before prepare_split")
      ev_record.append(r)
      members.append([int(first[r]) + i for i in dict.fromkeys(e["entities"])])
  return ev_record, members


def _windows_holding(prepared: PreparedSplit, placed: list[list[int]],
                     ev_record: list[int]) -> tuple[np.ndarray, np.ndarray]:
  """(event, window) pairs where the window holds every placed argument of the event (events without one have
  none): every window of the event's record, kept when the arguments' token span lies inside its content."""
  G = len(placed)
  tok_E2 = prepared.entity_token_E2.astype(np.int64)
  n_placed = np.asarray([len(p) for p in placed], np.int64)
  flat = np.asarray([m for p in placed for m in p], np.int64)
  owner = np.repeat(np.arange(G, dtype=np.int64), n_placed)
  lo, hi = np.full(G, np.iinfo(np.int64).max), np.full(G, -1, np.int64)
  np.minimum.at(lo, owner, tok_E2[flat, 0])
  np.maximum.at(hi, owner, tok_E2[flat, 1])
  ev_record = np.asarray(ev_record, np.int64)
  nwin = np.bincount(prepared.window_record.astype(np.int64), minlength=prepared.num_records)
  cand = np.nonzero(n_placed > 0)[0]
  pair_e = np.repeat(cand, nwin[ev_record[cand]])
  pair_w = _repeat_ranges(_ptr(nwin)[ev_record[cand]], nwin[ev_record[cand]])
  ws = prepared.window_start.astype(np.int64)[pair_w]
  inside = (lo[pair_e] >= ws) & (hi[pair_e] < ws + prepared.window_content_len.astype(np.int64)[pair_w])
  return pair_e[inside], pair_w[inside]


def _link_rows(prepared: PreparedSplit, placed: list[list[int]], pair_e: np.ndarray, pair_w: np.ndarray) -> np.ndarray:
  """Unique (window, min start, max start, min end, max end) rows, window tokens: per held (event, window) pair, one
  per pair i1 < i2 of the event's placed arguments."""
  tok_E2 = prepared.entity_token_E2.astype(np.int64)
  n_placed = np.asarray([len(p) for p in placed], np.int64)
  pa, pb = [], []
  for p in placed:
    for i, a in enumerate(p):
      pa.extend([a] * (len(p) - i - 1))
      pb.extend(p[i + 1:])
  n_pairs = n_placed * (n_placed - 1) // 2
  rows = _repeat_ranges(_ptr(n_pairs)[pair_e], n_pairs[pair_e])
  a, b = np.asarray(pa, np.int64)[rows], np.asarray(pb, np.int64)[rows]
  w = np.repeat(pair_w, n_pairs[pair_e])
  off = int(prepared.num_prefix) - prepared.window_start.astype(np.int64)[w]
  ha, hb, ta, tb = tok_E2[a, 0] + off, tok_E2[b, 0] + off, tok_E2[a, 1] + off, tok_E2[b, 1] + off
  key = np.stack([w, np.minimum(ha, hb), np.maximum(ha, hb), np.minimum(ta, tb), np.maximum(ta, tb)], 1)
  return np.unique(key.reshape(-1, 5), axis=0)
