"""JSON lines and CoNLL readers: formats, errors naming file:line, lenient skip counts."""

import io
import json
import os
import tempfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gp_jax.data import DataError, read_conll, read_jsonl
from gp_jax.data import tags as T


def write(tmp_path, name, text, newline="\n"):
  path = tmp_path / name
  path.write_bytes(text.replace("\n", newline).encode("utf-8"))
  return path


def ents(*triples):
  return [{"start": s, "end": e, "type": t} for s, e, t in triples]


# --- JSON lines ---------------------------------------------------------------------------


def test_jsonl_record_format(tmp_path):
  path = write(tmp_path, "a.jsonl", "\n".join([
      json.dumps({"id": "x", "text": "Hello Paris", "entities": ents((6, 11, "LOC"))}),
      "",  # blank lines are not records
      json.dumps({"text": "no id", "entities": [{"start": 0, "end": 2, "type": "A", "text": "no"}]}),
  ]) + "\n")
  records = read_jsonl(path)
  assert records == [
      {"id": "x", "text": "Hello Paris", "entities": ents((6, 11, "LOC"))},
      {"id": "a-1", "text": "no id", "entities": ents((0, 2, "A"))},
  ]
  assert records.report.records == 2 and records.report.entities == 2 and records.report.num_skipped == 0


def test_jsonl_cluener_format_inclusive_ends(tmp_path):
  line = {"text": "浙商银行叶老桂说叶老桂", "label": {"name": {"叶老桂": [[4, 6], [8, 10]]}, "company": {"浙商银行": [[0, 3]]}}}
  records = read_jsonl(write(tmp_path, "train.json", json.dumps(line, ensure_ascii=False) + "\n"), id_prefix="c")
  assert records == [{"id": "c-0", "text": line["text"],
                      "entities": ents((0, 4, "company"), (4, 7, "name"), (8, 11, "name"))}]


def test_jsonl_unlabelled(tmp_path):
  path = write(tmp_path, "test.json", '{"id": 7, "text": "四川"}\n')
  assert read_jsonl(path, allow_unlabelled=True) == [{"id": "7", "text": "四川", "entities": []}]
  with pytest.raises(DataError, match=r"test.json:1: missing key \"entities\""):
    read_jsonl(path)


def test_jsonl_accepts_open_file():
  f = io.StringIO('{"text": "ab", "entities": []}\n')
  assert read_jsonl(f, name="mem.jsonl")[0] == {"id": "mem-0", "text": "ab", "entities": []}


BAD_JSONL = [
    ('{"text": "ab", "entities": []', "bad_json", "malformed JSON"),
    ('["text"]', "bad_json", "expected an object"),
    ('{"entities": []}', "missing_key", 'missing key "text"'),
    ('{"text": "ab"}', "missing_key", 'missing key "entities"'),
    ('{"text": 5, "entities": []}', "bad_value", "expected a string"),
    ('{"text": "ab", "entities": {}}', "bad_value", "expected a list"),
    ('{"text": "ab", "entities": [{"start": 0, "type": "A"}]}', "missing_key", "expected keys start, end, type"),
    ('{"text": "ab", "entities": [{"start": 0, "end": "2", "type": "A"}]}', "bad_value", "expected an integer"),
    ('{"text": "ab", "entities": [{"start": 0, "end": 2, "type": ""}]}', "bad_value", "non-empty string"),
    ('{"text": "ab", "entities": [{"start": 1, "end": 1, "type": "A"}]}', "empty_span", "expected start < end"),
    ('{"text": "ab", "entities": [{"start": 2, "end": 1, "type": "A"}]}', "empty_span", "expected start < end"),
    ('{"text": "ab", "entities": [{"start": 0, "end": 3, "type": "A"}]}', "span_out_of_range", "outside the text"),
    ('{"text": "ab", "entities": [{"start": -1, "end": 1, "type": "A"}]}', "span_out_of_range", "outside the text"),
    ('{"text": "ab", "entities": [{"start": 0, "end": 1, "type": "A", "text": "b"}]}', "entity_text_mismatch",
     "'b' != text"),
    ('{"text": "abc", "label": {"A": {"bc": [[0, 1]]}}}', "entity_text_mismatch", "but the text there is 'ab'"),
    ('{"text": "abc", "label": {"A": {"c": [[2, 3]]}}}', "span_out_of_range", "outside the text"),
    ('{"text": "abc", "label": {"A": {"c": [[2, 1]]}}}', "empty_span", "expected start < end"),
    ('{"text": "abc", "label": {"A": {"c": [2, 2]}}}', "bad_value", "expected [start, end]"),
    ('{"text": "abc", "label": {"A": ["c"]}}', "bad_value", "expected {text: [[s, e]]}"),
    ('{"text": "abc", "label": []}', "bad_value", '"label" is list'),
]
GOOD_LINE = '{"text": "ab", "entities": [{"start": 0, "end": 2, "type": "A"}]}'


@pytest.mark.parametrize("bad, reason, message", BAD_JSONL)
def test_jsonl_bad_input_strict(tmp_path, bad, reason, message):
  path = write(tmp_path, "bad.jsonl", f"{GOOD_LINE}\n\n{bad}\n{GOOD_LINE}\n")
  with pytest.raises(DataError) as e:
    read_jsonl(path)
  assert isinstance(e.value, ValueError)
  assert str(e.value).startswith(f"{path}:3: ")
  assert message in str(e.value)
  assert (e.value.path, e.value.line, e.value.reason) == (str(path), 3, reason)


@pytest.mark.parametrize("bad, reason, message", BAD_JSONL)
def test_jsonl_bad_input_lenient(tmp_path, bad, reason, message, caplog):
  path = write(tmp_path, "bad.jsonl", f"{GOOD_LINE}\n{bad}\n{GOOD_LINE}\n")
  with caplog.at_level("WARNING"):
    records = read_jsonl(path, strict=False)
  assert [r["id"] for r in records] == ["bad-0", "bad-2"]  # ids keep the line's record number
  assert records.report.skipped == {reason: 1}
  assert message in records.report.errors[0]
  assert "skipped 1" in caplog.text and f"{path}:2" in caplog.text


def test_jsonl_not_utf8(tmp_path):
  path = tmp_path / "latin.jsonl"
  path.write_bytes(b'{"text": "ab", "entities": []}\n{"text": "\xe9", "entities": []}\n')
  with pytest.raises(DataError, match="latin.jsonl:2: not valid UTF-8"):
    read_jsonl(path)


# --- JSON lines with events ------------------------------------------------------------------------------------

EVENT_TEXT = "insulin-induced lipoatrophy and rash"


def event(kind, trigger, *args):
  return {"type": kind, "trigger": None if trigger is None else {"start": trigger[0], "end": trigger[1]},
          "arguments": [{"start": s, "end": e, "role": r} for s, e, r in args]}


def test_jsonl_events_nested_shared_and_merged(tmp_path):
  drug = (0, 7, "Treatment.Drug")
  e1 = event("Adverse_event", (8, 15), (0, 7, "Treatment"), drug, (16, 27, "Effect"))
  e2 = event("Adverse_event", (8, 15), (0, 7, "Treatment"), drug, drug, (32, 36, "Effect"))  # drug repeated
  e3 = event("Other", None, (0, 15, "Cause"))  # no trigger; nests over e1's arguments
  lines = [json.dumps({"id": "s1", "text": EVENT_TEXT, "events": [e1, e2, e3, e1]}),  # e1 twice
           json.dumps({"text": "ab", "entities": ents((0, 2, "X")), "events": []}),
           json.dumps({"text": "ab", "entities": ents((0, 1, "X"))})]
  records = read_jsonl(write(tmp_path, "ev.jsonl", "\n".join(lines) + "\n"))
  want_e2 = event("Adverse_event", (8, 15), (0, 7, "Treatment"), drug, (32, 36, "Effect"))
  assert records[0] == {"id": "s1", "text": EVENT_TEXT, "entities": [], "events": [e1, want_e2, e3]}
  assert records[1] == {"id": "ev-1", "text": "ab", "entities": ents((0, 2, "X")), "events": []}
  assert "events" not in records[2]  # an entity record stays one
  report = records.report
  assert (report.events, report.arguments) == (3, 3 + 3 + 1)
  assert report.event_notes == {"repeated_argument": 1, "repeated_event": 1}
  assert report.as_dict()["event_notes"] == {"repeated_argument": 1, "repeated_event": 1}
  assert "3 events (7 arguments)" in report.summary()


def test_jsonl_entity_reads_keep_their_report_keys(tmp_path):
  records = read_jsonl(write(tmp_path, "a.jsonl", GOOD_LINE + "\n"))
  assert "events" not in records.report.as_dict() and "events" not in records.report.summary()


def ev_line(*events, text="ab cd"):
  return json.dumps({"text": text, "events": list(events)})


ARG = {"start": 3, "end": 5, "role": "R"}
BAD_EVENTS = [
    (json.dumps({"text": "ab", "events": {}}), "bad_value", '"events" is dict: expected a list'),
    (ev_line(["E"]), "bad_value", "event #0 is list: expected an object"),
    (ev_line({"trigger": None, "arguments": []}), "missing_key", "event #0 lacks ['type']"),
    (ev_line({"type": "E", "trigger": None}), "missing_key", "lacks ['arguments']"),
    (ev_line({"type": "", "arguments": [ARG]}), "bad_value", "expected a non-empty string without ':'"),
    (ev_line({"type": "A:B", "arguments": [ARG]}), "bad_value", "without ':'"),
    (ev_line({"type": "E", "trigger": [0, 2], "arguments": []}), "bad_value", 'trigger is [0, 2]: expected {"start"'),
    (ev_line({"type": "E", "trigger": {"start": 0}, "arguments": []}), "missing_key", "trigger lacks ['end']"),
    (ev_line({"type": "E", "trigger": {"start": 0, "end": 9}, "arguments": []}), "span_out_of_range",
     "E) trigger [0, 9) is outside the text (length 5)"),
    (ev_line({"type": "E", "trigger": {"start": 2, "end": 2}, "arguments": []}), "empty_span",
     "expected start < end"),
    (ev_line({"type": "E", "trigger": {"start": 0, "end": "2"}, "arguments": []}), "bad_value",
     "expected an integer"),
    (ev_line({"type": "E", "trigger": {"start": 0, "end": 2, "text": "cd"}, "arguments": []}),
     "event_text_mismatch", "text 'cd' != text[0:2] 'ab'"),
    (ev_line({"type": "E", "arguments": {}}), "bad_value", '"arguments" is dict: expected a list'),
    (ev_line({"type": "E", "arguments": ["x"]}), "bad_value", "argument #0 is str: expected an object"),
    (ev_line({"type": "E", "arguments": [{"start": 3, "end": 5}]}), "missing_key", "argument #0 lacks ['role']"),
    (ev_line({"type": "E", "arguments": [{"start": 3, "end": 5, "role": ""}]}), "bad_value", "role ''"),
    (ev_line({"type": "E", "arguments": [{"start": 3, "end": 5, "role": "trigger"}]}), "bad_value",
     "other than 'trigger'"),
    (ev_line({"type": "E", "arguments": [{"start": -1, "end": 5, "role": "R"}]}), "span_out_of_range",
     "argument #0 (R) [-1, 5) is outside the text"),
    (ev_line({"type": "E", "arguments": [{"start": 4, "end": 3, "role": "R"}]}), "empty_span", "start < end"),
    (ev_line({"type": "E", "trigger": None, "arguments": []}), "empty_event", "neither a trigger nor arguments"),
]


@pytest.mark.parametrize("bad, reason, message", BAD_EVENTS)
def test_jsonl_bad_events_strict(tmp_path, bad, reason, message):
  path = write(tmp_path, "bad.jsonl", f"{GOOD_LINE}\n\n{bad}\n{GOOD_LINE}\n")
  with pytest.raises(DataError) as e:
    read_jsonl(path)
  assert str(e.value).startswith(f"{path}:3: ")
  assert message in str(e.value)
  assert (e.value.line, e.value.reason) == (3, reason)


def test_jsonl_bad_events_lenient_counts(tmp_path):
  good = ev_line(event("E", (0, 2), (3, 5, "R")), event("E", (0, 2), (3, 5, "R")))
  bad = [line for line, _, _ in BAD_EVENTS]
  path = write(tmp_path, "bad.jsonl", "\n".join([good, *bad, good]) + "\n")
  records = read_jsonl(path, strict=False)
  assert [r["id"] for r in records] == ["bad-0", f"bad-{len(bad) + 1}"]
  want = {}
  for _, reason, _ in BAD_EVENTS:
    want[reason] = want.get(reason, 0) + 1
  assert records.report.skipped == want
  assert records.report.events == 2 and records.report.event_notes == {"repeated_event": 2}  # kept records only
  assert records.report.errors[0].startswith(f"{path}:2: ")


# --- CoNLL --------------------------------------------------------------------------------

CONLL = """-DOCSTART- -X- -X- O

EU NNP B-NP B-ORG
rejects VBZ B-VP O
German JJ B-NP B-MISC
call NN I-NP O
. . O O

Peter NNP B-NP B-PER
Blackburn NNP I-NP I-PER

-DOCSTART- -X- -X- O
Lee NNP B-NP B-PER
"""


def test_conll_basic(tmp_path):
  records = read_conll(write(tmp_path, "eng.txt", CONLL), id_prefix="en")
  assert records == [
      {"id": "en-0", "text": "EU rejects German call .", "entities": ents((0, 2, "ORG"), (11, 17, "MISC"))},
      {"id": "en-1", "text": "Peter Blackburn", "entities": ents((0, 15, "PER"))},
      {"id": "en-2", "text": "Lee", "entities": ents((0, 3, "PER"))},
  ]
  assert records.report.scheme == "BIO" and records.report.records == 3 and records.report.entities == 4


def test_conll_crlf_and_tabs(tmp_path):
  path = write(tmp_path, "crlf.txt", "a\tB-X\nb\tI-X\n\nc\tO\n", newline="\r\n")
  assert read_conll(path, sep="\t") == [
      {"id": "crlf-0", "text": "a b", "entities": ents((0, 3, "X"))},
      {"id": "crlf-1", "text": "c", "entities": []},
  ]


def test_conll_chinese_bmes_detected(tmp_path):
  text = "我 O\n在 O\n北 B-LOC\n京 E-LOC\n见 O\n张 B-PER\n小 M-PER\n明 E-PER\n\n沪 S-LOC\n"
  records = read_conll(write(tmp_path, "msra.txt", text), joiner="")
  assert records.report.scheme == "BMES"
  assert records[0] == {"id": "msra-0", "text": "我在北京见张小明", "entities": ents((2, 4, "LOC"), (5, 8, "PER"))}
  assert records[1]["entities"] == ents((0, 1, "LOC"))


def test_conll_nested_two_levels(tmp_path):
  text = ("Die\tO\tO\nBundesrepublik\tB-LOC\tO\nDeutschland\tI-LOC\tB-LOC\n.\tO\tO\n\n"
          "Berliner\tB-LOCderiv\tO\n")
  records = read_conll(write(tmp_path, "germ.iob2", text), tag_cols=(1, 2), sep="\t")
  assert records[0] == {"id": "germ-0", "text": "Die Bundesrepublik Deutschland .",
                        "entities": ents((4, 30, "LOC"), (19, 30, "LOC"))}
  assert records[1]["entities"] == ents((0, 8, "LOCderiv"))


def test_conll_token_col_and_explicit_scheme(tmp_path):
  text = "1 x I-A\n2 y I-A\n3 z B-A\n"  # IOB1: B- splits two adjacent A entities
  records = read_conll(write(tmp_path, "iob1.txt", text), token_col=1, tag_cols=[2], scheme="IOB1")
  assert records[0] == {"id": "iob1-0", "text": "x y z", "entities": ents((0, 3, "A"), (4, 5, "A"))}
  assert read_conll(write(tmp_path, "iob1.txt", text), token_col=1).report.scheme == "IOB1"


def test_conll_repairs_counted(tmp_path):
  text = "a O\nb I-X\nc I-Y\n\nd I-X\n\ne B-X\n"  # two orphans, one type switch, in BIO
  records = read_conll(write(tmp_path, "r.txt", text), scheme="BIO")
  assert [r["entities"] for r in records] == [ents((2, 3, "X"), (4, 5, "Y")), ents((0, 1, "X")), ents((0, 1, "X"))]
  assert records.report.repairs == {"orphan_continuation": 2, "type_mismatch": 1}
  assert records.report.repaired == {"r-0": {"orphan_continuation": 1, "type_mismatch": 1},
                                     "r-1": {"orphan_continuation": 1}}


def test_conll_empty_file(tmp_path):
  records = read_conll(write(tmp_path, "empty.txt", "\n\n-DOCSTART- O\n\n"))
  assert records == [] and records.report.records == 0


BAD_CONLL = [
    # (file text, bad line, reason, message part, kwargs)
    ("a O\nb O\n\nc O x\nd O\n", 4, "column_count", "3 columns", {}),
    ("a O\n\nb\n", 3, "column_count", "1 columns", {}),
    ("a O\n\nb B_X\n", 3, "bad_tag", "malformed tag 'B_X'", {}),
    ("a O\n\nb O\nc X-PER\n", 4, "bad_tag", "malformed tag 'X-PER'", {}),
    ("a O\n\nb O\nc E-PER\n", 4, "bad_tag", "not allowed in scheme BIO", {"scheme": "BIO"}),
    ("a\tO\n\n\tO\n", 3, "bad_value", "empty token", {"sep": "\t"}),
]


@pytest.mark.parametrize("text, line, reason, message, kw", BAD_CONLL)
def test_conll_bad_input_strict(tmp_path, text, line, reason, message, kw):
  path = write(tmp_path, "bad.txt", text)
  with pytest.raises(DataError) as e:
    read_conll(path, **kw)
  assert str(e.value).startswith(f"{path}:{line}: ") and message in str(e.value)
  assert e.value.reason == reason


@pytest.mark.parametrize("text, line, reason, message, kw", BAD_CONLL)
def test_conll_bad_input_lenient(tmp_path, text, line, reason, message, kw):
  records = read_conll(write(tmp_path, "bad.txt", text), strict=False, **kw)
  assert records.report.skipped == {reason: 1}
  assert records.report.records == len(records) == text.strip().count("\n\n") + 1 - 1
  assert f":{line}: " in records.report.errors[0]


def test_conll_file_level_errors(tmp_path):
  path = write(tmp_path, "mixed.txt", "a B-X\nb I-X\n\nc B-Y\nd M-Y\ne E-Y\n")
  for strict in (True, False):  # one scheme per file: lenient mode cannot pick one either
    with pytest.raises(DataError, match=r"mixed.txt:5: .*cannot tell BIOES from BMES.*I- on line 2, M- on line 5"):
      read_conll(path, strict=strict)
  with pytest.raises(DataError, match="unknown tag scheme 'BILOU'") as e:
    read_conll(path, scheme="BILOU")
  assert e.value.reason == "unknown_scheme"
  with pytest.raises(DataError, match=r"tag columns \[3\]"):
    read_conll(write(tmp_path, "few.txt", "a O\n"), tag_cols=[3])


# --- properties ---------------------------------------------------------------------------

WORDS = st.text(alphabet="abcXYZ中文é", min_size=1, max_size=4)
TYPES = st.sampled_from(["PER", "LOC", "ORGpart"])


@st.composite
def sentences(draw):
  """A sentence: tokens and sorted non-overlapping token spans."""
  tokens = draw(st.lists(WORDS, min_size=1, max_size=8))
  cuts = sorted(draw(st.lists(st.integers(0, len(tokens)), max_size=6)))
  spans, pos = [], 0
  for a, b in zip(cuts[::2], cuts[1::2]):
    a = max(a, pos)
    if a < b:
      spans.append((a, b, draw(TYPES)))
      pos = b
  return tokens, spans


def char_entities(tokens, spans, joiner):
  starts = [sum(len(t) + len(joiner) for t in tokens[:i]) for i in range(len(tokens) + 1)]
  return ents(*[(starts[a], starts[b] - len(joiner), k) for a, b, k in spans])


@settings(max_examples=60, deadline=None)
@given(st.lists(sentences(), min_size=1, max_size=5), st.sampled_from(["BIO", "BIOES", "BMES", "IOB1"]),
       st.sampled_from([" ", ""]), st.booleans())
def test_conll_round_trip(sents, scheme, joiner, give_scheme):
  lines = []
  for tokens, spans in sents:
    lines += [f"{t} {g}" for t, g in zip(tokens, T.spans_to_tags(spans, len(tokens), scheme))] + [""]
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "rt.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines))
    records = read_conll(path, scheme=scheme if give_scheme else None, joiner=joiner)
  assert [r["text"] for r in records] == [joiner.join(t) for t, _ in sents]
  assert [r["entities"] for r in records] == [char_entities(t, s, joiner) for t, s in sents]
  assert not records.report.repairs


@settings(max_examples=60, deadline=None)
@given(st.lists(sentences(), min_size=1, max_size=5), st.data())
def test_conll_bad_line_named(sents, data):
  """A bad line anywhere: strict names its line; lenient skips exactly its sentence."""
  lines, starts = [], []
  for tokens, spans in sents:
    starts.append(len(lines))
    lines += [f"{t} {g}" for t, g in zip(tokens, T.spans_to_tags(spans, len(tokens), "BIO"))] + [""]
  k = data.draw(st.integers(0, len(sents) - 1))
  i = starts[k] + data.draw(st.integers(0, len(sents[k][0]) - 1))
  bad, reason = data.draw(st.sampled_from([(f"{lines[i]} extra", "column_count"), ("tok Z-PER", "bad_tag")]))
  if reason == "column_count" and i == 0:
    bad = lines[i].split()[0]  # the first line fixes the column count: make it short instead
  lines[i] = bad
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "bad.txt")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines))
    if reason == "column_count" and i == 0:
      with pytest.raises(DataError, match=f"{path}:1: "):
        read_conll(path, scheme="BIO", strict=False)  # nothing to go by: file-level error
      return
    with pytest.raises(DataError) as e:
      read_conll(path, scheme="BIO")
    assert (e.value.line, e.value.reason) == (i + 1, reason)
    records = read_conll(path, scheme="BIO", strict=False)
  assert records.report.skipped == {reason: 1}
  assert [r["id"] for r in records] == [f"bad-{n}" for n in range(len(sents)) if n != k]


@settings(max_examples=60, deadline=None)
@given(st.lists(sentences(), min_size=1, max_size=6), st.sets(st.integers(0, 5)))
def test_jsonl_lenient_counts_every_skip(sents, bad_rows):
  """Every corrupted line is skipped and counted; the others round-trip."""
  lines, want = [], []
  for n, (tokens, spans) in enumerate(sents):
    text = " ".join(tokens)
    record = {"id": f"r{n}", "text": text, "entities": char_entities(tokens, spans, " ")}
    if n in bad_rows:
      lines.append(json.dumps({"id": f"r{n}", "text": text, "entities": ents((0, len(text) + 1, "PER"))}))
    else:
      lines.append(json.dumps(record, ensure_ascii=False))
      want.append(record)
  with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "x.jsonl")
    with open(path, "w", encoding="utf-8") as f:
      f.write("\n".join(lines) + "\n")
    records = read_jsonl(path, strict=False)
    bad = sorted(n for n in bad_rows if n < len(sents))
    n_bad = len(bad)
    if bad:
      first = bad[0] + 1
      with pytest.raises(DataError, match=f"{path}:{first}: .*outside the text"):
        read_jsonl(path)
  assert records == want
  assert records.report.skipped == ({"span_out_of_range": n_bad} if n_bad else {})
  assert records.report.records + records.report.num_skipped == len(sents)


def test_jsonl_names_importable_from_readers():
  from gp_jax.data import jsonl, readers  # noqa: PLC0415
  from gp_jax.data.readers import merge_relations  # noqa: PLC0415
  assert readers.read_jsonl is jsonl.read_jsonl and merge_relations is jsonl.merge_relations
  with pytest.raises(AttributeError, match="no attribute 'read_json'"):
    readers.read_json  # noqa: B018
