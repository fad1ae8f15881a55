"""From-scratch encoder for char-level NER: char (+ bigram) embeddings, a residual conv stack,
optional light self-attention (RoPE) on top. Built to be fast on CPU (no pretrained weights).

  ids_BL, bigram_ids_BL -> Embed (concat) -> Dense(hidden) -> num_layers x ConvBlock
                        -> num_attn_layers x AttnBlock -> LayerNorm -> hidden_BLD

ConvBlock (pre-LN, residual): x + Dropout(Dense(GLU(Conv_k,dil(LN(x) * mask)))). The conv is an
"unfold + one matmul": k shifted copies of the input concatenated on channels, so XLA:CPU emits a
single GEMM. Padding is zeroed before every conv and masked out of attention, so padded positions
never change valid outputs.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import ops
from gp_jax.models.layers import embed, linear
from gp_jax.ops import attention as ops_attention

BLOCKS = ("glu", "gelu")
CONV_IMPLS = ("unfold", "xla")


@dataclasses.dataclass(frozen=True)
class ScratchConfig:
  vocab_size: int  # char vocabulary (ids 0 = pad, 1 = unk)
  bigram_vocab_size: int = 0  # char-bigram vocabulary; 0 = no bigram embedding
  embed_dim: int = 128  # char embedding width
  bigram_dim: int = 128  # bigram embedding width
  hidden_size: int = 128  # width of the conv / attention stack (= output width)
  num_layers: int = 4  # residual conv blocks
  block: str = "glu"  # "glu": conv -> 2*hidden, gated linear unit; "gelu": conv -> hidden, GELU
  kernel_size: int = 3  # conv width (odd)
  dilations: tuple[int, ...] = (1, 2, 4, 1)  # per conv block, cycled if shorter than num_layers
  conv_out_proj: bool = False  # Dense(hidden -> hidden) after the gate (more params, slower)
  conv_impl: str = "unfold"  # "unfold": k shifted copies + one GEMM; "xla": lax.conv (same params)
  num_attn_layers: int = 0  # pre-LN self-attention + MLP blocks after the convs (RoPE)
  num_heads: int = 4  # attention heads
  mlp_ratio: int = 2  # attention block MLP width = mlp_ratio * hidden
  rope_base: float = 10000.0  # RoPE base of the attention layers
  dropout: float = 0.1  # residual-branch dropout
  embed_dropout: float = 0.1  # dropout on the concatenated embeddings
  attention: str = "xla"  # ops.attention implementation: auto | xla | cudnn | splash
  attention_dropout: float = 0.0  # attention-probability dropout (the XLA attention path only)
  target_platform: str | None = None  # platform the model is compiled for (attention=auto); None: at lowering

  def __post_init__(self):
    if self.block not in BLOCKS:
      raise ValueError(f"block must be one of {BLOCKS}, got {self.block!r}")
    if self.conv_impl not in CONV_IMPLS:
      raise ValueError(f"conv_impl must be one of {CONV_IMPLS}, got {self.conv_impl!r}")
    if self.attention not in ops_attention.IMPLEMENTATIONS:
      raise ValueError(f"attention must be one of {ops_attention.IMPLEMENTATIONS}, got {self.attention!r}")
    if self.kernel_size % 2 != 1:
      raise ValueError(f"kernel_size must be odd, got {self.kernel_size}")
    if self.num_attn_layers and self.hidden_size % (2 * self.num_heads):
      raise ValueError("hidden_size must be divisible by 2 * num_heads (RoPE needs even head dims)")

  def dilation(self, layer: int) -> int:
    return self.dilations[layer % len(self.dilations)] if self.dilations else 1


def _unfold(x_BLD, kernel_size: int, dilation: int):
  """[B, L, D] -> [B, L, k*D]: the k taps x[t + (j - k//2) * dilation] (zeros outside)."""
  half = (kernel_size // 2) * dilation
  L = x_BLD.shape[1]
  xp_BPD = jnp.pad(x_BLD, ((0, 0), (half, half), (0, 0)))
  taps = [xp_BPD[:, j * dilation : j * dilation + L] for j in range(kernel_size)]
  return jnp.concatenate(taps, axis=-1)


def _conv_xla(x_BLD, kernel_KF, bias_F, kernel_size: int, dilation: int):
  """The same dilated 'same' conv as Linear(_unfold(x)), as one lax.conv (kernel rows are (tap, d))."""
  D = x_BLD.shape[-1]
  w_kDF = kernel_KF.reshape(kernel_size, D, -1).astype(x_BLD.dtype)
  half = (kernel_size // 2) * dilation
  y_BLF = jax.lax.conv_general_dilated(
      x_BLD, w_kDF, (1,), [(half, half)], rhs_dilation=(dilation,), dimension_numbers=("NWC", "WIO", "NWC")
  )
  return y_BLF + bias_F.astype(x_BLD.dtype)


class ConvBlock(nnx.Module):
  """Pre-LN residual 1-D conv block (GLU or GELU), masked so padding cannot leak."""

  def __init__(self, config: ScratchConfig, dilation: int, *, dtype, rngs: nnx.Rngs):
    D, k = config.hidden_size, config.kernel_size
    self.kernel_size, self.dilation, self.block, self.conv_impl = k, dilation, config.block, config.conv_impl
    out = 2 * D if config.block == "glu" else D
    self.norm = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.conv = linear(k * D, out, dtype=dtype, rngs=rngs)
    self.proj = linear(D, D, dtype=dtype, rngs=rngs) if config.conv_out_proj else None
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)

  def __call__(self, x_BLD, mask_BL1):
    h_BLD = self.norm(x_BLD) * mask_BL1
    if self.conv_impl == "xla":
      h_BLF = _conv_xla(h_BLD, self.conv.kernel[...], self.conv.bias[...], self.kernel_size, self.dilation)
    else:
      h_BLF = self.conv(_unfold(h_BLD, self.kernel_size, self.dilation))
    if self.block == "glu":
      a_BLD, g_BLD = jnp.split(h_BLF, 2, axis=-1)
      h_BLD = a_BLD * jax.nn.sigmoid(g_BLD)
    else:
      h_BLD = jax.nn.gelu(h_BLF)
    if self.proj is not None:
      h_BLD = self.proj(h_BLD)
    return x_BLD + self.dropout(h_BLD)


class AttnBlock(nnx.Module):
  """Pre-LN multi-head self-attention with RoPE on q/k, then a GELU MLP."""

  def __init__(self, config: ScratchConfig, *, dtype, rngs: nnx.Rngs):
    D = config.hidden_size
    self.num_heads, self.rope_base = config.num_heads, config.rope_base
    self.attention, self.target_platform = config.attention, config.target_platform
    self.norm1 = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.qkv = linear(D, 3 * D, dtype=dtype, rngs=rngs)
    self.out = linear(D, D, dtype=dtype, rngs=rngs)
    self.norm2 = nnx.LayerNorm(D, dtype=dtype, rngs=rngs)
    self.mlp_in = linear(D, config.mlp_ratio * D, dtype=dtype, rngs=rngs)
    self.mlp_out = linear(config.mlp_ratio * D, D, dtype=dtype, rngs=rngs)
    self.dropout = nnx.Dropout(config.dropout, rngs=rngs)
    self.attention_dropout = nnx.Dropout(config.attention_dropout, rngs=rngs) if config.attention_dropout else None

  def __call__(self, x_BLD, mask_BL, positions_BL):
    B, L, D = x_BLD.shape
    N = self.num_heads
    qkv_BL3ND = self.qkv(self.norm1(x_BLD)).reshape(B, L, 3, N, D // N)
    q_BLND, k_BLND, v_BLND = qkv_BL3ND[:, :, 0], qkv_BL3ND[:, :, 1], qkv_BL3ND[:, :, 2]
    q_BLND = ops.apply_rope(q_BLND, positions=positions_BL, base=self.rope_base)
    k_BLND = ops.apply_rope(k_BLND, positions=positions_BL, base=self.rope_base)
    drop = self.attention_dropout
    probs_dropout = None if drop is None or drop.deterministic else drop
    a_BLD = ops_attention.attention(q_BLND, k_BLND, v_BLND, mask_BL=mask_BL.astype(bool),
                                    implementation=self.attention, platform=self.target_platform,
                                    probs_dropout=probs_dropout).reshape(B, L, D)
    x_BLD = x_BLD + self.dropout(self.out(a_BLD))
    h_BLD = self.mlp_out(jax.nn.gelu(self.mlp_in(self.norm2(x_BLD))))
    return x_BLD + self.dropout(h_BLD)


class ScratchEncoder(nnx.Module):
  """Char (+ bigram) embedding -> conv stack -> optional attention -> LayerNorm; [B, L, hidden]."""

  def __init__(self, config: ScratchConfig, *, dtype=jnp.float32, rngs: nnx.Rngs):
    self.config = config
    self.hidden_size = config.hidden_size
    self.dtype = dtype
    emb_init = nnx.initializers.normal(0.1)
    self.embed = nnx.Embed(config.vocab_size, config.embed_dim, dtype=dtype, embedding_init=emb_init, rngs=rngs)
    self.bigram_embed = (
        nnx.Embed(config.bigram_vocab_size, config.bigram_dim, dtype=dtype, embedding_init=emb_init, rngs=rngs)
        if config.bigram_vocab_size
        else None
    )
    width = config.embed_dim + (config.bigram_dim if config.bigram_vocab_size else 0)
    self.embed_width = width  # the embedding output `embed_delta` is added to
    self.embed_dropout = nnx.Dropout(config.embed_dropout, rngs=rngs)
    self.in_proj = linear(width, config.hidden_size, dtype=dtype, rngs=rngs)
    self.convs = nnx.List(
        [ConvBlock(config, config.dilation(i), dtype=dtype, rngs=rngs) for i in range(config.num_layers)]
    )
    self.attns = nnx.List([AttnBlock(config, dtype=dtype, rngs=rngs) for _ in range(config.num_attn_layers)])
    self.final_norm = nnx.LayerNorm(config.hidden_size, dtype=dtype, rngs=rngs)

  def __call__(self, input_ids, attention_mask, bigram_ids=None, positions=None, embed_delta=None):
    """input_ids, attention_mask, bigram_ids, positions: [B, L] -> hidden [B, L, hidden_size].

    `embed_delta` [B, L, embed_width] is added to the concatenated char (+ bigram) embeddings (adversarial
    training)."""
    if self.bigram_embed is not None and bigram_ids is None:
      raise ValueError("this encoder was built with bigram embeddings: pass bigram_ids")
    mask_BL = jnp.asarray(attention_mask)
    mask_BL1 = mask_BL[..., None].astype(self.dtype)
    e_BLE = embed(self.embed, input_ids)
    if self.bigram_embed is not None:
      e_BLE = jnp.concatenate([e_BLE, embed(self.bigram_embed, bigram_ids)], axis=-1)
    if embed_delta is not None:
      e_BLE = e_BLE + embed_delta.astype(e_BLE.dtype)
    x_BLD = self.in_proj(self.embed_dropout(e_BLE))
    for conv in self.convs:
      x_BLD = conv(x_BLD, mask_BL1)
    if self.attns:
      if positions is None:
        positions = jnp.broadcast_to(jnp.arange(x_BLD.shape[1]), mask_BL.shape)
      for attn in self.attns:
        x_BLD = attn(x_BLD, mask_BL, positions)
    return self.final_norm(x_BLD) * mask_BL1.astype(x_BLD.dtype)


__all__ = ["ScratchConfig", "ScratchEncoder", "ConvBlock", "AttnBlock"]
