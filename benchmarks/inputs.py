"""Model inputs several benchmarks share: synthetic batches in the pipeline's format, the project's train step
(`gp_jax.steps.make_train_step` on a model from `gp_jax.state.init_model`), and the MSRA main job's config.
"""

from __future__ import annotations

import json
import os

import jax
import numpy as np

from experiments import msra_scratch
from gp_jax import aot
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import steps
from gp_jax.configs import base
from gp_jax.evaluate import model_batch
from gp_jax.models.pretrained import minilm_l6_path
from gp_jax.optim import make_optimizer

MSRA_TYPES = ("LOC", "ORG", "PER")


def synthetic_batch(*, batch: int, seq: int, num_types: int, features: dict, num_prefix: int = 0,
                    num_suffix: int = 0, min_len: int | None = None, spans_per_row: int = 4, seed: int = 0) -> dict:
  """A numpy batch in the pipeline's format (`gp_jax.data.batching` docstring).

  `features`: name -> (low, high, pad value) of random ids; a name with low == high is constant (token types).
  Rows hold `min_len..seq` real tokens (default: all `seq`), the first `num_prefix` / last `num_suffix`
  of them specials ([CLS]/[SEP]: id 101 / 102); `spans_per_row` random gold spans (width <= 5) per row."""
  rng = np.random.default_rng(seed)
  B, L, H = batch, seq, num_types
  lens_B = np.full(B, L) if min_len is None else rng.integers(min_len, L + 1, size=B)
  col_BL = np.arange(L)[None, :]
  real_BL = col_BL < lens_B[:, None]
  out_features = {}
  for name, (low, high, pad) in features.items():
    ids_BL = np.full((B, L), low, np.int32) if high <= low else rng.integers(low, high, size=(B, L)).astype(np.int32)
    if name == "input_ids" and num_prefix:
      ids_BL[:, 0] = 101
    if name == "input_ids" and num_suffix:
      ids_BL[np.arange(B), lens_B - 1] = 102
    out_features[name] = np.where(real_BL, ids_BL, pad).astype(np.int32)
  content_BL = (col_BL >= num_prefix) & (col_BL < (lens_B - num_suffix)[:, None])
  span_ids_BHK = np.full((B, H, L), -1, np.int32)
  for b in range(B):
    lo, hi = num_prefix, int(lens_B[b]) - num_suffix
    for n in range(spans_per_row):
      i = int(rng.integers(lo, hi))
      j = min(hi - 1, i + int(rng.integers(0, 5)))
      span_ids_BHK[b, int(rng.integers(0, H)), n] = i * L + j
  span_ids_BHK.sort(axis=-1)
  span_ids_BHK = span_ids_BHK[..., ::-1].copy()  # -1 padding last, ids distinct per (row, type)
  return {
      "features": out_features,
      "attention_mask": real_BL.astype(np.int32),
      "span_mask": content_BL.astype(np.int32),
      "positions": np.where(real_BL, col_BL, 0).astype(np.int32),
      "span_ids": span_ids_BHK,
      "example_index": np.arange(B, dtype=np.int32),
      "window_start": np.zeros(B, np.int32),
      "window_index": np.arange(B, dtype=np.int32),
  }


class ProjectStep:
  """`init_model` + `steps.make_train_step` (state shardings, donated state), as training runs them.

  `mesh`: default `config.mesh`; `init_kwargs` go to `init_model` (e.g. `load_weights=False, encoder_config=hf`)."""

  def __init__(self, config, tokenizer, types, *, mesh=None, total_steps: int = 10_000, **init_kwargs):
    self.config = config
    self.mesh = mesh or shd.make_mesh(config.mesh.data, config.mesh.fsdp)
    self.setup, params = state_lib.init_model(config, tokenizer, types, self.mesh, **init_kwargs)
    self.n_params = state_lib.param_count(params)
    spec = self.setup.spec
    self.tx, _ = make_optimizer(spec.optimizer, total_steps, params)
    self.state = state_lib.init_train_state(self.setup, params, self.tx, seed=spec.seed)
    self.step_fn = steps.make_train_step(self.setup, self.tx, loss_kind=spec.loss_kind)

  def device_batch(self, batch):
    return shd.global_batch(model_batch(batch), self.mesh)

  def step(self, device_batch):
    """One step, blocked on (as a host that reads the metrics would be)."""
    self.state, metrics = self.step_fn(self.state, device_batch)
    jax.block_until_ready((self.state, metrics))
    return metrics


def msra_config():
  """`experiments/msra_scratch.py`'s config (the README main job)."""
  return msra_scratch.get_config()


def msra_inputs(vocab: int = 4734, bigram_vocab: int = 50002):
  """(tokenizer stand-in, synthetic_batch feature ranges) with the main job's vocabulary sizes."""
  return aot.char_tokenizer(vocab, bigram_vocab), {"input_ids": (2, vocab, 0), "bigram_ids": (2, bigram_vocab, 0)}


BERT_BASE = {  # bert-base-chinese's config.json, architecture fields
    "model_type": "bert", "vocab_size": 21128, "hidden_size": 768, "num_hidden_layers": 12,
    "num_attention_heads": 12, "intermediate_size": 3072, "max_position_embeddings": 512, "type_vocab_size": 2,
    "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1,
    "layer_norm_eps": 1e-12, "pad_token_id": 0, "initializer_range": 0.02,
}


def encoder_source(model: str, layers: int):
  """-> (HF config dict, pretrained dir or None for random init) of `--model` / `--layers`."""
  if model == "bert-base":
    hf, pretrained = dict(BERT_BASE), None
  else:
    pretrained = minilm_l6_path()
    with open(os.path.join(pretrained, "config.json")) as f:
      hf = json.load(f)
  if layers:
    hf["num_hidden_layers"], pretrained = layers, None
  return hf, pretrained


def bert_inputs(hf: dict):
  """(tokenizer stand-in, synthetic_batch feature ranges) of a BERT vocabulary."""
  pad = hf.get("pad_token_id", 0)
  return aot.bert_tokenizer(hf), {"input_ids": (1000, hf["vocab_size"], pad), "token_type_ids": (0, 0, 0)}


def bert_config(num_types: int, head_size: int):
  c = base.get_config("encoder=bert")
  c.model.pretrained = "minilm"
  c.model.head = "standard"
  c.model.head_size = head_size
  c.model.dropout = 0.1
  c.loss.kind = "sparse_zlpr"
  return c, [f"T{i}" for i in range(num_types)]


def minilm_step(batch: int, seq: int, *, warmup: int = 2):
  """-> (ProjectStep, device batch): the MiniLM + GlobalPointer (H=10, d=64) train step of `benchmarks.train_step`
  on a synthetic batch, compiled (traced now: settings read at trace time apply) and run `warmup` times."""
  hf, _ = encoder_source("minilm", 0)
  tokenizer, features = bert_inputs(hf)
  config, types = bert_config(10, 64)
  config.batch_size = batch
  step = ProjectStep(config, tokenizer, types)
  b = step.device_batch(synthetic_batch(batch=batch, seq=seq, num_types=len(types), num_prefix=1, num_suffix=1,
                                        features=features))
  for _ in range(warmup):
    step.step(b)
  return step, b
