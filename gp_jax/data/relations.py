"""Relation records from the CasRel triple format (WebNLG*, NYT*): strings aligned to whole words.

A CasRel file is ONE JSON array: [{"text": str, "triple_list": [[subject, relation, object], ...]}, ...], subjects
and objects given as surface strings without offsets. `read_casrel` turns it into Records with relations
(types.py): every subject and object string is aligned to whole words of the text (`find_words`), the FIRST
occurrence when it occurs several times (as the published systems do; counted as "ambiguous" in
report.alignments); a string that is not a whole word or words of its text is bad input (file, true line and the
fix; strict=False skips the record, counted in report.skipped and report.alignments["failed"]).

Entities are typed by their role, "subject" or "object" (ROLES, subject first): these corpora have no entity types,
and the GPLinker entity pointer of an untyped corpus has exactly these two heads. A string that is the subject of one
triple and the object of another gives two entities on the same span. Entities are sorted by (start, end, type),
relations keep the order of their first triple; a repeated triple is merged (report.merged["repeated_relation"]).
"""

from __future__ import annotations

import collections
import os
from typing import Any

from gp_jax.data import cblue
from gp_jax.data.jsonl import read_records
from gp_jax.data.readers import DataError, PathOrFile, ReadReport, Records, is_cjk
from gp_jax.data.types import Entity, Record, Relation

SUBJECT, OBJECT = "subject", "object"
ROLES = (SUBJECT, OBJECT)  # the entity types of a CasRel corpus, subject first: ids 0 and 1, as GPLinker (Su) has them
CASREL_EXPECTED = 'a JSON array of records [{"text", "triple_list": [[subject, relation, object], ...]}, ...]'


# --- whole-word alignment ----------------------------------------------------------------------------------------


def is_boundary(text: str, i: int) -> bool:
  """Whether a word may begin or end at character i: an end of the text, whitespace, or a CJK character on either
  side (CJK text is written without spaces: each of its characters is a word)."""
  if i <= 0 or i >= len(text):
    return True
  a, b = text[i - 1], text[i]
  return a.isspace() or b.isspace() or is_cjk(a) or is_cjk(b)


def find_words(text: str, s: str) -> list[int]:
  """Every start of `s` in `text` that begins and ends on word boundaries ("12" is not found inside "2012"); none
  for a string that is empty or begins or ends with whitespace (not words)."""
  starts, i = [], text.find(s) if s and s == s.strip() else -1
  while i >= 0:
    if is_boundary(text, i) and is_boundary(text, i + len(s)):
      starts.append(i)
    i = text.find(s, i + 1)
  return starts


# --- a JSON array with true lines -------------------------------------------------------------------------------


# --- CasRel records ---------------------------------------------------------------------------------------------


def _triples(obj: Any, *, where: str, line: int, index: int, allow_unlabelled: bool) -> list[tuple[str, str, str]]:
  """The validated (subject, relation, object) strings of one CasRel record."""
  at = f"record {index}"
  if not isinstance(obj, dict):
    raise DataError(where, line, f"{at} is a JSON {type(obj).__name__}: expected an object", reason="bad_json")
  if not isinstance(obj.get("text"), str):
    raise DataError(where, line, f'{at}: "text" is {obj.get("text")!r:.40}: expected a string',
                    reason="bad_value" if "text" in obj else "missing_key")
  if "triple_list" not in obj:
    if allow_unlabelled:
      return []
    raise DataError(where, line, f'{at}: no "triple_list": expected labelled records', reason="missing_key")
  raw = obj["triple_list"]
  if not isinstance(raw, list):
    raise DataError(where, line, f'{at}: "triple_list" is {type(raw).__name__}: expected a list of '
                    "[subject, relation, object]", reason="bad_value")
  out = []
  for k, t in enumerate(raw):
    if not (isinstance(t, list) and len(t) == 3 and all(isinstance(x, str) and x for x in t)):
      raise DataError(where, line, f"{at}: triple #{k} is {t!r:.80}: expected [subject, relation, object], three "
                      "non-empty strings", reason="bad_value")
    for role, x in ((SUBJECT, t[0]), (OBJECT, t[2])):
      if x != x.strip():
        raise DataError(where, line, f"{at}: {role} {x!r} of triple #{k} has spaces at its ends: expected the "
                        "words as the text writes them", reason="bad_value")
    out.append((t[0], t[1], t[2]))
  return out


def _align(text: str, triples: list[tuple[str, str, str]], *, where: str, line: int, index: int,
           counts: collections.Counter) -> dict[str, int]:
  """string -> its first start on word boundaries, for every subject and object; counts unique / ambiguous /
  failed alignments; raises DataError on the first failed one."""
  starts, failed = {}, []
  for k, (subj, _, obj) in enumerate(triples):
    for role, s in ((SUBJECT, subj), (OBJECT, obj)):
      if s in starts or any(s == f[2] for f in failed):
        continue
      found = find_words(text, s)
      if found:
        starts[s] = found[0]
        counts["ambiguous" if len(found) > 1 else "unique"] += 1
      else:
        failed.append((k, role, s))
  if failed:
    counts["failed"] += len(failed)
    k, role, s = failed[0]
    more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    i = text.find(s)
    if i < 0:
      what, reason = "is not in the text", "string_not_in_text"
    else:
      what = f"occurs only inside other words (first at character {i}: {text[max(0, i - 10):i + len(s) + 10]!r})"
      reason = "string_inside_word"
    raise DataError(where, line, f"record {index}: {role} {s!r} of triple #{k} {what}{more}: expected whole words "
                    "of the text (whitespace-separated; CJK: characters); fix the triple, or give the record as "
                    "JSON lines with character offsets", reason=reason)
  return starts


def casrel_record(obj: Any, *, id: str, where: str, line: int, index: int,  # pylint: disable=redefined-builtin
                  allow_unlabelled: bool = False, alignments: collections.Counter | None = None,
                  merged: collections.Counter | None = None) -> Record:
  """One CasRel record -> a Record with role-typed entities and relations (see the module docstring).

  alignments: counts unique / ambiguous / failed string alignments; merged: counts repeated_relation. Both are
  updated only for a record that is returned."""
  triples = _triples(obj, where=where, line=line, index=index, allow_unlabelled=allow_unlabelled)
  text = obj["text"]
  local = collections.Counter()
  try:
    starts = _align(text, triples, where=where, line=line, index=index, counts=local)
  except DataError:
    if alignments is not None:
      alignments["failed"] += local["failed"]
    raise
  keys = sorted({(starts[s], starts[s] + len(s), role) for subj, _, o in triples
                 for role, s in ((SUBJECT, subj), (OBJECT, o))})
  entity_index = {k: i for i, k in enumerate(keys)}
  relations, seen = [], set()
  for subj, rel, o in triples:
    head = entity_index[(starts[subj], starts[subj] + len(subj), SUBJECT)]
    tail = entity_index[(starts[o], starts[o] + len(o), OBJECT)]
    if (head, tail, rel) in seen:
      local["repeated_relation"] += 1
      continue
    seen.add((head, tail, rel))
    relations.append(Relation(head=head, tail=tail, type=rel))
  if alignments is not None:
    alignments.update({k: v for k, v in local.items() if k in ("unique", "ambiguous")})
  if merged is not None and local["repeated_relation"]:
    merged["repeated_relation"] += local["repeated_relation"]
  return Record(id=str(obj.get("id", id)), text=text,
                entities=[Entity(start=a, end=b, type=role) for a, b, role in keys], relations=relations)


def read_casrel(path: PathOrFile, *, strict: bool = True, allow_unlabelled: bool = False,
                id_prefix: str | None = None, name: str | None = None,
                chunk_chars: int = cblue.CHUNK_CHARS) -> Records:
  """A CasRel JSON array -> Records with relations and a ReadReport (report.alignments, report.merged).

  path: a file path or an open file, binary or text (then `name` names it in messages). Ids: the record's "id"
  when it has one, else f"{id_prefix}-{index}" (default prefix: the file's stem). A record without "triple_list"
  is an error unless `allow_unlabelled`. strict=False skips bad records, counted by reason."""
  if isinstance(path, (str, os.PathLike)):
    where = name or os.fspath(path)
    if not os.path.isfile(path):
      raise DataError(where, None, "no such file", reason="missing_file")
    f, owned = open(path, "rb"), True
  else:
    f, where, owned = path, name or str(getattr(path, "name", "<stream>")), False
  prefix = id_prefix or os.path.splitext(os.path.basename(where))[0]
  report = ReadReport(where)
  items = cblue.iter_json_array(f, source=where, expected=CASREL_EXPECTED, chunk_chars=chunk_chars)

  def parse(index, line, obj):
    return casrel_record(obj, id=f"{prefix}-{index}", where=where, line=line, index=index,
                         allow_unlabelled=allow_unlabelled, alignments=report.alignments, merged=report.merged)

  return read_records(items, parse, report, strict=strict, close=f if owned else None)
