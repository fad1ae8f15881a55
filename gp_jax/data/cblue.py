"""The CBLUE / CMeEE file format: read it, and write CMeEE and CLUENER submissions.

A CMeEE file (CBLUE benchmark, `CMeEE_{train,dev,test}.json`, `CMeEE-V2_*.json`) is ONE JSON document, an
array of records:

  [{"text": "...", "entities": [{"start_idx": 3, "end_idx": 5, "type": "dis", "entity": "..."}, ...]}, ...]

`end_idx` is INCLUSIVE; nested and overlapping entities are allowed; the test split has no "entities" (or an
empty list). Our Records have exclusive ends (types.py). Three functions:

  iter_cblue(path)                     -> (index, record) for each record, streamed and validated
  to_cmeee(record, entities)           -> the CMeEE submission record (the input record, "entities" filled)
  cluener_line(id, text, entities)     -> one CLUENER submission line {"id", "label": {type: {mention: [[s, e]]}}}

`read_cblue(path)` wraps `iter_cblue` into `readers.Records` (with a `ReadReport`), as `read_jsonl` does for
JSON lines; it backs `data.name=cblue` (user files) and the `cmeee`/`cmeee_v2` corpora.
"""

from __future__ import annotations

import codecs
import json
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from gp_jax.data.readers import DataError, ReadReport, Records, utf8_error
from gp_jax.data.types import Entity, Record

CHUNK_CHARS = 1 << 20  # bytes (characters for a text stream without a byte buffer) read per step by iter_cblue


class _Stream:
  """Text of a file read in chunks, with the consumed prefix dropped and line numbers kept.

  Bytes are decoded here, strictly, so that a byte that is not UTF-8 is reported at its own line and column
  (a text file is read through its byte buffer when it has one, as sys.stdin does); a UTF-8 byte-order mark at
  the start is dropped."""

  def __init__(self, f, where: str, chunk: int):
    self.f, self.where, self.chunk = getattr(f, "buffer", f), where, chunk
    self.buf, self.pos, self.eof = "", 0, False
    self.line, self._counted = 1, 0  # line number at buf[_counted]
    self._pending = b""  # the start of a character cut by the chunk boundary
    self._newlines, self._tail = 0, 0  # over all text decoded so far: line breaks, characters after the last one
    self._at_start = True  # no text decoded yet

  def _decode(self, piece) -> str:
    """The text of the next chunk read; raises DataError at the true line and column of a bad byte."""
    if isinstance(piece, str):
      text = piece
    else:
      data = self._pending + piece
      if self._at_start and data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
      try:
        text, self._pending = data.decode("utf-8"), b""
      except UnicodeDecodeError as e:
        if piece and e.end == len(data) and len(data) - e.start < 4:  # a character cut by the chunk: read on
          text, self._pending = data[:e.start].decode("utf-8"), data[e.start:]
        else:
          raise utf8_error(self.where, data, e, line=self._newlines + 1, column=self._tail + 1) from None
    if self._at_start and text:
      text, self._at_start = text.removeprefix("\ufeff"), False
    return text

  def more(self) -> bool:
    """Reads one more chunk (dropping what was consumed); False at end of file."""
    if self.eof:
      return False
    try:
      piece = self.f.read(self.chunk)
    except UnicodeDecodeError as e:  # a text stream without a byte buffer decodes by itself: only a bound is known
      raise DataError(self.where, None, f"not valid UTF-8 after line {self._newlines + 1} ({e.reason}); convert "
                      "the file to UTF-8 (e.g. iconv -f GB18030 -t UTF-8)", reason="encoding") from None
    text = self._decode(piece)
    n = text.count("\n")
    self._newlines += n
    self._tail = len(text) - text.rfind("\n") - 1 if n else self._tail + len(text)
    self.line_at(self.pos)
    self.buf, self._counted, self.pos = self.buf[self.pos:] + text, 0, 0
    self.eof = not piece
    return bool(text) or self.more()

  def line_at(self, pos: int) -> int:
    """1-based line of buf[pos]; pos must not go backwards between calls."""
    self.line += self.buf.count("\n", self._counted, pos)
    self._counted = pos
    return self.line

  def peek(self) -> str:
    """The next non-blank character ("" at end of file), without consuming it."""
    while True:
      while self.pos < len(self.buf) and self.buf[self.pos] in " \t\r\n":
        self.pos += 1
      if self.pos < len(self.buf) or not self.more():
        return self.buf[self.pos:self.pos + 1]


def _int(value: Any, what: str, where: str, line: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise DataError(where, line, f"{what} is {value!r}: expected an integer", reason="bad_value")
  return value


def check_record(obj: Any, *, where: str, line: int | None, index: int, allow_unlabelled: bool = True) -> None:
  """Raises DataError (file, line, record index) unless `obj` is a valid CMeEE record."""
  at = f"record {index}"
  if not isinstance(obj, dict):
    raise DataError(where, line, f"{at} is a JSON {type(obj).__name__}: expected an object", reason="bad_json")
  text = obj.get("text")
  if not isinstance(text, str):
    raise DataError(where, line, f'{at}: "text" is {text!r:.40}: expected a string', reason="missing_key"
                    if "text" not in obj else "bad_value")
  if "entities" not in obj:
    if allow_unlabelled:
      return
    raise DataError(where, line, f'{at}: no "entities": expected labelled records', reason="missing_key")
  ents = obj["entities"]
  if not isinstance(ents, list):
    raise DataError(where, line, f'{at}: "entities" is {type(ents).__name__}: expected a list', reason="bad_value")
  for k, e in enumerate(ents):
    if not isinstance(e, dict):
      raise DataError(where, line, f"{at}: entity #{k} is {type(e).__name__}: expected an object",
                      reason="bad_value")
    missing = [key for key in ("start_idx", "end_idx", "type") if key not in e]
    if missing:
      raise DataError(where, line, f"{at}: entity #{k} lacks {missing}: expected start_idx, end_idx, type, entity",
                      reason="missing_key")
    start = _int(e["start_idx"], f"{at}: entity #{k} start_idx", where, line)
    end = _int(e["end_idx"], f"{at}: entity #{k} end_idx", where, line)
    kind = e["type"]
    if not isinstance(kind, str) or not kind:
      raise DataError(where, line, f"{at}: entity #{k} type {kind!r}: expected a non-empty string",
                      reason="bad_value")
    if start > end:
      raise DataError(where, line, f"{at}: entity #{k} {kind} start_idx {start} > end_idx {end}: expected "
                      "start_idx <= end_idx (end_idx is inclusive)", reason="empty_span")
    if start < 0 or end >= len(text):
      raise DataError(where, line, f"{at}: entity #{k} {kind} [{start}, {end}] is outside the text (length "
                      f"{len(text)}; end_idx is inclusive)", reason="span_out_of_range")
    if "entity" in e and e["entity"] != text[start:end + 1]:
      raise DataError(where, line, f"{at}: entity #{k} {kind} {e['entity']!r} != text[{start}:{end + 1}] "
                      f"{text[start:end + 1]!r}", reason="entity_text_mismatch")


def iter_cblue(path: str | os.PathLike, *, strict: bool = True, allow_unlabelled: bool = True,
               report: ReadReport | None = None, chunk_chars: int = CHUNK_CHARS) -> Iterator[tuple[int, dict]]:
  """Yields (index, record) for each record of a CBLUE/CMeEE JSON array, validated, one at a time.

  The file is one JSON document but is never held whole: it is read `chunk_chars` bytes at a time and each
  record is decoded with `json.JSONDecoder.raw_decode` as soon as it is complete, so memory stays at about one
  chunk plus one record (a 100 MB file streams). Records are the file's dicts as they are ("text", "entities"
  with inclusive `end_idx`, any other keys). A record that fails `check_record` raises DataError naming the file,
  the line where the record starts and its 0-based index; with strict=False it is skipped and counted in
  `report` (reason -> count). Malformed JSON always raises (the array cannot be resynchronised).
  """
  where = os.fspath(path)
  if not os.path.isfile(where):
    raise DataError(where, None, "no such file", reason="missing_file")
  with open(where, "rb") as f:
    yield from iter_cblue_file(f, source=where, strict=strict, allow_unlabelled=allow_unlabelled, report=report,
                               chunk_chars=chunk_chars)


def iter_json_array(f, *, source: str, expected: str,
                    chunk_chars: int = CHUNK_CHARS) -> Iterator[tuple[int, int, Any]]:
  """(index, line where it starts, value) of each element of a JSON array, streamed in chunks
  (strict UTF-8, a bad byte at its true line and column). Malformed JSON raises DataError (file, line, `expected`)."""
  decoder = json.JSONDecoder()
  s = _Stream(f, source, chunk_chars)
  if s.peek() != "[":
    found = f"starts with {s.buf[s.pos:s.pos + 20]!r}" if s.peek() else "is empty"
    raise DataError(source, s.line_at(s.pos) if s.peek() else None, f"{found}: expected {expected}",
                    reason="bad_json")
  s.pos += 1
  index = 0
  while True:
    c = s.peek()
    if c == "]":
      s.pos += 1
      break
    if index:
      if c != ",":
        raise DataError(source, s.line_at(s.pos), f"after record {index - 1}: got {c or 'end of file'!r}: "
                        "expected ',' or ']'", reason="bad_json")
      s.pos += 1
      s.peek()
    line = s.line_at(s.pos)
    while True:  # decode the element, reading more while it is incomplete
      try:
        obj, end = decoder.raw_decode(s.buf, s.pos)
      except json.JSONDecodeError as e:
        if s.eof:
          at = line + s.buf.count("\n", s.pos, e.pos)
          raise DataError(source, at, f"record {index}: malformed JSON ({e.msg})"
                          + ("" if at == line else f" in the record that starts on line {line}")
                          + f": expected {expected} (python -m json.tool FILE shows where it breaks)",
                          reason="bad_json") from None
        s.more()
        continue
      if end < len(s.buf) or s.eof:  # a value ending at the buffer's end may go on (a number)
        break
      s.more()
    s.pos = end
    yield index, line, obj
    index += 1
  if s.peek():
    raise DataError(source, s.line_at(s.pos), f"text after the closing ']': {s.buf[s.pos:s.pos + 20]!r}",
                    reason="bad_json")


def iter_cblue_file(f, *, source: str, strict: bool = True, allow_unlabelled: bool = True,
                    report: ReadReport | None = None, chunk_chars: int = CHUNK_CHARS) -> Iterator[tuple[int, dict]]:
  """`iter_cblue` over an open file, binary or text (`source` names it in errors), e.g. standard input or a gs://
  object."""
  expected = 'a JSON array of records [{"text", "entities"}, ...]'
  for index, line, obj in iter_json_array(f, source=source, expected=expected, chunk_chars=chunk_chars):
    try:
      check_record(obj, where=source, line=line, index=index, allow_unlabelled=allow_unlabelled)
    except DataError as e:
      if strict:
        raise
      if report is not None:
        report.skip(e)
    else:
      yield index, obj


def from_cmeee(obj: Mapping, *, id: str) -> Record:  # pylint: disable=redefined-builtin
  """A validated CMeEE record -> our Record (end exclusive), entities sorted by (start, end, type)."""
  ents = [Entity(start=e["start_idx"], end=e["end_idx"] + 1, type=e["type"]) for e in obj.get("entities") or ()]
  ents.sort(key=lambda e: (e["start"], e["end"], e["type"]))
  return Record(id=str(obj.get("id", id)), text=obj["text"], entities=ents)


def read_cblue(path: str | os.PathLike, *, strict: bool = True, allow_unlabelled: bool = False,
               id_prefix: str | None = None) -> Records:
  """A CBLUE/CMeEE JSON array -> Records with a ReadReport (like readers.read_jsonl).

  Ids: the record's "id" when it has one, else f"{id_prefix}-{index}" (default prefix: the file's stem).
  A record without "entities" is an error unless `allow_unlabelled` (test splits)."""
  where = os.fspath(path)
  prefix = id_prefix or os.path.splitext(os.path.basename(where))[0]
  report = ReadReport(where)
  records = [from_cmeee(obj, id=f"{prefix}-{i}")
             for i, obj in iter_cblue(where, strict=strict, allow_unlabelled=allow_unlabelled, report=report)]
  return report.finish(records)


def to_cmeee(record: Mapping, entities: Iterable[Mapping]) -> dict:
  """The CMeEE submission record: a copy of `record` (it needs "text") with "entities" set from ours.

  entities: dicts with "start", "end" (character offsets, end EXCLUSIVE), "type" (any other key, e.g. "score",
  is ignored). Out: {"start_idx", "end_idx" (INCLUSIVE), "type", "entity": the text there}, sorted by
  (start_idx, end_idx, type); nested spans are kept. `to_cmeee(r, from_cmeee(r)["entities"])` gives r back
  (up to entity order).
  """
  text = record["text"]
  out = dict(record)
  out["entities"] = [{"start_idx": int(e["start"]), "end_idx": int(e["end"]) - 1, "type": e["type"],
                      "entity": text[int(e["start"]):int(e["end"])]}
                     for e in sorted(entities, key=lambda e: (int(e["start"]), int(e["end"]), e["type"]))]
  return out


def cluener_line(id: Any, text: str, entities: Iterable[Mapping]) -> str:  # pylint: disable=redefined-builtin
  """One line of a CLUENER submission: {"id": id, "label": {type: {mention: [[start, end_inclusive], ...]}}}.

  entities as in `to_cmeee` (end exclusive). `"label": {}` when there are none. An id that is a string of digits
  is written as an int, as CLUENER's test.json has it ("id": 0); other ids are written as given. No newline.
  """
  if isinstance(id, str) and id.isdigit():
    id = int(id)
  label: dict[str, dict[str, list[list[int]]]] = {}
  for e in sorted(entities, key=lambda e: (int(e["start"]), int(e["end"]), e["type"])):
    s, t = int(e["start"]), int(e["end"])
    label.setdefault(e["type"], {}).setdefault(text[s:t], []).append([s, t - 1])
  return json.dumps({"id": id, "label": label}, ensure_ascii=False)
