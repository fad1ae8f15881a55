"""Integer tag sequences for the tagging baselines (host side, numpy only).

Tag layout, H entity types:
  BIO:   O = 0, B-t = 1 + 2t, I-t = 2 + 2t                               T = 1 + 2H
  BIOES: O = 0, B-t = 1 + 4t, I-t = 2 + 4t, E-t = 3 + 4t, S-t = 4 + 4t    T = 1 + 4H
Spans are (start, end inclusive, type) in token coordinates. A negative tag (padding) reads as O.

Decoding is conlleval-lenient, as in gp_jax.data.tags (which it reuses): an I-X (or E-X) that
does not continue an open X entity starts one, and an entity left open ends at its last token.
"""

from __future__ import annotations

import functools

import numpy as np

from gp_jax.data import tags as tag_strings

SCHEMES = ("BIO", "BIOES")
PREFIXES = {"BIO": "BI", "BIOES": "BIES"}


def normalize_scheme(scheme: str) -> str:
  """'BIO' / 'IOB2' -> 'BIO', 'BIOES' / 'IOBES' -> 'BIOES'; ValueError for others."""
  name = tag_strings.normalize_scheme(scheme)
  if name not in SCHEMES:
    raise ValueError(f"tagging baselines support {' and '.join(SCHEMES)} only, got {scheme!r}")
  return name


def num_tags(num_types: int, scheme: str = "BIO") -> int:
  return 1 + len(PREFIXES[normalize_scheme(scheme)]) * num_types


def tag_id(prefix: str, kind: int, *, scheme: str = "BIO") -> int:
  """('B', 2) -> the id of B-2; ('O', _) -> 0."""
  if prefix == "O":
    return 0
  prefixes = PREFIXES[normalize_scheme(scheme)]
  return 1 + len(prefixes) * kind + prefixes.index(prefix)


@functools.cache
def _constraints(num_types: int, scheme: str):
  prefixes = PREFIXES[scheme]
  n = num_tags(num_types, scheme)
  prefix = ["O"] + [p for _ in range(num_types) for p in prefixes]
  kind = [-1] + [t for t in range(num_types) for _ in prefixes]
  allowed_TT = np.zeros((n, n), bool)
  for i in range(n):
    open_after = prefix[i] in "BI"  # an entity of kind[i] is still open after tag i
    for j in range(n):
      if prefix[j] in "IE":
        allowed_TT[i, j] = open_after and kind[i] == kind[j]
      else:  # O, B, S: only once the previous entity is closed (always in BIO)
        allowed_TT[i, j] = scheme == "BIO" or not open_after
  allowed_start_T = np.array([p not in "IE" for p in prefix])
  allowed_end_T = np.array([scheme == "BIO" or p not in "BI" for p in prefix])
  for a in (allowed_TT, allowed_start_T, allowed_end_T):
    a.setflags(write=False)
  return allowed_TT, allowed_start_T, allowed_end_T


def transition_constraints(num_types: int, scheme: str = "BIO") -> tuple[np.ndarray, np.ndarray]:
  """(allowed_TT, allowed_start_T) bool: which moves i -> j and which first tags the scheme allows.

  BIO: I-X only after B-X or I-X, and not first. BIOES: I-X/E-X only after B-X or I-X; O, B-Y,
  S-Y only after O, E-X or S-X; I-X/E-X not first. Read-only arrays.
  """
  allowed_TT, allowed_start_T, _ = _constraints(num_types, normalize_scheme(scheme))
  return allowed_TT, allowed_start_T


def end_constraints(num_types: int, scheme: str = "BIO") -> np.ndarray:
  """allowed_end_T bool: which last tags the scheme allows (BIOES: not B-X or I-X; BIO: all)."""
  return _constraints(num_types, normalize_scheme(scheme))[2]


def spans_to_tags(spans_S3, *, length: int, num_types: int, scheme: str = "BIO") -> tuple[np.ndarray, int]:
  """(start, end inclusive, type) spans -> (tags int32 `[length]`, number of spans left out).

  One tag layer, outermost entity wins: spans are placed longest first (ties: earlier start, then
  lower type); a span overlapping one already placed (nested, crossing or duplicate) cannot be
  represented and is counted instead. ValueError for spans outside `[0, length)` or bad types.
  """
  scheme = normalize_scheme(scheme)
  spans = np.asarray(spans_S3, dtype=np.int64).reshape(-1, 3)
  start, end, kind = spans.T
  bad = (start < 0) | (end < start) | (end >= length) | (kind < 0) | (kind >= num_types)
  if bad.any():
    raise ValueError(f"span {tuple(spans[bad][0])} is invalid for length {length}, {num_types} types")
  tags = np.zeros(length, np.int32)
  taken = np.zeros(length, bool)
  unrepresentable = 0
  for s, e, t in spans[np.lexsort((kind, start, start - end))]:
    if taken[s:e + 1].any():
      unrepresentable += 1
      continue
    taken[s:e + 1] = True
    if scheme == "BIOES" and s == e:
      tags[s] = tag_id("S", t, scheme=scheme)
      continue
    tags[s] = tag_id("B", t, scheme=scheme)
    tags[s + 1:e + 1] = tag_id("I", t, scheme=scheme)
    if scheme == "BIOES":
      tags[e] = tag_id("E", t, scheme=scheme)
  return tags, unrepresentable


def tags_to_spans(tags, *, num_types: int, scheme: str = "BIO") -> list[tuple[int, int, int]]:
  """Tag ids (negative = O) -> sorted (start, end inclusive, type) spans, repaired like conlleval."""
  scheme = normalize_scheme(scheme)
  tags = np.asarray(tags, dtype=np.int64).reshape(-1)
  if (tags >= num_tags(num_types, scheme)).any():
    raise ValueError(f"tag id {int(tags.max())} out of range for {num_types} types ({scheme})")
  prefixes = PREFIXES[scheme]
  width = len(prefixes)
  names = ["O" if t <= 0 else f"{prefixes[(t - 1) % width]}-{(t - 1) // width}" for t in tags]
  return [(s, e - 1, int(k)) for s, e, k in tag_strings.tags_to_spans(names, scheme)]


__all__ = [
    "num_tags",
    "tag_id",
    "transition_constraints",
    "end_constraints",
    "spans_to_tags",
    "tags_to_spans",
    "normalize_scheme",
]
