"""Records with relations: the whole-word aligner, the CasRel and jsonl readers (merges, errors at file:line,
lenient counts), the webnlg_star builder, relation types, and relations cut into windows."""

from __future__ import annotations

import collections
import json
import logging
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gp_jax.configs.base import get_config
from gp_jax.data import DataError, corpora, load_split, read_jsonl, relations, windows
from gp_jax.data.readers import is_cjk
from gp_jax.data.sources import load_records, relation_types
from gp_jax.tasks.relations import table as rtable
from tests.data.fakes import CharTok, ref_windows

# --- the aligner ------------------------------------------------------------------------------------------------


def ref_words(text):
  """(start, end) of each word: a run of non-space, non-CJK characters, or one CJK character (plain Python)."""
  words, i = [], 0
  while i < len(text):
    if text[i].isspace():
      i += 1
    elif is_cjk(text[i]):
      words.append((i, i + 1))
      i += 1
    else:
      j = i
      while j < len(text) and not text[j].isspace() and not is_cjk(text[j]):
        j += 1
      words.append((i, j))
      i = j
  return words


def ref_find(text, s):
  """Starts of `s` as a run of whole words of `text`, found by walking the word list."""
  words, out = ref_words(text), []
  for a, (start, _) in enumerate(words):
    for b in range(a, len(words)):
      if text[start:words[b][1]] == s:
        out.append(start)
  return out


def test_repeated_strings_first_occurrence_on_word_boundaries():
  text = "In 2012 , 12 of the 12 crew flew Apollo 12"
  assert relations.find_words(text, "12") == [10, 20, 40]  # never inside "2012"
  assert relations.find_words(text, "201") == [] and "201" in text
  assert relations.find_words(text, "Apollo 12") == [33]
  assert relations.find_words("北京大学在北京", "北京") == [0, 5]  # CJK: characters
  assert relations.find_words("2012年12月", "12") == [5]  # digits glued to CJK are still one word
  assert relations.find_words("ab", "") == []


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet="ab 1京", max_size=16), st.text(alphabet="ab 1京", min_size=1, max_size=4))
def test_find_words_agrees_with_a_word_list(text, s):
  assert relations.find_words(text, s) == ref_find(text, s)


# --- CasRel records -----------------------------------------------------------------------------------------------


def write_json(path, value, indent=2):
  path.write_text(json.dumps(value, ensure_ascii=False, indent=indent), encoding="utf-8")
  return path


def record_line(value, index, indent=2):
  """The 1-based line where element `index` of json.dumps(value, indent) starts."""
  lines = json.dumps(value, ensure_ascii=False, indent=indent).split("\n")
  starts = [n for n, line in enumerate(lines, 1) if line == " " * indent + "{"]
  return starts[index]


def triples_of(record):
  """(subject text, relation, object text) of a Record, for comparison with the file's triples."""
  ents, text = record["entities"], record["text"]
  return [(text[ents[r["head"]]["start"]:ents[r["head"]]["end"]], r["type"],
           text[ents[r["tail"]]["start"]:ents[r["tail"]]["end"]]) for r in record["relations"]]


CASREL = [
    # SEO: "Bean" is the subject of two triples; "Texas" occurs twice (the first is taken); a repeated triple.
    {"text": "Alan Bean was born in Texas and flew Apollo 12 , like Texas .",
     "triple_list": [["Bean", "birthPlace", "Texas"], ["Bean", "mission", "12"], ["Bean", "birthPlace", "Texas"]]},
    # EPO: two relations between one pair; "Paris" the object of one triple and the subject of another.
    {"text": "Lyon to Paris : Paris is in France", "triple_list": [
        ["Lyon", "near", "Paris"], ["Lyon", "road", "Paris"], ["Paris", "country", "France"]]},
    {"text": "nothing here", "triple_list": []},
]


def test_casrel_seo_epo_merges_and_counts(tmp_path):
  path = write_json(tmp_path / "train_triples.json", CASREL)
  recs = relations.read_casrel(path)
  assert [r["id"] for r in recs] == ["train_triples-0", "train_triples-1", "train_triples-2"]
  seo, epo, empty = recs
  text = seo["text"]
  assert seo["entities"] == [{"start": 5, "end": 9, "type": "subject"},
                             {"start": text.index("Texas"), "end": text.index("Texas") + 5, "type": "object"},
                             {"start": text.index("12"), "end": text.index("12") + 2, "type": "object"}]
  assert seo["relations"] == [{"head": 0, "tail": 1, "type": "birthPlace"}, {"head": 0, "tail": 2, "type": "mission"}]
  # "Paris" at 8 is an object and a subject: two entities on one span; the pair (Lyon, Paris) has two relations.
  assert epo["entities"] == [{"start": 0, "end": 4, "type": "subject"}, {"start": 8, "end": 13, "type": "object"},
                             {"start": 8, "end": 13, "type": "subject"}, {"start": 28, "end": 34, "type": "object"}]
  assert epo["relations"] == [{"head": 0, "tail": 1, "type": "near"}, {"head": 0, "tail": 1, "type": "road"},
                              {"head": 2, "tail": 3, "type": "country"}]
  assert empty["entities"] == [] and empty["relations"] == []
  for rec, raw in zip(recs, CASREL):  # every distinct triple comes back, in the file's order
    assert triples_of(rec) == list(dict.fromkeys(map(tuple, raw["triple_list"])))
  report = recs.report
  assert report.merged == {"repeated_relation": 1}
  # Distinct strings per record: Bean, 12 unique; Texas twice; Lyon, France unique; Paris twice.
  assert report.alignments == {"unique": 4, "ambiguous": 2}
  assert (report.records, report.entities, report.relations) == (3, 7, 5)
  assert "5 relations" in report.summary() and "'ambiguous': 2" in report.summary()


@pytest.mark.parametrize("triple, reason, message", [
    (["Bean", "r", "Mars"], "string_not_in_text", "object 'Mars' of triple #1 is not in the text"),
    (["Bean", "r", "201"], "string_inside_word", "object '201' of triple #1 occurs only inside other words"),
    (["Bean", "r"], "bad_value", "expected [subject, relation, object]"),
    (["Bean", "", "2012"], "bad_value", "three non-empty strings"),
    (["Bean ", "r", "2012"], "bad_value", "has spaces at its ends"),
])
def test_casrel_bad_records_at_their_true_line(tmp_path, triple, reason, message):
  data = [CASREL[2], {"text": "Alan Bean flew in 2012 .", "triple_list": [["Bean", "r", "2012"], triple]}, CASREL[2]]
  path = write_json(tmp_path / "bad.json", data)
  with pytest.raises(DataError) as e:
    relations.read_casrel(path)
  line = record_line(data, 1)
  assert (e.value.path, e.value.line, e.value.reason) == (str(path), line, reason)
  assert str(e.value).startswith(f"{path}:{line}: record 1: ") and message in str(e.value)
  assert "\n" not in str(e.value)
  recs = relations.read_casrel(path, strict=False)
  assert [r["id"] for r in recs] == ["bad-0", "bad-2"] and recs.report.skipped == {reason: 1}
  assert recs.report.alignments["failed"] == (reason.startswith("string_"))
  assert recs.report.errors == [str(e.value)]


def test_casrel_failed_alignment_names_the_fix_and_counts_each_string(tmp_path):
  data = [{"text": "In 2012 , 12 flew", "triple_list": [["20", "r", "2012"], ["201", "r", "Mars"]]}]
  path = write_json(tmp_path / "a.json", data, indent=None)
  with pytest.raises(DataError, match=r"a.json:1: record 0: subject '20' of triple #0 occurs only inside other "
                     r"words \(first at character 3: 'In 2012 , 12 fl'\) \(and 2 more\): expected whole words"):
    relations.read_casrel(path)
  recs = relations.read_casrel(path, strict=False)
  assert not recs and recs.report.alignments == {"failed": 3}
  assert "JSON lines with character offsets" in recs.report.errors[0]


def test_casrel_file_errors(tmp_path):
  (tmp_path / "a.json").write_text('{"text": "a"}')
  with pytest.raises(DataError, match=r"a.json:1: starts with .*expected a JSON array of records \[\{\"text\", "
                     r"\"triple_list\""):
    relations.read_casrel(tmp_path / "a.json")
  (tmp_path / "b.json").write_text('[{"text": "a b", "triple_list": []},\n{"text": "a" "triple_list": []}]')
  with pytest.raises(DataError, match=r"b.json:2: record 1: malformed JSON"):
    relations.read_casrel(tmp_path / "b.json")
  (tmp_path / "c.json").write_bytes('[{"text": "a b", "triple_list": []},\n{"text": "\xe9"}]'.encode("latin-1"))
  with pytest.raises(DataError, match=r"c.json:2: not valid UTF-8: byte 0xe9 at column 11"):
    relations.read_casrel(tmp_path / "c.json")
  write_json(tmp_path / "d.json", [{"text": "a b"}])
  with pytest.raises(DataError, match=r'record 0: no "triple_list": expected labelled records'):
    relations.read_casrel(tmp_path / "d.json")
  assert relations.read_casrel(tmp_path / "d.json", allow_unlabelled=True)[0]["relations"] == []
  with pytest.raises(DataError, match="no such file"):
    relations.read_casrel(tmp_path / "missing.json")


def test_casrel_streams_with_small_chunks(tmp_path):
  data = [{"text": f"w{i} said x{i} to y{i} .", "triple_list": [[f"w{i}", "said", f"x{i}"]]} for i in range(200)]
  data[150]["triple_list"].append(["w150", "told", "nobody"])
  path = write_json(tmp_path / "big.json", data)
  with pytest.raises(DataError) as e:
    relations.read_casrel(path, chunk_chars=64)
  assert e.value.line == record_line(data, 150)
  got = relations.read_casrel(path, chunk_chars=64, strict=False)
  assert len(got) == 199 and got[150]["id"] == "big-151"


# --- jsonl records with relations -------------------------------------------------------------------------------


def test_jsonl_relations_untyped_entities_and_merges(tmp_path):
  line = {"text": "Ann met Bob", "entities": [{"start": 0, "end": 3}, {"start": 8, "end": 11, "type": ""},
                                               {"start": 0, "end": 3, "type": ""}],
          "relations": [{"head": 2, "tail": 1, "type": "met"}, {"head": 0, "tail": 1, "type": "met"},
                        {"head": 1, "tail": 0, "type": "met"}]}
  typed = {"text": "Ann met Bob", "entities": [{"start": 0, "end": 3, "type": "PER"}], "relations": []}
  path = tmp_path / "rel.jsonl"
  path.write_text(json.dumps(line) + "\n" + json.dumps(typed) + "\n" + json.dumps({"text": "x", "entities": []}))
  recs = read_jsonl(path)
  assert recs[0]["entities"] == [{"start": 0, "end": 3, "type": ""}, {"start": 8, "end": 11, "type": ""}]
  assert recs[0]["relations"] == [{"head": 0, "tail": 1, "type": "met"}, {"head": 1, "tail": 0, "type": "met"}]
  assert recs[1]["relations"] == [] and "relations" not in recs[2]  # an entity record stays as it was
  assert recs.report.merged == {"duplicate_entity": 1, "repeated_relation": 1} and recs.report.relations == 2


BAD_RELATIONS = [
    ('{"text": "ab", "entities": [{"start": 0, "end": 1}], "relations": [{"head": 0, "tail": 1, "type": "r"}]}',
     "bad_relation", "relation #0 tail 1 points at no entity: expected an index into the record's 1 entities "
     "(0 to 0); fix the index or add the entity"),
    ('{"text": "ab", "entities": [{"start": 0, "end": 1}], "relations": [{"head": -1, "tail": 0, "type": "r"}]}',
     "bad_relation", "relation #0 head -1 points at no entity"),
    ('{"text": "ab", "entities": [{"start": 0, "end": 1}], "relations": [{"head": 0, "tail": 0, "type": 3}]}',
     "bad_value", "relation #0 type 3: expected a non-empty string"),
    ('{"text": "ab", "entities": [], "relations": [{"head": 0, "type": "r"}]}', "missing_key",
     "expected keys head, tail, type"),
    ('{"text": "ab", "entities": [], "relations": {}}', "bad_value", '"relations" is dict: expected a list'),
    ('{"text": "ab", "label": {}, "relations": []}', "missing_key", '"relations" without "entities"'),
    ('{"text": "ab", "entities": [{"start": 0, "end": 1, "type": 5}], "relations": []}', "bad_value",
     "non-empty string"),
]


@pytest.mark.parametrize("bad, reason, message", BAD_RELATIONS)
def test_jsonl_bad_relations(tmp_path, bad, reason, message):
  good = '{"text": "ab", "entities": [{"start": 0, "end": 1}], "relations": [{"head": 0, "tail": 0, "type": "r"}]}'
  path = tmp_path / "bad.jsonl"
  path.write_text(f"{good}\n\n{bad}\n{good}\n")
  with pytest.raises(DataError) as e:
    read_jsonl(path)
  assert (e.value.line, e.value.reason) == (3, reason)
  assert str(e.value).startswith(f"{path}:3: ") and message in str(e.value)
  recs = read_jsonl(path, strict=False)
  assert len(recs) == 2 and recs.report.skipped == {reason: 1} and recs.report.relations == 2


# --- relation types and user files ------------------------------------------------------------------------------


def test_relation_types_union_and_missing_from_train(caplog):
  rec = lambda *types: {"text": "a", "entities": [], "relations": [{"head": 0, "tail": 0, "type": t} for t in types]}
  with caplog.at_level(logging.WARNING):
    got = relation_types(train=[rec("b", "a")], dev=[rec("c")], test=[rec("a", "d"), {"text": "x", "entities": []}])
  assert got == ["a", "b", "c", "d"]
  assert "Relation types absent from train (never trained, their F1 is 0): {'c': ['dev'], 'd': ['test']}" in caplog.text
  caplog.clear()
  with caplog.at_level(logging.WARNING):
    assert relation_types(train=[rec("a")], dev=[], test=[]) == ["a"]
  assert not caplog.text


def test_casrel_user_files_through_the_config(tmp_path):
  train = write_json(tmp_path / "train.json", CASREL)
  dev = write_json(tmp_path / "dev.json", [CASREL[1]])
  test = write_json(tmp_path / "test.json", [{"text": "no triples"}])
  c = get_config().data
  c.name, c.train_file, c.dev_file, c.test_file = "casrel", str(train), str(dev), str(test)
  tr, dv, te, types = load_records(c)
  assert types == list(relations.ROLES) and len(tr) == 3 and dv[0]["relations"] and te[0]["relations"] == []
  assert relation_types(train=tr, dev=dv, test=te) == ["birthPlace", "country", "mission", "near", "road"]


# --- the webnlg_star builder --------------------------------------------------------------------------------------


def webnlg_manual(root, *, extra_relation=None):
  root.mkdir(parents=True, exist_ok=True)
  names = ["birthPlace", "country", "mission", "near", "road"]
  (root / "rel2id.json").write_text(json.dumps([{str(i): n for i, n in enumerate(names)},
                                                {n: i for i, n in enumerate(names)}]))
  train = CASREL if extra_relation is None else [*CASREL, {"text": "a b", "triple_list": [["a", extra_relation, "b"]]}]
  write_json(root / "train_triples.json", train)
  write_json(root / "val_triples.json", [CASREL[1]])
  write_json(root / "test_triples.json", [CASREL[2], CASREL[0]])
  return root


def test_webnlg_star_builder_fixture(tmp_path):
  manual = webnlg_manual(tmp_path / "webnlg")
  train = load_split("webnlg_star", "train", manual_dir=manual, data_dir=tmp_path / "tfds")
  want = relations.read_casrel(manual / "train_triples.json")
  assert list(train) == [dict(r, id=f"webnlg_star-train-{i}") for i, r in enumerate(want)]
  assert train._raw is not None  # the fast proto decoder agrees with TFDS's
  assert [corpora.to_record(train._source[i]) for i in range(len(train))] == list(train)
  dev = load_split("webnlg_star", "val", manual_dir=manual, data_dir=tmp_path / "tfds")
  assert dev.split == "dev" and dev[0]["relations"] == want[1]["relations"]
  test = load_split("webnlg_star", "test", manual_dir=manual, data_dir=tmp_path / "tfds")
  assert test[0]["relations"] == [] and test[1]["relations"] == want[0]["relations"]  # empty first: still decoded
  md = train.metadata
  assert md["types"] == ["subject", "object"] and md["relation_types"] == ["birthPlace", "country", "mission",
                                                                            "near", "road"]
  assert md["reports"]["train"]["merged"] == {"repeated_relation": 1} and md["reports"]["dev"]["relations"] == 3
  bad = webnlg_manual(tmp_path / "bad", extra_relation="flies")
  with pytest.raises(DataError, match=r"train_triples.json: record webnlg_star-train-3: relation 'flies' is not in "
                     r".*rel2id.json: expected one of its 5 relations"):
    load_split("webnlg_star", "train", manual_dir=bad, data_dir=tmp_path / "tfds_bad")


# --- the real files (skipped without shared/data) ---------------------------------------------------------------

WEBNLG_COUNTS = {"train": (5019, 11776), "val": (500, 1118), "test": (703, 1591)}  # SOURCE.md


@pytest.mark.e2e
@pytest.mark.parametrize("split", sorted(WEBNLG_COUNTS))
def test_real_webnlg_star_files(shared_data, split):
  path = shared_data / "webnlg_star" / f"{split}_triples.json"
  if not path.is_file():
    pytest.skip(f"{path} not found")
  raw = json.loads(path.read_text(encoding="utf-8"))
  recs = relations.read_casrel(path)
  report = recs.report
  assert (len(recs), sum(len(x["triple_list"]) for x in raw)) == WEBNLG_COUNTS[split]
  assert report.relations + report.merged["repeated_relation"] == WEBNLG_COUNTS[split][1]
  assert report.merged["repeated_relation"] == sum(len(x["triple_list"]) - len({tuple(t) for t in x["triple_list"]})
                                                   for x in raw)
  # Alignments against whitespace tokens: how often each distinct string occurs as a run of whole tokens.
  want = collections.Counter()
  for x, rec in zip(raw, recs):
    tokens = [(m.start(), m.group()) for m in re.finditer(r"\S+", x["text"])]
    for s in dict.fromkeys(v for t in x["triple_list"] for v in (t[0], t[2])):
      words = s.split(" ")
      found = [tokens[i][0] for i in range(len(tokens) - len(words) + 1)
               if [w for _, w in tokens[i:i + len(words)]] == words]
      want["ambiguous" if len(found) > 1 else "unique" if found else "failed"] += 1
      assert found and any(e["start"] == found[0] and e["end"] == found[0] + len(s) for e in rec["entities"])
    assert sorted(triples_of(rec)) == sorted({tuple(t) for t in x["triple_list"]})
  assert report.alignments == want and not report.skipped


@pytest.mark.e2e
def test_real_webnlg_star_builder(shared_data, tmp_path, caplog):
  if not (shared_data / "webnlg_star" / "rel2id.json").is_file():
    pytest.skip("webnlg_star not in shared/data")
  splits = {s: load_split("webnlg_star", s, manual_dir=shared_data / "webnlg_star", data_dir=tmp_path)
            for s in ("train", "dev", "test")}
  assert [len(splits[s]) for s in ("train", "dev", "test")] == [5019, 500, 703]
  assert len(splits["train"].metadata["relation_types"]) == 171
  with caplog.at_level(logging.WARNING):
    types = relation_types(**{s: list(v) for s, v in splits.items()})
  assert len(types) == 171 and set(types) == set(splits["train"].metadata["relation_types"])
  raw = {s: {t[1] for x in json.loads((shared_data / "webnlg_star" / f"{f}_triples.json").read_text())
             for t in x["triple_list"]} for s, f in (("train", "train"), ("dev", "val"), ("test", "test"))}
  lacking = {r: [s for s in ("dev", "test") if r in raw[s]] for r in sorted(raw["dev"] | raw["test"]) if
             r not in raw["train"]}
  assert len(raw["train"]) == 170 and len(lacking) == 1  # SOURCE.md: train uses 170 of the 171
  assert f"Relation types absent from train (never trained, their F1 is 0): {lacking}" in caplog.text


# --- windows ------------------------------------------------------------------------------------------------------

REL_TYPES = ("r0", "r1")


@st.composite
def relation_split(draw):
  specials = draw(st.booleans())
  records = []
  for r in range(draw(st.integers(1, 4))):
    text = draw(st.text(alphabet="ab c", max_size=30))
    ents = []
    if text:
      for _ in range(draw(st.integers(0, 5))):
        a = draw(st.integers(0, len(text) - 1))
        b = draw(st.integers(a + 1, min(len(text), a + 6)))
        ents.append({"start": a, "end": b, "type": draw(st.sampled_from(("subject", "object")))})
    rels = [{"head": draw(st.integers(0, len(ents) - 1)), "tail": draw(st.integers(0, len(ents) - 1)),
             "type": draw(st.sampled_from(REL_TYPES))} for _ in range(draw(st.integers(0, 6)) if ents else 0)]
    records.append({"id": f"doc{r}", "text": text, "entities": ents, "relations": rels})
  P = int(specials)
  max_len = draw(st.integers(2 * P + 1, 2 * P + 12))
  stride = draw(st.one_of(st.none(), st.integers(1, max_len - 2 * P)))
  width = draw(st.one_of(st.none(), st.integers(1, 4)))
  return specials, records, max_len, stride, width


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(relation_split())
def test_windows_keep_in_window_relations_and_count_the_others(case):
  specials, records, max_len, stride, width = case
  tok = CharTok(specials)
  p = rtable.prepare(records, tok, ("object", "subject"), REL_TYPES, max_len=max_len, stride=stride,
                     max_span_width=width)
  P = int(specials)
  W = max_len - 2 * P
  S = max(1, W // 2) if stride is None else stride
  # Reference, one record at a time: token spans of entities, then each relation's fate.
  want_windows, first_entity = collections.defaultdict(set), 0
  gold, want_status = [], []
  for r, rec in enumerate(records):
    char_to_tok = {int(a): t for t, (a, _) in enumerate(tok.encode(rec["text"]).offsets)}
    starts = ref_windows(len(char_to_tok), W, S)
    first_window = int(np.searchsorted(p.window_record, r))
    spans = [(char_to_tok.get(e["start"]), char_to_tok.get(e["end"] - 1)) for e in rec["entities"]]
    seen = set()
    for rel in rec["relations"]:
      gold.append((r, first_entity + rel["head"], first_entity + rel["tail"], REL_TYPES.index(rel["type"])))
      (ha, hb), (ta, tb) = spans[rel["head"]], spans[rel["tail"]]
      if None in (ha, hb, ta, tb):
        want_status.append(windows.MISALIGNED)
        continue
      if width is not None and max(hb - ha, tb - ta) + 1 > width:
        want_status.append(windows.TOO_LONG)
        continue
      key = (rel["type"], ha, hb, ta, tb)
      if key in seen:  # the first one is kept
        want_status.append(windows.DUPLICATE)
        continue
      seen.add(key)
      held = [k for k, s in enumerate(starts) if s <= min(ha, ta) and max(hb, tb) < s + W]
      want_status.append(windows.OK if held else windows.LOST)
      for k in held:
        s = starts[k] - P
        want_windows[first_window + k].add((ha - s, hb - s, ta - s, tb - s, REL_TYPES.index(rel["type"])))
    first_entity += len(rec["entities"])
  t = p.table
  for w in range(p.num_windows):
    got = t.window_relations(w).tolist()
    assert sorted(got, key=lambda x: (x[4], *x[:4])) == got  # sorted by type, then positions
    assert {tuple(x) for x in got} == want_windows[w] and len(got) == len(want_windows[w])
  assert list(zip(t.record.tolist(), t.head.tolist(), t.tail.tolist(), t.type.tolist())) == gold
  assert t.status.tolist() == want_status
  s, n = t.stats, collections.Counter(want_status)
  assert (s["relations"], s["relation_targets"], s["relations_misaligned"], s["relations_too_long"],
          s["relation_duplicates"], s["relations_split"]) == (len(gold), n[windows.OK], n[windows.MISALIGNED],
                                                              n[windows.TOO_LONG], n[windows.DUPLICATE],
                                                              n[windows.LOST])
  per_type = collections.Counter((w, x[4]) for w in range(p.num_windows) for x in t.window_relations(w).tolist())
  assert s["max_relations_per_type"] == max(per_type.values(), default=0)


def test_a_relation_split_across_windows_is_counted_and_logged(caplog):
  text = "ab cd ef gh"
  rec = {"id": "x", "text": text, "entities": [{"start": 0, "end": 2, "type": "subject"},
                                                {"start": 9, "end": 11, "type": "object"},
                                                {"start": 3, "end": 5, "type": "object"}],
         "relations": [{"head": 0, "tail": 1, "type": "r0"}, {"head": 0, "tail": 2, "type": "r1"}]}
  with caplog.at_level(logging.INFO):
    p = rtable.prepare([rec], CharTok(), ("object", "subject"), REL_TYPES, max_len=6, stride=2, name="dev")
  # Content tokens a b c d e f g h; windows of 4 start at 0, 2, 4: (ab, cd) is in window 0, (ab, gh) in none.
  t = p.table
  assert t.window_relations(0).tolist() == [[1, 2, 3, 4, 1]] and t.window_relations(1).size == 0
  assert t.stats["relations_split"] == 1 and t.stats["relation_targets"] == 1
  assert t.status.tolist() == [windows.LOST, windows.OK]
  assert "dev: 2 relations of 2 types: 1 targets, 0 misaligned, 0 too long, 0 duplicates, 1 split" in caplog.text


def test_relation_errors():
  rec = {"id": "doc-3", "text": "ab", "entities": [{"start": 0, "end": 1, "type": "subject"}],
         "relations": [{"head": 0, "tail": 1, "type": "r0"}]}
  with pytest.raises(ValueError, match=r"doc-3.*\(0, 1\) outside its 1 entities"):
    rtable.prepare([rec], CharTok(), ("subject",), REL_TYPES, max_len=8)
  rec["relations"] = [{"head": 0, "tail": 0, "type": "r9"}]
  with pytest.raises(ValueError, match=r"doc-3.*relation type 'r9'"):
    rtable.prepare([rec], CharTok(), ("subject",), REL_TYPES, max_len=8)
  with pytest.raises(ValueError, match="duplicate relation types"):
    rtable.prepare([rec], CharTok(), ("subject",), ("a", "a"), max_len=8)
  p = windows.prepare_split([rec], CharTok(), types=("subject",), max_len=8)  # the entity task ignores relations
  assert p.table is None and "relations" not in p.all_stats()
