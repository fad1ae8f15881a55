"""load_records for user files: CoNLL tag columns and joiner from the config, the label set over all splits."""

from __future__ import annotations

import json
import logging

import pytest

from gp_jax.configs.base import get_config
from gp_jax.data import read_conll
from gp_jax.data.readers import detect_joiner
from gp_jax.data.sources import load_records
from gp_jax.errors import UserError


def ents(*triples):
  return [{"start": s, "end": e, "type": t} for s, e, t in triples]


def data_cfg(name, train, dev="", test="", **kw):
  c = get_config().data
  c.name, c.train_file, c.dev_file, c.test_file = name, str(train), str(dev), str(test)
  for k, v in kw.items():
    setattr(c, k, v)
  return c


# Token, outer level, inner level (GermEval style).
NESTED = ("Die\tO\tO\nBundesrepublik\tB-LOC\tO\nDeutschland\tI-LOC\tB-LOC\n.\tO\tO\n\n"
          "Berliner\tB-LOCderiv\tO\n")


def test_two_tag_columns_keep_outer_and_inner(tmp_path):
  path = tmp_path / "nested.tsv"
  path.write_text(NESTED, encoding="utf-8")
  train, _, _, types = load_records(data_cfg("conll", path, dev=path, conll_tag_cols=(1, 2), conll_scheme="BIO"))
  assert train[0]["text"] == "Die Bundesrepublik Deutschland ."
  assert train[0]["entities"] == ents((4, 30, "LOC"), (19, 30, "LOC"))  # outer and inner
  assert train[1]["entities"] == ents((0, 8, "LOCderiv"))
  assert types == ["LOC", "LOCderiv"]
  # () = the last column only: the inner level.
  train, _, _, types = load_records(data_cfg("conll", path, dev=path, conll_scheme="BIO"))
  assert train[0]["entities"] == ents((19, 30, "LOC")) and train[1]["entities"] == [] and types == ["LOC"]


# Sentences and (start, end, type) char spans; digits and Latin letters one char per line as in MSRA.
ZH = [
    ("我在北京见张小明", [(2, 4, "LOC"), (5, 8, "PER")]),
    ("2003年，ABC公司在上海。", [(6, 11, "ORG"), (12, 14, "LOC")]),
    ("沪", [(0, 1, "LOC")]),
    ("中华人民共和国国务院总理在人民大会堂会见了来访的外国客人并举行了会谈。", [(0, 10, "ORG"), (12, 17, "LOC")]),
]


def bmes(text, spans):
  tags = ["O"] * len(text)
  for a, b, kind in spans:
    tags[a:b] = [f"S-{kind}"] if b - a == 1 else [f"B-{kind}"] + [f"M-{kind}"] * (b - a - 2) + [f"E-{kind}"]
  return tags


def test_chinese_char_per_line_equals_the_same_data_as_jsonl(tmp_path, caplog):
  conll = tmp_path / "zh.txt"
  conll.write_text("\n\n".join("\n".join(f"{c} {t}" for c, t in zip(text, bmes(text, spans), strict=True))
                               for text, spans in ZH) + "\n", encoding="utf-8")
  with caplog.at_level(logging.INFO):
    from_conll = load_records(data_cfg("conll", conll, dev=conll))
  assert any("zh.txt" in r.getMessage() and "''" in r.getMessage() for r in caplog.records)  # decision logged
  assert [r["text"] for r in from_conll[0]] == [text for text, _ in ZH]  # no spaces added
  assert [r["entities"] for r in from_conll[0]] == [ents(*spans) for _, spans in ZH]
  # The same records written as JSON lines: identical text and entities, so training is identical.
  jsonl = tmp_path / "zh.jsonl"
  jsonl.write_text("\n".join(json.dumps({"text": r["text"], "entities": r["entities"]}, ensure_ascii=False)
                             for r in from_conll[0]) + "\n", encoding="utf-8")
  from_jsonl = load_records(data_cfg("jsonl", jsonl, dev=jsonl))
  strip = lambda recs: [(r["text"], r["entities"]) for r in recs]  # noqa: E731
  assert strip(from_conll[0]) == strip(from_jsonl[0]) and strip(from_conll[1]) == strip(from_jsonl[1])
  assert from_conll[3] == from_jsonl[3] == ["LOC", "ORG", "PER"]


def test_english_keeps_spaces(tmp_path):
  path = tmp_path / "en.txt"
  path.write_text("EU B-ORG\nrejects O\nGerman B-MISC\ncall O\n. O\n\nI O\nam O\n", encoding="utf-8")
  train, _, _, _ = load_records(data_cfg("conll", path, dev=path))
  assert [r["text"] for r in train] == ["EU rejects German call .", "I am"]
  assert train[0]["entities"] == ents((0, 2, "ORG"), (11, 17, "MISC"))
  assert read_conll(path, joiner="auto").report.joiner == " "


@pytest.mark.parametrize("tokens, want", [
    (list("北京欢迎你。"), ""),
    (list("東京タワー，서울"), ""),  # kanji, katakana, fullwidth comma, hangul
    (list("2003年上海站"), ""),  # 4 of 8 CJK: exactly half
    (list("2003年上海"), " "),  # 3 of 7: below half
    (["I", "a", "."], " "),  # single characters, none CJK
    (["北京", "欢迎"], " "),  # words, not characters
    ([], " "),
])
def test_detect_joiner(tokens, want):
  assert detect_joiner(tokens) == want


def test_type_only_in_dev_is_in_types_and_logged(tmp_path, caplog):
  train = tmp_path / "train.jsonl"
  dev = tmp_path / "dev.jsonl"
  test = tmp_path / "test.jsonl"
  train.write_text(json.dumps({"text": "ab", "entities": [{"start": 0, "end": 1, "type": "PER"}]}) + "\n")
  dev.write_text(json.dumps({"text": "cd", "entities": [{"start": 0, "end": 2, "type": "GPE"}]}) + "\n")
  test.write_text(json.dumps({"text": "ef", "entities": [{"start": 1, "end": 2, "type": "PER"}]}) + "\n")
  with caplog.at_level(logging.WARNING):
    _, _, _, types = load_records(data_cfg("jsonl", train, dev=dev, test=test))
  assert types == ["GPE", "PER"]
  warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
  assert any("GPE" in m and "dev" in m for m in warned) and not any("PER" in m for m in warned)


def _people_daily_fixture(tmp_path):
  manual = tmp_path / "pd"
  manual.mkdir()
  sents = [f"{'中北'[i % 2]} B-LOC\n国 I-LOC\n{i % 10} O\n" for i in range(20)]
  (manual / "example.dev").write_text("\n".join(sents[:5]), encoding="utf-8")
  (manual / "example.test").write_text("\n".join(sents), encoding="utf-8")
  c = get_config("dataset=people_daily").data
  c.manual_dir, c.tfds_dir = str(manual), str(tmp_path / "tfds")
  return c


def test_corpus_holdout_dev_from_the_training_split(tmp_path):
  c = _people_daily_fixture(tmp_path)
  c.train_split, c.dev_split, c.test_split, c.dev_fraction = "test", "holdout", "dev", 0.1
  train, dev, test, types = load_records(c)
  assert (len(train), len(dev), len(test)) == (18, 2, 5)
  assert {r["id"] for r in dev}.isdisjoint(r["id"] for r in train)
  assert all(r["id"].startswith("people_daily-test-") for r in train + dev)
  assert all(r["id"].startswith("people_daily-dev-") for r in test)
  assert [r["id"] for r in load_records(c)[1]] == [r["id"] for r in dev]  # deterministic
  assert types == ["LOC", "ORG", "PER"]


def test_corpus_test_split_equal_to_train_split_is_refused(tmp_path):
  c = _people_daily_fixture(tmp_path)
  c.train_split, c.dev_split, c.test_split = "test", "holdout", "test"
  with pytest.raises(UserError, match="also the training split"):
    load_records(c)


# --- a training file without records: named, with what was expected --------------------------------------------


@pytest.mark.parametrize("fmt,content,what", [
    ("jsonl", "", "is empty (0 bytes)"),
    ("conll", "\n\n  \n", "holds no records (5 bytes)"),
    ("cblue", "", "is empty (0 bytes)"),
])
def test_empty_training_file_is_named(tmp_path, fmt, content, what):
  from gp_jax.data.sources import FORMAT_EXPECTED

  path = tmp_path / f"train.{fmt}"
  path.write_text(content, encoding="utf-8")
  dev = tmp_path / "dev.jsonl"
  dev.write_text(json.dumps({"text": "ab", "entities": []}) + "\n")
  if fmt == "cblue":
    with pytest.raises(UserError, match=rf"^{path}: is empty: expected a JSON array of records"):  # its own
      load_records(data_cfg(fmt, path, dev=dev))
    path.write_text("[]", encoding="utf-8")
    what = "holds no records (2 bytes)"
  with pytest.raises(UserError) as e:
    load_records(data_cfg(fmt, path, dev=dev))
  assert str(e.value) == (f"{path}: {what}: expected {FORMAT_EXPECTED[fmt]}; is data.train_file the file you meant?")


def test_training_file_whose_records_were_all_skipped_or_held_out(tmp_path):
  path = tmp_path / "train.jsonl"
  path.write_text('{"text": "ab"}\n{"text": "cd", "entities": [{"start": 0, "end": 9, "type": "X"}]}\n')
  with pytest.raises(UserError) as e:
    load_records(data_cfg("jsonl", path, strict=False))
  assert str(e.value).startswith(f"{path}: all 2 records were skipped {{'missing_key': 1, 'span_out_of_range': 1}} "
                                 f"(data.strict=False; the first: {path}:1: missing key \"entities\"")
  assert "\n" not in str(e.value)
  path.write_text('{"text": "ab", "entities": []}\n')
  with pytest.raises(UserError) as e:  # one record, no dev file: the dev split takes it
    load_records(data_cfg("jsonl", path))
  assert str(e.value) == (f"{path}: 1 record(s), all held out as dev (no data.dev_file; data.dev_fraction=0.05): "
                          "give data.dev_file or more training records")
  c = get_config("dataset=synthetic").data
  c.synthetic_records = 0
  with pytest.raises(UserError, match=r"data.synthetic_records=0: expected at least 1"):
    load_records(c)


def test_the_data_line_says_where_the_records_came_from(tmp_path, caplog):
  train, dev = tmp_path / "train.jsonl", tmp_path / "dev.jsonl"
  for p in (train, dev):
    p.write_text(json.dumps({"text": "ab", "entities": [{"start": 0, "end": 1, "type": "PER"}]}) + "\n")
  with caplog.at_level(logging.INFO, logger="gp_jax.data.sources"):
    load_records(data_cfg("jsonl", train, dev=dev))
    load_records(get_config("dataset=synthetic_distance").data, seed=3)
  lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Data ")]
  assert lines[0].endswith(f"; train from {train}, dev from {dev}")
  assert lines[1].endswith("; generated (synthetic_distance, data.synthetic_records=2000, seed 3)")


@pytest.mark.parametrize("which", ["dev", "test"])
@pytest.mark.parametrize("content,what", [("", "is empty (0 bytes)"), ("\n  \n", "holds no records (4 bytes)")])
def test_an_empty_dev_or_test_file_is_refused_as_the_training_file_is(tmp_path, which, content, what):
  """It was read as 0 records: a run with no dev evaluation (or no test one), exit 0."""
  from gp_jax.data.sources import FORMAT_EXPECTED

  train, empty = tmp_path / "train.jsonl", tmp_path / "empty.jsonl"
  train.write_text((json.dumps({"text": "ab", "entities": [{"start": 0, "end": 1, "type": "PER"}]}) + "\n") * 3)
  empty.write_text(content)
  with pytest.raises(UserError) as e:
    load_records(data_cfg("jsonl", train, **{which: empty}))
  assert str(e.value) == (f"{empty}: {what}: expected {FORMAT_EXPECTED['jsonl']}; is data.{which}_file the file you "
                          "meant?")


def test_a_folder_given_as_a_data_file_is_named_a_folder(tmp_path):
  train = tmp_path / "train.jsonl"
  train.write_text(json.dumps({"text": "ab", "entities": []}) + "\n")
  for kw, field in (({"train": tmp_path}, "train_file"), ({"train": train, "dev": tmp_path}, "dev_file")):
    with pytest.raises(UserError) as e:
      load_records(data_cfg("jsonl", **kw))
    assert str(e.value) == f"{tmp_path}: is a folder, not a file: give data.{field} a jsonl file"
