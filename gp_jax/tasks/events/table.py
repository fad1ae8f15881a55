"""The event task's window table: the link targets of each window (`data.events.EventTable`) and the split's gold
events at char level (what the metric scores: every gold event, also those no window holds whole).

NumPy only: the host half (`host.prepare`) builds it too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from gp_jax.data import events as events_lib
from gp_jax.data import windows


@dataclasses.dataclass(frozen=True)
class EventSplitTable:
  """`PreparedSplit.table` of task=events: `ptr` / `links_Q4` as `targets.event_targets` reads them, the gold events
  per record ({"type", "trigger": {"start", "end"} | None, "arguments": [{"start", "end", "role"}]}, char offsets)."""

  types: tuple[str, ...]  # the event types (the task's labels)
  links: events_lib.EventTable
  gold: tuple[tuple[dict, ...], ...]  # per record; an unlabelled record has none

  @property
  def ptr(self) -> np.ndarray:
    return self.links.ptr

  @property
  def links_Q4(self) -> np.ndarray:
    return self.links.links_Q4

  @property
  def stats(self) -> dict[str, int]:
    return self.links.stats


def gold_events(records: Sequence) -> tuple[tuple[dict, ...], ...]:
  """Per record its events with char offsets only (the span-form "entities" indices dropped)."""
  out = []
  for rec in records:
    evs = []
    for e in rec.get("events", ()):
      trig = e.get("trigger")
      evs.append({"type": e["type"],
                  "trigger": None if trig is None else {"start": int(trig["start"]), "end": int(trig["end"])},
                  "arguments": [{"start": int(a["start"]), "end": int(a["end"]), "role": a["role"]}
                                for a in e["arguments"]]})
    out.append(tuple(evs))
  return tuple(out)


def in_span_form(records: Sequence) -> bool:
  """Whether every event already lists its entities (`data.events.as_span_records` was applied)."""
  return all("entities" in e for r in records for e in r.get("events", ()))


def prepare(records, tokenizer, types, labels, **window_options) -> windows.PreparedSplit:
  """Event records -> span form (`as_span_records`, the span classes `types` being "type:role") ->
  `windows.prepare_split` -> `PreparedSplit.table` = `EventSplitTable` (links per window, gold events)."""
  records = list(records)
  if not in_span_form(records):
    records = events_lib.as_span_records(records, types)
  p = windows.prepare_split(records, tokenizer, types=types, **window_options)
  return dataclasses.replace(p, table=EventSplitTable(types=tuple(labels), links=events_lib.event_table(p, records),
                                                      gold=gold_events(records)))


__all__ = ["EventSplitTable", "gold_events", "in_span_form", "prepare"]
