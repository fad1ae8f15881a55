import json
import os

import numpy as np
import pytest

from gp_jax.data.char_tokenizer import MANIFEST, PAD_ID, UNK_ID, CharTokenizer
from gp_jax.data.types import Tokenizer

TRAIN = ["中国人民", "中国银行", "人民银行", "北京 大学", "ABC中国"]


@pytest.fixture
def tok():
  return CharTokenizer.build(TRAIN, min_freq=1, bigram_min_freq=1)


def _eq(a, b):
  assert np.array_equal(a.offsets, b.offsets)
  assert a.features.keys() == b.features.keys()
  for k in a.features:
    assert np.array_equal(a.features[k], b.features[k]), k


def test_protocol_and_specials(tok):
  assert isinstance(tok, Tokenizer)
  assert tok.feature_names == ("input_ids", "bigram_ids")
  assert tok.pad_values == {"input_ids": 0, "bigram_ids": 0}
  assert tok.num_prefix == tok.num_suffix == 0
  enc = tok.encode("中国")
  out = tok.add_special_tokens(enc.features)
  for k in enc.features:
    assert np.array_equal(out[k], enc.features[k])


def test_offsets_skip_whitespace(tok):
  text = " 北京\t大 学\n"
  enc = tok.encode(text)
  assert len(enc) == 4
  assert enc.offsets.dtype == np.int32 and enc.offsets.shape == (4, 2)
  assert [text[s:e] for s, e in enc.offsets] == ["北", "京", "大", "学"]
  assert enc.offsets.tolist() == [[1, 2], [2, 3], [4, 5], [6, 7]]
  for k in tok.feature_names:
    assert enc.features[k].dtype == np.int32 and enc.features[k].shape == (4,)


def test_empty_and_all_whitespace(tok):
  for text in ["", "  \u3000\n"]:
    enc = tok.encode(text)
    assert len(enc) == 0 and enc.offsets.shape == (0, 2)
    assert enc.features["input_ids"].shape == (0,)


def test_ids_and_unknowns(tok):
  enc = tok.encode("中国火")  # 火 never seen
  ids = enc.features["input_ids"]
  assert ids[0] == tok.chars.index("中") + 2
  assert ids[1] == tok.chars.index("国") + 2
  assert ids[2] == UNK_ID
  assert (ids != PAD_ID).all()
  assert tok.vocab_size == len(tok.chars) + 2


def test_bigram_ids(tok):
  enc = tok.encode("中国 京")
  bi = enc.features["bigram_ids"]
  # (中, 国), (国, 京) across the space, (京, end)
  assert bi[0] == tok.bigrams.index(("中", "国")) + 2
  assert ("国", "京") not in tok.bigrams and bi[1] == UNK_ID
  assert bi[2] == UNK_ID  # 京 never ends a training text
  # training bigrams span whitespace too ("北京 大学" -> (京, 大))
  assert tok.encode("京\n大").features["bigram_ids"][0] == tok.bigrams.index(("京", "大")) + 2
  assert tok.encode("民").features["bigram_ids"][0] == tok.bigrams.index(("民", None)) + 2
  assert tok.bigram_vocab_size == len(tok.bigrams) + 2
  # a bigram of an unknown char is unknown
  assert tok.encode("火国").features["bigram_ids"][0] == UNK_ID


def test_min_freq_and_caps():
  texts = ["aab", "aac", "ab"]
  t = CharTokenizer.build(texts, min_freq=2, bigram_min_freq=2)
  assert t.chars == ["a", "b"]  # c once; frequency order
  assert t.bigrams == [("a", "a"), ("a", "b"), ("b", None)]  # ties broken by key
  t = CharTokenizer.build(texts, min_freq=1, bigram_min_freq=1, max_chars=1, max_bigrams=2)
  assert t.chars == ["a"] and len(t.bigrams) == 2
  assert t.vocab_size == 3 and t.bigram_vocab_size == 4
  # chars under min_freq are [UNK]; their bigrams can still exist
  t = CharTokenizer.build(["xy", "xy", "z"], min_freq=2, bigram_min_freq=1)
  assert "z" not in t.chars and ("z", None) in t.bigrams
  enc = t.encode("z")
  assert enc.features["input_ids"][0] == UNK_ID and enc.features["bigram_ids"][0] != UNK_ID


def test_normalisation_keeps_offsets():
  t = CharTokenizer.build(["abc 123", "ABC"], bigram_min_freq=1)
  assert "A" not in t.chars and "a" in t.chars
  text = "Ａ\u3000ｂ１"  # full-width A, ideographic space, full-width b and 1
  enc = t.encode(text)
  assert enc.offsets.tolist() == [[0, 1], [2, 3], [3, 4]]
  assert enc.features["input_ids"].tolist() == [t.chars.index(c) + 2 for c in "ab1"]
  raw = CharTokenizer.build(["abc 123", "ABC"], bigram_min_freq=1, lowercase=False, nfkc=False)
  assert "A" in raw.chars
  assert (raw.encode(text).features["input_ids"] == UNK_ID).all()
  assert raw.encode(text).offsets.tolist() == enc.offsets.tolist()


def test_nfkc_multi_char_expansion_is_one_token():
  t = CharTokenizer.build(["kg ﬁ"], bigram_min_freq=1)  # ﬁ -> "fi": still one token
  enc = t.encode("ﬁ㎏")
  assert len(enc) == 2 and enc.offsets.tolist() == [[0, 1], [1, 2]]
  assert enc.features["input_ids"][0] == t.chars.index("fi") + 2


def test_encode_batch_matches_encode(tok):
  texts = ["中国人民银行", "", "  ", "北京 大学", "ABC中国火", "民"]
  for a, b in zip(tok.encode_batch(texts), [tok.encode(x) for x in texts]):
    _eq(a, b)
  assert tok.encode_batch([]) == []


def test_save_load_round_trip(tok, tmp_path):
  tok.save(str(tmp_path))
  manifest = json.loads((tmp_path / MANIFEST).read_text())
  assert manifest["kind"] == "char"
  assert os.path.exists(tmp_path / manifest["vocab_file"])
  back = CharTokenizer.load(str(tmp_path))
  assert back.chars == tok.chars and back.bigrams == tok.bigrams
  assert (back.lowercase, back.nfkc) == (tok.lowercase, tok.nfkc)
  assert back.vocab_size == tok.vocab_size and back.bigram_vocab_size == tok.bigram_vocab_size
  for text in ["中国人民 银行", "ABC火", "ｂｃ"]:
    _eq(back.encode(text), tok.encode(text))


def test_load_rejects_other_kind(tmp_path):
  (tmp_path / MANIFEST).write_text(json.dumps({"kind": "wordpiece"}))
  with pytest.raises(ValueError):
    CharTokenizer.load(str(tmp_path))


def test_encode_batch_at_scale():
  """20k texts in one call (speed is measured by `python -m benchmarks.pipeline_throughput --tokenizer char`)."""
  rng = np.random.default_rng(0)
  alphabet = np.array(list("中国人民银行北京大学上海市政府公司，。的了在是有和"))
  texts = ["".join(row) for row in rng.choice(alphabet, size=(20000, 44))]
  t = CharTokenizer.build(texts)
  encs = t.encode_batch(texts)
  assert sum(len(e) for e in encs) == 44 * 20000
  for i in (0, 9999, 19999):
    _eq(encs[i], t.encode(texts[i]))
