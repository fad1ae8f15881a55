"""PHEE: English pharmacovigilance event extraction (sentences from case reports), 2 event types, nested arguments.

Files (manual dir): train.json, dev.json, test.json of github.com/ZhaoyueSun/PHEE data/json/, JSON lines {"id",
"context", "annotations": [{"events": [...]}]}; the first annotation is read, as the paper's scorer reads it. Each
PHEE event becomes one event record item (types.py): type = event_type ("Adverse_event" or
"Potential_therapeutic_event"); arguments with the roles the paper's scorer scores (phee_metric.py and the gold
readers beside it): the main roles Subject, Treatment, Effect; their sub-roles as "Subject.Age", "Treatment.Drug",
...; the drugs of a Treatment's Combination sub-events as "Combination.Drug" (the scorer's key is
"<type>.Combination.Drug", a sub-argument). Decisions, each counted in the build log and metadata["reports"]:
- trigger: the first piece of the first mention, as the scorer takes it (`Trigger.text[0][0]`); further pieces or
  mentions would be left out (counted: trigger_extra_pieces / trigger_extra_mentions; none in PHEE).
- discontinuous mentions: each piece its own argument, as the scorer counts them (discontinuous_mentions,
  pieces_of_discontinuous_mentions).
- attributes Speculated / Negated / Severity: left out (attribute:<name>): the published figures (Trigger, MainArgs,
  SubArgs) do not score them, and a cue word is not an argument of the event's other roles; the Combination
  sub-events' own triggers likewise (combination_trigger).
- offsets: a piece runs from its start to start + len(piece) in the context; a piece whose text differs from the
  context there is bad input (offset_mismatch; none in PHEE).
- a span given twice with one role in one event (a drug in two Combination sub-events) is one argument
  (repeated_argument); the scorer would count it twice.
Counts: train 2,898 sentences / 3,006 events, dev 961 / 1,003, test 968 / 1,010. Ids: PHEE's own ("<pmid>_<n>").

Citation: Zhaoyue Sun et al. 2022. PHEE: A Dataset for Pharmacovigilance Event Extraction from Text. EMNLP 2022.
Licence: MIT (the repository's LICENSE). Never committed to the project.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Any

import numpy as np
import tensorflow_datasets as tfds

from gp_jax.data import events as events_lib
from gp_jax.data import readers
from gp_jax.data.builders import base
from gp_jax.data.types import Event, EventArgument, Record, Span

FILES = {"train": "train.json", "dev": "dev.json", "test": "test.json"}
EVENT_TYPES = ("Adverse_event", "Potential_therapeutic_event")
MAIN_ROLES = ("Subject", "Treatment", "Effect")
SUB_ROLES = {"Subject": ("Age", "Disorder", "Gender", "Population", "Race"),
             "Treatment": ("Disorder", "Dosage", "Drug", "Duration", "Freq", "Route", "Time_elapsed"),
             "Effect": ()}
COMBINATION, COMBINATION_DRUG = "Combination", "Combination.Drug"
ATTRIBUTES = ("Negated", "Severity", "Speculated")
ROLES = tuple(sorted([*MAIN_ROLES, *(f"{m}.{s}" for m, subs in SUB_ROLES.items() for s in subs), COMBINATION_DRUG]))
ARG_KEYS = ("text", "start", "entity_id")  # an ARG's own keys; the rest are its sub-arguments
EXPECTED = ('one JSON object per line {"id", "context", "annotations": [{"events": [{"event_type", "Trigger", '
            '"Subject", "Treatment", "Effect", ...}]}]} as data/json/ of github.com/ZhaoyueSun/PHEE ships them')


def features() -> tfds.features.FeaturesDict:
  """The entity features of every corpus (no entities here), plus events stored flat: `events` in order with their
  trigger (-1, -1 for none) and `event_arguments` naming their event by index."""
  return tfds.features.FeaturesDict({
      **base.features(),
      "events": tfds.features.Sequence({
          "type": tfds.features.Text(),
          "trigger_start": np.int32,
          "trigger_end": np.int32,
      }),
      "event_arguments": tfds.features.Sequence({
          "event": np.int32,
          "start": np.int32,
          "end": np.int32,
          "role": tfds.features.Text(),
      }),
  })


def example_events(events: list[Event]) -> dict[str, list[dict]]:
  """A record's events -> the flat `events` / `event_arguments` features (inverse: corpora.to_record)."""
  return {
      "events": [{"type": e["type"], "trigger_start": -1 if e["trigger"] is None else e["trigger"]["start"],
                  "trigger_end": -1 if e["trigger"] is None else e["trigger"]["end"]} for e in events],
      "event_arguments": [{"event": k, **a} for k, e in enumerate(events) for a in e["arguments"]],
  }


# --- reading the JSON lines -----------------------------------------------------------------------------------------


def _pieces(arg: Any, what: str, text: str, *, where: str, line: int, notes: collections.Counter
            ) -> list[list[tuple[int, int]]]:
  """An ARG {"text": [[piece, ...], ...], "start": [[char, ...], ...]} -> its mentions as lists of (start, end)."""
  if not isinstance(arg, dict) or not all(k in arg for k in ("text", "start")):
    raise readers.DataError(where, line, f"{what} is {arg!r:.80}: expected {{\"text\": [[piece, ...]], \"start\": "
                            f"[[char, ...]]}} ({EXPECTED})", reason="bad_value")
  texts, starts = arg["text"], arg["start"]
  shape_ok = (isinstance(texts, list) and isinstance(starts, list) and len(texts) == len(starts)
              and all(isinstance(t, list) and isinstance(s, list) and len(t) == len(s) and t
                      for t, s in zip(texts, starts)))
  if not shape_ok:
    raise readers.DataError(where, line, f"{what}: text {texts!r:.60} and start {starts!r:.60} differ in shape: "
                            "expected one start per piece", reason="bad_value")
  mentions = []
  for mention_texts, mention_starts in zip(texts, starts):
    pieces = []
    for piece, start in zip(mention_texts, mention_starts):
      if not isinstance(piece, str) or not piece or isinstance(start, bool) or not isinstance(start, int):
        raise readers.DataError(where, line, f"{what}: piece {piece!r} at {start!r}: expected a non-empty string "
                                "and an integer start", reason="bad_value")
      end = start + len(piece)
      if start < 0 or text[start:end] != piece:
        raise readers.DataError(where, line, f"{what}: piece {piece!r} at {start} but the context there is "
                                f"{text[max(start, 0):end]!r}: expected start + len(piece) to give the piece; "
                                "re-download the file (SOURCE.md gives its git blob)", reason="offset_mismatch")
      pieces.append((start, end))
    if len(pieces) > 1:
      notes["discontinuous_mentions"] += 1
      notes["pieces_of_discontinuous_mentions"] += len(pieces)
    mentions.append(pieces)
  return mentions


def phee_events(obj: Any, *, where: str, line: int, notes: collections.Counter) -> tuple[str, str, list[Event]]:
  """One PHEE line -> (id, context, events) as the module docstring says; DataError for bad input."""
  if not isinstance(obj, dict) or not all(k in obj for k in ("id", "context", "annotations")):
    raise readers.DataError(where, line, f"expected {EXPECTED}", reason="missing_key")
  text, anns = obj["context"], obj["annotations"]
  if not isinstance(text, str) or not isinstance(anns, list) or not anns or not isinstance(anns[0], dict) \
      or not isinstance(anns[0].get("events"), list):
    raise readers.DataError(where, line, f'"context" or "annotations" malformed: expected {EXPECTED}',
                            reason="bad_value")
  notes["extra_annotations"] += len(anns) - 1
  events, seen = [], set()
  for k, e in enumerate(anns[0]["events"]):
    at = f"event #{k}"
    kind = e.get("event_type") if isinstance(e, dict) else None
    if not isinstance(kind, str) or not kind or ":" in kind:
      raise readers.DataError(where, line, f"{at}: event_type {kind!r}: expected a non-empty string without ':' "
                              f"({EXPECTED})", reason="bad_value")
    trigger = _trigger(e, at, text, where=where, line=line, notes=notes)
    args = _arguments(e, at, text, where=where, line=line, notes=notes)
    if trigger is None and not args:
      raise readers.DataError(where, line, f"{at} ({kind}) has neither a trigger nor arguments: expected {EXPECTED}",
                              reason="empty_event")
    key = (kind, None if trigger is None else (trigger["start"], trigger["end"]),
           frozenset((a["start"], a["end"], a["role"]) for a in args))
    if key in seen:
      notes["repeated_event"] += 1
      continue
    seen.add(key)
    events.append(Event(type=kind, trigger=trigger, arguments=args))
  return str(obj["id"]), text, events


def _trigger(e: dict, at: str, text: str, *, where: str, line: int, notes: collections.Counter) -> Span | None:
  """An event's trigger: the first piece of its first mention (further pieces and mentions counted); None without
  one (counted)."""
  if "Trigger" not in e:
    notes["no_trigger"] += 1
    return None
  mentions = _pieces(e["Trigger"], f"{at} Trigger", text, where=where, line=line, notes=notes)
  if not mentions:
    return None
  notes["trigger_extra_pieces"] += len(mentions[0]) - 1
  notes["trigger_extra_mentions"] += len(mentions) - 1
  return Span(start=mentions[0][0][0], end=mentions[0][0][1])


def _arguments(e: dict, at: str, text: str, *, where: str, line: int,
               notes: collections.Counter) -> list[EventArgument]:
  """An event's main and sub-arguments (and Treatment.Combination's drugs) in the file's order, each (start, end,
  role) once (repeats counted); attributes counted and left out; an unknown key is a DataError."""
  args: list[EventArgument] = []
  keys = set()

  def add(role: str, arg: Any, what: str) -> None:
    for mention in _pieces(arg, what, text, where=where, line=line, notes=notes):
      for start, end in mention:
        if (start, end, role) in keys:
          notes["repeated_argument"] += 1
          continue
        keys.add((start, end, role))
        args.append(EventArgument(start=start, end=end, role=role))

  for key, value in e.items():
    if key in ("event_id", "event_type", "Trigger"):
      continue
    if key in ATTRIBUTES:
      notes[f"attribute:{key}"] += 1
      continue
    if key not in MAIN_ROLES:
      raise readers.DataError(where, line, f"{at}: unknown key {key!r}: expected {list(MAIN_ROLES)}, "
                              f"{list(ATTRIBUTES)}, Trigger, event_id, event_type", reason="unknown_type")
    add(key, value, f"{at} {key}")
    for sub, sub_value in value.items():
      if sub in ARG_KEYS:
        continue
      if sub == COMBINATION and key == "Treatment" and isinstance(sub_value, list):
        for j, comb in enumerate(sub_value):
          if not isinstance(comb, dict):
            raise readers.DataError(where, line, f"{at} Treatment.Combination #{j} is {comb!r:.60}: expected an "
                                    "event {\"Trigger\", \"Drug\"}", reason="bad_value")
          notes["combination_trigger"] += "Trigger" in comb
          if "Drug" in comb:
            add(COMBINATION_DRUG, comb["Drug"], f"{at} Treatment.Combination #{j} Drug")
      elif sub in SUB_ROLES[key]:
        add(f"{key}.{sub}", sub_value, f"{at} {key}.{sub}")
      else:
        raise readers.DataError(where, line, f"{at}: unknown sub-argument {key}.{sub}: expected one of "
                                f"{list(SUB_ROLES[key]) + ([COMBINATION] if key == 'Treatment' else [])}",
                                reason="unknown_type")
  return args


def read_phee(path: str | os.PathLike, *, strict: bool = True, name: str | None = None) -> readers.Records:
  """A PHEE JSON-lines file -> event Records (no entities) with a ReadReport (report.event_notes: the decisions of
  the module docstring, counted). strict=False skips a bad line, counted by reason."""
  where = name or os.fspath(path)
  report = readers.ReadReport(where)
  records: list[Record] = []
  with open(path, "rb") as f:
    for line, raw in readers.text_lines(f, where):
      if not raw.strip():
        continue
      notes = collections.Counter()
      try:
        try:
          obj = json.loads(raw)
        except json.JSONDecodeError as e:
          raise readers.DataError(where, line, f"malformed JSON ({e.msg} at column {e.colno}): expected {EXPECTED}",
                                  reason="bad_json") from None
        rid, text, events = phee_events(obj, where=where, line=line, notes=notes)
      except readers.DataError as e:
        if strict:
          raise
        report.skip(e)
        continue
      report.event_notes.update({k: v for k, v in notes.items() if v})
      records.append(Record(id=rid, text=text, entities=[], events=events))
  return report.finish(records)


class GpPhee(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_phee"
  CORPUS = "phee"
  TYPES = ()  # no entities: the span classes are the event classes (metadata["event_classes"])
  LANGUAGE = "en"
  NESTED = True
  HOMEPAGE = "https://github.com/ZhaoyueSun/PHEE"
  CITATION = """@inproceedings{sun2022phee,
  title={{PHEE}: A Dataset for Pharmacovigilance Event Extraction from Text},
  author={Sun, Zhaoyue and Li, Jiazheng and Pergola, Gabriele and Wallace, Byron and John, Bino and Greene, Nigel
          and Kim, Joseph and He, Yulan},
  booktitle={Proceedings of EMNLP 2022},
  pages={5571--5587},
  year={2022}
}"""
  LICENSE = "MIT"
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put train.json, dev.json and test.json (data/json/ of
  github.com/ZhaoyueSun/PHEE) in the manual dir."""

  def _info(self) -> tfds.core.DatasetInfo:
    info = super()._info()  # the metadata every corpus has
    metadata = info.metadata
    metadata.update(event_types=list(EVENT_TYPES), roles=list(ROLES), event_classes=[])  # classes: while building
    return tfds.core.DatasetInfo(builder=self, description=info.description, features=features(),
                                 homepage=self.HOMEPAGE, citation=self.CITATION, disable_shuffling=True,
                                 license=self.LICENSE, metadata=metadata)

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    splits = {split: read_phee(base.find_file(root, fname)) for split, fname in FILES.items()}
    self.info.metadata["event_classes"] = list(events_lib.event_classes(**splits))
    return splits

  def _check(self, split: str, records: readers.Records) -> None:
    """The entity checks, and every event of a known type with known roles and offsets inside its text."""
    super()._check(split, records)
    where = records.report.path
    for r in records:
      for e in r["events"]:
        spans = ([e["trigger"]] if e["trigger"] else []) + e["arguments"]
        roles = {a["role"] for a in e["arguments"]}
        if e["type"] not in EVENT_TYPES or not roles <= set(ROLES):
          raise readers.DataError(where, None, f"record {r['id']}: event {e['type']!r} with roles {sorted(roles)}: "
                                  f"expected a type in {EVENT_TYPES} and roles in {ROLES}", reason="unknown_type")
        if any(not 0 <= s["start"] < s["end"] <= len(r["text"]) for s in spans):
          raise readers.DataError(where, None, f"record {r['id']}: an event span lies outside its text",
                                  reason="span_out_of_range")

  def _generate_examples(self, records: readers.Records):
    for i, r in enumerate(records):
      yield i, {"id": r["id"], "text": r["text"], "entities": [], **example_events(r["events"])}
