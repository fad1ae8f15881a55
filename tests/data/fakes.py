"""Fake tokenizers and random records shared by the data tests."""

from __future__ import annotations

import numpy as np

from gp_jax.data.types import Encoding

TYPES = ("PER", "LOC", "ORG")


class CharTok:
  """One token per non-space char (spaces leave gaps in offsets); optional [CLS]/[SEP]."""

  feature_names = ("input_ids", "aux_ids")
  pad_values = {"input_ids": 0, "aux_ids": 7}

  def __init__(self, specials: bool = True):
    self.specials = specials
    self.num_prefix = self.num_suffix = int(specials)

  def encode(self, text: str) -> Encoding:
    idx = [i for i, c in enumerate(text) if not c.isspace()]
    ids = np.array([ord(text[i]) for i in idx], np.int32)
    offsets = np.array([[i, i + 1] for i in idx], np.int32).reshape(-1, 2)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, offsets)

  def add_special_tokens(self, features):
    if not self.specials:
      return dict(features)
    return {"input_ids": np.concatenate([[1], features["input_ids"], [2]]).astype(np.int32),
            "aux_ids": np.concatenate([[20], features["aux_ids"], [21]]).astype(np.int32)}

  def save(self, directory: str) -> None:
    pass


class WordTok(CharTok):
  """Whitespace words, [CLS]/[SEP]."""

  def encode(self, text: str) -> Encoding:
    offs, i = [], 0
    for word in text.split():
      i = text.index(word, i)
      offs.append((i, i + len(word)))
      i += len(word)
    ids = np.array([hash(text[a:b]) % 1000 + 30 for a, b in offs], np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 3}, np.array(offs, np.int32).reshape(-1, 2))


def ref_windows(n: int, W: int, S: int) -> list[int]:
  """Reference window starts, written independently of the vectorised version."""
  if n == 0:
    return []
  if n <= W:
    return [0]
  starts = list(range(0, n - W, S))
  return starts + [n - W]


def random_records(seed: int, n: int = 40, max_chars: int = 50) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for r in range(n):
    length = int(rng.integers(0, max_chars))
    text = "".join(rng.choice(list("abcdefg h"), size=length))
    ents = []
    for _ in range(int(rng.integers(0, 6))):
      if length == 0:
        break
      a = int(rng.integers(0, length))
      b = int(rng.integers(a + 1, min(length, a + 8) + 1))
      ents.append({"start": a, "end": b, "type": TYPES[int(rng.integers(0, 3))]})
    out.append({"id": f"r{r}", "text": text, "entities": ents})
  return out


class ZeroWidthTok(CharTok):
  """CharTok plus a zero-width (b, b) token after every "c" at [a, b) (skipped by alignment)."""

  def encode(self, text: str) -> Encoding:
    enc = super().encode(text)
    ids, offs = [], []
    for i, (a, b) in zip(enc.features["input_ids"].tolist(), enc.offsets.tolist()):
      ids.append(i)
      offs.append((a, b))
      if text[a] == "c":
        ids.append(99)
        offs.append((b, b))
    ids = np.array(ids, np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, np.array(offs, np.int32).reshape(-1, 2))


class EchoTok(ZeroWidthTok):
  """ZeroWidthTok plus, after every "a", a copy of the previous token: offsets are not monotone."""

  def encode(self, text: str) -> Encoding:
    enc = super().encode(text)
    ids, offs = [], []
    for i, (a, b) in zip(enc.features["input_ids"].tolist(), enc.offsets.tolist()):
      prev = offs[-1] if offs else None
      ids.append(i)
      offs.append((a, b))
      if a < b and text[a] == "a" and prev is not None:
        ids.append(98)
        offs.append(prev)
    ids = np.array(ids, np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, np.array(offs, np.int32).reshape(-1, 2))


def window_token_features(p, w: int) -> dict[str, np.ndarray]:
  """Content-token features of window `w` of a PreparedSplit."""
  a, b = p.window_ptr[w], p.window_ptr[w + 1]
  return {k: v[a:b] for k, v in p.window_features.items()}


def window_positions(p, w: int) -> np.ndarray:
  """Document positions of window `w`'s content tokens."""
  return (p.window_start[w] + np.arange(p.window_len[w])).astype(np.int32)
