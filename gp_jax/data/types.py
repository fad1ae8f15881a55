"""Shared data contracts: records, tokenizer protocol, batches.

Record (every corpus and user file becomes this):
  {"id": str, "text": str, "entities": [{"start": int, "end": int, "type": str}]}
  character offsets into ``text``, ``end`` exclusive; nested/overlapping allowed.
  Optional "relations": [{"head": i, "tail": j, "type": str}], i and j indexing ``entities`` (SpERT-style):
  head is the subject, tail the object. In such a record entity types may be "" (untyped) or roles;
  the CasRel reader (relations.py) types them "subject" / "object".
  Optional "events": [{"type": str, "trigger": {"start", "end"} | None, "arguments": [{"start", "end", "role"}]}],
  character offsets as above; arguments may nest and one span may serve several events. For the event task
  (events.py) the spans become entities typed "type:role" (the trigger's role "trigger") and each event also
  lists them by index ("entities", trigger first).

Batch (what `gp_jax.data.batching` yields; numpy arrays, B rows of this process, L = bucket length):
  features         dict name -> int32 [B, L], one per ``Tokenizer.feature_names`` (input_ids, ...)
  attention_mask   int32 [B, L]    1 for every real token (specials included)
  span_mask        int32 [B, L]    1 for content tokens only (no [CLS]/[SEP], no padding)
  positions        int32 [B, L]    document position of each token (RoPE offsets); 0 on padding
  span_ids         int32 [B, H, L] flat i * L + j of gold spans (K = L), -1 padded
  example_index    int32 [B]       index of the source record in the split, -1 for filler rows
  window_start     int32 [B]       content-token offset of this window in its record (0 on filler)
  window_index     int32 [B]       index of the window in the PreparedSplit, -1 for filler rows
"""

from __future__ import annotations

import dataclasses
from typing import NotRequired, Protocol, TypedDict, runtime_checkable

import numpy as np


class Entity(TypedDict):
  start: int
  end: int
  type: str


class Relation(TypedDict):
  head: int  # index of the subject in the record's entities
  tail: int  # index of the object
  type: str


class Span(TypedDict):
  start: int
  end: int


class EventArgument(TypedDict):
  start: int
  end: int
  role: str  # e.g. "Treatment.Drug"; never "trigger" (the trigger's role in the event classes)


class Event(TypedDict):
  type: str
  trigger: Span | None
  arguments: list[EventArgument]
  entities: NotRequired[list[int]]  # events.as_span_records: its spans in the record's entities, trigger first


class Record(TypedDict):
  id: str
  text: str
  entities: list[Entity]
  relations: NotRequired[list[Relation]]
  events: NotRequired[list[Event]]


@dataclasses.dataclass(frozen=True)
class Encoding:
  """Content tokens of one text (no special tokens, no truncation)."""

  features: dict[str, np.ndarray]  # name -> int32 [n]
  offsets: np.ndarray  # int32 [n, 2]: character [start, end) of each token in the text

  def __len__(self) -> int:
    return int(self.offsets.shape[0])


@runtime_checkable
class Tokenizer(Protocol):
  """What the pipeline, training and predict need from a tokenizer."""

  feature_names: tuple[str, ...]  # e.g. ("input_ids", "token_type_ids")
  pad_values: dict[str, int]  # padding value per feature
  num_prefix: int  # special tokens added before the content ([CLS] -> 1)
  num_suffix: int  # special tokens added after the content ([SEP] -> 1)

  def encode(self, text: str) -> Encoding:
    ...

  def add_special_tokens(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Wraps content-token features [n] with the specials -> [num_prefix + n + num_suffix]."""
    ...

  def save(self, directory: str) -> None:
    """Writes everything `gp_jax.data.tokenize.load_tokenizer(directory)` needs."""
    ...
