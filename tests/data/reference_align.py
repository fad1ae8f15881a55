"""Reference char <-> token span alignment for tests: plain Python, one record at a time.

Written independently of `gp_jax.data.windows._align` (the package's one alignment rule, vectorised
over a split); tests check that the two agree. Token indices count from the start of the model
input: with `num_prefix=1` ([CLS]) content token t sits at index t + 1. Entities whose boundaries
do not fall on token boundaries are reported back, never moved to the nearest token.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gp_jax.data.types import Entity


def char_to_token_spans(
    offsets: Any,
    entities: Iterable[Entity | Mapping[str, Any]],
    *,
    type_to_id: Mapping[str, int],
    num_prefix: int = 0,
) -> tuple[list[tuple[int, int, int]], list[Entity]]:
  """Maps character entities onto token spans.

  Args:
    offsets: int [n, 2], character [start, end) of each content token (`Encoding.offsets`).
    entities: dicts with "start", "end" (exclusive) character offsets and "type".
    type_to_id: entity type name -> id; an unknown type raises KeyError.
    num_prefix: special tokens before the content ([CLS] -> 1); added to every token index.

  Returns:
    (spans, misaligned): spans are (start_tok, end_tok inclusive, type_id); misaligned lists the
    entities whose start is not a token start or whose end is not a token end (a boundary inside a
    word piece, or on whitespace), or that cover no token.
  """
  offsets_n2 = np.asarray(offsets, dtype=np.int64).reshape(-1, 2)
  # First token starting at each char, last token ending at each char (zero-width tokens skipped).
  first_at_start, last_at_end = {}, {}
  for t, (s, e) in enumerate(offsets_n2.tolist()):
    if e <= s:
      continue
    first_at_start.setdefault(s, t)
    last_at_end[e] = t
  spans, misaligned = [], []
  for ent in entities:
    type_name = ent["type"]
    if type_name not in type_to_id:
      raise KeyError(f"entity type {type_name!r} not in type_to_id {sorted(type_to_id)}")
    start_tok = first_at_start.get(int(ent["start"]))
    end_tok = last_at_end.get(int(ent["end"]))
    if start_tok is None or end_tok is None or end_tok < start_tok:
      misaligned.append(ent)  # type: ignore[arg-type]
      continue
    spans.append((start_tok + num_prefix, end_tok + num_prefix, int(type_to_id[type_name])))
  return spans, misaligned


def token_to_char_span(offsets: Any, start_tok: int, end_tok: int, *, num_prefix: int = 0) -> tuple[int, int]:
  """Token span [start_tok, end_tok] (inclusive, model-input indices) -> character [start, end).

  Raises IndexError when the span touches a special token or padding (outside the content tokens).
  """
  offsets_n2 = np.asarray(offsets).reshape(-1, 2)
  s, e = start_tok - num_prefix, end_tok - num_prefix
  if not 0 <= s <= e < offsets_n2.shape[0]:
    raise IndexError(f"token span [{start_tok}, {end_tok}] is outside the content tokens "
                     f"[{num_prefix}, {num_prefix + offsets_n2.shape[0] - 1}]")
  return int(offsets_n2[s, 0]), int(offsets_n2[e, 1])


def spans_to_entities(offsets: Any, spans: Sequence[tuple[int, int, int]], *, id_to_type: Sequence[str],
                      num_prefix: int = 0) -> list[Entity]:
  """Inverse of `char_to_token_spans` for aligned spans: token spans -> character entities."""
  out = []
  for start_tok, end_tok, type_id in spans:
    s, e = token_to_char_span(offsets, start_tok, end_tok, num_prefix=num_prefix)
    out.append(Entity(start=s, end=e, type=id_to_type[type_id]))
  return out
