"""Tokenizers (transformers fast tokenizers, char vocab) and character <-> token span alignment.

Token indices from `char_to_token_spans` count from the start of the model input: with
`num_prefix=1` ([CLS]) content token t sits at index t + 1. Entities whose boundaries do not fall on
token boundaries are reported back, never moved to the nearest token.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from gp_jax.data.types import Encoding, Entity, Tokenizer

MANIFEST = "gp_jax_tokenizer.json"


class HFTokenizer:
  """`Tokenizer` around a local transformers fast tokenizer (BERT / RoBERTa style, [CLS] x [SEP])."""

  feature_names = ("input_ids", "token_type_ids")
  num_prefix = 1
  num_suffix = 1

  def __init__(self, path: str | os.PathLike):
    from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
      raise FileNotFoundError(f"{path} is not a directory with tokenizer files (tokenizer.json, ...)")
    self.path = path
    self._hf = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    if not self._hf.is_fast:
      raise ValueError(f"{path}: need a fast tokenizer (tokenizer.json) for character offsets")
    cls_id, sep_id = self._hf.cls_token_id, self._hf.sep_token_id
    if cls_id is None or sep_id is None:
      raise ValueError(f"{path}: tokenizer has no [CLS]/[SEP] (cls_token / sep_token) ids")
    self.cls_token_id, self.sep_token_id = int(cls_id), int(sep_id)
    self.pad_token_id = int(self._hf.pad_token_id if self._hf.pad_token_id is not None else 0)
    self.vocab_size = len(self._hf)
    self.pad_values = {"input_ids": self.pad_token_id, "token_type_ids": 0}

  def encode(self, text: str) -> Encoding:
    """Content tokens of `text` (no specials, no truncation) with character offsets."""
    enc = self._hf(text, add_special_tokens=False, return_offsets_mapping=True,
                   return_token_type_ids=False, return_attention_mask=False,
                   truncation=False, padding=False, verbose=False)
    ids_n = np.asarray(enc["input_ids"], dtype=np.int32).reshape(-1)
    offsets_n2 = np.asarray(enc["offset_mapping"], dtype=np.int32).reshape(-1, 2)
    features = {"input_ids": ids_n, "token_type_ids": np.zeros_like(ids_n)}
    return Encoding(features=features, offsets=offsets_n2)

  def add_special_tokens(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """[CLS] content [SEP] for input_ids; token type 0 (pad value) on the specials for the rest."""
    out = {}
    for name, x_n in features.items():
      x_n = np.asarray(x_n, dtype=np.int32)
      if name == "input_ids":
        pre, post = self.cls_token_id, self.sep_token_id
      else:
        pre = post = self.pad_values.get(name, 0)
      out[name] = np.concatenate([np.array([pre], np.int32), x_n, np.array([post], np.int32)])
    return out

  def save(self, directory: str | os.PathLike) -> None:
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    self._hf.save_pretrained(str(directory))
    manifest = {"kind": "hf", "version": 1, "source": str(self.path), "vocab_size": self.vocab_size,
                "num_prefix": self.num_prefix, "num_suffix": self.num_suffix}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))

  def __repr__(self) -> str:
    return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"


def load_tokenizer(directory: str | os.PathLike) -> Tokenizer:
  """Rebuilds a tokenizer saved with `.save(directory)` (manifest `gp_jax_tokenizer.json`).

  A plain transformers tokenizer directory (tokenizer.json, no manifest) loads as `HFTokenizer`.
  """
  directory = pathlib.Path(directory)
  manifest_path = directory / MANIFEST
  if not manifest_path.exists():
    if (directory / "tokenizer.json").exists():
      return HFTokenizer(directory)
    raise FileNotFoundError(f"{directory} has no {MANIFEST} (nor a transformers tokenizer.json)")
  kind = json.loads(manifest_path.read_text()).get("kind")
  if kind == "hf":
    return HFTokenizer(directory)
  if kind == "char":
    from gp_jax.data.char_tokenizer import CharTokenizer  # pylint: disable=g-import-not-at-top
    return CharTokenizer.load(directory)
  raise ValueError(f"{manifest_path}: unknown tokenizer kind {kind!r}")


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
