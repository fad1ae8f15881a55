"""Event P/R/F1 on char-offset events: Su's argument and event levels, CasEE's TI / TC / AI / AC, breakdowns.

Why: the selection figure must be the one GPLinker's authors report (argument level, bojone/GPLinker duee_v1.py and
bert4torch examples/others/task_event_extraction_gplinker.py, `evaluate`), and the other papers' figures must be
comparable. Plain Python, no jax: the host half and an exported folder use it.

An event is {"type": str, "trigger": {"start", "end"} | None, "arguments": [{"start", "end", "role"}]} (char offsets,
end exclusive) of its record's text; other fields (scores, texts) are ignored.

- Argument level (Su; "f1" selects checkpoints): per sentence the set of (type, role, text, start) over all its
  events, triggers excluded, so an argument that two events share, or two same-type events both hold, counts once.
  Predicted events without a trigger count here, as in Su's `evaluate` (it decodes with `trigger=False`).
- Event level (Su): per sentence the set of predicted events that have a trigger and the set of gold events (all);
  an event is its type, trigger (text, start) and multiset of (role, text, start) arguments (Su's sorted list of
  (type, role, text, start) tuples, the trigger being the tuple of role 触发词); a predicted event is a hit when it
  equals a gold event. Two identical events of one side count once (Su's DedupList). An event with neither trigger
  nor arguments keeps its type here (Su's empty list would equal one of any type).
- TI / TC / AI / AC (CasEE, JiaweiSheng/CasEE utils/metric.py `gen_tuples`/`score`: sets per sentence): trigger
  (start, end); + event type; argument (event type, start, end), no role; + role. UIE (universal-ie/UIE
  uie/extraction/scorer.py, EventScorer) reports the same TC and AC tuples ("offset-evt-trigger", "offset-evt-role")
  but counts a tuple once per occurrence; here, as CasEE, once per sentence. Events without a trigger give no TI / TC
  tuple; their arguments count in AI / AC.
"""

from __future__ import annotations

from typing import Sequence

from gp_jax.metrics import per_record_counts, span_prf

RESULT_KEYS = ("precision", "recall", "f1", "tp", "pred", "gold")
EVENT_COUNTS = (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3+", 3, None))  # gold events per sentence: label, lo, hi
TRIGGER = "trigger"


def _span(text: str, span, where: str) -> tuple[int, int]:
  try:
    a, b = int(span["start"]), int(span["end"])
  except (TypeError, KeyError, ValueError) as e:
    raise ValueError(f"{where}: expected {{'start': int, 'end': int}}, got {span!r}") from e
  if not 0 <= a < b <= len(text):
    raise ValueError(f"{where}: span [{a}, {b}) is not inside the text (length {len(text)}); offsets are chars, "
                     "end exclusive, start < end")
  return a, b


def _event(text: str, event, where: str) -> tuple[str, tuple | None, list[tuple[str, int, int]]]:
  """(type, trigger (start, end) or None, [(role, start, end)]) of one event, checked."""
  if not isinstance(event, dict) or "type" not in event:
    raise ValueError(f"{where}: expected an event dict with 'type', 'trigger' and 'arguments', got {event!r}")
  trig = event.get("trigger")
  trig = None if trig is None else _span(text, trig, f"{where} trigger")
  args = []
  for k, a in enumerate(event.get("arguments") or ()):
    if "role" not in a:
      raise ValueError(f"{where} argument {k}: no 'role' in {a!r}")
    args.append((str(a["role"]), *_span(text, a, f"{where} argument {k}")))
  return str(event["type"]), trig, args


def checked_events(texts: Sequence[str], events: Sequence[Sequence[dict]], side: str) -> list[list[tuple]]:
  """Per record the events as (type, trigger, [(role, start, end)]); bad input raises naming record and event."""
  if len(events) != len(texts):
    raise ValueError(f"{side}: {len(events)} records of events for {len(texts)} texts; pass one list per text")
  return [[_event(t, e, f"{side} record {r} event {i}") for i, e in enumerate(evs)]
          for r, (t, evs) in enumerate(zip(texts, events))]


def argument_tuples(text: str, event) -> list[tuple[str, str, str, int]]:
  """Su's argument tuples (type, role, text, start) of one checked event (`checked_events`), trigger excluded."""
  etype, _, args = event
  return [(etype, role, text[a:b], a) for role, a, b in args]


def event_key(text: str, event) -> tuple:
  """Su's event as a hashable value: (type, trigger (text, start) | None, sorted (role, text, start) arguments)."""
  etype, trig, args = event
  return (etype, None if trig is None else (text[trig[0]:trig[1]], trig[0]),
          tuple(sorted((role, text[a:b], a) for role, a, b in args)))


def _label(n: int) -> str:
  return next(lab for lab, lo, hi in EVENT_COUNTS if n >= lo and (hi is None or n <= hi))


def _by_events(labels: list[str], pred: set, gold: set) -> dict[str, dict[str, int]]:
  """tp / pred / gold per class of sentence (tuples carry their record first)."""
  out = {lab: {"tp": 0, "pred": 0, "gold": 0} for lab, *_ in EVENT_COUNTS}
  for field, items in (("gold", gold), ("pred", pred), ("tp", pred & gold)):
    for x in items:
      out[labels[x[0]]][field] += 1
  return out


def _main(result: dict) -> dict:
  return {k: result[k] for k in RESULT_KEYS}


def _tuple_sets(texts, pred_ev, gold_ev) -> tuple[dict, dict, dict]:
  """{"pred", "gold"} sets of the argument tuples, the events (Su's event level) and, under "ti", "tc", "ai", "ac",
  the trigger / argument identification and classification tuples; each (record, ..., class)."""
  arg = {"pred": set(), "gold": set()}
  evt = {"pred": set(), "gold": set()}
  cas = {k: {"pred": set(), "gold": set()} for k in ("ti", "tc", "ai", "ac")}
  for side, per_record in (("pred", pred_ev), ("gold", gold_ev)):
    for r, (text, events) in enumerate(zip(texts, per_record)):
      for e in events:
        etype, trig, args = e
        # (record, start, text, (type, role)): Su's tuple with the record first and the class last for span_prf.
        arg[side].update((r, s, t, (ty, role)) for ty, role, t, s in argument_tuples(text, e))
        if trig is not None or side == "gold":
          evt[side].add((r, etype, event_key(text, e)[1:], etype))
        if trig is not None:
          cas["ti"][side].add((r, *trig, TRIGGER))
          cas["tc"][side].add((r, *trig, etype))
        cas["ai"][side].update((r, a, b, etype) for _, a, b in args)
        cas["ac"][side].update((r, a, b, (etype, role)) for role, a, b in args)
  return arg, evt, cas


def _joined_per_type(per_type: dict) -> dict:
  """span_prf's per-class counts keyed (type, role) -> keyed "type:role"; ValueError when two join alike."""
  out = {}
  for (ty, role), v in per_type.items():
    key = f"{ty}:{role}"
    if key in out:
      raise ValueError(f"event type / role names {key!r} are ambiguous joined by ':'; rename a type or role")
    out[key] = v
  return out


def event_prf(texts: Sequence[str], pred_events: Sequence[Sequence[dict]], gold_events: Sequence[Sequence[dict]]):
  """Argument-level micro P/R/F1 (Su; the selection "f1") with per role, event level, TI / TC / AI / AC, breakdowns.

  Returns {"precision", "recall", "f1", "tp", "pred", "gold"} (argument level) and
  "per_type" ({"type:role": the same six}), "macro_f1" (mean F1 over roles with gold arguments),
  "event_level" (the six, "per_type" by event type, "per_record", "by_events"), "ti", "tc", "ai", "ac" (the six each),
  "per_record" ({"tp", "fp", "fn"}: one int per record, `metrics.per_record_counts`' format, argument level),
  "by_events" ({"0", "1", "2", "3+"}: tp / pred / gold of the sentences with that many distinct gold events; "0"
  holds the false positives of sentences without gold events).
  """
  pred_ev, gold_ev = checked_events(texts, pred_events, "predictions"), checked_events(texts, gold_events, "gold")
  n = len(texts)
  arg, evt, cas = _tuple_sets(texts, pred_ev, gold_ev)
  result = span_prf(arg["pred"], arg["gold"])
  per_type = _joined_per_type(result["per_type"])
  result["per_type"] = dict(sorted(per_type.items()))
  f1s = [v["f1"] for v in per_type.values() if v["gold"]]  # summed in span_prf's order, as before the sort
  result["macro_f1"] = sum(f1s) / len(f1s) if f1s else 0.0
  result["level"] = "argument"

  gold_count = [0] * n
  for x in evt["gold"]:
    gold_count[x[0]] += 1
  labels = [_label(c) for c in gold_count]
  ev = span_prf(evt["pred"], evt["gold"])
  result["event_level"] = dict(_main(ev), per_type=ev["per_type"],
                               per_record=per_record_counts(evt["pred"], evt["gold"], n),
                               by_events=_by_events(labels, evt["pred"], evt["gold"]))
  for k, v in cas.items():
    result[k] = _main(span_prf(v["pred"], v["gold"]))
  result["per_record"] = per_record_counts(arg["pred"], arg["gold"], n)
  result["by_events"] = _by_events(labels, arg["pred"], arg["gold"])
  return result


__all__ = ["event_prf", "checked_events", "argument_tuples", "event_key", "EVENT_COUNTS", "RESULT_KEYS", "TRIGGER"]
