"""The CBLUE/CMeEE format (gp_jax.data.cblue): streaming reader, validation, submission writers, the corpora."""

import json

import ml_collections
import pytest

from gp_jax.data import cblue, load_split
from gp_jax.data.readers import DataError, ReadReport
from gp_jax.data.sources import load_records
from gp_jax.errors import UserError

GOLD = [
    {"text": "小儿肺炎支原体感染", "entities": [
        {"start_idx": 0, "end_idx": 8, "type": "dis", "entity": "小儿肺炎支原体感染"},
        {"start_idx": 2, "end_idx": 3, "type": "bod", "entity": "肺炎"},  # nested inside the dis span
        {"start_idx": 2, "end_idx": 6, "type": "mic", "entity": "肺炎支原体"},
    ]},
    {"text": "发热3天。", "entities": [{"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "发热"}]},
    {"text": "无", "entities": []},
]


def write(path, records, **dump):
  path.write_text(json.dumps(records, ensure_ascii=False, **dump), encoding="utf-8")
  return path


def test_reader_keeps_nested_spans_and_makes_ends_exclusive(tmp_path):
  path = write(tmp_path / "train.json", GOLD, indent=2)
  recs = cblue.read_cblue(path, id_prefix="t")
  assert [r["id"] for r in recs] == ["t-0", "t-1", "t-2"]
  assert recs[0]["entities"] == [{"start": 0, "end": 9, "type": "dis"}, {"start": 2, "end": 4, "type": "bod"},
                                 {"start": 2, "end": 7, "type": "mic"}]
  assert recs[1]["entities"] == [{"start": 0, "end": 2, "type": "sym"}]
  assert recs.report.records == 3 and recs.report.entities == 4
  # Records -> CMeEE submission -> records is the identity on gold.
  for obj, rec in zip(GOLD, recs):
    assert cblue.to_cmeee({"text": obj["text"]}, rec["entities"]) == obj
  sub = tmp_path / "sub.json"
  write(sub, [cblue.to_cmeee({"text": r["text"]}, [{**e, "score": 1.0} for e in r["entities"]]) for r in recs])
  assert list(cblue.read_cblue(sub, id_prefix="t")) == list(recs)


@pytest.mark.parametrize("entity,message", [
    ({"start_idx": 0, "end_idx": 1, "type": "sym", "entity": "发"}, r"entity #0 sym '发' != text\[0:2\] '发热'"),
    ({"start_idx": 2, "end_idx": 1, "type": "sym", "entity": ""}, r"start_idx 2 > end_idx 1"),
    ({"start_idx": 0, "end_idx": 5, "type": "sym", "entity": "发热3天。?"}, r"outside the text \(length 5"),
    ({"start_idx": 0, "type": "sym"}, r"lacks \['end_idx'\]"),
    ({"start_idx": "0", "end_idx": 1, "type": "sym"}, r"start_idx is '0': expected an integer"),
])
def test_bad_entities_name_file_line_and_record(tmp_path, entity, message):
  records = [GOLD[0], {"text": "发热3天。", "entities": [entity]}, GOLD[2]]
  path = write(tmp_path / "bad.json", records, indent=1)
  with pytest.raises(DataError, match=message) as e:
    cblue.read_cblue(path)
  assert str(e.value).startswith(f"{path}:") and "record 1:" in str(e.value)
  assert e.value.line == json.dumps(records, ensure_ascii=False, indent=1).split("\n").index(" {", 2) + 1
  # Lenient: the bad record is skipped and counted.
  recs = cblue.read_cblue(path, strict=False)
  assert len(recs) == 2 and recs.report.num_skipped == 1 and recs.report.errors[0] == str(e.value)


def test_bad_records_and_json(tmp_path):
  path = write(tmp_path / "a.json", [GOLD[1], ["not", "a", "record"], {"entities": []}, {"text": "x"}])
  recs = cblue.read_cblue(path, strict=False)
  assert [r["text"] for r in recs] == ["发热3天。"]
  assert dict(recs.report.skipped) == {"bad_json": 1, "missing_key": 2}  # record 3 lacks "entities" (train)
  with pytest.raises(DataError, match=r"record 1 is a JSON list: expected an object"):
    cblue.read_cblue(path)
  assert len(cblue.read_cblue(tmp_path / "a.json", strict=False, allow_unlabelled=True)) == 2
  (tmp_path / "b.json").write_text('[{"text": "a", "entities": []},\n {"text": "b" "entities"}]')
  with pytest.raises(DataError, match=r"b.json:2: record 1: malformed JSON"):
    cblue.read_cblue(tmp_path / "b.json")
  (tmp_path / "c.json").write_text('{"text": "a"}')
  with pytest.raises(DataError, match=r"expected a JSON array"):
    cblue.read_cblue(tmp_path / "c.json")
  (tmp_path / "d.json").write_text('[{"text": "a", "entities": []}] x')
  with pytest.raises(DataError, match=r"text after the closing"):
    cblue.read_cblue(tmp_path / "d.json")
  write(tmp_path / "e.json", [])
  assert list(cblue.iter_cblue(tmp_path / "e.json")) == []
  with pytest.raises(DataError, match=r"no such file"):
    list(cblue.iter_cblue(tmp_path / "missing.json"))


def test_streaming_reader_on_a_file_larger_than_its_chunk(tmp_path):
  records = [{"text": f"第{i}例发热" * (1 + i % 7), "entities": [{"start_idx": 0, "end_idx": 0, "type": "sym",
                                                                 "entity": "第"}], "id": f"r{i}"}
             for i in range(300)]
  records.append({"text": "长" * 5000, "entities": []})  # one record longer than several chunks
  records.append({"text": "咳嗽", "entities": [{"start_idx": 0, "end_idx": 9, "type": "sym", "entity": "咳嗽"}]})
  path = write(tmp_path / "big.json", records, indent=2)
  assert path.stat().st_size > 20 * 256
  report = ReadReport(str(path))
  got = list(cblue.iter_cblue(path, chunk_chars=256, strict=False, report=report))
  assert got == list(enumerate(records[:-1]))
  assert report.num_skipped == 1 and "record 301:" in report.errors[0]
  with pytest.raises(DataError) as e:
    list(cblue.iter_cblue(path, chunk_chars=256))
  lines = json.dumps(records, ensure_ascii=False, indent=2).split("\n")
  assert e.value.line == len(lines) - 11 and lines[e.value.line - 1] == "  {"  # where record 301 starts


def test_cluener_line():
  text = "浙商银行企业信贷部叶老桂博士"
  ents = [{"start": 9, "end": 12, "type": "name", "score": 0.9}, {"start": 0, "end": 4, "type": "company"},
          {"start": 0, "end": 9, "type": "organization"}]
  assert json.loads(cblue.cluener_line("7", text, ents)) == {
      "id": 7, "label": {"company": {"浙商银行": [[0, 3]]}, "organization": {"浙商银行企业信贷部": [[0, 8]]},
                         "name": {"叶老桂": [[9, 11]]}}}
  assert cblue.cluener_line("a-1", "无", []) == '{"id": "a-1", "label": {}}'
  # The same mention twice: one key, both spans.
  assert json.loads(cblue.cluener_line(0, "北京到北京", [{"start": 3, "end": 5, "type": "address"},
                                                        {"start": 0, "end": 2, "type": "address"}]))["label"] == {
      "address": {"北京": [[0, 1], [3, 4]]}}
  # What the CLUENER reader reads back is what was written.
  from gp_jax.data.readers import read_jsonl
  import io

  back = read_jsonl(io.StringIO(json.dumps({"text": text, **json.loads(cblue.cluener_line(1, text, ents))})))
  assert back[0]["entities"] == sorted(({k: e[k] for k in ("start", "end", "type")} for e in ents),
                                       key=lambda e: (e["start"], e["end"], e["type"]))


def _data_cfg(**kw):
  c = ml_collections.ConfigDict(dict(name="cblue", train_file="", dev_file="", test_file="", strict=True,
                                     dev_fraction=0.05, max_train_records=0, max_eval_records=0))
  c.update(kw)
  return c


def test_cblue_user_files_through_the_config(tmp_path):
  train = write(tmp_path / "train.json", GOLD)
  dev = write(tmp_path / "dev.json", GOLD[:2])
  test = write(tmp_path / "test.json", [{"text": r["text"]} for r in GOLD])  # unlabelled, as CMeEE's
  tr, dv, te, types = load_records(_data_cfg(train_file=str(train), dev_file=str(dev), test_file=str(test)))
  assert len(tr) == 3 and len(dv) == 2 and types == ["bod", "dis", "mic", "sym"]
  assert [r["entities"] for r in te] == [[], [], []]
  bad = write(tmp_path / "bad.json", [GOLD[0], {"text": "发热", "entities": [{"start_idx": 0, "end_idx": 0,
                                                                            "type": "sym", "entity": "热"}]}])
  with pytest.raises(UserError, match="bad.json:1: record 1: entity #0 sym '热'"):
    load_records(_data_cfg(train_file=str(bad), dev_file=str(dev)))
  tr, *_ = load_records(_data_cfg(train_file=str(bad), dev_file=str(dev), strict=False))
  assert len(tr) == 1
  with pytest.raises(UserError, match="nope.json: no such file"):
    load_records(_data_cfg(train_file=str(tmp_path / "nope.json")))


def test_cmeee_corpora(tmp_path):
  for name, prefix in (("cmeee", "CMeEE"), ("cmeee_v2", "CMeEE-V2")):
    manual = tmp_path / name
    manual.mkdir()
    write(manual / f"{prefix}_train.json", GOLD)
    write(manual / f"{prefix}_dev.json", GOLD[1:])
    write(manual / f"{prefix}_test.json", [{"text": "咳嗽"}])
    train = load_split(name, "train", manual_dir=manual, data_dir=tmp_path / "tfds")
    assert train[0] == {"id": f"{name}-train-0", "text": GOLD[0]["text"],
                        "entities": cblue.read_cblue(manual / f"{prefix}_train.json")[0]["entities"]}
    assert len(load_split(name, "dev", manual_dir=manual, data_dir=tmp_path / "tfds")) == 2
    test = load_split(name, "test", manual_dir=manual, data_dir=tmp_path / "tfds")
    assert not test.labelled and list(test) == [{"id": f"{name}-test-0", "text": "咳嗽", "entities": []}]
  # A missing folder or file: one line naming it.
  with pytest.raises(UserError, match=r"empty: manual data for cmeee not found: .* Put CMeEE_train.json, ") as e:
    load_split("cmeee", "train", manual_dir=tmp_path / "empty", data_dir=tmp_path / "tfds2")
  assert "\n" not in str(e.value)
  (tmp_path / "dev_only").mkdir()
  write(tmp_path / "dev_only" / "CMeEE_dev.json", GOLD)
  with pytest.raises(UserError, match=r"dev_only: none of \['CMeEE_train.json'\] found"):
    load_split("cmeee", "train", manual_dir=tmp_path / "dev_only", data_dir=tmp_path / "tfds2")
