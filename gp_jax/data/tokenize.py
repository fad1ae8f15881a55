"""Tokenizers: transformers fast tokenizers (`HFTokenizer`) and loading a saved one (`load_tokenizer`).

A BERT tokenizer folder (tokenizer_class BertTokenizer, or a bert config.json without one) is built with `tokenizers`
alone, as transformers 5 builds it (`bert_backend`): importing transformers (and torch with it) cost ~2 s a process
on a CPU and ~15 s on a GPU machine. Other folders load through transformers' AutoTokenizer; so does every folder
with GP_JAX_TOKENIZER=transformers. tests/data/test_tokenize_backend.py checks both give the same tokens.

Char -> token alignment of entities lives in `gp_jax.data.windows` (one rule for the package).
"""

from __future__ import annotations

import json
import logging
import os
import pathlib

import numpy as np
from tokenizers import AddedToken, normalizers

from gp_jax.data.readers import DataError
from gp_jax.data.types import Encoding, Tokenizer

# Deferred imports below: transformers is slow to import and only a non-BERT `HFTokenizer` needs it;
# `load_tokenizer` imports the char tokenizer module when a folder holds one (tests/data/test_tokenize.py stands a
# fake module in for it).

log = logging.getLogger(__name__)

MANIFEST = "gp_jax_tokenizer.json"
BERT_CLASSES = ("BertTokenizer", "BertTokenizerFast")
BERT_SPECIALS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                 "mask_token": "[MASK]"}  # transformers' BertTokenizer defaults


class HFTokenizer:
  """`Tokenizer` around a local transformers fast tokenizer (BERT / RoBERTa style, [CLS] x [SEP])."""

  feature_names = ("input_ids", "token_type_ids")
  num_prefix = 1
  num_suffix = 1

  def __init__(self, path: str | os.PathLike, *, lowercase: bool | None = None):
    """`lowercase`: True/False sets the tokenizer's lowercasing (config `tokenizer.lowercase`); None keeps its own."""
    path = pathlib.Path(path).expanduser()
    if not path.is_dir():
      raise FileNotFoundError(f"{path} is not a directory with tokenizer files (tokenizer.json, ...)")
    self.path = path
    self._hf = None  # the transformers tokenizer, where one is loaded
    native = None if os.environ.get("GP_JAX_TOKENIZER", "").lower() == "transformers" else bert_backend(path)
    if native is not None:
      self._backend, self._config, specials = native
    else:
      from transformers import AutoTokenizer  # pylint: disable=g-import-not-at-top

      self._hf = AutoTokenizer.from_pretrained(str(path), use_fast=True)
      if not self._hf.is_fast:
        raise ValueError(f"{path}: need a fast tokenizer (tokenizer.json) for character offsets")
      self._backend, self._config = self._hf.backend_tokenizer, None
      specials = {"cls_token": self._hf.cls_token, "sep_token": self._hf.sep_token, "pad_token": self._hf.pad_token}
    own = _lowercases(self._backend.normalizer)
    self.lowercase = own if lowercase is None else bool(lowercase)
    on_off = lambda b: "on" if b else "off"  # noqa: E731
    if self.lowercase == own:
      log.info("Tokenizer %s: lowercase %s (its own setting)", path, on_off(own))
    else:
      _set_lowercase(self._backend, self.lowercase, self._hf)
      log.warning("Tokenizer %s: lowercase %s (tokenizer.lowercase), its own setting was %s", path,
                  on_off(self.lowercase), on_off(own))
    ids = {k: None if t is None else self._backend.token_to_id(str(t)) for k, t in specials.items()}
    if ids["cls_token"] is None or ids["sep_token"] is None:
      raise ValueError(f"{path}: tokenizer has no [CLS]/[SEP] (cls_token / sep_token) ids")
    self.cls_token_id, self.sep_token_id = int(ids["cls_token"]), int(ids["sep_token"])
    self.pad_token_id = int(ids["pad_token"] if ids["pad_token"] is not None else 0)
    self.vocab_size = self._backend.get_vocab_size(with_added_tokens=True)
    self.pad_values = {"input_ids": self.pad_token_id, "token_type_ids": 0}
    self.backend = "tokenizers" if self._hf is None else "transformers"

  def encode(self, text: str) -> Encoding:
    """Content tokens of `text` (no specials, no truncation) with character offsets."""
    if self._hf is None:
      enc = self._backend.encode(text, add_special_tokens=False)
      ids, offsets = enc.ids, enc.offsets
    else:
      enc = self._hf(text, add_special_tokens=False, return_offsets_mapping=True,
                     return_token_type_ids=False, return_attention_mask=False,
                     truncation=False, padding=False, verbose=False)
      ids, offsets = enc["input_ids"], enc["offset_mapping"]
    return _encoding(ids, offsets)

  def encode_batch(self, texts: list[str]) -> list[Encoding]:
    """`[encode(t) for t in texts]`: the tokenizers backend encodes the list at once, on all cores."""
    if self._hf is not None:
      return [self.encode(t) for t in texts]
    return [_encoding(enc.ids, enc.offsets)
            for enc in self._backend.encode_batch(list(texts), add_special_tokens=False)]

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
    if self._hf is not None:
      self._hf.save_pretrained(str(directory))
    else:  # what transformers' save_pretrained writes for a BERT tokenizer, read back by either backend
      self._backend.save(str(directory / "tokenizer.json"))
      config = dict(self._config, do_lower_case=self.lowercase)
      (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False))
    manifest = {"kind": "hf", "version": 1, "source": str(self.path), "vocab_size": self.vocab_size,
                "lowercase": self.lowercase, "num_prefix": self.num_prefix, "num_suffix": self.num_suffix}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2))

  def __repr__(self) -> str:
    return f"HFTokenizer({str(self.path)!r}, vocab_size={self.vocab_size}, lowercase={self.lowercase})"


def _encoding(ids, offsets) -> Encoding:
  """Content token ids (token type 0) and their character offsets as an `Encoding`."""
  ids_n = np.asarray(ids, dtype=np.int32).reshape(-1)
  return Encoding(features={"input_ids": ids_n, "token_type_ids": np.zeros_like(ids_n)},
                  offsets=np.asarray(offsets, dtype=np.int32).reshape(-1, 2))


def _lowercases(normalizer) -> bool:
  """Whether a `tokenizers` normalizer lowercases (BertNormalizer(lowercase=True), Lowercase, or a Sequence
  holding one)."""
  if isinstance(normalizer, normalizers.BertNormalizer):
    return bool(normalizer.lowercase)
  if isinstance(normalizer, normalizers.Sequence):
    return any(_lowercases(normalizer[i]) for i in range(len(normalizer)))
  return isinstance(normalizer, normalizers.Lowercase)


def _set_lowercase(backend, lowercase: bool, hf=None) -> None:
  """Sets a `tokenizers` tokenizer's lowercasing: BertNormalizer's `lowercase` flag, else a Lowercase normalizer
  prepended or removed; on the transformers tokenizer `hf` also `do_lower_case` where the class has it (its saved
  config rebuilds the normalizer from that flag)."""
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
  if hf is not None and hasattr(hf, "do_lower_case"):
    hf.do_lower_case = lowercase
    hf.init_kwargs["do_lower_case"] = lowercase
  if _lowercases(backend.normalizer) != lowercase:
    raise ValueError(f"could not set lowercase={lowercase} on the tokenizer's normalizer {backend.normalizer}")


def bert_backend(path: pathlib.Path):
  """(tokenizers.Tokenizer, tokenizer_config, special tokens) built as transformers 5's BertTokenizer builds it:
  WordPiece over tokenizer.json's vocabulary (else vocab.txt), the normalizer from tokenizer_config.json's
  do_lower_case / tokenize_chinese_chars / strip_accents, BERT's pre-tokenizer, then its added and special tokens;
  None where the folder holds another tokenizer class."""
  from tokenizers import Tokenizer, pre_tokenizers  # pylint: disable=g-import-not-at-top
  from tokenizers.models import WordPiece  # pylint: disable=g-import-not-at-top

  config = _read_json(path / "tokenizer_config.json")
  if config.get("auto_map"):  # the folder's own tokenizer code
    return None
  klass = config.get("tokenizer_class")
  if klass is None:
    klass = "BertTokenizer" if _read_json(path / "config.json").get("model_type") == "bert" else None
  if klass not in BERT_CLASSES:
    return None
  vocab, added_by_id = None, {}
  if (path / "tokenizer.json").is_file():
    saved = _read_json(path / "tokenizer.json")
    model = saved.get("model", {})
    added_by_id = {int(t["id"]): t for t in saved.get("added_tokens") or ()}
    if model.get("type") not in (None, "WordPiece"):
      return None
    vocab = model.get("vocab")
    if isinstance(vocab, list):
      vocab = {t[0] if isinstance(t, list) else t: i for i, t in enumerate(vocab)}
  elif (path / "vocab.txt").is_file():
    with (path / "vocab.txt").open(encoding="utf-8") as f:
      vocab = {line.rstrip("\n"): i for i, line in enumerate(f)}
  if not vocab:
    return None
  specials = {k: str(config.get(k) or v) if not isinstance(config.get(k), dict) else config[k]["content"]
              for k, v in BERT_SPECIALS.items()}
  backend = Tokenizer(WordPiece(vocab, unk_token=specials["unk_token"]))
  backend.normalizer = normalizers.BertNormalizer(
      clean_text=True, handle_chinese_chars=config.get("tokenize_chinese_chars", True),
      strip_accents=config.get("strip_accents"), lowercase=config.get("do_lower_case", True))
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  added_by_id.update((int(i), t) for i, t in (config.get("added_tokens_decoder") or {}).items())
  added = [AddedToken(**{k: v for k, v in t.items() if k not in ("__type", "id")}) if isinstance(t, dict) else
           AddedToken(str(t), special=True) for _, t in sorted(added_by_id.items())]
  extra = config.get("extra_special_tokens") or config.get("additional_special_tokens") or []
  names = {a.content for a in added}
  added += [AddedToken(t, special=True) for t in [*specials.values(), *map(str, extra)] if t not in names]
  backend.add_tokens(added)
  config.setdefault("tokenizer_class", "BertTokenizer")
  return backend, config, specials


def _read_json(path: pathlib.Path) -> dict:
  """A JSON object from `path`; {} when there is no such file. A file that is no JSON object names itself."""
  if not path.is_file():
    return {}
  try:
    value = json.loads(path.read_text(encoding="utf-8"))
  except json.JSONDecodeError as e:
    raise DataError(str(path), e.lineno, f"not valid JSON ({e.msg})", reason="bad_json") from e
  if not isinstance(value, dict):
    raise DataError(str(path), None, f"expected a JSON object, got {type(value).__name__}", reason="bad_json")
  return value


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
