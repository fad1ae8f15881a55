"""The event task's host half and task object (gp_jax.tasks.events) against plain-Python references written from the
rules: gold cells of every window decode to the gold events a window holds; assembly over overlapping windows (the
window with most context on both sides decides, ties to the earlier; equal events keep the highest score); the
bound on arguments per type counted; one event per trigger; the metric on gold; the exported program's buffers
grown; labels through a workdir and a manifest."""

from __future__ import annotations

import math

import numpy as np
import pytest

from gp_jax.data import events as events_lib
from gp_jax.data.synthetic_events import event_records
from gp_jax.tasks import events as task_lib
from gp_jax.tasks.events import cliques, host
from tests.data.fakes import CharTok

CLASSES_KW = dict(dev=[], test=[])


def prepared_synthetic(n=40, *, max_len=24, seed=0):
  recs = event_records(n, seed=seed)
  types = events_lib.event_classes(train=recs, **CLASSES_KW)
  labels = events_lib.event_types(train=recs, **CLASSES_KW)
  p = host.prepare(recs, CharTok(), types, labels, max_len=max_len, name="t")
  return recs, p


def content_chars(p, w):
  """Char range [lo, hi) of window w's content tokens."""
  r = int(p.window_record[w])
  off = p.record_offsets(r)
  s, n = int(p.window_start[w]), int(p.window_content_len[w])
  return int(off[s, 0]), int(off[s + n - 1, 1])


def event_key(e):
  trig = None if e["trigger"] is None else (e["trigger"]["start"], e["trigger"]["end"])
  return (e["type"], trig, tuple(sorted((a["role"], a["start"], a["end"]) for a in e["arguments"])))


def gold_cell_hits(p):
  """Every window as one batch row: its gold argument cells and link cells, scores 1."""
  arg, head, tail = [], [], []
  for w in range(p.num_windows):
    arg += [(w, int(c), int(s), int(e)) for s, e, c in p.window_spans(w).tolist()]
    for ha, hb, ta, tb in p.table.links.window_links(w).tolist():
      head.append((w, 0, ha, hb))
      tail.append((w, 0, ta, tb))

  def buf(rows):
    rows = sorted(set(rows))
    return len(rows), np.asarray(rows, np.int32).reshape(-1, 4), np.ones(len(rows), np.float32)

  return buf(arg), buf(head), buf(tail)


def test_gold_cells_of_every_window_assemble_to_the_gold_events_that_a_window_holds():
  recs, p = prepared_synthetic()
  assert p.num_windows > p.num_records  # several windows per record: the merge is exercised
  hits = host.window_hits(gold_cell_hits(p), np.arange(p.num_windows), types=p.types)
  got = host.assemble(p, host.concat_hits([hits]))
  held, whole = 0, 0
  for r, rec in enumerate(recs):
    wins = [w for w in range(p.num_windows) if p.window_record[w] == r]
    want = set()
    for e in rec["events"]:
      spans = [a for a in e["arguments"]] + [e["trigger"]]
      lo, hi = min(s["start"] for s in spans), max(s["end"] for s in spans)
      if any(content_chars(p, w)[0] <= lo and hi <= content_chars(p, w)[1] for w in wins):
        want.add(event_key(e))
    held += len(want)
    found = {event_key(e) for e in got[r]["events"]}
    if len(wins) == 1:  # one window: exactly the gold events
      whole += 1
      assert found == want == {event_key(e) for e in rec["events"]}, (r, rec["text"])
    else:  # a window holding part of an event has its arguments unlinked (single-argument cliques) beside the rest
      assert want <= found and all(len(k[2]) + (k[1] is not None) == 1 for k in found - want), (r, rec["text"])
  assert held > 40 and 5 < whole < len(recs)
  # Scored against every gold event: events split by windows are the misses.
  result = host.score(p, got)
  assert result["event_level"]["tp"] == held and result["event_level"]["gold"] == sum(len(r["events"]) for r in recs)
  assert "phee" not in result


def reference_deciding(p, r, a, b):
  """Plain Python: among record r's windows holding content tokens [a, b], the one with most context (min of left
  and right, a document edge unlimited); ties to the earliest."""
  n_tok = int(p.token_ptr[r + 1] - p.token_ptr[r])
  best, best_ctx = None, None
  for w in range(p.num_windows):
    if p.window_record[w] != r:
      continue
    s, n = int(p.window_start[w]), int(p.window_content_len[w])
    if not (s <= a and b < s + n):
      continue
    left = math.inf if s == 0 else a - s
    right = math.inf if s + n == n_tok else s + n - 1 - b
    ctx = min(left, right)
    if best is None or ctx > best_ctx:
      best, best_ctx = w, ctx
  return best


def test_assemble_over_windows_against_a_plain_python_reference():
  """Random record-level events, each emitted (or not) by every window holding it with its own score, some twice."""
  rng = np.random.default_rng(3)
  recs, p = prepared_synthetic(30, max_len=16)
  roles = [events_lib.split_class(t) for t in p.types]
  emitted, want = [], {}
  for r in range(p.num_records):
    n_tok = int(p.token_ptr[r + 1] - p.token_ptr[r])
    off = p.record_offsets(r)
    for _ in range(6):
      etype = str(rng.choice(["Attack", "Meet"]))
      args = []
      for role in ("trigger", *rng.choice([x for t, x in roles if t == etype and x != "trigger"],
                                          size=int(rng.integers(1, 3)))):
        s = int(rng.integers(0, n_tok))
        e = min(n_tok - 1, s + int(rng.integers(0, 3)))
        args.append((str(role), s, e))
      if rng.random() < 0.2:
        args = [x for x in args if x[0] != "trigger"]  # trigger-less: kept by assemble (the argument level)
      args = sorted(set(args))
      a, b = min(x[1] for x in args), max(x[2] for x in args)
      if b - a >= 14:
        continue
      decider, by_window = reference_deciding(p, r, a, b), {}
      for w in range(p.num_windows):
        s, n = int(p.window_start[w]), int(p.window_content_len[w])
        if p.window_record[w] != r or not (s <= a and b < s + n) or rng.random() < 0.3:
          continue
        for _ in range(1 + (rng.random() < 0.2)):  # sometimes twice in one window: the higher score stays
          score = float(rng.random())
          tok = tuple((role, x - s + p.num_prefix, y - s + p.num_prefix, score) for role, x, y in args)
          emitted.append((w, etype, tok, score))
          by_window[w] = max(by_window.get(w, -1.0), score)
      if decider in by_window:
        trig = [(int(off[x, 0]), int(off[y, 1])) for role, x, y in args if role == "trigger"]
        key = (r, etype, trig[0] if trig else None,
               tuple(sorted((role, int(off[x, 0]), int(off[y, 1])) for role, x, y in args if role != "trigger")))
        want[key] = max(want.get(key, -1.0), by_window[decider])
  perm = rng.permutation(len(emitted))
  got = host.assemble(p, {"events": [emitted[i] for i in perm], "counts": {}})
  flat = {}
  for r, x in enumerate(got):
    for e in x["events"]:
      trig = None if e["trigger"] is None else (e["trigger"]["start"], e["trigger"]["end"])
      key = (r, e["type"], trig, tuple(sorted((a["role"], a["start"], a["end"]) for a in e["arguments"])))
      assert key not in flat
      flat[key] = e["score"]
  assert len(want) > 50 and flat == pytest.approx(want)


def test_groups_over_the_bound_give_no_events_and_are_counted(caplog):
  types = ("A:trigger", "A:x", "B:trigger", "B:x")
  # Row 0: type A has 5 arguments (over a bound of 4), type B two, linked; row 1: type A two, linked.
  arg = [(0, 1, i, i) for i in range(1, 5)] + [(0, 0, 6, 6), (0, 2, 8, 8), (0, 3, 9, 9), (1, 0, 1, 1), (1, 1, 2, 2)]
  links = [(0, 0, 8, 9), (1, 0, 1, 2)]
  buf = lambda rows: (len(rows), np.asarray(rows, np.int32), np.ones(len(rows), np.float32))  # noqa: E731
  with caplog.at_level("INFO"):
    hits = host.window_hits((buf(arg), buf(links), buf(links)), np.array([5, 7]), types=types,
                            options={"max_arguments_per_type": 4})
  assert hits["counts"]["over_bound"] == 1 and hits["counts"]["over_bound_arguments"] == 5
  assert "more than 4 decoded arguments" in caplog.text
  assert hits["capped"].tolist() == [5]  # row 0's window: `assemble` names its record in a warning
  assert sorted((w, t, tuple(a[:3] for a in args)) for w, t, args, _ in hits["events"]) == [
      (5, "B", (("trigger", 8, 8), ("x", 9, 9))), (7, "A", (("trigger", 1, 1), ("x", 2, 2)))]


def _merged_reference(events):
  """One event per (window, type, trigger) as a plain reading of the rule: the union of the arguments of every event
  of that key (each argument its highest score), the key's lowest event score; trigger-less events untouched."""
  keys, plain = [], []
  for w, t, args, score in events:
    trig = [a[1:3] for a in args if a[0] == "trigger"]
    if len(trig) == 1:
      if (w, t, trig[0]) not in keys:
        keys.append((w, t, trig[0]))
    else:
      plain.append((w, t, args, score))
  out = []
  for key in keys:
    same = [e for e in events if (e[0], e[1]) == key[:2] and [a[1:3] for a in e[2] if a[0] == "trigger"] == [key[2]]]
    spans = sorted({a[:3] for e in same for a in e[2]})
    args = tuple((*x, max(a[3] for e in same for a in e[2] if a[:3] == x)) for x in spans)
    out.append((key[0], key[1], args, min(e[3] for e in same)))
  return sorted(out + plain)


def test_merge_by_trigger_against_a_plain_reading_of_the_rule():
  rng = np.random.default_rng(3)
  roles = ("trigger", "Treatment", "Treatment.Drug", "Effect")
  for _ in range(200):
    events = []
    for _ in range(rng.integers(0, 7)):
      picked = {(roles[rng.integers(1, 4)], int(s), int(s) + int(rng.integers(0, 2)))
                for s in rng.integers(0, 6, rng.integers(1, 4))}
      if rng.random() < 0.85:
        picked.add(("trigger", int(rng.integers(0, 2)), int(rng.integers(2, 3))))
      args = tuple(sorted((*a, round(float(rng.random()), 3)) for a in picked))
      events.append((int(rng.integers(0, 2)), "AB"[rng.integers(0, 2)], args, round(float(rng.random()), 3)))
    got, merged = host.merge_by_trigger(events)
    assert sorted(got) == _merged_reference(events)
    assert merged == len(events) - len(got)


def test_trigger_grouping_merges_the_cliques_that_share_a_trigger():
  types = ("A:trigger", "A:main", "A:sub")
  # One trigger (1, 1); a main (4, 5) and a sub on the same span, each linked to the trigger, not to each other.
  arg = [(0, 0, 1, 1), (0, 1, 4, 5), (0, 2, 4, 5)]
  head, tail = [(0, 0, 1, 4)], [(0, 0, 1, 5)]
  buf = lambda rows: (len(rows), np.asarray(rows, np.int32), np.ones(len(rows), np.float32))  # noqa: E731
  spans = lambda hits: sorted(tuple(a[:3] for a in e[2]) for e in hits["events"])  # noqa: E731
  su = host.window_hits((buf(arg), buf(head), buf(tail)), np.array([0]), types=types)
  assert spans(su) == [(("main", 4, 5), ("trigger", 1, 1)), (("sub", 4, 5), ("trigger", 1, 1))]
  one = host.window_hits((buf(arg), buf(head), buf(tail)), np.array([0]), types=types,
                         options={"event_grouping": "trigger"})
  assert spans(one) == [(("main", 4, 5), ("sub", 4, 5), ("trigger", 1, 1))] and one["counts"]["merged"] == 1


def test_a_clique_with_two_triggers_gives_one_event_per_trigger():
  A = cliques.Argument
  e = cliques.Event(0, "A", (A("trigger", 1, 1, 0.9), A("trigger", 3, 3, 0.8), A("x", 5, 6, 0.7)), 0.5)
  got = host.one_trigger_each(e)
  assert [[a[:3] for a in x.arguments] for x in got] == [[("trigger", 1, 1), ("x", 5, 6)],
                                                         [("trigger", 3, 3), ("x", 5, 6)]]
  assert host.one_trigger_each(e._replace(arguments=e.arguments[1:])) == [e._replace(arguments=e.arguments[1:])]


def test_output_record_drops_triggerless_events_and_writes_texts():
  text = "Abc_hit_Def"
  pred = {"events": [
      {"type": "Attack", "trigger": {"start": 4, "end": 7, "score": 0.9},
       "arguments": [{"start": 0, "end": 3, "role": "agent", "score": 0.8}], "score": 0.7},
      {"type": "Attack", "trigger": None, "arguments": [{"start": 8, "end": 11, "role": "patient", "score": 0.8}],
       "score": 0.6}]}
  assert host.output_record(text, pred) == {"events": [{
      "type": "Attack", "trigger": {"start": 4, "end": 7, "text": "hit", "score": 0.9},
      "arguments": [{"start": 0, "end": 3, "role": "agent", "text": "Abc", "score": 0.8}], "score": 0.7}]}


def test_phee_like_classes_add_the_papers_figures():
  assert host.phee_like(("Adverse_event:trigger", "Adverse_event:Subject", "Adverse_event:Subject.Age"))
  assert not host.phee_like(("Attack:trigger", "Attack:agent"))
  text = "aspirin caused rash"
  gold = [[{"type": "Adverse_event", "trigger": {"start": 8, "end": 14},
            "arguments": [{"start": 0, "end": 7, "role": "Treatment.Drug"}, {"start": 15, "end": 19,
                                                                              "role": "Effect"}]}]]

  class P:  # the fields score reads
    texts = (text,)
    types = ("Adverse_event:trigger", "Adverse_event:Effect", "Adverse_event:Treatment.Drug")
    table = type("T", (), {"gold": (tuple(gold[0]),)})

  pred = [{"events": [dict(gold[0][0], score=1.0)]}]
  result = host.score(P, pred)
  assert result["f1"] == result["event_level"]["f1"] == 1.0
  assert {g: v["em_f1"] for g, v in result["phee"]["headline"].items()} == {"Trigger": 1.0, "MainArgs": 1.0,
                                                                           "SubArgs": 1.0}
  assert "PHEE" in host.result_lines(result)[1]
  fields = host.final_fields(result)
  assert fields["phee"] is result["phee"] and fields["per_record"] == result["per_record"]


def test_run_exported_grows_each_buffer():
  counts = (5, 9, 3)
  calls = []

  def run(arrays, sizes):
    calls.append(sizes)
    out = {}
    for k, c, s in zip(host.POINTERS, counts, sizes):
      out[f"{k}_count"] = np.int32(c)
      out[f"{k}_coords"] = np.arange(4 * s, dtype=np.int32).reshape(s, 4)
      out[f"{k}_scores"] = np.ones(s, np.float32)
    return out

  hits, sizes = host.run_exported(run, {}, sizes=(4, 4, 4), threshold=0.0)
  assert sizes == (8, 16, 4) and calls == [(4, 4, 4), (8, 16, 4)]
  assert [h[0] for h in hits] == list(counts) and [len(h[1]) for h in hits] == list(counts)


def test_task_labels_options_and_shapes(tmp_path):
  import ml_collections

  task = task_lib.TASK()
  recs = event_records(8, seed=1)
  labels = task.labels(train=recs, dev=[], test=[])
  assert labels == ("Attack", "Meet")
  task.save_labels(str(tmp_path), labels)
  assert task.load_labels(str(tmp_path)) == labels
  assert host.labels_from_json(host.labels_to_json(labels)) == labels
  assert host.manifest_settings({"labels": list(labels), "task_options": {"pointer_rope": True}}, ()) == (
      labels, {"pointer_rope": True})
  with pytest.raises(Exception, match="holds no events"):
    task.labels(train=[{"text": "x", "entities": []}], dev=[], test=[])
  c = ml_collections.ConfigDict({"model": {"head": "efficient", "pointer_rope": True}, "loss": {"kind": "zlpr"}})
  assert task_lib.TASK.options(c, {}) == {"pointer_rope": True, "event_grouping": "cliques"}
  c.model.event_grouping = "per_trigger"
  with pytest.raises(Exception, match="event_grouping must be one of"):
    task_lib.TASK.options(c, {})
  del c.model["event_grouping"]
  assert "sparse_zlpr" in task_lib.TASK.config_refusal(c)
  c.loss.kind, c.model.head = "sparse_zlpr", "crf"
  assert "tagger" in task_lib.TASK.config_refusal(c)
  assert task.target_shapes(labels, num_types=7, batch=2, length=9) == {
      "argument_ids": (2, 7, 9), "head_ids": (2, 1, 4 * 9), "tail_ids": (2, 1, 4 * 9)}  # link ids: LINK_SLOTS * L
  assert "stablehlo" in task.export_refusal("onnx") and task.export_refusal("stablehlo") is None
