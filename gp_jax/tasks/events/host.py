"""The event task's host half: window hits -> events (cliques) -> records, the event metric, the exported program's
call (numpy, gp_jax.data, gp_jax.tasks.base and the task's own plain-Python modules only: no flax, orbax,
ml_collections; tests/test_import_graph.py checks it).

`gp_jax.tasks.events.EventTask` (training, evaluation, predict from a workdir) and `gp_jax.serving` (an exported
folder, reached through `tasks.host("events")`) both call these, so a folder and its workdir give the same records.

Decisions (docs/tasks.md, issue 60):
- Grouping per window (`window_hits`): Su's cliques (`cliques.group_events`) of each row and event type, kept with
  or without a trigger (Su's argument-level metric counts the arguments of trigger-less events; the event level and
  the written predictions drop them, `output_records` counting them in a warning). A (row, event type) with more decoded arguments than
  `cliques.MAX_ARGUMENTS_PER_TYPE` gives no events; such groups and their arguments are counted, and `assemble`
  names the records that lost events in one warning.
- A clique holding several triggers gives one event per trigger, each with all the clique's other arguments (Su's
  output would keep one event with two triggers, which no gold event has).
- `event_grouping="trigger"` (an option; Su's cliques are the default): after the split above, the events of one
  window, type and trigger span are merged into one (`merge_by_trigger`). Chosen on PHEE's dev split, where a main
  argument and its sub-argument on one span are often left unlinked and Su's cliques write one trigger twice.
- Over windows: an event counts where the window that decides its whole extent (first to last token of its
  arguments, `merge.deciding_windows`, as entities and triples are decided) found it; events equal at char level
  (type, trigger, arguments) keep the highest score.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from gp_jax.data import merge
from gp_jax.data.events import TRIGGER, split_class
from gp_jax.tasks.base import (RESULT_KEYS, capped_windows, concat_capped, pointers_run_exported, trimmed,
                               warn_capped)
from gp_jax.tasks.events import cliques, table
from gp_jax.tasks.events.metrics import event_prf
from gp_jax.tasks.events.phee_score import answer_key, phee_score

log = logging.getLogger(__name__)

# The exported program (`gp_jax.tasks.pointer_export`): hit-buffer sizes are inputs, int32 [0, size] arrays (only
# the shape) after the model's arrays and before threshold; each pointer returns (count, coords [size, 4], scores
# [size]) as `ops.events.event_hits` gives them.
POINTERS = ("argument", "head", "tail")
BUFFERS = tuple(f"{k}_buffer" for k in POINTERS)
OUTPUT_FIELDS = ("events",)  # the fields `output_record` writes
OUTPUTS = tuple(f"{k}_{x}" for k in POINTERS for x in ("count", "coords", "scores"))
COUNTS = ("over_bound", "over_bound_arguments", "multi_trigger", "merged")  # what window_hits counts (logged)
GROUPINGS = ("cliques", "trigger")


# ----------------------------------------------------------------------------- label space and settings


def labels_to_json(labels) -> list[str]:
  """The event types, as the manifest's "labels" holds them."""
  return list(labels)


def labels_from_json(value) -> tuple[str, ...]:
  return tuple(value or ())


def manifest_settings(manifest: Mapping, types: Sequence[str]) -> tuple[tuple[str, ...], dict]:
  """(labels, options) of an exported folder's manifest."""
  return labels_from_json(manifest.get("labels")), dict(manifest.get("task_options") or {})


# ----------------------------------------------------------------------------- prepared splits
# prepare(records, tokenizer, types, labels, **window_options): span form, `windows.prepare_split` and the split's
# `table.EventSplitTable` (link targets per window, gold events) as `PreparedSplit.table`.
prepare = table.prepare


# ----------------------------------------------------------------------------- window hits


def _bounded(argument, head, tail, pairs, bound: int):
  """Argument hits of (row, event type) groups above `bound` removed, and the link hits of rows left without
  arguments -> (argument, head, tail) hits, groups removed, their arguments, the rows they were in (int64 [n])."""
  (ac, as_), (hc, hs), (tc, ts) = (trimmed(h) for h in (argument, head, tail))
  ac, hc, tc = (np.asarray(c, np.int64).reshape(-1, 4) for c in (ac, hc, tc))
  if not ac.size:
    return (0, ac, as_), (0, hc[:0], hs[:0]), (0, tc[:0], ts[:0]), 0, 0, np.zeros(0, np.int64)
  type_names = sorted({t for t, _ in pairs})
  type_of_class = np.asarray([type_names.index(t) for t, _ in pairs], np.int64)
  if ac[:, 1].max() >= len(pairs) or ac[:, 1].min() < 0:
    raise ValueError(f"argument hit of class {int(ac[:, 1].max())}: the classes name {len(pairs)} (pass the model's "
                     "span classes, in its order)")
  group = ac[:, 0] * len(type_names) + type_of_class[ac[:, 1]]
  uniq, inverse, counts = np.unique(group, return_inverse=True, return_counts=True)
  over = counts > bound
  keep = ~over[inverse.reshape(-1)]
  rows = np.unique(ac[keep, 0])
  keep_h, keep_t = np.isin(hc[:, 0], rows), np.isin(tc[:, 0], rows)
  return ((int(keep.sum()), ac[keep], as_[keep]), (int(keep_h.sum()), hc[keep_h], hs[keep_h]),
          (int(keep_t.sum()), tc[keep_t], ts[keep_t]), int(over.sum()), int(counts[over].sum()),
          np.unique(uniq[over] // len(type_names)).astype(np.int64))


def one_trigger_each(event: cliques.Event, trigger_role: str = TRIGGER) -> list[cliques.Event]:
  """A clique with k > 1 triggers -> k events, each one trigger and all the other arguments (the module's rule)."""
  triggers = [a for a in event.arguments if a.role == trigger_role]
  if len(triggers) <= 1:
    return [event]
  rest = tuple(a for a in event.arguments if a.role != trigger_role)
  return [event._replace(arguments=tuple(sorted((t, *rest)))) for t in triggers]


def merge_by_trigger(events: Sequence[tuple]) -> tuple[list[tuple], int]:
  """Window events (window, type, ((role, start, end, score), ...), score) -> those of one (window, type, trigger
  span) merged into one: the union of their arguments (an argument in several keeps its highest score), the score
  the lowest of theirs; events without a trigger are kept as they are. -> (events, how many were merged away)."""
  out, at = [], {}
  for w, etype, args, score in events:
    trig = [(s, e) for role, s, e, _ in args if role == TRIGGER]
    if len(trig) != 1:
      out.append((w, etype, args, score))
      continue
    key = (w, etype, trig[0])
    if key not in at:
      at[key] = len(out)
      out.append((w, etype, args, score))
      continue
    _, _, old, old_score = out[at[key]]
    best = {a[:3]: a[3] for a in old}
    for a in args:
      best[a[:3]] = max(best.get(a[:3], a[3]), a[3])
    out[at[key]] = (w, etype, tuple(sorted((*k, sc) for k, sc in best.items())), min(old_score, score))
  return out, len(events) - len(out)


def window_hits(outputs, window_index, *, types: Sequence[str] = (), options: Mapping | None = None) -> dict:
  """(argument hits, head hits, tail hits) as `ops.events.event_hits` gives them and the batch's window index ->
  {"events": [(window, type, ((role, start, end, score), ...), score)], "counts": {COUNTS}, "capped": the windows
  of groups over the bound (`assemble` names their records in a warning)}, tokens of the window. `types`: the span
  classes "type:role" (the model's argument classes, in order)."""
  pairs = tuple(split_class(t) for t in types)
  bound = int((options or {}).get("max_arguments_per_type", cliques.MAX_ARGUMENTS_PER_TYPE))
  window_B = np.asarray(window_index)
  argument, head, tail, over, over_args, rows = _bounded(*outputs[:3], pairs, bound)
  grouping = cliques.group_events(argument, head, tail, classes=pairs, require_trigger=False,
                                  max_arguments_per_type=bound)
  counts = {"over_bound": over + grouping.over_bound,
            "over_bound_arguments": over_args + grouping.over_bound_arguments, "multi_trigger": 0, "merged": 0}
  if counts["over_bound"]:  # `assemble` names the records in a warning
    log.info("%d (row, event type) groups hold more than %d decoded arguments (%d arguments in all): no events from "
             "them", counts["over_bound"], bound, counts["over_bound_arguments"])
  events = []
  for e in grouping.events:
    w = int(window_B[e.row]) if 0 <= e.row < window_B.shape[0] else -1
    if w < 0:
      continue  # a filler row
    split = one_trigger_each(e)
    counts["multi_trigger"] += len(split) > 1
    events.extend((w, x.type, tuple((a.role, a.start, a.end, a.score) for a in x.arguments), x.score) for x in split)
  if counts["multi_trigger"]:
    log.info("%d decoded cliques held several triggers: one event per trigger", counts["multi_trigger"])
  if (options or {}).get("event_grouping", "cliques") == "trigger":
    events, counts["merged"] = merge_by_trigger(events)
  return {"events": events, "counts": counts, "capped": capped_windows(window_B, rows)}


def concat_hits(hits: Sequence[dict]) -> dict:
  return {"events": [e for h in hits for e in h["events"]],
          "counts": {k: sum(h["counts"][k] for h in hits) for k in COUNTS},
          "capped": concat_capped(hits)}


# ----------------------------------------------------------------------------- records


def assemble(prepared, hits) -> list[dict]:
  """Per record {"events": [{"type", "trigger": {"start", "end", "score"} | None, "arguments": [{"start", "end",
  "role", "score"}], "score"}]} in char offsets, sorted; trigger-less events kept (the argument level scores
  them; `output_record` drops them). An event counts where its deciding window found it; equal events keep the
  highest score."""
  p = prepared
  warn_capped(p, hits.get("capped", ()), what="events",
              why="held more decoded arguments of one event type than grouping takes (cliques.MAX_ARGUMENTS_PER_TYPE)")
  out = [{"events": []} for _ in range(p.num_records)]
  evs = hits["events"]
  if not evs:
    return out
  w = np.asarray([e[0] for e in evs], np.int64)
  first = np.asarray([min(a[1] for a in e[2]) for e in evs], np.int64)
  last = np.asarray([max(a[2] for a in e[2]) for e in evs], np.int64)
  ok = (w >= 0) & (w < p.num_windows)
  wc = np.where(ok, w, 0)
  ok &= (first >= p.num_prefix) & (last < p.num_prefix + p.window_content_len[wc]) & (first <= last)
  if not ok.all():
    log.warning("assemble %s: dropped %d events with an argument outside window content", p.name, int((~ok).sum()))
  idx = np.nonzero(ok)[0]
  w = w[idx]
  rec = p.window_record[w].astype(np.int64)
  to_content = p.window_start[w].astype(np.int64) - p.num_prefix
  own = merge.deciding_windows(p, record_M=rec, start_M=first[idx] + to_content, end_M=last[idx] + to_content) == w
  best: dict = {}
  for k in np.nonzero(own)[0].tolist():
    _, etype, args, score = evs[idx[k]]
    base = int(p.token_ptr[rec[k]] + to_content[k])
    chars = tuple((role, int(p.offsets_T2[base + s, 0]), int(p.offsets_T2[base + e, 1]), float(sc))
                  for role, s, e, sc in args)
    triggers = [c for c in chars if c[0] == TRIGGER]
    trig = triggers[0][1:3] if triggers else None
    arguments = tuple(sorted(c for c in chars if c[0] != TRIGGER))
    key = (int(rec[k]), etype, trig, tuple(c[:3] for c in arguments))
    if key not in best or score > best[key][0]:
      best[key] = (float(score), triggers[0][3] if triggers else None, arguments)
  for (r, etype, trig, _), (score, trig_score, arguments) in sorted(best.items(), key=lambda kv: str(kv[0])):
    out[r]["events"].append({
        "type": etype,
        "trigger": None if trig is None else {"start": trig[0], "end": trig[1], "score": trig_score},
        "arguments": [{"start": a, "end": b, "role": role, "score": sc} for role, a, b, sc in arguments],
        "score": score})
  return out


def output_record(text: str, prediction: Mapping) -> dict:
  """The fields predict writes: {"events": [{"type", "trigger": {"start", "end", "text", "score"}, "arguments":
  [{"start", "end", "role", "text", "score"}], "score"}]}; events without a trigger are dropped (Su's
  `extract_events` at prediction)."""
  def span(x, **extra):
    return {"start": int(x["start"]), "end": int(x["end"]), **extra, "text": text[int(x["start"]):int(x["end"])],
            "score": round(float(x["score"]), 4)}

  return {"events": [{"type": e["type"], "trigger": span(e["trigger"]),
                      "arguments": [span(a, role=a["role"]) for a in e["arguments"]],
                      "score": round(float(e["score"]), 4)}
                     for e in prediction["events"] if e["trigger"] is not None]}


def output_records(texts: Sequence[str], predictions: Sequence[Mapping]) -> list[dict]:
  """`output_record` of each text and its prediction (what predict writes for a chunk of texts). Events without a
  trigger stay out of the output, as Su's `extract_events` leaves them out (docs/tasks.md; a written event always
  has its trigger, which the PHEE scorer and the event level read), and are counted in one warning per chunk;
  evaluation's argument level still scores them."""
  rows = [output_record(t, x) for t, x in zip(texts, predictions, strict=True)]
  total = sum(len(x["events"]) for x in predictions)
  dropped = total - sum(len(r["events"]) for r in rows)
  if dropped:
    log.warning("%d of %d predicted events have no trigger: not written (an event is written with its trigger, as "
                "Su's extract_events; %d of %d texts had such events)", dropped, total,
                sum(any(e["trigger"] is None for e in x["events"]) for x in predictions), len(rows))
  return rows


# ----------------------------------------------------------------------------- the metric


def phee_like(types: Sequence[str]) -> bool:
  """Whether the span classes are PHEE's (every role one the paper's scorer keys, a main role among them): then
  `score` adds the paper's EM / token F1."""
  roles = [split_class(t) for t in types]
  keyed = [answer_key(t, r) for t, r in roles if r != TRIGGER]
  return bool(keyed) and all(k is not None for k in keyed) and any(k[1] == "MainArg" for k in keyed)


def score(prepared, predictions, *, options: Mapping | None = None) -> dict:
  """`metrics.event_prf` (argument level: "f1" selects checkpoints; event level, TI / TC / AI / AC, per role, by
  events per sentence, per-record counts) of all predicted events against the split's gold events; for PHEE-like
  classes also "phee" (`phee_score`: EM / token F1 of Trigger, MainArgs, SubArgs) on the events predict writes
  (those with a trigger)."""
  p = prepared
  gold = [list(g) for g in p.table.gold]
  pred = [x["events"] for x in predictions]
  result = event_prf(p.texts, pred, gold)
  if phee_like(p.types):
    result["phee"] = phee_score(p.texts, [[e for e in evs if e["trigger"] is not None] for evs in pred], gold)
  return result


def final_fields(result: dict) -> dict:
  """What results.json keeps of a final split's result."""
  keys = ("per_type", "per_record", "macro_f1", "level", "event_level", "ti", "tc", "ai", "ac", "by_events", "phee")
  return dict({k: result[k] for k in RESULT_KEYS}, **{k: result[k] for k in keys if k in result})


def result_lines(result: dict) -> list[str]:
  """The event level, TI / TC / AI / AC, macro over roles and (PHEE) the paper's headline beside the argument F1."""
  ev = result["event_level"]
  lines = [f"event level F1 {ev['f1']:.4f} (P {ev['precision']:.4f} R {ev['recall']:.4f}); "
           + ", ".join(f"{k.upper()} {result[k]['f1']:.4f}" for k in ("ti", "tc", "ai", "ac"))
           + f"; argument level (selection) {result['f1']:.4f}, macro over roles {result['macro_f1']:.4f}"]
  if "phee" in result:
    head = result["phee"]["headline"]
    lines.append("PHEE (paper's rules): " + ", ".join(f"{g} EM F1 {v['em_f1']:.4f} token F1 {v['token_f1']:.4f}"
                                                      for g, v in head.items()))
  return lines


# ----------------------------------------------------------------------------- the exported program


run_exported = pointers_run_exported(POINTERS)


__all__ = ["POINTERS", "BUFFERS", "OUTPUTS", "OUTPUT_FIELDS", "COUNTS", "labels_to_json", "labels_from_json",
           "manifest_settings", "prepare", "one_trigger_each", "merge_by_trigger", "GROUPINGS", "window_hits",
           "concat_hits", "assemble", "output_record", "output_records", "phee_like", "score", "final_fields",
           "result_lines", "run_exported"]
