"""A byte that is not UTF-8, far past the first 8 KiB, is reported at its own line and column in every format and
reader: JSON lines, CoNLL columns, the CBLUE JSON array (any chunk size, binary or text stream), zip members, the
corpus builders, user files through the config, and the tokenizer files of a workdir."""

from __future__ import annotations

import io
import json
import zipfile

import ml_collections
import pytest

from gp_jax.data import cblue, load_split
from gp_jax.data.builders import base
from gp_jax.data.char_tokenizer import CharTokenizer
from gp_jax.data.readers import DataError, read_conll, read_jsonl
from gp_jax.data.sources import load_records
from gp_jax.errors import UserError

MARK = "\u2603"  # a placeholder character that the test files use nowhere else
BAD = (b"\xff", b"\xe9", b"\xc3(")  # invalid start byte; a Latin-1 byte; a lead byte with a bad continuation


def place(text: str, bad: bytes) -> tuple[bytes, int, int]:
  """The file's bytes with MARK replaced by `bad`, and MARK's 1-based line and column counted in `text`."""
  before = text[:text.index(MARK)]
  line, column = before.count("\n") + 1, len(before) - (before.rfind("\n") + 1) + 1
  data = text.encode("utf-8").replace(MARK.encode("utf-8"), bad)
  assert len(data[:data.index(bad)]) > 3 * 8192  # past several 8 KiB chunks
  return data, line, column


def jsonl_text(n=600, at=517):
  rows = [json.dumps({"text": f"第{i}行：北京 Beijing", "entities": [{"start": 2, "end": 4, "type": "LOC"}]},
                     ensure_ascii=False) for i in range(n)]
  rows[at] = rows[at].replace("Beijing", "Bei" + MARK + "jing")
  return "\n".join(rows) + "\n"


def conll_text(sentences=1200, at=911):
  sents = [f"第 O\n{i % 10} O\n句 O\n北 B-LOC\n京 I-LOC\n" for i in range(sentences)]
  sents[at] = sents[at].replace("京 I-LOC", "京" + MARK + " I-LOC")
  return "\n".join(sents)


def cblue_text(n=300, at=233, indent=2):
  records = [{"text": f"第{i}例小儿发热", "entities": [{"start_idx": len(f"第{i}例小儿"),
                                                       "end_idx": len(f"第{i}例小儿") + 1, "type": "sym",
                                                       "entity": "发热"}]} for i in range(n)]
  records[at]["text"] = records[at]["text"].replace("小儿", "小" + MARK + "儿")
  return json.dumps(records, ensure_ascii=False, indent=indent)


def check(error: DataError, name, line: int, column: int, bad: bytes):
  assert error.line == line and error.reason == "encoding"
  message = str(error)
  assert message.startswith(f"{name}:{line}: not valid UTF-8: byte 0x{bad[0]:02x}")
  assert f"at column {column} " in message and "convert the file to UTF-8" in message and "\n" not in message


@pytest.mark.parametrize("bad", BAD)
def test_jsonl_and_conll(tmp_path, bad):
  for fname, text, read in (("a.jsonl", jsonl_text(), read_jsonl), ("a.conll", conll_text(), read_conll)):
    data, line, column = place(text, bad)
    path = tmp_path / fname
    path.write_bytes(data)
    with pytest.raises(DataError) as e:
      read(path)
    check(e.value, path, line, column, bad)
    with pytest.raises(DataError) as e:  # an open text file (as sys.stdin) is decoded the same way
      read(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), name="<stdin>")
    check(e.value, "<stdin>", line, column, bad)


@pytest.mark.parametrize("bad", BAD)
@pytest.mark.parametrize("chunk", [None, 1, 2, 3, 7, 256, 8192])
def test_cblue_any_chunk(tmp_path, bad, chunk):
  data, line, column = place(cblue_text(), bad)
  path = tmp_path / "CMeEE_train.json"
  path.write_bytes(data)
  kw = {} if chunk is None else {"chunk_chars": chunk}
  with pytest.raises(DataError) as e:
    list(cblue.iter_cblue(path, **kw))
  check(e.value, path, line, column, bad)
  with pytest.raises(DataError) as e:  # a text stream with a byte buffer (sys.stdin, a gs:// object)
    list(cblue.iter_cblue_file(io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"), source="-", **kw))
  check(e.value, "-", line, column, bad)


@pytest.mark.parametrize("chunk", [1, 2, 3, 5, 256])
def test_cblue_chunks_that_cut_characters_read_the_same(tmp_path, chunk):
  text = cblue_text().replace(MARK, "")
  path = tmp_path / "ok.json"
  path.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))  # with a byte-order mark, as Windows tools write
  want = list(enumerate(json.loads(text)))
  assert list(cblue.iter_cblue(path, chunk_chars=chunk)) == want
  assert list(cblue.iter_cblue_file(io.StringIO(text), source="s", chunk_chars=chunk)) == want
  # A truncated character at the very end is an error at its line, not a silent drop.
  path.write_bytes(text.encode("utf-8")[:-1] + "\n冰".encode("utf-8")[:-1])
  with pytest.raises(DataError, match=r"ok.json:%d: not valid UTF-8: byte 0xe5 at column 1 \(unexpected end of data"
                     % (text.count("\n") + 2)):
    list(cblue.iter_cblue(path, chunk_chars=chunk))


def test_cblue_malformed_json_at_its_own_line(tmp_path):
  text = cblue_text().replace(MARK, "")
  lines = text.split("\n")
  k = next(i for i, s in enumerate(lines) if '"type": "sym"' in s and i > 1000)
  lines[k] = lines[k].replace('"type": "sym"', '"type" "sym"')
  path = tmp_path / "broken.json"
  path.write_text("\n".join(lines), encoding="utf-8")
  start = max(i for i in range(k) if lines[i] == "  {") + 1
  with pytest.raises(DataError, match=rf"broken.json:{k + 1}: record \d+: malformed JSON \(Expecting ':' delimiter\) "
                     rf"in the record that starts on line {start}: expected a JSON array"):
    list(cblue.iter_cblue(path, chunk_chars=512))


@pytest.mark.parametrize("bad", BAD)
def test_zip_member(tmp_path, bad):
  data, line, column = place(conll_text(), bad)
  path = tmp_path / "GermEval2014.zip"
  with zipfile.ZipFile(path, "w") as zf:
    zf.writestr("GermEval2014/germ.train.iob2", data)
  with pytest.raises(DataError) as e:
    base.read_member(path, "GermEval2014/germ.train.iob2")
  check(e.value, f"{path}!GermEval2014/germ.train.iob2", line, column, bad)


def test_corpus_builders(tmp_path):
  """Each builder's format, built by TFDS from the manual dir: the build fails at the bad byte's line."""
  conll, line, column = place(conll_text(), b"\xff")
  germ = conll.replace(b" O\n", b"\tO\tO\n").replace(b" B-LOC\n", b"\tB-LOC\tO\n").replace(b" I-LOC\n",
                                                                                          b"\tI-LOC\tO\n")
  jsonl = place(jsonl_text().replace('"type": "LOC"', '"type": "address"'), b"\xff")
  cmeee = place(cblue_text(), b"\xff")
  good_conll = b"\xe5\x8c\x97 B-LOC\n"
  cases = {
      "people_daily": ({"example.dev": conll, "example.test": good_conll}, "example.dev", (line, column)),
      "msra": ({"msra_train.txt": conll.replace(b"I-LOC", b"E-LOC"),  # BMES
                "msra_test.txt": b"\xe5\x8c\x97 S-LOC\n"}, "msra_train.txt", (line, column)),
      "cluener2020": ({"train.json": jsonl[0], "dev.json": b"", "test.json": b""}, "train.json", jsonl[1:]),
      "cmeee": ({"CMeEE_train.json": cmeee[0], "CMeEE_dev.json": b"[]", "CMeEE_test.json": b"[]"},
                "CMeEE_train.json", cmeee[1:]),
  }
  for name, (files, bad_file, (want_line, want_column)) in cases.items():
    manual = tmp_path / name
    manual.mkdir()
    for fname, content in files.items():
      (manual / fname).write_bytes(content)
    with pytest.raises(DataError) as e:
      load_split(name, "dev", manual_dir=manual, data_dir=tmp_path / f"tfds-{name}")
    check(e.value, manual / bad_file, want_line, want_column, b"\xff")
  manual = tmp_path / "germeval2014"
  manual.mkdir()
  with zipfile.ZipFile(manual / "GermEval2014.zip", "w") as zf:
    for split in ("train", "dev", "test"):
      zf.writestr(f"GermEval2014/germ.{split}.iob2", germ if split == "train" else b"EU\tB-ORG\tO\n")
  with pytest.raises(DataError) as e:
    load_split("germeval2014", "dev", manual_dir=manual, data_dir=tmp_path / "tfds-germeval2014")
  check(e.value, f"{manual / 'GermEval2014.zip'}!GermEval2014/germ.train.iob2", line, column, b"\xff")


@pytest.mark.parametrize("fmt", ["jsonl", "conll", "cblue"])
def test_user_files_through_the_config(tmp_path, fmt):
  text = {"jsonl": jsonl_text, "conll": conll_text, "cblue": cblue_text}[fmt]()
  data, line, column = place(text, b"\xe9")
  path = tmp_path / f"train.{fmt}"
  path.write_bytes(data)
  c = ml_collections.ConfigDict(dict(name=fmt, train_file=str(path), dev_file="", test_file="", strict=False,
                                     dev_fraction=0.05, max_train_records=0, max_eval_records=0, conll_scheme="",
                                     conll_tag_cols=(), conll_joiner="auto"))
  with pytest.raises(UserError) as e:  # even when bad records are skipped: the file cannot be read on
    load_records(c)
  check(e.value, path, line, column, b"\xe9")


def test_tokenizer_files(tmp_path):
  CharTokenizer.build(["".join(chr(0x4e00 + i) for i in range(3000))]).save(str(tmp_path))
  vocab = tmp_path / "char_vocab.json"
  text = json.dumps(json.loads(vocab.read_text(encoding="utf-8")), ensure_ascii=False, indent=1)
  vocab.write_text(text, encoding="utf-8")
  assert CharTokenizer.load(str(tmp_path)).vocab_size == 3002
  k = text.index('"\u4e00\u4e00"' if '"\u4e00\u4e00"' in text else '"' + chr(0x4e00 + 2900) + '"')
  data, line, column = place(text[:k + 1] + MARK + text[k + 1:], b"\xff")  # one entry, far into the file
  vocab.write_bytes(data)
  with pytest.raises(DataError) as e:
    CharTokenizer.load(str(tmp_path))
  check(e.value, vocab, line, column, b"\xff")
  lines = text.split("\n")
  lines[1000] = lines[1000].rstrip(",")
  vocab.write_text("\n".join(lines), encoding="utf-8")
  with pytest.raises(DataError, match=r"char_vocab.json:1002: malformed JSON \(Expecting ',' delimiter at column "
                     r"\d+\): expected the tokenizer file written by training"):
    CharTokenizer.load(str(tmp_path))
