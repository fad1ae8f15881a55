"""Readers for user files: JSON lines and CoNLL-style columns -> Records (see types.py).

Both return a `Records` list carrying a `ReadReport`: records kept, records skipped by
reason (lenient mode), tag repairs (see tags.py). With strict=True the first bad record
raises `DataError` naming the file, the line and what was expected. JSON lines may carry
relations (`merge_relations`); the CasRel triple format is read by `gp_jax.data.relations`.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import io
import json
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from gp_jax.data import tags as tags_lib
from gp_jax.errors import UserError
from gp_jax.data.types import Entity, Record, Relation

log = logging.getLogger(__name__)

DOCSTART = "-DOCSTART-"
_COLUMN_SEP = re.compile(r"[ \t]+")  # ASCII blanks only: CJK/NBSP spaces may be tokens


class DataError(UserError):
  """Bad input data: `path:line: what (expected ...)`; `reason` is a short key for counting."""

  def __init__(self, path: str, line: int | None, message: str, *, reason: str):
    where = f"{path}:{line}" if line is not None else str(path)
    super().__init__(f"{where}: {message}")
    self.path, self.line, self.reason = path, line, reason


@dataclasses.dataclass
class ReadReport:
  """What one read did: kept/skipped records, skip reasons, tag repairs, first errors."""

  path: str
  records: int = 0
  entities: int = 0
  skipped: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  repairs: collections.Counter = dataclasses.field(default_factory=collections.Counter)
  repaired: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)  # record id -> its repairs
  errors: list[str] = dataclasses.field(default_factory=list)  # first few skip messages
  scheme: str | None = None  # CoNLL only: the scheme used (given or detected)
  joiner: str | None = None  # CoNLL only: the string between tokens (given or detected)
  relations: int = 0  # relations kept (records with "relations" only)
  merged: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # duplicate_entity, ...
  alignments: collections.Counter = dataclasses.field(default_factory=collections.Counter)  # CasRel: unique, ...

  max_errors = 5

  @property
  def num_skipped(self) -> int:
    return sum(self.skipped.values())

  def skip(self, error: DataError) -> None:
    self.skipped[error.reason] += 1
    if len(self.errors) < self.max_errors:
      self.errors.append(str(error))

  @property
  def has_relations(self) -> bool:
    return bool(self.relations or self.merged or self.alignments)

  def summary(self) -> str:
    s = f"{self.path}: {self.records} records, {self.entities} entities"
    if self.has_relations:
      s += f", {self.relations} relations, merged {dict(self.merged)}"
      if self.alignments:
        s += f", alignments {dict(self.alignments)}"
    if self.scheme:
      s += f", scheme {self.scheme}"
    if self.joiner is not None:
      s += f", joiner {self.joiner!r}"
    s += f", skipped {self.num_skipped}" + (f" {dict(self.skipped)}" if self.skipped else "")
    s += f", tag repairs {sum(self.repairs.values())}" + (f" {dict(self.repairs)}" if self.repairs else "")
    return s

  def finish(self, records: list[Record]) -> Records:
    """Counts what a read kept, logs the summary, and returns `records` carrying this report."""
    self.records, self.entities = len(records), sum(len(r["entities"]) for r in records)
    self.relations = sum(len(r.get("relations", ())) for r in records)
    self.log()
    return Records(records, self)

  def log(self) -> None:
    level = logging.WARNING if self.skipped else logging.INFO
    log.log(level, "%s", self.summary())
    for e in self.errors:
      log.warning("skipped: %s", e)

  def as_dict(self) -> dict[str, Any]:
    out = {
        "records": self.records, "entities": self.entities, "scheme": self.scheme, "joiner": self.joiner,
        "skipped": dict(self.skipped), "repairs": dict(self.repairs), "repaired_records": len(self.repaired),
    }
    if self.has_relations:  # entity reads keep their keys
      out.update(relations=self.relations, merged=dict(self.merged), alignments=dict(self.alignments))
    return out


class Records(list):
  """A plain list of Records with the `report` of the read that made it."""

  def __init__(self, records: Iterable[Record], report: ReadReport):
    super().__init__(records)
    self.report = report


PathOrFile = str | os.PathLike | TextIO


def _open(source: PathOrFile, name: str | None) -> tuple[Any, str, bool]:
  """-> (file, name for messages, whether we opened it); a path is opened in binary for `text_lines`."""
  if isinstance(source, (str, os.PathLike)):
    return open(source, "rb"), name or os.fspath(source), True
  if isinstance(source, io.IOBase) or hasattr(source, "readline"):
    return source, name or str(getattr(source, "name", "<stream>")), False
  raise TypeError(f"expected a path or a file, got {type(source).__name__}")


def utf8_error(name: str, data: bytes, error: UnicodeDecodeError, *, line: int = 1, column: int = 1) -> DataError:
  """The DataError for the bad byte at `error.start` of `data`, whose first byte is at `line`, `column` of the
  file: the true line and column of that byte, what it is, and how to fix the file."""
  start = error.start
  line += data.count(b"\n", 0, start)
  line_start = data.rfind(b"\n", 0, start) + 1
  column = (column if line_start == 0 else 1) + len(data[line_start:start].decode("utf-8", "replace"))
  return DataError(name, line, f"not valid UTF-8: byte 0x{data[start]:02x} at column {column} ({error.reason}); "
                   "convert the file to UTF-8 (e.g. iconv -f GB18030 -t UTF-8)", reason="encoding")


def text_lines(f: Any, name: str) -> Iterator[tuple[int, str]]:
  """(1-based line number, line without its line break) of a binary or text file, decoded as strict UTF-8 one
  line at a time, so that a bad byte is reported at its own line (a text file is read through its byte buffer
  when it has one, as sys.stdin does). A UTF-8 byte-order mark at the start is dropped."""
  raw = getattr(f, "buffer", f)
  for lineno, line in enumerate(raw, 1):
    if isinstance(line, bytes):
      if lineno == 1 and line.startswith(codecs.BOM_UTF8):
        line = line[len(codecs.BOM_UTF8):]
      try:
        line = line.decode("utf-8")
      except UnicodeDecodeError as e:
        raise utf8_error(name, line, e, line=lineno) from None
    elif lineno == 1:
      line = line.removeprefix("\ufeff")
    yield lineno, line.rstrip("\r\n")


def check_entities(text: str, entities: Sequence[Entity], *, where: str, line: int | None,
                   allow_untyped: bool = False) -> None:
  """Validates offsets against `text`: 0 <= start < end <= len(text), type a non-empty str ("" too with
  `allow_untyped`, as entities of relation records may be)."""
  for e in entities:
    start, end, kind = e["start"], e["end"], e["type"]
    if not isinstance(kind, str) or not (kind or allow_untyped):
      raise DataError(where, line, f"entity type {kind!r}: expected a non-empty string", reason="bad_value")
    if start >= end:
      raise DataError(where, line, f"entity {kind} [{start}, {end}): expected start < end", reason="empty_span")
    if start < 0 or end > len(text):
      raise DataError(where, line, f"entity {kind} [{start}, {end}) is outside the text (length {len(text)})",
                      reason="span_out_of_range")


# --- JSON lines ---------------------------------------------------------------------------


def _int(value: Any, what: str, where: str, line: int) -> int:
  if isinstance(value, bool) or not isinstance(value, int):
    raise DataError(where, line, f"{what} is {value!r}: expected an integer", reason="bad_value")
  return value


def _record_entities(obj: dict, text: str, where: str, line: int, *, untyped: bool = False) -> list[Entity]:
  """Record format: "entities": [{"start", "end", "type", optional "text"}], end exclusive; `untyped` (a record
  with relations): "type" may be "" or absent (then "")."""
  raw = obj["entities"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'"entities" is {type(raw).__name__}: expected a list', reason="bad_value")
  out = []
  required = ("start", "end") if untyped else ("start", "end", "type")
  for k, e in enumerate(raw):
    if not isinstance(e, dict):
      raise DataError(where, line, f"entity #{k} is {type(e).__name__}: expected an object", reason="bad_value")
    missing = [key for key in required if key not in e]
    if missing:
      raise DataError(where, line, f"entity #{k} lacks {missing}: expected keys {', '.join(required)}",
                      reason="missing_key")
    ent = Entity(start=_int(e["start"], f"entity #{k} start", where, line),
                 end=_int(e["end"], f"entity #{k} end", where, line), type=e.get("type", ""))
    check_entities(text, [ent], where=where, line=line, allow_untyped=untyped)
    if "text" in e and text[ent["start"]:ent["end"]] != e["text"]:
      raise DataError(where, line, f"entity #{k} text {e['text']!r} != text[{ent['start']}:{ent['end']}] "
                      f"{text[ent['start']:ent['end']]!r}", reason="entity_text_mismatch")
    out.append(ent)
  return out


def _record_relations(obj: dict, num_entities: int, where: str, line: int) -> list[Relation]:
  """"relations": [{"head", "tail", "type"}], head and tail indexing the record's "entities"."""
  raw = obj["relations"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'"relations" is {type(raw).__name__}: expected a list', reason="bad_value")
  out = []
  for k, r in enumerate(raw):
    if not isinstance(r, dict):
      raise DataError(where, line, f"relation #{k} is {type(r).__name__}: expected an object", reason="bad_value")
    missing = [key for key in ("head", "tail", "type") if key not in r]
    if missing:
      raise DataError(where, line, f"relation #{k} lacks {missing}: expected keys head, tail, type",
                      reason="missing_key")
    for key in ("head", "tail"):
      i = _int(r[key], f"relation #{k} {key}", where, line)
      if not 0 <= i < num_entities:
        raise DataError(where, line, f"relation #{k} {key} {i} points at no entity: expected an index into the "
                        f"record's {num_entities} entities (0 to {num_entities - 1}); fix the index or add the "
                        "entity", reason="bad_relation")
    if not isinstance(r["type"], str) or not r["type"]:
      raise DataError(where, line, f"relation #{k} type {r['type']!r}: expected a non-empty string",
                      reason="bad_value")
    out.append(Relation(head=r["head"], tail=r["tail"], type=r["type"]))
  return out


def merge_relations(entities: Sequence[Entity], relations: Sequence[Relation]
                    ) -> tuple[list[Entity], list[Relation], collections.Counter]:
  """Merges entities with the same (start, end, type) and then repeated (head, tail, type) relations, keeping
  first occurrences in order; relation indices are remapped. -> (entities, relations, counts of what was
  merged: duplicate_entity, repeated_relation)."""
  counts = collections.Counter()
  index, kept, remap = {}, [], []
  for e in entities:
    key = (e["start"], e["end"], e["type"])
    if key in index:
      counts["duplicate_entity"] += 1
    else:
      index[key] = len(kept)
      kept.append(e)
    remap.append(index[key])
  seen, rels = set(), []
  for r in relations:
    rel = Relation(head=remap[r["head"]], tail=remap[r["tail"]], type=r["type"])
    key = (rel["head"], rel["tail"], rel["type"])
    if key in seen:
      counts["repeated_relation"] += 1
    else:
      seen.add(key)
      rels.append(rel)
  return kept, rels, counts


def _cluener_entities(obj: dict, text: str, where: str, line: int) -> list[Entity]:
  """CLUENER format: "label": {type: {entity_text: [[start, end], ...]}}, end INCLUSIVE."""
  label = obj["label"]
  if not isinstance(label, dict):
    raise DataError(where, line, f'"label" is {type(label).__name__}: expected {{type: {{text: [[s, e]]}}}}',
                    reason="bad_value")
  out = []
  for kind, by_text in label.items():
    if not isinstance(by_text, dict):
      raise DataError(where, line, f'"label"[{kind!r}] is {type(by_text).__name__}: expected {{text: [[s, e]]}}',
                      reason="bad_value")
    for ent_text, pairs in by_text.items():
      if not isinstance(pairs, list):
        raise DataError(where, line, f"spans of {ent_text!r} are {pairs!r}: expected [[start, end], ...]",
                        reason="bad_value")
      for pair in pairs:
        if not isinstance(pair, list) or len(pair) != 2:
          raise DataError(where, line, f"span {pair!r} of {ent_text!r}: expected [start, end]", reason="bad_value")
        start = _int(pair[0], f"start of {ent_text!r}", where, line)
        end = _int(pair[1], f"end of {ent_text!r}", where, line) + 1  # inclusive -> exclusive
        ent = Entity(start=start, end=end, type=kind)
        check_entities(text, [ent], where=where, line=line)
        if text[start:end] != ent_text:
          raise DataError(where, line, f"{kind} {ent_text!r} at [{start}, {end - 1}] (inclusive) but the text there "
                          f"is {text[start:end]!r}", reason="entity_text_mismatch")
        out.append(ent)
  out.sort(key=lambda e: (e["start"], e["end"], e["type"]))
  return out


def read_jsonl(path: PathOrFile, *, strict: bool = True, allow_unlabelled: bool = False,
               id_prefix: str | None = None, name: str | None = None) -> Records:
  """Reads JSON lines in the Record format or the CLUENER format, per line.

  path: a file path or an open text file (then `name` names it in messages).

  Record: {"text", "entities": [{"start", "end", "type"[, "text"]}]} (end exclusive), optionally with
  "relations": [{"head", "tail", "type"}] indexing "entities"; in such a record an entity's "type" may be ""
  or absent (untyped), duplicate entities and repeated relations are merged (counted in report.merged).
  CLUENER: {"text", "label": {type: {entity_text: [[start, end], ...]}}} (end inclusive).
  A line with neither "entities" nor "label" is an error unless `allow_unlabelled`
  (then it gets no entities). "id" is kept when present (as str), else
  f"{id_prefix}-{n}" with n the 0-based record number in the file. Blank lines are ignored.
  """
  f, where, owned = _open(path, name)
  prefix = id_prefix or os.path.splitext(os.path.basename(where))[0]
  report = ReadReport(where)
  records: list[Record] = []
  n = 0
  try:
    for line, raw in text_lines(f, where):
      if not raw.strip():
        continue
      n += 1
      try:
        records.append(_parse_json_line(raw, where, line, f"{prefix}-{n - 1}", allow_unlabelled, report.merged))
      except DataError as e:
        if strict:
          raise
        report.skip(e)
  finally:
    if owned:
      f.close()
  return report.finish(records)


def _parse_json_line(raw: str, where: str, line: int, default_id: str, allow_unlabelled: bool,
                     merged: collections.Counter) -> Record:
  try:
    obj = json.loads(raw)
  except json.JSONDecodeError as e:
    raise DataError(where, line, f"malformed JSON ({e.msg} at column {e.colno}): expected one object per line",
                    reason="bad_json") from e
  if not isinstance(obj, dict):
    raise DataError(where, line, f"got a JSON {type(obj).__name__}: expected an object", reason="bad_json")
  if "text" not in obj:
    raise DataError(where, line, 'missing key "text": expected {"text", "entities"} or {"text", "label"}',
                    reason="missing_key")
  text = obj["text"]
  if not isinstance(text, str):
    raise DataError(where, line, f'"text" is {type(text).__name__}: expected a string', reason="bad_value")
  if "relations" in obj:
    if "entities" not in obj:
      raise DataError(where, line, '"relations" without "entities": expected {"text", "entities", "relations"} '
                      "with head and tail indexing the entities", reason="missing_key")
    entities = _record_entities(obj, text, where, line, untyped=True)
    relations = _record_relations(obj, len(entities), where, line)
    entities, relations, counts = merge_relations(entities, relations)
    merged.update(counts)
    return Record(id=str(obj.get("id", default_id)), text=text, entities=entities, relations=relations)
  if "entities" in obj:
    entities = _record_entities(obj, text, where, line)
  elif "label" in obj:
    entities = _cluener_entities(obj, text, where, line)
  elif allow_unlabelled:
    entities = []
  else:
    raise DataError(where, line, 'missing key "entities" (or CLUENER "label"): expected labelled records',
                    reason="missing_key")
  rid = obj.get("id", default_id)
  return Record(id=str(rid), text=text, entities=entities)


# --- CoNLL columns ------------------------------------------------------------------------


@dataclasses.dataclass
class _Sentence:
  lines: list[int]  # line number of each token
  tokens: list[str]
  tags: list[list[str]]  # [level][token]
  error: DataError | None = None  # first problem seen while collecting


def _conll_sentences(f: TextIO, where: str, *, token_col: int, tag_cols: Sequence[int] | None,
                     sep: str | None) -> Iterator[_Sentence]:
  """Groups token lines into sentences; tag_cols None = the last column."""
  ncols = first_line = None  # column count, fixed by the first token line
  cur = None
  for line, raw in text_lines(f, where):
    cols = raw.split(sep) if sep is not None else _COLUMN_SEP.split(raw.strip(" \t"))
    if not raw.strip(" \t") or cols[0] == DOCSTART or (len(cols) > token_col and cols[token_col] == DOCSTART):
      if cur is not None:  # blank or -DOCSTART- line: end of sentence
        yield cur
        cur = None
      continue
    if ncols is None:
      ncols, first_line = len(cols), line
      if tag_cols is None:
        tag_cols = [ncols - 1]
      need = max([token_col, *tag_cols]) + 1
      if ncols < need or ncols < 2:
        raise DataError(where, line, f"{ncols} column(s) {raw!r}: expected at least {max(need, 2)} "
                        f"(token column {token_col}, tag columns {list(tag_cols)})", reason="column_count")
    if cur is None:
      cur = _Sentence([], [], [[] for _ in tag_cols])
    if cur.error is not None:
      continue
    if len(cols) != ncols:
      cur.error = DataError(where, line, f"{len(cols)} columns {raw!r}: expected {ncols} as on line {first_line}",
                            reason="column_count")
    elif not cols[token_col]:
      cur.error = DataError(where, line, f"empty token in {raw!r}: expected a non-empty token column",
                            reason="bad_value")
    else:
      cur.lines.append(line)
      cur.tokens.append(cols[token_col])
      for level, c in enumerate(tag_cols):
        cur.tags[level].append(cols[c])
  if cur is not None:
    yield cur


def read_conll(path: PathOrFile, *, scheme: str | None = None, strict: bool = True, token_col: int = 0,
               tag_cols: Sequence[int] | None = None, sep: str | None = None, joiner: str = " ",
               id_prefix: str | None = None, name: str | None = None) -> Records:
  """Reads token-per-line columns, blank line between sentences, into Records.

  path: a file path or an open text file (then `name` names it in messages).

  token_col: column of the token; tag_cols: columns of tags, one per nesting level
  (default: the last column); sep: column separator (default: runs of spaces/tabs).
  scheme: BIO/IOB2, IOB1, BIOES, BMES, or None to detect it once for the whole file
  (all levels). `-DOCSTART-` lines are skipped and end the sentence. The text is the
  tokens joined by `joiner` (" " for words, "" for Chinese characters, "auto" to decide once
  per file with `detect_joiner`); entities are character offsets into it, sorted by
  (start, end, type). Ids are f"{id_prefix}-{n}".
  """
  f, where, owned = _open(path, name)
  prefix = id_prefix or os.path.splitext(os.path.basename(where))[0]
  report = ReadReport(where)
  try:
    if scheme is not None:
      try:
        scheme = tags_lib.normalize_scheme(scheme)
      except ValueError as e:
        raise DataError(where, None, str(e), reason="unknown_scheme") from None
    sentences = list(_conll_sentences(f, where, token_col=token_col,
                                      tag_cols=None if tag_cols is None else list(tag_cols), sep=sep))
  finally:
    if owned:
      f.close()
  if scheme is None:
    scheme = _detect(sentences, where)
  report.scheme = scheme
  if joiner == "auto":
    joiner = detect_joiner(tok for s in sentences for tok in s.tokens)
    log.info("%s: tokens joined by %r (%s)", where, joiner,
             "single CJK characters" if joiner == "" else "not single CJK characters")
  report.joiner = joiner
  records: list[Record] = []
  for n, sent in enumerate(sentences):
    try:
      if sent.error is not None:
        raise sent.error
      records.append(_conll_record(sent, scheme, joiner, f"{prefix}-{n}", where, report))
    except DataError as e:
      if strict:
        raise
      report.skip(e)
  return report.finish(records)


# Blocks whose characters are written without spaces between them (char-per-line corpora).
_CJK_RANGES = (
    (0x2E80, 0x2FDF),  # CJK radicals, Kangxi radicals
    (0x3000, 0x303F),  # CJK symbols and punctuation
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x3100, 0x312F),  # bopomofo
    (0x3190, 0x31FF),  # kanbun, bopomofo ext., CJK strokes, katakana ext.
    (0x3200, 0x4DBF),  # enclosed CJK, CJK compatibility, ideographs ext. A
    (0x4E00, 0x9FFF),  # CJK unified ideographs
    (0xAC00, 0xD7AF),  # hangul syllables
    (0xF900, 0xFAFF),  # CJK compatibility ideographs
    (0xFE30, 0xFE4F),  # CJK compatibility forms
    (0xFF00, 0xFFEF),  # halfwidth and fullwidth forms (，。！ and fullwidth letters)
    (0x20000, 0x3FFFF),  # ideographs ext. B and later
)


def is_cjk(char: str) -> bool:
  """Whether one character lies in a CJK block (ideographs, kana, hangul, CJK/fullwidth punctuation)."""
  code = ord(char)
  return any(a <= code <= b for a, b in _CJK_RANGES)


def detect_joiner(tokens: Iterable[str]) -> str:
  """"" when every token is one character (NFC) and at least half of them are CJK, else " ".

  Char-per-line Chinese/Japanese corpora also hold single digits, Latin letters and ASCII
  punctuation (often over 10% of the tokens in technical text); those stay glued to their
  neighbours, as in the original text. A word-per-line file has some longer token. No tokens -> " ".
  """
  n = n_cjk = 0
  for tok in tokens:
    tok = unicodedata.normalize("NFC", tok)
    if len(tok) != 1:
      return " "
    n += 1
    n_cjk += is_cjk(tok)
  return "" if n and 2 * n_cjk >= n else " "


def _detect(sentences: list[_Sentence], where: str) -> str:
  """One scheme for the file; sentences with malformed tags are left to the decoder to report."""

  def parses(level):
    try:
      for t in level:
        tags_lib.split_tag(t)
      return True
    except tags_lib.TagError:
      return False

  seqs = [level for s in sentences if s.error is None for level in s.tags if parses(level)]
  try:
    return tags_lib.detect_scheme(seqs)
  except ValueError as e:
    first = {}  # prefix -> first line using it
    for s in sentences:
      for level in s.tags:
        for i, t in enumerate(level):
          first.setdefault(t[:2], s.lines[i])
    lines = ", ".join(f"{p} on line {n}" for p, n in sorted(first.items()) if p in ("I-", "M-"))
    raise DataError(where, max(first.get("I-", 0), first.get("M-", 0)) or None,
                    f"{e} ({lines}): expected one scheme per file (pass scheme=)", reason="unknown_scheme") from None


def _conll_record(sent: _Sentence, scheme: str, joiner: str, rid: str, where: str, report: ReadReport) -> Record:
  # Character offset of each token in the joined text.
  starts, pos = [], 0
  for tok in sent.tokens:
    starts.append(pos)
    pos += len(tok) + len(joiner)
  text = joiner.join(sent.tokens)
  local = collections.Counter()  # merged only if the sentence is kept
  entities: list[Entity] = []
  for level in sent.tags:
    try:
      spans = tags_lib.tags_to_spans(level, scheme, repairs=local)
    except tags_lib.TagError as e:
      raise DataError(where, sent.lines[e.index], f"{e}", reason="bad_tag") from None
    for a, b, kind in spans:
      entities.append(Entity(start=starts[a], end=starts[b - 1] + len(sent.tokens[b - 1]), type=kind))
  entities.sort(key=lambda e: (e["start"], e["end"], e["type"]))
  if local:
    report.repairs.update(local)
    report.repaired[rid] = dict(local)
  return Record(id=rid, text=text, entities=entities)
