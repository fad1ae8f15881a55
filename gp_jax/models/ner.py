"""Encoder + span head, and builders from a training config."""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os

import jax.numpy as jnp
from flax import nnx

from gp_jax.models.heads import HEADS
from gp_jax.models.taggers import TAGGERS
from gp_jax.ops import span_mask, zlpr_loss

log = logging.getLogger(__name__)

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


class NerModel(nnx.Module):
  """Token encoder followed by a head. The head interface used by training and evaluation:

  `loss(batch)` -> scalar, and `decode_hits(batch, size=...)` -> hits in `ops.gather_hits` format
  ((count, coords [size, 4] as (row, type, start, end), scores [size])), so nothing outside the
  model assumes `[B, H, L, L]` logits. Span heads also give those logits through `__call__`.
  """

  def __init__(self, encoder: nnx.Module, head: nnx.Module, feature_names: tuple[str, ...]):
    self.encoder = encoder
    self.head = head
    self.feature_names = tuple(feature_names)
    params = inspect.signature(type(encoder).__call__).parameters
    self._encoder_takes_positions = "positions" in params

  def encode(self, batch):
    kwargs = {name: batch[name] for name in self.feature_names}
    if self._encoder_takes_positions:
      kwargs["positions"] = batch["positions"]
    return self.encoder(attention_mask=batch["attention_mask"], **kwargs)

  def __call__(self, batch):
    """Span heads: logits [B, H, L, L]; taggers: emissions [B, L, T]."""
    return self.head(self.encode(batch), batch["span_mask"], positions=batch["positions"])

  @property
  def is_tagger(self) -> bool:
    return hasattr(self.head, "tag_loss")

  def loss(self, batch, *, loss_kind: str = "sparse_zlpr", block_size: int | None = None):
    hidden_BLD = self.encode(batch)
    if self.is_tagger:
      return self.head.tag_loss(hidden_BLD, batch["span_mask"], tags_BL=batch["tags"])
    if loss_kind == "sparse_zlpr":
      return self.head.span_loss(hidden_BLD, batch["span_mask"], span_ids=batch["span_ids"],
                                 positions=batch["positions"], block_size=block_size)
    if loss_kind == "zlpr":
      logits_BHLL = self.head(hidden_BLD, batch["span_mask"], positions=batch["positions"])
      return zlpr_loss(logits_BHLL, labels=dense_labels(batch["span_ids"], logits_BHLL.shape),
                       mask=span_mask(batch["span_mask"], max_span_width=self.head.max_span_width))
    raise ValueError(f"loss.kind must be 'sparse_zlpr' or 'zlpr', got {loss_kind!r}")

  def decode_hits(self, batch, *, size: int, block_size: int | None = None, hit_sharding=None):
    return self.head.decode_hits(self.encode(batch), batch["span_mask"], positions=batch["positions"], size=size,
                                 block_size=block_size, hit_sharding=hit_sharding)


def dense_labels(span_ids_BHK, shape):
  """Flat positive ids `[B, H, K]` (-1 padded) -> {0, 1} labels of `shape` `[B, H, L, L]`."""
  B, H, L, _ = shape
  ids = span_ids_BHK
  labels = jnp.zeros((B, H, L * L), jnp.int32)
  labels = labels.at[jnp.arange(B)[:, None, None], jnp.arange(H)[None, :, None],
                     jnp.where(ids >= 0, ids, L * L)].set(1, mode="drop")
  return labels.reshape(shape)


def resolve_pretrained(name_or_path: str) -> str:
  if name_or_path == "minilm":
    from gp_jax.models.pretrained import minilm_l6_path  # pylint: disable=g-import-not-at-top

    return str(minilm_l6_path())
  return name_or_path


def build_tokenizer(config, train_texts):
  """Builds the tokenizer from the training texts (scratch) or opens the pretrained one (bert)."""
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


def load_encoder_config(config) -> dict | None:
  """bert: the HF config.json dict of `model.pretrained`; None for the scratch encoder."""
  if config.model.encoder != "bert":
    return None
  with open(os.path.join(resolve_pretrained(config.model.pretrained), "config.json")) as f:
    return json.load(f)


def build_model(config, tokenizer, num_types: int, *, seed: int = 0, load_weights: bool = True,
                encoder_config: dict | None = None) -> NerModel:
  """Builds the NER model. With `load_weights=False` a bert encoder is built from `encoder_config` (the HF
  config.json dict; default: read from `model.pretrained`) without reading weights."""
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
        conv_impl=m.get("conv_impl", "unfold"),
        num_attn_layers=m.num_attn_layers,
        dropout=m.dropout,
        embed_dropout=m.embed_dropout,
    )
    encoder = ScratchEncoder(scfg, dtype=dtype, rngs=rngs)
  elif m.encoder == "bert":
    from gp_jax.models import bert

    dropout = {"hidden_dropout": float(m.dropout), "attention_dropout": float(m.dropout)}
    if load_weights:
      encoder = bert.load_pretrained(resolve_pretrained(m.pretrained), dtype=dtype, overrides=dropout)
    else:
      hf = encoder_config or load_encoder_config(config)
      bcfg = dataclasses.replace(bert.BertConfig.from_hf_dict(hf), **dropout)
      encoder = bert.Bert(bcfg, dtype=dtype, rngs=rngs)
  else:
    raise ValueError(f"model.encoder must be 'scratch' or 'bert', got {m.encoder!r}")
  if m.head in TAGGERS:
    head = TAGGERS[m.head](encoder.hidden_size, num_types, scheme=m.tag_scheme, dtype=dtype, rngs=rngs)
    return NerModel(encoder, head, tokenizer.feature_names)
  if m.head not in HEADS:
    raise ValueError(f"model.head must be one of {sorted(HEADS) + sorted(TAGGERS)}, got {m.head!r}")
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
