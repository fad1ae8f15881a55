"""Character tokenizer for Chinese (and other unsegmented) text: chars + char bigrams.

One token per non-whitespace character; whitespace produces no token. Offsets are
character positions in the original text, even when normalisation is on (it only
changes which vocabulary entry a character maps to, never the offsets).

Features:
  input_ids   int32 [n]  id of the (normalised) character
  bigram_ids  int32 [n]  id of the bigram (char_i, char_{i+1}); the last token pairs with an end marker
Both vocabularies reserve 0 = [PAD] and 1 = [UNK]. There are no special tokens.

Encoding is vectorised with numpy: each code point maps to an internal "key" index
through a lazily filled table, char ids and bigram ids are gathered from that.
"""

from __future__ import annotations

import json
import os
import unicodedata
from collections.abc import Iterable, Sequence

import numpy as np

from gp_jax.data.readers import DataError, utf8_error
from gp_jax.data.types import Encoding

PAD, UNK = "[PAD]", "[UNK]"
PAD_ID, UNK_ID = 0, 1
MANIFEST = "gp_jax_tokenizer.json"
VOCAB_FILE = "char_vocab.json"
_MAX_CP = 0x110000
_NOT_SEEN = -2  # code point whose key was not computed yet
_NO_KEY = -1  # key outside both vocabularies
# Every code point with str.isspace() is below U+3001.
_IS_SPACE = np.array([chr(c).isspace() for c in range(0x3002)], dtype=bool)  # last entry: False


def _normalize(c: str, *, lowercase: bool, nfkc: bool) -> str:
  """Vocabulary key of one character: NFKC (full-width -> half-width, ...), then lowercase."""
  k = c
  if nfkc:
    n = unicodedata.normalize("NFKC", c)
    if n and not any(ch.isspace() for ch in n):
      k = n
  return k.lower() if lowercase else k


def _code_points(text: str) -> np.ndarray:
  return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


class CharTokenizer:
  """Char + char-bigram tokenizer; build it with `CharTokenizer.build(train_texts)`."""

  feature_names = ("input_ids", "bigram_ids")
  pad_values = {"input_ids": PAD_ID, "bigram_ids": PAD_ID}
  num_prefix = 0
  num_suffix = 0

  def __init__(
      self,
      chars: Sequence[str],
      bigrams: Sequence[tuple[str, str | None]] = (),
      *,
      lowercase: bool = True,
      nfkc: bool = True,
  ):
    """`chars`: vocabulary keys for ids 2.. ; `bigrams`: (key, next key or None = end) for ids 2.."""
    self.lowercase = lowercase
    self.nfkc = nfkc
    self.chars = list(chars)
    self.bigrams = [(a, b) for a, b in bigrams]
    keys = list(dict.fromkeys(self.chars + [k for ab in self.bigrams for k in ab if k is not None]))
    self._key_index = {k: i for i, k in enumerate(keys)}
    num_keys = len(keys)
    self._end = num_keys  # key index of the end marker
    self._stride = num_keys + 1
    # key index -> char id (UNK for keys known only from bigrams; index -1 = unknown key)
    self._key_to_id = np.full(num_keys + 1, UNK_ID, dtype=np.int32)
    for i, c in enumerate(self.chars):
      self._key_to_id[self._key_index[c]] = i + 2
    # sorted bigram codes a * stride + b and their ids
    codes = np.array(
        [self._key_index[a] * self._stride + (self._end if b is None else self._key_index[b]) for a, b in self.bigrams],
        dtype=np.int64,
    )
    order = np.argsort(codes, kind="stable")
    self._bigram_codes = codes[order]
    self._bigram_ids = (order + 2).astype(np.int32)
    if len(np.unique(codes)) != len(codes) or len(set(self.chars)) != len(self.chars):
      raise ValueError("duplicate entries in the vocabulary")
    self._cp_to_key = np.full(_MAX_CP, _NOT_SEEN, dtype=np.int32)

  # -- vocabulary ------------------------------------------------------------

  @property
  def vocab_size(self) -> int:
    return len(self.chars) + 2

  @property
  def bigram_vocab_size(self) -> int:
    return len(self.bigrams) + 2

  def normalize_char(self, c: str) -> str:
    """The vocabulary key of one character (NFKC: full-width -> half-width, then lowercase)."""
    return _normalize(c, lowercase=self.lowercase, nfkc=self.nfkc)

  # -- encoding --------------------------------------------------------------

  def _keys(self, cps_N: np.ndarray) -> np.ndarray:
    """Key index per code point (-1 = unknown key), filling the table on first sight."""
    k_N = self._cp_to_key[cps_N]
    if (k_N == _NOT_SEEN).any():
      for cp in np.unique(cps_N[k_N == _NOT_SEEN]):
        self._cp_to_key[cp] = self._key_index.get(self.normalize_char(chr(cp)), _NO_KEY)
      k_N = self._cp_to_key[cps_N]
    return k_N

  def _ids(self, k_N: np.ndarray, is_last_N: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Char ids and bigram ids of a token sequence of key indices."""
    ids_N = self._key_to_id[k_N]  # k = -1 -> the trailing UNK entry
    nxt_N = np.empty_like(k_N)
    nxt_N[:-1] = k_N[1:]
    nxt_N[is_last_N] = self._end
    ok_N = (k_N >= 0) & (nxt_N >= 0)
    codes_N = k_N.astype(np.int64) * self._stride + nxt_N
    pos_N = np.searchsorted(self._bigram_codes, codes_N)
    pos_N = np.minimum(pos_N, max(len(self._bigram_codes) - 1, 0))
    if len(self._bigram_codes):
      hit_N = ok_N & (self._bigram_codes[pos_N] == codes_N)
      bigram_N = np.where(hit_N, self._bigram_ids[pos_N], UNK_ID)
    else:
      bigram_N = np.full_like(k_N, UNK_ID)
    return ids_N.astype(np.int32), bigram_N.astype(np.int32)

  def _tokens(self, cps_N: np.ndarray) -> np.ndarray:
    """Positions of the non-whitespace code points."""
    return np.flatnonzero(~_IS_SPACE[np.minimum(cps_N, len(_IS_SPACE) - 1)])

  def encode(self, text: str) -> Encoding:
    cps = _code_points(text)
    pos_n = self._tokens(cps)
    cps_n = cps[pos_n]
    is_last_n = np.zeros(len(pos_n), dtype=bool)
    if len(pos_n):
      is_last_n[-1] = True
    ids_n, bigram_n = self._ids(self._keys(cps_n), is_last_n)
    offsets_n2 = np.stack([pos_n, pos_n + 1], axis=-1).astype(np.int32)
    return Encoding(features={"input_ids": ids_n, "bigram_ids": bigram_n}, offsets=offsets_n2)

  def encode_batch(self, texts: Sequence[str]) -> list[Encoding]:
    """`[encode(t) for t in texts]`, vectorised over the whole list (much faster)."""
    if not texts:
      return []
    cps_N, text_N, pos_N = self._flatten(texts)
    is_last_N = np.ones(len(pos_N), dtype=bool)
    is_last_N[:-1] = text_N[:-1] != text_N[1:]
    ids_N, bigram_N = self._ids(self._keys(cps_N), is_last_N)
    offsets_N2 = np.stack([pos_N, pos_N + 1], axis=-1).astype(np.int32)
    ends = np.cumsum(np.bincount(text_N, minlength=len(texts))).tolist()
    out, s = [], 0
    for e in ends:
      out.append(Encoding(features={"input_ids": ids_N[s:e], "bigram_ids": bigram_N[s:e]}, offsets=offsets_N2[s:e]))
      s = e
    return out

  def _flatten(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token code points, text index and in-text position of every token of `texts`."""
    lengths = np.array([len(t) for t in texts], dtype=np.int64)
    all_cps = _code_points("".join(texts))
    keep = self._tokens(all_cps)
    starts = np.cumsum(lengths) - lengths
    text_N = np.repeat(np.arange(len(texts)), lengths)[keep]
    return all_cps[keep], text_N, (keep - starts[text_N]).astype(np.int32)

  def add_special_tokens(self, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return dict(features)

  # -- building, saving, loading ---------------------------------------------

  @classmethod
  def build(
      cls,
      texts: Iterable[str],
      *,
      min_freq: int = 1,
      bigram_min_freq: int = 2,
      max_chars: int | None = None,
      max_bigrams: int | None = 50000,
      lowercase: bool = True,
      nfkc: bool = True,
  ) -> "CharTokenizer":
    """Counts chars and bigrams of `texts` (the training split); keeps the frequent ones.

    Entries are ordered by frequency (descending), ties by the key; `max_chars` and
    `max_bigrams` cap the number of entries besides [PAD] and [UNK].
    """
    texts = list(texts)
    # A provisional tokenizer whose key space is every normalised char of the corpus.
    if not texts:
      return cls([], lowercase=lowercase, nfkc=nfkc)
    uniq = set("".join(texts))
    keys = sorted({_normalize(c, lowercase=lowercase, nfkc=nfkc) for c in uniq if not c.isspace()})
    probe = cls(keys, lowercase=lowercase, nfkc=nfkc)
    cps_N, text_N, _ = probe._flatten(texts)
    k_N = probe._keys(cps_N)
    is_last_N = np.ones(len(k_N), dtype=bool)
    is_last_N[:-1] = text_N[:-1] != text_N[1:]

    def keep(counts, values, min_count, cap):
      ok = counts >= min_count
      counts, values = counts[ok], values[ok]
      order = np.lexsort((values, -counts))  # frequency desc, then key order
      return values[order][:cap]

    key_u, key_c = np.unique(k_N, return_counts=True)
    chars = [keys[i] for i in keep(key_c, key_u, min_freq, max_chars)]
    nxt_N = np.empty_like(k_N)
    nxt_N[:-1] = k_N[1:]
    nxt_N[is_last_N] = probe._end
    code_u, code_c = np.unique(k_N.astype(np.int64) * probe._stride + nxt_N, return_counts=True)
    bigrams = []
    for code in keep(code_c, code_u, bigram_min_freq, max_bigrams):
      a, b = divmod(int(code), probe._stride)
      bigrams.append((keys[a], None if b == probe._end else keys[b]))
    return cls(chars, bigrams, lowercase=lowercase, nfkc=nfkc)

  def save(self, directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    vocab = {"chars": [PAD, UNK] + self.chars, "bigrams": [[PAD, None], [UNK, None]] + [list(ab) for ab in self.bigrams]}
    with open(os.path.join(directory, VOCAB_FILE), "w", encoding="utf-8") as f:
      json.dump(vocab, f, ensure_ascii=False)
    manifest = {
        "kind": "char",
        "vocab_file": VOCAB_FILE,
        "lowercase": self.lowercase,
        "nfkc": self.nfkc,
        "vocab_size": self.vocab_size,
        "bigram_vocab_size": self.bigram_vocab_size,
    }
    with open(os.path.join(directory, MANIFEST), "w", encoding="utf-8") as f:
      json.dump(manifest, f, indent=2)

  @classmethod
  def load(cls, directory: str) -> "CharTokenizer":
    manifest = _read_json(os.path.join(directory, MANIFEST))
    if manifest.get("kind") != "char":
      raise ValueError(f"{directory} holds a {manifest.get('kind')!r} tokenizer, not 'char'")
    vocab = _read_json(os.path.join(directory, manifest.get("vocab_file", VOCAB_FILE)))
    chars, bigrams = vocab["chars"][2:], [tuple(ab) for ab in vocab["bigrams"][2:]]
    return cls(chars, bigrams, lowercase=manifest["lowercase"], nfkc=manifest["nfkc"])


def _read_json(path: str) -> dict:
  """A JSON object written by `save`; a damaged file is a DataError at its true line."""
  with open(path, "rb") as f:
    data = f.read()
  fix = "expected the tokenizer file written by training: restore it from the run's workdir or retrain"
  try:
    obj = json.loads(data.decode("utf-8"))
  except UnicodeDecodeError as e:
    raise utf8_error(path, data, e) from None
  except json.JSONDecodeError as e:
    raise DataError(path, e.lineno, f"malformed JSON ({e.msg} at column {e.colno}): {fix}", reason="bad_json") from None
  if not isinstance(obj, dict):
    raise DataError(path, 1, f"a JSON {type(obj).__name__}: {fix}", reason="bad_json")
  return obj
