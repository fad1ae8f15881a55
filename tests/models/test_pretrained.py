"""Pretrained encoders: the resolver (local, `~`, hub ids from an offline HF cache, `@revision`, missing files),
the identity a workdir records, weight formats (safetensors and flax msgpack, sharded or not) and the tokenizer's
lowercase setting. No network: hub ids come from an HF cache written under tmp_path in the standard layout."""

import hashlib
import json
import pathlib
import string
import types

import jax
import numpy as np
import pytest
from flax import nnx, serialization
from safetensors.numpy import save_file

from gp_jax import workdir as wd
from gp_jax.data.tokenize import HFTokenizer, load_tokenizer
from gp_jax.models import locate, pretrained
from gp_jax.models.bert import BertConfig
from tests.models.test_bert import _hf_config_dict, _hf_weights, _random_batch, _run

CHARS = string.ascii_letters + string.digits + "[]_"
SMALL = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, max_position_embeddings=128)


# ----------------------------------------------------------------------------------------------
# Tiny encoders in Hugging Face format, and an HF cache holding them.


def _bert_tokenizer(directory: pathlib.Path, *, lowercase: bool) -> int:
  """A WordPiece tokenizer over CHARS (transformers' BertTokenizerFast from a vocab.txt); returns its size."""
  from transformers import BertTokenizerFast

  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *CHARS, *("##" + c for c in CHARS)]
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
  BertTokenizerFast(str(directory / "vocab.txt"), do_lower_case=lowercase).save_pretrained(str(directory))
  return len(vocab)


def _roberta_tokenizer(directory: pathlib.Path) -> int:
  """A byte-level-free BPE over CHARS with RoBERTa's specials (<s>=0, <pad>=1, </s>=2) and no normalizer."""
  from tokenizers import Tokenizer, models, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  vocab = ["<s>", "<pad>", "</s>", "<unk>", "<mask>", *CHARS]
  tok = Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, [], unk_token="<unk>"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.post_processor = processors.TemplateProcessing(single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", cls_token="<s>",
                                 sep_token="</s>", pad_token="<pad>", unk_token="<unk>", mask_token="<mask>")
  fast.save_pretrained(str(directory))
  return len(vocab)


def tiny_encoder(directory, *, model_type: str = "bert", weights_format: str = "safetensors", seed: int = 0,
                 lowercase: bool = False, num_layers: int = 2) -> tuple[dict, dict]:
  """A random BERT or RoBERTa (2 layers) written as a Hugging Face folder: config.json, tokenizer files and the
  weights as model.safetensors, flax_model.msgpack (transformers' Flax layout) or not at all ("none").
  Returns (HF config, weights)."""
  directory = pathlib.Path(directory)
  directory.mkdir(parents=True, exist_ok=True)
  if model_type == "bert":
    vocab_size = _bert_tokenizer(directory, lowercase=lowercase)
    cfg = BertConfig(vocab_size=vocab_size, **{**SMALL, "num_layers": num_layers})
  else:
    vocab_size = _roberta_tokenizer(directory)
    cfg = BertConfig(vocab_size=vocab_size, model_type="roberta", pad_token_id=1, type_vocab_size=1,
                     **{**SMALL, "num_layers": num_layers})
  hf = _hf_config_dict(cfg)
  # A trainable start: unit LayerNorm scales, the rest scaled down from test_bert's N(0, 0.3).
  weights = {k: np.ones_like(v) if k.endswith("LayerNorm.weight") else v / 3
             for k, v in _hf_weights(cfg, np.random.default_rng(seed)).items()}
  (directory / "config.json").write_text(json.dumps(hf))
  if weights_format == "safetensors":
    save_file(weights, str(directory / "model.safetensors"))
  elif weights_format == "flax":
    write_flax(directory, weights, prefix=model_type)
  return hf, weights


def flax_tree(weights: dict[str, np.ndarray], *, prefix: str | None = None) -> dict:
  """PyTorch-named weights -> transformers' Flax layout: nested dicts by '.', kernels [in, out], `embedding`,
  LayerNorm `scale`, under an optional top-level `prefix` (bert / roberta)."""
  tree = {}
  for name, array in weights.items():
    *path, leaf = ([prefix] if prefix else []) + name.split(".")
    if leaf == "weight":
      leaf = "embedding" if "embeddings" in path[-1] else "scale" if path[-1] == "LayerNorm" else "kernel"
      array = array.T if leaf == "kernel" else array
    node = tree
    for p in path:
      node = node.setdefault(p, {})
    node[leaf] = np.ascontiguousarray(array)
  return tree


def write_flax(directory: pathlib.Path, weights: dict, *, prefix: str | None = None, shards: int = 1) -> None:
  """flax_model.msgpack, or `shards` files flax_model-0000i-of-0000n.msgpack with their index (as transformers
  writes them: each shard a nested dict, the index keyed by '/'-joined paths)."""
  tree = flax_tree(weights, prefix=prefix)
  if shards == 1:
    (directory / "flax_model.msgpack").write_bytes(serialization.msgpack_serialize(tree))
    return
  flat = {"/".join(k): v for k, v in _flatten(tree)}
  names = sorted(flat)
  weight_map = {}
  for i in range(shards):
    file = f"flax_model-{i + 1:05d}-of-{shards:05d}.msgpack"
    shard = {}
    for key in names[i::shards]:
      *path, leaf = key.split("/")
      node = shard
      for p in path:
        node = node.setdefault(p, {})
      node[leaf] = flat[key]
      weight_map[key] = file
    (directory / file).write_bytes(serialization.msgpack_serialize(shard))
  (directory / "flax_model.msgpack.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def _flatten(tree, prefix=()):
  for k, v in tree.items():
    if isinstance(v, dict):
      yield from _flatten(v, prefix + (k,))
    else:
      yield prefix + (k,), v


def hub_cache(hf_home, repo_id: str, **kw) -> tuple[str, pathlib.Path]:
  """Writes `tiny_encoder(**kw)` into <hf_home>/hub in the layout huggingface_hub keeps (snapshots/<commit>,
  refs/main). Returns (commit, snapshot folder)."""
  commit = hashlib.sha1(f"{repo_id} {sorted(kw.items())}".encode()).hexdigest()
  repo = pathlib.Path(hf_home) / "hub" / f"models--{repo_id.replace('/', '--')}"
  snapshot = repo / "snapshots" / commit
  tiny_encoder(snapshot, **kw)
  (repo / "refs").mkdir(parents=True, exist_ok=True)
  (repo / "refs" / "main").write_text(commit)
  return commit, snapshot


@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
  """HF_HOME=tmp_path/hf with HF_HUB_OFFLINE (as huggingface_hub reads them at import), nothing resolved yet."""
  from huggingface_hub import constants

  hf_home = tmp_path / "hf"
  monkeypatch.setenv("HF_HOME", str(hf_home))
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hf_home / "hub"))
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(locate, "_RESOLVED", {})
  return hf_home


def _params(model):
  return jax.tree.leaves(nnx.state(model, nnx.Param))


def _assert_same_model(a, b):
  for x, y in zip(_params(a), _params(b), strict=True):
    np.testing.assert_array_equal(x, y)
  ids_BL, mask_BL, _ = _random_batch(np.random.default_rng(0), [7, 3], vocab_size=a.config.vocab_size,
                                     pad_id=a.config.pad_token_id)
  np.testing.assert_array_equal(_run(a, ids_BL, mask_BL), _run(b, ids_BL, mask_BL))


# ----------------------------------------------------------------------------------------------
# Resolver.


def test_hub_id_and_pinned_revision_resolve_to_the_cached_snapshot(offline_hub):
  commit, snapshot = hub_cache(offline_hub, "org/tiny")
  folder = pretrained.resolve("org/tiny")
  assert folder == snapshot
  assert pretrained.resolve(f"org/tiny@{commit}") == snapshot
  a, b = pretrained.source("org/tiny"), pretrained.source(f"org/tiny@{commit}")
  assert a == {"repo_id": "org/tiny", "revision": "main", "commit": commit}
  assert b == {"repo_id": "org/tiny", "revision": commit, "commit": commit}
  assert pretrained.same_source(a, b)
  assert not pretrained.same_source(a, pretrained.source("org/tiny@" + "0" * 40))
  assert not pretrained.same_source(a, pretrained.source("org/other@" + commit))
  # Tokenizer, encoder config and weights all come from that folder.
  assert pretrained.encoder_config("org/tiny")["num_hidden_layers"] == 2
  assert HFTokenizer(folder).vocab_size == pretrained.load_pretrained(folder).config.vocab_size


def test_hub_id_not_in_the_offline_cache_is_one_line(offline_hub):
  with pytest.raises(FileNotFoundError) as err:
    pretrained.resolve("org/absent")
  msg = str(err.value)
  assert "\n" not in msg and "'org/absent'" in msg and "HF_HUB_OFFLINE" in msg and str(offline_hub) in msg
  hub_cache(offline_hub, "org/tiny")
  with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE"):
    pretrained.resolve("org/tiny@" + "1" * 40)  # a commit the cache does not hold


@pytest.mark.parametrize("files, want", [
    (["model.safetensors", "flax_model.msgpack", "pytorch_model.bin"], ["model.safetensors"]),
    (["flax_model.msgpack.index.json", "flax_model-00001-of-00002.msgpack", "pytorch_model.bin"],
     ["flax_model.msgpack.index.json", "flax_model-*.msgpack"]),
    (["model.safetensors.index.json", "model-00001-of-00002.safetensors", "flax_model.msgpack"],
     ["model.safetensors.index.json", "model-*.safetensors"]),
    (["pytorch_model.bin"], None),
])
def test_online_hub_fetches_one_weight_format(offline_hub, monkeypatch, files, want):
  """Online (the hub's file listing and snapshot_download stand in): config, tokenizer files and the first
  weight format the repo has are fetched; a repo with pickled weights only fails before downloading."""
  import huggingface_hub
  from huggingface_hub import constants

  commit, snapshot = hub_cache(offline_hub, "org/tiny")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
  listing = [types.SimpleNamespace(rfilename=f) for f in ["config.json", "tokenizer.json", "README.md", *files]]
  monkeypatch.setattr(huggingface_hub.HfApi, "model_info",
                      lambda self, repo_id, revision=None: types.SimpleNamespace(sha=commit, siblings=listing))
  calls = []

  def snapshot_download(repo_id, *, revision, allow_patterns, local_files_only):
    calls.append(dict(repo_id=repo_id, revision=revision, allow_patterns=allow_patterns, local=local_files_only))
    return str(snapshot)

  monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
  if want is None:
    with pytest.raises(FileNotFoundError, match="AutoModel.from_pretrained\\('org/tiny', revision='v1'\\)"):
      pretrained.resolve("org/tiny@v1")
    assert not calls
    return
  assert pretrained.resolve("org/tiny") == snapshot
  assert calls == [dict(repo_id="org/tiny", revision=None, local=False,
                        allow_patterns=["config.json", *pretrained.TOKENIZER_FILES, *want])]
  assert pretrained.source("org/tiny") == {"repo_id": "org/tiny", "revision": "main", "commit": commit}


def test_unreachable_hub_falls_back_to_the_cache(offline_hub, monkeypatch, caplog):
  import huggingface_hub
  from huggingface_hub import constants

  commit, snapshot = hub_cache(offline_hub, "org/tiny")
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)

  def unreachable(self, repo_id, revision=None):
    raise ConnectionError("Name or service not known")

  monkeypatch.setattr(huggingface_hub.HfApi, "model_info", unreachable)
  assert pretrained.resolve("org/tiny") == snapshot
  assert pretrained.source(f"org/tiny@{commit}")["commit"] == commit
  assert "cannot be reached (ConnectionError: Name or service not known)" in caplog.text
  with pytest.raises(FileNotFoundError, match="the hub .* is unreachable"):
    pretrained.resolve("org/absent")


@pytest.mark.parametrize("remove, named", [("tokenizer.json", "a tokenizer"), ("config.json", "config.json"),
                                           ("model.safetensors", "weights (model.safetensors or")])
def test_missing_file_is_one_clear_line(offline_hub, remove, named):
  _, snapshot = hub_cache(offline_hub, "org/tiny")
  (snapshot / remove).unlink()
  (snapshot / "vocab.txt").unlink()
  with pytest.raises(FileNotFoundError) as err:
    pretrained.resolve("org/tiny")
  msg = str(err.value)
  assert "\n" not in msg and named in msg and msg.startswith("org/tiny (HF cache snapshot")


def test_missing_shard_is_named(tmp_path):
  _, weights = tiny_encoder(tmp_path / "enc", weights_format="none")
  write_flax(tmp_path / "enc", weights, prefix="bert", shards=2)
  (tmp_path / "enc" / "flax_model-00002-of-00002.msgpack").unlink()
  with pytest.raises(FileNotFoundError, match=r"lacks flax_model-00002-of-00002.msgpack \(named by "):
    pretrained.resolve(tmp_path / "enc")


def test_tilde_path_and_local_identity(tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  tiny_encoder(tmp_path / "models" / "enc")
  assert pretrained.resolve("~/models/enc") == tmp_path / "models" / "enc"
  assert pretrained.source("~/models/enc") == {"path": str(tmp_path / "models" / "enc")}
  assert pretrained.load_pretrained("~/models/enc").config.num_layers == 2
  with pytest.raises(FileNotFoundError, match="'~/models/nope' is not a directory"):
    pretrained.resolve("~/models/nope")


def test_unsupported_model_type_is_one_line(tmp_path):
  hf, _ = tiny_encoder(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps({**hf, "model_type": "gpt2"}))
  with pytest.raises(ValueError) as err:
    pretrained.load_pretrained(tmp_path)
  assert str(err.value) == "unsupported model_type gpt2; supported: bert, roberta, xlm-roberta, camembert"


def test_resume_compares_the_resolved_encoder(offline_hub, tmp_path):
  """pretrained.json records the resolved identity; org/name and org/name@<its commit> resume each other."""
  commit, _ = hub_cache(offline_hub, "org/tiny")
  run = tmp_path / "run"
  config = {"model": {"encoder": "bert", "pretrained": "org/tiny"}}
  tokenizer, encoder = HFTokenizer(pretrained.resolve("org/tiny")), pretrained.encoder_config("org/tiny")
  wd.save_run_files(run, config_json=json.dumps(config), types=["A"], tokenizer=tokenizer, encoder_config=encoder)
  assert wd.load_pretrained_source(run) == {"repo_id": "org/tiny", "revision": "main", "commit": commit}
  pinned = {"model": {"encoder": "bert", "pretrained": f"org/tiny@{commit}"}}
  assert wd.resume_changes(run, config, pinned) == []
  other = {"model": {"encoder": "bert", "pretrained": "org/tiny@" + "2" * 40}}
  assert wd.resume_changes(run, config, other) == [f"model.pretrained: 'org/tiny@{commit}' -> 'org/tiny@{'2' * 40}'"]
  # Saved again (a resumed run): the record of the first run stays.
  wd.save_run_files(run, config_json=json.dumps(other), types=["A"], tokenizer=tokenizer, encoder_config=encoder)
  assert wd.load_pretrained_source(run)["commit"] == commit


# ----------------------------------------------------------------------------------------------
# Weight formats.


def test_flax_msgpack_loads_like_safetensors(tmp_path):
  """The same weights as model.safetensors, flax_model.msgpack (with and without the bert/ prefix), a sharded
  msgpack and sharded safetensors: identical parameters and outputs."""
  _, weights = tiny_encoder(tmp_path / "st", seed=3)
  reference = pretrained.load_pretrained(tmp_path / "st")
  for name, write in {
      "flax_prefixed": lambda d: write_flax(d, weights, prefix="bert"),
      "flax_plain": lambda d: write_flax(d, weights),
      "flax_sharded": lambda d: write_flax(d, weights, prefix="bert", shards=3),
  }.items():
    tiny_encoder(tmp_path / name, seed=3, weights_format="none")
    write(tmp_path / name)
    files = pretrained.weight_files(tmp_path / name)
    assert [f.suffix for f in files] == [".msgpack"] * (3 if "sharded" in name else 1)
    _assert_same_model(reference, pretrained.load_pretrained(tmp_path / name))
  sharded = tmp_path / "st_sharded"
  tiny_encoder(sharded, seed=3, weights_format="none")
  names = sorted(weights)
  weight_map = {}
  for i, part in enumerate((names[::2], names[1::2])):
    file = f"model-{i + 1:05d}-of-00002.safetensors"
    save_file({k: weights[k] for k in part}, str(sharded / file))
    weight_map.update(dict.fromkeys(part, file))
  (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
  _assert_same_model(reference, pretrained.load_pretrained(sharded))


def test_safetensors_wins_over_msgpack_and_roberta_prefix(tmp_path):
  _, weights = tiny_encoder(tmp_path, model_type="roberta", seed=1)
  write_flax(tmp_path, {k: np.zeros_like(v) for k, v in weights.items()}, prefix="roberta")
  assert [f.name for f in pretrained.weight_files(tmp_path)] == ["model.safetensors"]
  (tmp_path / "model.safetensors").unlink()
  model = pretrained.load_pretrained(tmp_path)
  assert model.config.model_type == "roberta"
  assert not np.asarray(model.layers[0].query.kernel.value).any()  # the msgpack's zeros


# ----------------------------------------------------------------------------------------------
# Tokenizer lowercase.


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_tokenizer_lowercase_on_off_round_trip(tmp_path, model_type):
  """tokenizer.lowercase sets a pretrained tokenizer's case (BertNormalizer's flag; a Lowercase normalizer
  for RoBERTa's none), and the saved tokenizer reads text the same way."""
  tiny_encoder(tmp_path / "enc", model_type=model_type)  # cased
  ids = lambda tok, text: list(tok.encode(text).features["input_ids"])  # noqa: E731
  assert not HFTokenizer(tmp_path / "enc").lowercase
  for lowercase in (True, False):
    tok = HFTokenizer(tmp_path / "enc", lowercase=lowercase)
    assert tok.lowercase is lowercase
    assert (ids(tok, "AbC_Xy") == ids(tok, "abc_xy")) is lowercase
    tok.save(tmp_path / f"saved_{lowercase}")
    again = load_tokenizer(tmp_path / f"saved_{lowercase}")
    assert again.lowercase is lowercase and ids(again, "AbC_Xy") == ids(tok, "AbC_Xy")
  # The saved BERT files alone (no manifest) keep the choice too: do_lower_case is saved with it.
  if model_type == "bert":
    (tmp_path / "saved_True" / "gp_jax_tokenizer.json").unlink()
    assert load_tokenizer(tmp_path / "saved_True").lowercase
