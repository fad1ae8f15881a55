"""Encoder + span head, and builders from a training config."""

from __future__ import annotations

import inspect
import logging
import os

import jax.numpy as jnp
from flax import nnx

from gp_jax.models.heads import HEADS

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class NerModel(nnx.Module):
  """Token encoder followed by a GlobalPointer head; `__call__(batch) -> logits_BHLL`."""

  def __init__(self, encoder: nnx.Module, head: nnx.Module, feature_names: tuple[str, ...]):
    self.encoder = encoder
    self.head = head
    self.feature_names = tuple(feature_names)
    params = inspect.signature(type(encoder).__call__).parameters
    self._encoder_takes_positions = "positions" in params

  def __call__(self, batch):
    kwargs = {name: batch[name] for name in self.feature_names}
    if self._encoder_takes_positions:
      kwargs["positions"] = batch["positions"]
    hidden_BLD = self.encoder(attention_mask=batch["attention_mask"], **kwargs)
    return self.head(hidden_BLD, batch["span_mask"], positions=batch["positions"])


def resolve_pretrained(name_or_path: str) -> str:
  if name_or_path == "minilm":
    from gp_jax.models.pretrained import minilm_l6_path

    return str(minilm_l6_path())
  return name_or_path


def build_tokenizer(config, train_texts, workdir: str | None = None):
  """Loads the tokenizer saved in `workdir/tokenizer`, else builds it (scratch) or opens it (bert)."""
  from gp_jax.data.tokenize import load_tokenizer

  saved = os.path.join(workdir, "tokenizer") if workdir else None
  if saved and os.path.exists(os.path.join(saved, "gp_jax_tokenizer.json")):
    return load_tokenizer(saved)
  if config.model.encoder == "scratch":
    from gp_jax.data.char_tokenizer import CharTokenizer

    return CharTokenizer.build(
        train_texts,
        min_freq=config.tokenizer.min_freq,
        bigram_min_freq=config.tokenizer.bigram_min_freq,
        max_bigrams=config.tokenizer.max_bigrams or None,
        lowercase=config.tokenizer.lowercase,
    )
  if config.model.encoder == "bert":
    from gp_jax.data.tokenize import HFTokenizer

    return HFTokenizer(resolve_pretrained(config.model.pretrained))
  raise ValueError(f"model.encoder must be 'scratch' or 'bert', got {config.model.encoder!r}")


def build_model(config, tokenizer, num_types: int, *, seed: int = 0, load_weights: bool = True) -> NerModel:
  """Builds the NER model. With `load_weights=False` a bert encoder is built from its config only."""
  dtype = DTYPES[config.model.dtype]
  rngs = nnx.Rngs(params=seed, dropout=seed + 1)
  m = config.model
  if m.encoder == "scratch":
    from gp_jax.models.scratch import ScratchConfig, ScratchEncoder

    scfg = ScratchConfig(
        vocab_size=tokenizer.vocab_size,
        bigram_vocab_size=tokenizer.bigram_vocab_size if m.bigram_dim else 0,
        embed_dim=m.embed_dim,
        bigram_dim=m.bigram_dim or 128,
        hidden_size=m.hidden_size,
        num_layers=m.num_layers,
        block=m.block,
        kernel_size=m.kernel_size,
        dilations=tuple(m.dilations),
        num_attn_layers=m.num_attn_layers,
        dropout=m.dropout,
        embed_dropout=m.embed_dropout,
    )
    encoder = ScratchEncoder(scfg, dtype=dtype, rngs=rngs)
  elif m.encoder == "bert":
    from gp_jax.models import bert

    path = resolve_pretrained(m.pretrained)
    if load_weights:
      encoder = bert.load_pretrained(path, dtype=dtype)
    else:
      import json

      with open(os.path.join(path, "config.json")) as f:
        encoder = bert.Bert(bert.BertConfig.from_hf_dict(json.load(f)), dtype=dtype, rngs=rngs)
  else:
    raise ValueError(f"model.encoder must be 'scratch' or 'bert', got {m.encoder!r}")
  if m.head not in HEADS:
    raise ValueError(f"model.head must be one of {sorted(HEADS)}, got {m.head!r}")
  head = HEADS[m.head](
      encoder.hidden_size,
      num_types,
      head_size=m.head_size,
      use_rope=m.use_rope,
      max_span_width=config.data.max_span_width or None,
      dtype=dtype,
      rngs=rngs,
  )
  return NerModel(encoder, head, tokenizer.feature_names)
