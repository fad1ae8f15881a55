"""Tag sequences <-> token spans for BIO (IOB2), IOB1, BIOES and BMES.

Decoding follows conlleval: a continuation tag (I-/M-/E-) that does not continue an
open entity of the same type starts a new entity, and an entity that is left open
in BIOES/BMES (no E-) ends at its last token. Each such repair is counted in a
`collections.Counter` passed as `repairs=`, keyed by:

  orphan_continuation  I-/M-/E- with no open entity (after O, after E-/S-, at the start)
  type_mismatch        I-/M-/E- of type Y while an entity of type X is open
  unterminated         BIOES/BMES entity closed without E- (by O, B-, S-, another type, the end)

In IOB1 an I- may begin an entity, so there it is never counted.
Counts are of tags, not entities: an orphan M- followed by O counts once in each of
the first and last keys. Spans are (start, end, type) over token indices, end exclusive.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Sequence

SCHEMES = ("BIO", "IOB1", "BIOES", "BMES")
ALIASES = {"IOB2": "BIO", "IOBES": "BIOES", "BMESO": "BMES", "BMEO": "BMES"}
# Prefixes each scheme allows besides "O".
PREFIXES = {"BIO": "BI", "IOB1": "BI", "BIOES": "BIES", "BMES": "BMES"}
REPAIR_KINDS = ("orphan_continuation", "type_mismatch", "unterminated")

Span = tuple[int, int, str]


class TagError(ValueError):
  """A tag the scheme does not allow; `index` is its position in the sequence."""

  def __init__(self, message: str, *, index: int):
    super().__init__(message)
    self.index = index


def normalize_scheme(scheme: str) -> str:
  """Upper-cases and resolves aliases (IOB2 -> BIO); ValueError for an unknown scheme."""
  name = ALIASES.get(scheme.upper(), scheme.upper())
  if name not in SCHEMES:
    raise ValueError(f"unknown tag scheme {scheme!r}; expected one of {', '.join(SCHEMES)} (or {', '.join(ALIASES)})")
  return name


def split_tag(tag: str, *, index: int = 0) -> tuple[str, str]:
  """'B-PER' -> ('B', 'PER'); 'O' -> ('O', ''). TagError for anything else."""
  if tag == "O":
    return "O", ""
  prefix, dash, kind = tag.partition("-")
  if len(prefix) != 1 or not dash or not kind or prefix not in "BIMES":
    raise TagError(f"malformed tag {tag!r}; expected 'O' or '<B|I|M|E|S>-<TYPE>'", index=index)
  return prefix, kind


def detect_scheme(tags: Iterable[str] | Iterable[Sequence[str]]) -> str:
  """Guesses the scheme from one tag sequence or from many (a list of sentences).

  M- present -> BMES; E-/S- present -> BIOES; otherwise BIO, unless entities mostly
  begin with I- (IOB1, where B- only splits two adjacent same-type entities).
  Mixed I- and M- cannot be told apart: ValueError. Malformed tags: TagError.
  """
  tags = list(tags)
  sentences = [tags] if not tags or isinstance(tags[0], str) else tags
  prefixes = collections.Counter()
  i_starts = b_starts = 0
  for sentence in sentences:
    prev = ("O", "")
    for index, tag in enumerate(sentence):
      prefix, kind = split_tag(tag, index=index)
      prefixes[prefix] += 1
      continues = prev[0] in "BI" and prev[1] == kind
      if prefix == "I" and not continues:
        i_starts += 1
      elif prefix == "B" and not continues:
        b_starts += 1
      prev = (prefix, kind)
  if prefixes["M"]:
    if prefixes["I"]:
      raise ValueError("tags mix I- and M- continuations; cannot tell BIOES from BMES")
    return "BMES"
  if prefixes["E"] or prefixes["S"]:
    return "BIOES"
  return "IOB1" if i_starts > b_starts else "BIO"


def tags_to_spans(tags: Sequence[str], scheme: str, *, repairs: collections.Counter | None = None) -> list[Span]:
  """Decodes one sentence's tags to token spans, repairing like conlleval (see module doc).

  Raises TagError (with `.index`) for a malformed tag or a prefix the scheme does not use.
  """
  scheme = normalize_scheme(scheme)
  allowed = PREFIXES[scheme]
  closing = scheme in ("BIOES", "BMES")  # entities must end with E-/S-
  repairs = repairs if repairs is not None else collections.Counter()
  spans: list[Span] = []
  start, kind = -1, ""  # the open entity; start < 0 when none

  def close(end: int, *, proper: bool):
    nonlocal start
    if start >= 0:
      if closing and not proper:
        repairs["unterminated"] += 1
      spans.append((start, end, kind))
    start = -1

  for i, tag in enumerate(tags):
    prefix, t = split_tag(tag, index=i)
    if prefix != "O" and prefix not in allowed:
      raise TagError(f"tag {tag!r} is not allowed in scheme {scheme} (prefixes {'/'.join(allowed)}/O)", index=i)
    if prefix == "O":
      close(i, proper=False)
      continue
    if prefix in "BS":
      close(i, proper=False)
      start, kind = i, t
    elif start < 0 or kind != t:  # I-/M-/E- that continues nothing
      if scheme != "IOB1":  # in IOB1 an I- may begin an entity
        repairs["orphan_continuation" if start < 0 else "type_mismatch"] += 1
      close(i, proper=False)
      start, kind = i, t
    if prefix in "ES":
      close(i + 1, proper=True)
  close(len(tags), proper=False)
  return spans


def spans_to_tags(spans: Iterable[Span], length: int, scheme: str) -> list[str]:
  """Encodes non-overlapping token spans as tags; ValueError for overlap or out of range."""
  scheme = normalize_scheme(scheme)
  tags = ["O"] * length
  prev_end, prev_kind = -1, ""
  for start, end, kind in sorted(spans):
    if not 0 <= start < end <= length:
      raise ValueError(f"span {(start, end, kind)} is outside [0, {length})")
    if start < prev_end:
      raise ValueError(f"span {(start, end, kind)} overlaps another; flat tags cannot encode nesting")
    if scheme in ("BIO", "IOB1"):
      # IOB1 begins with I- unless the previous token ends an entity of the same type.
      adjacent = start == prev_end and kind == prev_kind
      first = "B" if scheme == "BIO" or adjacent else "I"
      tags[start:end] = [f"{first}-{kind}"] + [f"I-{kind}"] * (end - start - 1)
    elif end - start == 1:
      tags[start] = f"S-{kind}"
    else:
      middle = "I" if scheme == "BIOES" else "M"
      tags[start:end] = [f"B-{kind}"] + [f"{middle}-{kind}"] * (end - start - 2) + [f"E-{kind}"]
    prev_end, prev_kind = end, kind
  return tags
