"""JSON lines -> Records: the Record format (entities, relations, events) and the CLUENER format, one per line.

Re-exported by `gp_jax.data.readers` (read_jsonl, merge_relations), whose base (DataError, ReadReport, text_lines)
this module uses. A bad line raises `DataError` naming the file, its true line, what was expected and the fix; with
strict=False the record is skipped and counted by reason (a record is the unit: keeping a record with one of its
events dropped would teach that event's mentions as non-events).
"""

from __future__ import annotations

import collections
import json
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from gp_jax.data.readers import DataError, PathOrFile, ReadReport, Records, check_entities, open_source, text_lines
from gp_jax.data.types import Entity, Event, EventArgument, Record, Relation, Span

# --- JSON lines ---------------------------------------------------------------------------

# A record with untyped entities (allowed beside "relations": task=relations reads them) carries its file and line
# under this key, so that a task that trains entity types (task=entities) refuses it as a DataError there.
UNTYPED_AT = "untyped_at"


def _int(value: Any, what: str, where: str, line: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise DataError(where, line, f"{what} is {value!r}: expected an integer", reason="bad_value")
  return value


def _record_entities(obj: dict, text: str, where: str, line: int, *, untyped: bool = False) -> list[Entity]:
  """Record format: "entities": [{"start", "end", "type", optional "text"}], end exclusive; `untyped` (a record
  with relations): "type" may be "" or absent (then "")."""
  raw = obj["entities"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'"entities" is {type(raw).__name__}: expected a list', reason="bad_value")
  out = []
  required = ("start", "end") if untyped else ("start", "end", "type")
  for k, e in enumerate(raw):
    if not isinstance(e, dict):
      raise DataError(where, line, f"entity #{k} is {type(e).__name__}: expected an object", reason="bad_value")
    missing = [key for key in required if key not in e]
    if missing:
      raise DataError(where, line, f"entity #{k} lacks {missing}: expected keys {', '.join(required)}",
                      reason="missing_key")
    ent = Entity(start=_int(e["start"], f"entity #{k} start", where, line),
                 end=_int(e["end"], f"entity #{k} end", where, line), type=e.get("type", ""))
    check_entities(text, [ent], where=where, line=line, allow_untyped=untyped)
    if "text" in e and text[ent["start"]:ent["end"]] != e["text"]:
      raise DataError(where, line, f"entity #{k} text {e['text']!r} != text[{ent['start']}:{ent['end']}] "
                      f"{text[ent['start']:ent['end']]!r}", reason="entity_text_mismatch")
    out.append(ent)
  return out


def _record_relations(obj: dict, num_entities: int, where: str, line: int) -> list[Relation]:
  """"relations": [{"head", "tail", "type"}], head and tail indexing the record's "entities"."""
  raw = obj["relations"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'"relations" is {type(raw).__name__}: expected a list', reason="bad_value")
  out = []
  for k, r in enumerate(raw):
    if not isinstance(r, dict):
      raise DataError(where, line, f"relation #{k} is {type(r).__name__}: expected an object", reason="bad_value")
    missing = [key for key in ("head", "tail", "type") if key not in r]
    if missing:
      raise DataError(where, line, f"relation #{k} lacks {missing}: expected keys head, tail, type",
                      reason="missing_key")
    for key in ("head", "tail"):
      i = _int(r[key], f"relation #{k} {key}", where, line)
      if not 0 <= i < num_entities:
        raise DataError(where, line, f"relation #{k} {key} {i} points at no entity: expected an index into the "
                        f"record's {num_entities} entities (0 to {num_entities - 1}); fix the index or add the "
                        "entity", reason="bad_relation")
    if not isinstance(r["type"], str) or not r["type"]:
      raise DataError(where, line, f"relation #{k} type {r['type']!r}: expected a non-empty string",
                      reason="bad_value")
    out.append(Relation(head=r["head"], tail=r["tail"], type=r["type"]))
  return out


def merge_relations(entities: Sequence[Entity], relations: Sequence[Relation]
                    ) -> tuple[list[Entity], list[Relation], collections.Counter]:
  """Merges entities with the same (start, end, type) and then repeated (head, tail, type) relations, keeping
  first occurrences in order; relation indices are remapped. -> (entities, relations, counts of what was
  merged: duplicate_entity, repeated_relation)."""
  counts = collections.Counter()
  index, kept, remap = {}, [], []
  for e in entities:
    key = (e["start"], e["end"], e["type"])
    if key in index:
      counts["duplicate_entity"] += 1
    else:
      index[key] = len(kept)
      kept.append(e)
    remap.append(index[key])
  seen, rels = set(), []
  for r in relations:
    rel = Relation(head=remap[r["head"]], tail=remap[r["tail"]], type=r["type"])
    key = (rel["head"], rel["tail"], rel["type"])
    if key in seen:
      counts["repeated_relation"] += 1
    else:
      seen.add(key)
      rels.append(rel)
  return kept, rels, counts


def _cluener_entities(obj: dict, text: str, where: str, line: int) -> list[Entity]:
  """CLUENER format: "label": {type: {entity_text: [[start, end], ...]}}, end INCLUSIVE."""
  label = obj["label"]
  if not isinstance(label, dict):
    raise DataError(where, line, f'"label" is {type(label).__name__}: expected {{type: {{text: [[s, e]]}}}}',
                    reason="bad_value")
  out = []
  for kind, by_text in label.items():
    if not isinstance(by_text, dict):
      raise DataError(where, line, f'"label"[{kind!r}] is {type(by_text).__name__}: expected {{text: [[s, e]]}}',
                      reason="bad_value")
    for ent_text, pairs in by_text.items():
      if not isinstance(pairs, list):
        raise DataError(where, line, f"spans of {ent_text!r} are {pairs!r}: expected [[start, end], ...]",
                        reason="bad_value")
      for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
          raise DataError(where, line, f"span {pair!r} of {ent_text!r}: expected [start, end]", reason="bad_value")
        start = _int(pair[0], f"start of {ent_text!r}", where, line)
        end = _int(pair[1], f"end of {ent_text!r}", where, line) + 1  # inclusive -> exclusive
        ent = Entity(start=start, end=end, type=kind)
        check_entities(text, [ent], where=where, line=line)
        if text[start:end] != ent_text:
          raise DataError(where, line, f"{kind} {ent_text!r} at [{start}, {end - 1}] (inclusive) but the text there "
                          f"is {text[start:end]!r}", reason="entity_text_mismatch")
        out.append(ent)
  out.sort(key=lambda e: (e["start"], e["end"], e["type"]))
  return out


# --- events ------------------------------------------------------------------------------------------------------

TRIGGER = "trigger"  # the trigger's role in the event classes (events.py): no argument may take it
SPAN_FIX = "character offsets into the text, end exclusive: 0 <= start < end <= len(text)"


def _event_span(raw: Any, what: str, text: str, where: str, line: int) -> tuple[int, int]:
  """A validated {"start", "end"[, "text"]} of an event (its trigger or an argument) -> (start, end)."""
  missing = [key for key in ("start", "end") if key not in raw]
  if missing:
    raise DataError(where, line, f"{what} lacks {missing}: expected keys start, end", reason="missing_key")
  start, end = _int(raw["start"], f"{what} start", where, line), _int(raw["end"], f"{what} end", where, line)
  if start >= end:
    raise DataError(where, line, f"{what} [{start}, {end}): expected start < end ({SPAN_FIX})", reason="empty_span")
  if start < 0 or end > len(text):
    raise DataError(where, line, f"{what} [{start}, {end}) is outside the text (length {len(text)}): expected "
                    f"{SPAN_FIX}", reason="span_out_of_range")
  if "text" in raw and text[start:end] != raw["text"]:
    raise DataError(where, line, f"{what} text {raw['text']!r} != text[{start}:{end}] {text[start:end]!r}: fix the "
                    "offsets or the text", reason="event_text_mismatch")
  return start, end


def _record_events(obj: dict, text: str, where: str, line: int, notes: collections.Counter) -> list[Event]:
  """"events": [{"type", "trigger": {"start", "end"} | null, "arguments": [{"start", "end", "role"}]}] (types.py),
  validated; an argument repeated within its event and a repeated event are kept once (counted in `notes`)."""
  raw = obj["events"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'"events" is {type(raw).__name__}: expected a list of {{"type", "trigger", '
                    '"arguments"}', reason="bad_value")
  out, seen = [], set()
  for k, ev in enumerate(raw):
    event, keys = _one_event(ev, f"event #{k}", text, where, line, notes)
    trigger = event["trigger"]
    key = (event["type"], None if trigger is None else (trigger["start"], trigger["end"]), frozenset(keys))
    if key in seen:
      notes["repeated_event"] += 1
      continue
    seen.add(key)
    out.append(event)
  return out


def _one_event(ev, at: str, text: str, where: str, line: int, notes: collections.Counter):
  """(Event, its argument keys {(start, end, role)}) of one validated event object."""
  if not isinstance(ev, dict):
    raise DataError(where, line, f"{at} is {type(ev).__name__}: expected an object {{\"type\", \"trigger\", "
                    '"arguments"}', reason="bad_value")
  missing = [key for key in ("type", "arguments") if key not in ev]
  if missing:
    raise DataError(where, line, f"{at} lacks {missing}: expected keys type, arguments and optionally trigger "
                    "(null for none)", reason="missing_key")
  kind = ev["type"]
  if not isinstance(kind, str) or not kind or ":" in kind:
    raise DataError(where, line, f"{at} type {kind!r}: expected a non-empty string without ':' (event classes "
                    'are written "type:role")', reason="bad_value")
  trigger = ev.get("trigger")
  if trigger is not None:
    if not isinstance(trigger, dict):
      raise DataError(where, line, f"{at} ({kind}) trigger is {trigger!r:.60}: expected {{\"start\", \"end\"}} "
                      "or null", reason="bad_value")
    start, end = _event_span(trigger, f"{at} ({kind}) trigger", text, where, line)
    trigger = Span(start=start, end=end)
  if not isinstance(ev["arguments"], list):
    raise DataError(where, line, f'{at} ({kind}) "arguments" is {type(ev["arguments"]).__name__}: expected a '
                    'list of {"start", "end", "role"}', reason="bad_value")
  args, keys = _event_arguments(ev["arguments"], f"{at} ({kind})", text, where, line, notes)
  if trigger is None and not args:
    raise DataError(where, line, f"{at} ({kind}) has neither a trigger nor arguments: expected at least one",
                    reason="empty_event")
  return Event(type=kind, trigger=trigger, arguments=args), keys


def _event_arguments(raw: list, at: str, text: str, where: str, line: int, notes: collections.Counter):
  """(arguments, their keys {(start, end, role)}), an argument repeated within the event kept once."""
  args, keys = [], set()
  for j, a in enumerate(raw):
    what = f"{at} argument #{j}"
    if not isinstance(a, dict):
      raise DataError(where, line, f"{what} is {type(a).__name__}: expected an object {{\"start\", \"end\", "
                      '"role"}', reason="bad_value")
    if "role" not in a:
      raise DataError(where, line, f"{what} lacks ['role']: expected keys start, end, role", reason="missing_key")
    role = a["role"]
    if not isinstance(role, str) or not role or role == TRIGGER:
      raise DataError(where, line, f"{what} role {role!r}: expected a non-empty string other than {TRIGGER!r} "
                      '(give the trigger as the event\'s "trigger")', reason="bad_value")
    start, end = _event_span(a, f"{what} ({role})", text, where, line)
    if (start, end, role) in keys:
      notes["repeated_argument"] += 1
      continue
    keys.add((start, end, role))
    args.append(EventArgument(start=start, end=end, role=role))
  return args, keys


# --- the reader ---------------------------------------------------------------------------------------------------


def read_jsonl(path: PathOrFile, *, strict: bool = True, allow_unlabelled: bool = False,
               id_prefix: str | None = None, name: str | None = None) -> Records:
  """Reads JSON lines in the Record format or the CLUENER format, per line.

  path: a file path or an open text file (then `name` names it in messages).

  Record: {"text", "entities": [{"start", "end", "type"[, "text"]}]} (end exclusive), optionally with
  "relations": [{"head", "tail", "type"}] indexing "entities"; in such a record an entity's "type" may be ""
  or absent (untyped: the record then holds its file and line under `UNTYPED_AT`, for task=entities to refuse),
  duplicate entities and repeated relations are merged (counted in report.merged).
  Optionally "events": [{"type", "trigger": {"start", "end"[, "text"]} | null, "arguments": [{"start", "end",
  "role"[, "text"]}]}] (types.py; "entities" may then be absent); an argument repeated within its event and a
  repeated event are kept once (counted in report.event_notes).
  CLUENER: {"text", "label": {type: {entity_text: [[start, end], ...]}}} (end inclusive).
  A line with none of "entities", "label" and "events" is an error unless `allow_unlabelled`
  (then it gets no entities). "id" is kept when present (as str), else
  f"{id_prefix}-{n}" with n the 0-based record number in the file. Blank lines are ignored.
  """
  f, where, owned = open_source(path, name)
  prefix = id_prefix or os.path.splitext(os.path.basename(where))[0]
  report = ReadReport(where)

  def parse(n, line, raw):
    return _parse_json_line(raw, where, line, f"{prefix}-{n}", allow_unlabelled, report)

  return read_records(_json_lines(f, where), parse, report, strict=strict, close=f if owned else None)


def read_records(items: Iterable[tuple], parse: Callable[..., Record], report: ReadReport, *, strict: bool,
                 close: Any = None) -> Records:
  """The loop of the record readers (JSON lines here, CasRel's array in relations.py): `parse(*item)` for each
  item; a DataError stops the read (strict) or skips that record, counted by reason (`report.skip`); errors of the
  items themselves (a bad byte, malformed JSON around a record) always stop it. `close` (a file, or None) is closed
  at the end either way. -> `report.finish(records)`."""
  records: list[Record] = []
  try:
    for item in items:
      try:
        records.append(parse(*item))
      except DataError as e:
        if strict:
          raise
        report.skip(e)
  finally:
    if close is not None:
      close.close()
  return report.finish(records)


def _json_lines(f, where: str):
  """(record number from 0, true line, line) of each non-blank line."""
  n = 0
  for line, raw in text_lines(f, where):
    if raw.strip():
      yield n, line, raw
      n += 1


def _parse_json_line(raw: str, where: str, line: int, default_id: str, allow_unlabelled: bool,
                     report: ReadReport) -> Record:
  """One line -> a Record; counts (report.merged, report.event_notes) are updated only for a record returned."""
  try:
    obj = json.loads(raw)
  except json.JSONDecodeError as e:
    raise DataError(where, line, f"malformed JSON ({e.msg} at column {e.colno}): expected one object per line",
                    reason="bad_json") from e
  if not isinstance(obj, dict):
    raise DataError(where, line, f"got a JSON {type(obj).__name__}: expected an object", reason="bad_json")
  if "text" not in obj:
    raise DataError(where, line, 'missing key "text": expected {"text", "entities"} or {"text", "label"}',
                    reason="missing_key")
  text = obj["text"]
  if not isinstance(text, str):
    raise DataError(where, line, f'"text" is {type(text).__name__}: expected a string', reason="bad_value")
  notes = collections.Counter()
  events = _record_events(obj, text, where, line, notes) if "events" in obj else None
  rid = str(obj.get("id", default_id))
  if "relations" in obj:
    if "entities" not in obj:
      raise DataError(where, line, '"relations" without "entities": expected {"text", "entities", "relations"} '
                      "with head and tail indexing the entities", reason="missing_key")
    entities = _record_entities(obj, text, where, line, untyped=True)
    relations = _record_relations(obj, len(entities), where, line)
    entities, relations, counts = merge_relations(entities, relations)
    report.merged.update(counts)
    record = Record(id=rid, text=text, entities=entities, relations=relations)
    if any(not e["type"] for e in entities):  # where, for a task that needs types (`UNTYPED_AT`)
      record[UNTYPED_AT] = {"path": where, "line": line}
  elif "entities" in obj:
    record = Record(id=rid, text=text, entities=_record_entities(obj, text, where, line))
  elif "label" in obj:
    record = Record(id=rid, text=text, entities=_cluener_entities(obj, text, where, line))
  elif events is not None or allow_unlabelled:
    record = Record(id=rid, text=text, entities=[])
  else:
    raise DataError(where, line, 'missing key "entities" (or CLUENER "label", or "events"): expected labelled '
                    "records", reason="missing_key")
  if events is not None:
    record["events"] = events
    report.event_notes.update(notes)
  return record
