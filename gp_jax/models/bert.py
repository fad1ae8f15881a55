"""BERT / RoBERTa encoder in Flax NNX, numerically matching transformers' BertModel.

Post-LN Transformer: embeddings (word + position + token type) -> LayerNorm -> dropout, then N layers of
  h = LN(h + Dropout(Attn(h)));  h = LN(h + Dropout(W2 gelu(W1 h))).
RoBERTa checkpoints differ only in position ids (cumulative count of non-pad tokens + pad id) and the
weight-name prefix.

Weights come from `gp_jax.models.pretrained.load_pretrained`; a freshly built `Bert(...)` follows the nnx
convention and starts in train mode. `BertConfig.kernels` picks how the train step is written (`resolve_kernels`):
the same parameters and function either way.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import ops
from gp_jax.models.layers import embed, embed_prefix, linear
from gp_jax.ops import attention as attention_lib
from gp_jax.ops.dropout import dropout, dropout_words
from gp_jax.ops.gelu import gelu
from gp_jax.ops.layer_norm import layer_norm

ROBERTA_TYPES = ("roberta", "xlm-roberta", "camembert")
_ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
  "gelu": lambda x: jax.nn.gelu(x, approximate=False),  # BERT's "gelu" is the exact erf form
  "gelu_new": lambda x: jax.nn.gelu(x, approximate=True),
  "gelu_pytorch_tanh": lambda x: jax.nn.gelu(x, approximate=True),
  "relu": jax.nn.relu,
  "silu": jax.nn.silu,
  "swish": jax.nn.silu,
}
KERNELS = ("auto", "fused", "reference")
FUSED_ON = ("cuda",)  # targets where kernels="auto" is "fused" (docs/benchmarks/gpu_compiled.md)


@dataclasses.dataclass(frozen=True)
class BertConfig:
  """Architecture of a BERT-family encoder (field names follow the nnx side, not HF's)."""

  vocab_size: int = 30522
  hidden_size: int = 768
  num_layers: int = 12
  num_heads: int = 12
  intermediate_size: int = 3072
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  hidden_act: str = "gelu"
  model_type: str = "bert"  # "bert" | "roberta" (position ids offset by pad_token_id + 1)
  pad_token_id: int = 0
  hidden_dropout: float = 0.1  # embeddings, attention output, FFN output
  attention_dropout: float = 0.1  # attention probabilities (the XLA attention path only: ops.attention)
  attention: str = "xla"  # ops.attention implementation: auto | xla | cudnn | splash
  target_platform: str | None = None  # platform the model is compiled for (attention=auto); None: at lowering
  dropout_bits: str | None = None  # dropout masks from "hash" or "threefry" bits (ops.dropout); None: at trace time
  kernels: str = "auto"  # fused | reference | auto (fused for a cuda target): `resolve_kernels`

  def __post_init__(self):
    if self.model_type not in ("bert", "roberta"):
      raise ValueError(f"model_type must be 'bert' or 'roberta', got {self.model_type!r}")
    if self.hidden_act not in _ACTIVATIONS:
      raise ValueError(f"hidden_act {self.hidden_act!r} not supported; one of {sorted(_ACTIVATIONS)}")
    if self.attention not in attention_lib.IMPLEMENTATIONS:
      raise ValueError(f"attention must be one of {attention_lib.IMPLEMENTATIONS}, got {self.attention!r}")
    if self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size {self.hidden_size} is not a multiple of num_heads {self.num_heads}")
    if self.kernels not in KERNELS:
      raise ValueError(f"kernels must be one of {KERNELS}, got {self.kernels!r}")

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any]) -> BertConfig:
    """Builds the config from a transformers config.json dict (BertConfig / RobertaConfig)."""
    model_type = d.get("model_type", "bert")
    if model_type in ROBERTA_TYPES:
      model_type = "roberta"
    elif model_type != "bert":
      raise ValueError(f"unsupported model_type {model_type}; supported: {', '.join(('bert',) + ROBERTA_TYPES)}")
    pos_type = d.get("position_embedding_type", "absolute")
    if pos_type != "absolute":
      raise ValueError(f"position_embedding_type {pos_type!r} not supported (only 'absolute')")
    if d.get("is_decoder") or d.get("add_cross_attention"):
      raise ValueError("decoder / cross-attention BERT configs are not supported")
    pad = d.get("pad_token_id")
    return cls(
      vocab_size=d["vocab_size"],
      hidden_size=d["hidden_size"],
      num_layers=d["num_hidden_layers"],
      num_heads=d["num_attention_heads"],
      intermediate_size=d["intermediate_size"],
      max_position_embeddings=d.get("max_position_embeddings", 512),
      type_vocab_size=d.get("type_vocab_size", 2),
      layer_norm_eps=d.get("layer_norm_eps", 1e-12),
      hidden_act=d.get("hidden_act", "gelu"),
      model_type=model_type,
      pad_token_id=(1 if model_type == "roberta" else 0) if pad is None else pad,
      hidden_dropout=d.get("hidden_dropout_prob", 0.1),
      attention_dropout=d.get("attention_probs_dropout_prob", 0.1),
    )


def resolve_kernels(cfg: BertConfig) -> str:
  """How the encoder's train step is written, "fused" or "reference" (the value resolved.json records). Same
  parameters and function either way; fused takes fewer kernels and less memory traffic on a GPU: every dropout
  mask's key words from one draw per step (hash bits), Q, K and V as one [D, 3D] projection (one matmul each way, one
  bias reduction), LayerNorm's and GELU's hand-written backward (`ops.layer_norm`, `ops.gelu`), the attention logits'
  gradient in the compute dtype (`ops.attention.xla_attention`). Its float rounding differs, so "auto" keeps the
  reference formulation everywhere but a cuda target."""
  if cfg.kernels != "auto":
    return cfg.kernels
  return "fused" if cfg.target_platform in FUSED_ON else "reference"


def _norm(module: nnx.LayerNorm, x: jax.Array, fused: bool) -> jax.Array:
  """`module(x)`; fused: the same function with its hand-written backward (`ops.layer_norm`)."""
  if not fused:
    return module(x)
  return layer_norm(x, module.scale[...], module.bias[...], module.epsilon, module.dtype or x.dtype)


def _layer_norm(cfg: BertConfig, dtype, param_dtype, rngs: nnx.Rngs) -> nnx.LayerNorm:
  # Two-pass variance (like torch), statistics in f32 even when dtype is bf16.
  return nnx.LayerNorm(cfg.hidden_size, epsilon=cfg.layer_norm_eps, use_fast_variance=False,
                       dtype=dtype, param_dtype=param_dtype, rngs=rngs)


class BertLayer(nnx.Module):
  """One post-LN Transformer layer."""

  DROPOUTS = 3  # dropout calls per layer: attention probabilities, attention output, FFN output

  def __init__(self, cfg: BertConfig, *, dtype, param_dtype, rngs: nnx.Rngs, index: int = 0):
    init = nnx.initializers.normal(0.02)
    self.index = index  # the static seed of cuDNN's fused attention dropout (ops.attention)
    dense = lambda i, o: linear(i, o, dtype=dtype, param_dtype=param_dtype, kernel_init=init, rngs=rngs)
    D, F = cfg.hidden_size, cfg.intermediate_size
    self.num_heads = cfg.num_heads
    self.attention, self.target_platform, self.dropout_bits = cfg.attention, cfg.target_platform, cfg.dropout_bits
    self.fused = resolve_kernels(cfg) == "fused"
    self.query, self.key, self.value = dense(D, D), dense(D, D), dense(D, D)
    self.attention_out = dense(D, D)
    self.attention_norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.intermediate = dense(D, F)
    self.output = dense(F, D)
    self.output_norm = _layer_norm(cfg, dtype, param_dtype, rngs)
    self.act = gelu if self.fused and cfg.hidden_act == "gelu" else _ACTIVATIONS[cfg.hidden_act]
    self.attention_dropout = nnx.Dropout(cfg.attention_dropout, rngs=rngs)
    self.hidden_dropout = nnx.Dropout(cfg.hidden_dropout, rngs=rngs)

  def __call__(self, x_BLD: jax.Array, mask_BL: jax.Array, words: jax.Array | None = None) -> jax.Array:
    """`words` (uint32 [DROPOUTS, 2]): the key words of this layer's hash dropout masks (`ops.dropout.dropout_words`);
    None: each dropout draws its own from the module's stream."""
    B, L, D = x_BLD.shape
    H = self.num_heads
    if self.fused:
      q_BLD, k_BLD, v_BLD = jnp.split(self._qkv(x_BLD), 3, axis=-1)
    else:
      q_BLD, k_BLD, v_BLD = self.query(x_BLD), self.key(x_BLD), self.value(x_BLD)
    q_BLHK, k_BLHK, v_BLHK = (t.reshape(B, L, H, D // H) for t in (q_BLD, k_BLD, v_BLD))
    drop = self.attention_dropout
    bits = self.dropout_bits
    word = lambda i: None if words is None else words[i]  # noqa: E731
    probs_dropout = (None if drop.deterministic or float(drop.rate) == 0.0
                     else (lambda p: dropout(drop, p, bits, words=word(0))))
    ctx_BLD = attention_lib.attention(q_BLHK, k_BLHK, v_BLHK, mask_BL=mask_BL, implementation=self.attention,
                                      platform=self.target_platform, probs_dropout=probs_dropout,
                                      dropout_rate=float(drop.rate), dropout_seed=self.index,
                                      low_precision_grad=self.fused).reshape(B, L, D)
    attn_BLD = dropout(self.hidden_dropout, self.attention_out(ctx_BLD), bits, words=word(1))
    x_BLD = _norm(self.attention_norm, x_BLD + attn_BLD, self.fused)
    ffn_BLD = self.output(self.act(self.intermediate(x_BLD)))
    return _norm(self.output_norm, x_BLD + dropout(self.hidden_dropout, ffn_BLD, bits, words=word(2)), self.fused)

  def _qkv(self, x_BLD: jax.Array) -> jax.Array:
    """[query | key | value](x) as one [D, 3D] matmul (same parameters, same dtype policy as nnx.Linear): its
    gradient is one matmul for the input, one for the three kernels and one reduction for the three biases, where
    XLA merges the three forward matmuls but not their backward."""
    mods = (self.query, self.key, self.value)
    kernel_DE = jnp.concatenate([m.kernel[...] for m in mods], axis=1)
    bias_E = jnp.concatenate([m.bias[...] for m in mods])
    x_BLD, kernel_DE, bias_E = self.query.promote_dtype((x_BLD, kernel_DE, bias_E), dtype=self.query.dtype)
    # One cast of the concatenation that both matmuls read: without the barrier XLA casts the three kernels apart.
    kernel_DE = jax.lax.optimization_barrier(kernel_DE)
    y_BLE = ops.flat_dot_general(x_BLD, kernel_DE, (((x_BLD.ndim - 1,), (0,)), ((), ())),
                                 precision=self.query.precision)
    return y_BLE + bias_E


class Bert(nnx.Module):
  """BERT / RoBERTa encoder: `(input_ids, attention_mask, token_type_ids) -> last_hidden_state`.

  dtype is the compute dtype (e.g. bf16 activations); param_dtype the storage dtype of parameters.
  """

  def __init__(self, config: BertConfig, *, dtype=jnp.float32, param_dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    self.hidden_size = config.hidden_size
    self.embed_width = config.hidden_size  # the word embeddings `embed_delta` is added to
    self.dtype = dtype
    init = nnx.initializers.normal(0.02)
    embed = lambda n: nnx.Embed(n, config.hidden_size, dtype=dtype, param_dtype=param_dtype,
                                embedding_init=init, rngs=rngs)
    self.word_embeddings = embed(config.vocab_size)
    self.position_embeddings = embed(config.max_position_embeddings)
    self.token_type_embeddings = embed(config.type_vocab_size)
    self.embeddings_norm = _layer_norm(config, dtype, param_dtype, rngs)
    self.embeddings_dropout = nnx.Dropout(config.hidden_dropout, rngs=rngs)
    self.layers = nnx.List([BertLayer(config, dtype=dtype, param_dtype=param_dtype, rngs=rngs, index=i)
                            for i in range(config.num_layers)])

  def position_ids(self, input_ids_BL: jax.Array) -> jax.Array:
    """0..L-1 for BERT; for RoBERTa cumsum(non-pad) + pad id on real tokens, pad id on padding."""
    B, L = input_ids_BL.shape
    offset = self.config.pad_token_id + 1 if self.config.model_type == "roberta" else 0
    if L + offset > self.config.max_position_embeddings:
      raise ValueError(f"sequence length {L} exceeds the {self.config.max_position_embeddings - offset} "
                       "positions this encoder was trained with")
    if self.config.model_type == "roberta":
      pad = self.config.pad_token_id
      real_BL = (input_ids_BL != pad).astype(jnp.int32)
      return jnp.cumsum(real_BL, axis=1) * real_BL + pad
    return jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None, embed_delta: jax.Array | None = None) -> jax.Array:
    """input_ids, attention_mask (1 = real token), token_type_ids: int [B, L] -> [B, L, D].

    `embed_delta` [B, L, D] is added to the word embeddings, before position/type embeddings and LayerNorm
    (adversarial training)."""
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    word_BLD = embed(self.word_embeddings, input_ids)
    if embed_delta is not None:
      word_BLD = word_BLD + embed_delta.astype(word_BLD.dtype)
    if self.config.model_type == "roberta":
      pos_BLD = embed(self.position_embeddings, self.position_ids(input_ids))
    else:
      self.position_ids(input_ids)  # the length check
      pos_BLD = embed_prefix(self.position_embeddings, input_ids.shape[1])
    x_BLD = word_BLD + pos_BLD + embed(self.token_type_embeddings, token_type_ids)
    words = self._dropout_words()
    fused = resolve_kernels(self.config) == "fused"
    x_BLD = dropout(self.embeddings_dropout, _norm(self.embeddings_norm, x_BLD, fused), self.config.dropout_bits,
                    words=None if words is None else words[0])
    mask_BL = attention_mask.astype(bool)
    n = BertLayer.DROPOUTS
    for i, layer in enumerate(self.layers):
      x_BLD = layer(x_BLD, mask_BL, None if words is None else words[1 + n * i:1 + n * (i + 1)])
    return x_BLD

  def _dropout_words(self) -> jax.Array | None:
    """Fused kernels, hash bits, training: the key words of every dropout mask of the step from one draw
    (`ops.dropout.dropout_words`); else None (each dropout draws its own)."""
    if (resolve_kernels(self.config) != "fused" or self.config.dropout_bits != "hash"
        or self.embeddings_dropout.deterministic):
      return None
    return dropout_words(self.embeddings_dropout, 1 + BertLayer.DROPOUTS * len(self.layers))
