"""Readers for user files: the shared base (DataError, ReadReport, line decoding) and CoNLL-style columns.

JSON lines (entities, relations, events; CLUENER) live in `gp_jax.data.jsonl` and are importable from here:
`from gp_jax.data.readers import read_jsonl` (re-exported lazily, as jsonl.py imports this module's base).
Every reader returns a `Records` list carrying a `ReadReport`: records kept, records skipped by reason (lenient
mode), tag repairs (see tags.py). With strict=True the first bad record raises `DataError` naming the file, the
line and what was expected. The CasRel triple format is read by `gp_jax.data.relations`.
"""

from __future__ import annotations

import codecs
import collections
import dataclasses
import io
import logging
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TextIO

from gp_jax.data import tags as tags_lib
from gp_jax.errors import UserError
from gp_jax.data.types import Entity, Record

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
  events: int = 0  # events kept (records with "events" only)
  arguments: int = 0  # their arguments, triggers not included
  # What an event read changed or left out, by kind: repeated_argument, repeated_event, a corpus's attributes...
  event_notes: collections.Counter = dataclasses.field(default_factory=collections.Counter)

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

  @property
  def has_events(self) -> bool:
    return bool(self.events or self.event_notes)

  def summary(self) -> str:
    s = f"{self.path}: {self.records} records, {self.entities} entities"
    if self.has_relations:
      s += f", {self.relations} relations, merged {dict(self.merged)}"
      if self.alignments:
        s += f", alignments {dict(self.alignments)}"
    if self.has_events:
      s += f", {self.events} events ({self.arguments} arguments)"
      if self.event_notes:
        s += f", event notes {dict(self.event_notes)}"
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
    self.events = sum(len(r.get("events", ())) for r in records)
    self.arguments = sum(len(e["arguments"]) for r in records for e in r.get("events", ()))
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
    if self.has_events:  # likewise
      out.update(events=self.events, arguments=self.arguments, event_notes=dict(self.event_notes))
    return out


class Records(list):
  """A plain list of Records with the `report` of the read that made it."""

  def __init__(self, records: Iterable[Record], report: ReadReport):
    super().__init__(records)
    self.report = report


PathOrFile = str | os.PathLike | TextIO


def open_source(source: PathOrFile, name: str | None) -> tuple[Any, str, bool]:
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


_JSONL_NAMES = ("read_jsonl", "merge_relations")  # defined in jsonl.py, importable from here


def __getattr__(name: str):
  if name in _JSONL_NAMES:
    # Deferred: jsonl.py imports this module, so importing it at the top would make a cycle.
    from gp_jax.data import jsonl  # noqa: PLC0415
    return getattr(jsonl, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
  f, where, owned = open_source(path, name)
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
