"""The PHEE builder: a hand-written sample in PHEE's format (nested arguments, a discontinuous mention, Combination
drugs, attributes left out and counted), both decoders, bad input at file:line, and the real corpus's counts."""

from __future__ import annotations

import collections
import json

import pytest

from gp_jax.data import DataError, corpora, load_split
from gp_jax.data.builders import phee


def arg(*mentions, **subs):
  """An ARG: mentions as lists of (piece, start)."""
  out = {"text": [[p for p, _ in m] for m in mentions], "start": [[s for _, s in m] for m in mentions],
         "entity_id": [f"T{i}" for i in range(len(mentions))]}
  out.update(subs)
  return out


S1 = "A 50-year-old woman developed severe rash and liver injury after oral cisplatin and etoposide."
#     0         1         2         3         4         5         6         7         8         9
#     0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123


def at(s, piece, nth=0):
  i = -1
  for _ in range(nth + 1):
    i = s.index(piece, i + 1)
  return i


def p(s, piece):
  return (piece, at(s, piece))


E1 = {
    "event_id": "E1", "event_type": "Adverse_event",
    "Trigger": arg([p(S1, "developed")]),
    "Subject": arg([p(S1, "50-year-old woman")], Age=arg([p(S1, "50-year-old")]), Gender=arg([p(S1, "woman")])),
    "Treatment": arg([p(S1, "oral cisplatin and etoposide")], Route=arg([p(S1, "oral")]),
                     Drug=arg([p(S1, "cisplatin")], [p(S1, "etoposide")]),
                     Combination=[{"event_id": "E2", "event_type": "Combination", "Trigger": arg([p(S1, "and")]),
                                   "Drug": arg([p(S1, "cisplatin")], [p(S1, "etoposide")])},
                                  {"event_id": "E3", "event_type": "Combination", "Trigger": arg([p(S1, "and")]),
                                   "Drug": arg([p(S1, "etoposide")])}]),  # etoposide again: one argument
    # "severe rash and liver injury": two mentions, the first discontinuous ("severe rash", "injury").
    "Effect": arg([p(S1, "severe rash"), p(S1, "injury")], [p(S1, "liver injury")]),
    "Severity": {"text": [["severe"]], "start": [[at(S1, "severe")]], "entity_id": ["T9"], "value": "High"},
}
S2 = "Methotrexate was effective for psoriasis but caused nausea."
E2a = {"event_id": "E1", "event_type": "Potential_therapeutic_event", "Trigger": arg([p(S2, "effective")]),
       "Treatment": arg([p(S2, "Methotrexate")], Drug=arg([p(S2, "Methotrexate")]),
                        Disorder=arg([p(S2, "psoriasis")])),
       "Speculated": {"text": [["effective"]], "start": [[at(S2, "effective")]], "entity_id": ["T5"], "value": False}}
E2b = {"event_id": "E2", "event_type": "Adverse_event", "Trigger": arg([p(S2, "caused")]),
       "Treatment": arg([p(S2, "Methotrexate")], Drug=arg([p(S2, "Methotrexate")])),
       "Effect": arg([p(S2, "nausea")])}


def line(rid, text, *events):
  return json.dumps({"id": rid, "context": text, "is_mult_event": len(events) > 1,
                     "annotations": [{"events": list(events)}]})


def span(s, piece, role, nth=0):
  a = at(s, piece, nth)
  return {"start": a, "end": a + len(piece), "role": role}


WANT_1 = {"id": "1_1", "text": S1, "entities": [], "events": [{
    "type": "Adverse_event", "trigger": {"start": at(S1, "developed"), "end": at(S1, "developed") + 9},
    "arguments": [
        span(S1, "50-year-old woman", "Subject"), span(S1, "50-year-old", "Subject.Age"),
        span(S1, "woman", "Subject.Gender"),
        span(S1, "oral cisplatin and etoposide", "Treatment"), span(S1, "oral", "Treatment.Route"),
        span(S1, "cisplatin", "Treatment.Drug"), span(S1, "etoposide", "Treatment.Drug"),
        span(S1, "cisplatin", "Combination.Drug"), span(S1, "etoposide", "Combination.Drug"),
        span(S1, "severe rash", "Effect"), span(S1, "injury", "Effect"), span(S1, "liver injury", "Effect"),
    ]}]}
WANT_2 = {"id": "2_1", "text": S2, "entities": [], "events": [
    {"type": "Potential_therapeutic_event", "trigger": {"start": at(S2, "effective"), "end": at(S2, "effective") + 9},
     "arguments": [span(S2, "Methotrexate", "Treatment"), span(S2, "Methotrexate", "Treatment.Drug"),
                   span(S2, "psoriasis", "Treatment.Disorder")]},
    {"type": "Adverse_event", "trigger": {"start": at(S2, "caused"), "end": at(S2, "caused") + 6},
     "arguments": [span(S2, "Methotrexate", "Treatment"), span(S2, "Methotrexate", "Treatment.Drug"),
                   span(S2, "nausea", "Effect")]}]}


def manual(root):
  root.mkdir(parents=True, exist_ok=True)
  (root / "train.json").write_text(line("1_1", S1, E1) + "\n" + line("2_1", S2, E2a, E2b) + "\n", encoding="utf-8")
  (root / "dev.json").write_text(line("2_1", S2, E2b) + "\n", encoding="utf-8")
  (root / "test.json").write_text(line("1_1", S1, E1) + "\n", encoding="utf-8")
  return root


def test_phee_builder_sample(tmp_path):
  root = manual(tmp_path / "phee")
  train = load_split("phee", "train", manual_dir=root, data_dir=tmp_path / "tfds")
  assert list(train) == [WANT_1, WANT_2]
  assert list(load_split("phee", "val", manual_dir=root, data_dir=tmp_path / "tfds")) == [
      dict(WANT_2, events=WANT_2["events"][1:])]
  # Both decoders give the same records (the fast one reads the stored proto).
  assert train._raw is not None
  assert [corpora.to_record(x) for x in train._source] == [WANT_1, WANT_2]
  notes = train.metadata["reports"]["train"]["event_notes"]
  assert notes == {"attribute:Severity": 1, "attribute:Speculated": 1, "combination_trigger": 2,
                   "repeated_argument": 1, "discontinuous_mentions": 1, "pieces_of_discontinuous_mentions": 2}
  assert train.metadata["reports"]["train"]["events"] == 3
  ae = ["trigger", "Subject", "Subject.Age", "Subject.Gender", "Treatment", "Treatment.Route", "Treatment.Drug",
        "Combination.Drug", "Effect"]
  pte = ["trigger", "Treatment", "Treatment.Drug", "Treatment.Disorder"]
  assert train.metadata["event_classes"] == sorted([f"Adverse_event:{r}" for r in ae] +
                                                   [f"Potential_therapeutic_event:{r}" for r in pte])
  assert corpora.corpus_types("phee") == ()


def test_phee_bad_input_names_file_and_line(tmp_path):
  bad = json.loads(line("2_1", S2, E2b))
  bad["annotations"][0]["events"][0]["Effect"]["start"] = [[at(S2, "nausea") + 1]]
  path = tmp_path / "train.json"
  path.write_text(line("1_1", S1, E1) + "\n\n" + json.dumps(bad) + "\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"train.json:3: event #0 Effect: piece 'nausea' at \d+ but the context there "
                     r"is 'ausea.'") as e:
    phee.read_phee(path)
  assert e.value.reason == "offset_mismatch"
  records = phee.read_phee(path, strict=False)
  assert list(records) == [WANT_1] and records.report.skipped == {"offset_mismatch": 1}
  bad["annotations"][0]["events"][0]["Outcome"] = bad["annotations"][0]["events"][0].pop("Effect")
  path.write_text(json.dumps(bad) + "\n", encoding="utf-8")
  with pytest.raises(DataError, match=r"train.json:1: event #0: unknown key 'Outcome'"):
    phee.read_phee(path)


@pytest.mark.e2e
def test_real_phee_counts(shared_data, tmp_path):
  if not (shared_data / "phee" / "train.json").is_file():
    pytest.skip("phee not in shared/data")
  want = {"train": (2898, 3006, 102), "dev": (961, 1003, 41), "test": (968, 1010, 40)}
  for split, (sentences, events, multi) in want.items():
    records = load_split("phee", split, manual_dir=shared_data / "phee", data_dir=tmp_path)
    got = list(records)
    assert (len(got), sum(len(r["events"]) for r in got), sum(len(r["events"]) > 1 for r in got)) == want[split]
    report = records.metadata["reports"][split]
    assert report["skipped"] == {} and "offset_mismatch" not in report["event_notes"]
    if split == "train":  # SOURCE.md's argument counts: events holding each role (every Trigger kept)
      holding = collections.Counter(role for r in got for e in r["events"]
                                    for role in {a["role"] for a in e["arguments"]})
      assert sum(e["trigger"] is not None for r in got for e in r["events"]) == 3006
      assert {k: holding[k] for k in ("Treatment", "Treatment.Drug", "Effect", "Subject", "Subject.Age")} == {
          "Treatment": 3005, "Treatment.Drug": 2973, "Effect": 2781, "Subject": 1444, "Subject.Age": 399}
      assert {k: report["event_notes"][f"attribute:{k}"] for k in ("Speculated", "Severity", "Negated")} == {
          "Speculated": 367, "Severity": 258, "Negated": 40}
  assert len(records.metadata["event_classes"]) == 34
