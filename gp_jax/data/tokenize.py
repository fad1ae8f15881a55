"""Tokenizers: transformers fast tokenizers (`HFTokenizer`) and loading a saved one (`load_tokenizer`).

Char -> token alignment of entities lives in `gp_jax.data.windows` (one rule for the package).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib

import numpy as np
from tokenizers import normalizers

from gp_jax.data.types import Encoding, Tokenizer

# Deferred imports below: transformers is slow to import and only `HFTokenizer` needs it (char tokenizers and the
# exported-folder reader do not); `load_tokenizer` imports the char tokenizer module when a folder holds one
# (tests/data/test_tokenize.py stands a fake module in for it).

log = logging.getLogger(__name__)

MANIFEST = "gp_jax_tokenizer.json"


class HFTokenizer:
  """`Tokenizer` around a local transformers fast tokenizer (BERT / RoBERTa style, [CLS] x [SEP])."""

  feature_names = ("input_ids", "token_type_ids")
  num_prefix = 1
  num_suffix = 1

  def __init__(self, path: str | os.PathLike, *, lowercase: bool | None = None):
    """`lowercase`: True/False sets the tokenizer's lowercasing (config `tokenizer.lowercase`); None keeps its own."""
    from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
      raise FileNotFoundError(f"{path} is not a directory with tokenizer files (tokenizer.json, ...)")
    self.path = path
    self._hf = AutoTokenizer.from_pretrained(str(path), use_fast=True)
    if not self._hf.is_fast:
      raise ValueError(f"{path}: need a fast tokenizer (tokenizer.json) for character offsets")
    own = _lowercases(self._hf.backend_tokenizer.normalizer)
    self.lowercase = own if lowercase is None else bool(lowercase)
    on_off = lambda b: "on" if b else "off"  # noqa: E731
    if self.lowercase == own:
      log.info("Tokenizer %s: lowercase %s (its own setting)", path, on_off(own))
    else:
      _set_lowercase(self._hf, self.lowercase)
      log.warning("Tokenizer %s: lowercase %s (tokenizer.lowercase), its own setting was %s", path,
                  on_off(self.lowercase), on_off(own))
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
                "lowercase": self.lowercase, "num_prefix": self.num_prefix, "num_suffix": self.num_suffix}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))

  def __repr__(self) -> str:
    return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, lowercase={self.lowercase})"


def _lowercases(normalizer) -> bool:
  """Whether a `tokenizers` normalizer lowercases (BertNormalizer(lowercase=True), Lowercase, or a Sequence
  holding one)."""
  if isinstance(normalizer, normalizers.BertNormalizer):
    return bool(normalizer.lowercase)
  if isinstance(normalizer, normalizers.Sequence):
    return any(_lowercases(normalizer[i]) for i in range(len(normalizer)))
  return isinstance(normalizer, normalizers.Lowercase)


def _set_lowercase(hf, lowercase: bool) -> None:
  """Sets a transformers fast tokenizer's lowercasing: BertNormalizer's `lowercase` flag, else a Lowercase
  normalizer prepended or removed; also `do_lower_case` where the class has it (its saved config rebuilds the
  normalizer from that flag)."""
  backend = hf.backend_tokenizer
  norm = backend.normalizer
  if isinstance(norm, normalizers.BertNormalizer):
    norm.lowercase = lowercase
  else:
    if isinstance(norm, normalizers.Sequence):
      parts = [norm[i] for i in range(len(norm))]
    else:
      parts = [] if norm is None else [norm]
    parts = [p for p in parts if not isinstance(p, normalizers.Lowercase)]
    if lowercase:
      parts.insert(0, normalizers.Lowercase())
    backend.normalizer = normalizers.Sequence(parts)
  if hasattr(hf, "do_lower_case"):
    hf.do_lower_case = lowercase
    hf.init_kwargs["do_lower_case"] = lowercase
  if _lowercases(backend.normalizer) != lowercase:
    raise ValueError(f"could not set lowercase={lowercase} on the tokenizer's normalizer {backend.normalizer}")


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
  manifest = json.loads(manifest_path.read_text())
  kind = manifest.get("kind")
  if kind == "hf":
    return HFTokenizer(directory, lowercase=manifest.get("lowercase"))
  if kind == "char":
    from gp_jax.data.char_tokenizer import CharTokenizer  # pylint: disable=g-import-not-at-top

    return CharTokenizer.load(directory)
  raise ValueError(f"{manifest_path}: unknown tokenizer kind {kind!r}")
