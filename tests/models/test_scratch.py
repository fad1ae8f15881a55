import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.models.scratch import ScratchConfig, ScratchEncoder

SMALL = ScratchConfig(
    vocab_size=50,
    bigram_vocab_size=70,
    embed_dim=8,
    bigram_dim=6,
    hidden_size=16,
    num_layers=3,
    dilations=(1, 2, 4),
    num_heads=2,
    dropout=0.3,
    embed_dropout=0.3,
)
CONFIGS = {
    "glu": SMALL,
    "gelu_proj": dataclasses.replace(SMALL, block="gelu", conv_out_proj=True, kernel_size=5),
    "attn": dataclasses.replace(SMALL, num_attn_layers=1),
    "no_bigrams": dataclasses.replace(SMALL, bigram_vocab_size=0),
}


def n_params(module):
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def expected_params(c: ScratchConfig) -> int:
  D, k = c.hidden_size, c.kernel_size
  width = c.embed_dim + (c.bigram_dim if c.bigram_vocab_size else 0)
  n = c.vocab_size * c.embed_dim + c.bigram_vocab_size * (c.bigram_dim if c.bigram_vocab_size else 0)
  n += width * D + D  # in_proj
  F = 2 * D if c.block == "glu" else D
  conv = 2 * D + k * D * F + F + ((D * D + D) if c.conv_out_proj else 0)
  R = c.mlp_ratio * D
  attn = 4 * D + (D * 3 * D + 3 * D) + (D * D + D) + (D * R + R) + (R * D + D)
  return n + c.num_layers * conv + c.num_attn_layers * attn + 2 * D


# Jitted init and forward: eager mode would compile every small op separately (slow).
@nnx.jit(static_argnums=(0, 2))
def _make(c: ScratchConfig, seed, dtype) -> ScratchEncoder:
  return ScratchEncoder(c, dtype=dtype, rngs=nnx.Rngs(seed))


def make(c: ScratchConfig, seed: int, dtype=jnp.float32) -> ScratchEncoder:
  return _make(c, jax.random.key(seed), dtype)


@nnx.jit
def _apply(enc, ids, mask, bi, positions):
  return enc(ids, mask, bigram_ids=bi, positions=positions)


def apply(enc, ids, mask, bi, positions=None):
  if positions is None:  # one compile per shape whether or not positions are given
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
  return np.asarray(_apply(enc, ids, mask, bi, np.asarray(positions, np.int32)))


def batch(c: ScratchConfig, B=3, L=12, seed=0):
  rng = np.random.default_rng(seed)
  lengths = np.array([L, L - 5, 3])[:B]
  mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
  ids = rng.integers(2, c.vocab_size, (B, L)).astype(np.int32) * mask
  bi = rng.integers(2, max(c.bigram_vocab_size, 3), (B, L)).astype(np.int32) * mask
  return ids, mask, (bi if c.bigram_vocab_size else None), lengths


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_param_count(name):
  c = CONFIGS[name]
  enc = nnx.eval_shape(lambda: ScratchEncoder(c, rngs=nnx.Rngs(0)))  # shapes only, nothing compiled
  assert enc.hidden_size == c.hidden_size
  assert n_params(enc) == expected_params(c)


@pytest.mark.parametrize("name", ["glu", "attn", "no_bigrams"])
def test_shape_and_padding_does_not_leak(name):
  c = CONFIGS[name]
  enc = make(c, 1)
  enc.eval()
  ids, mask, bi, lengths = batch(c)
  h = apply(enc, ids, mask, bi)
  assert h.shape == (3, 12, c.hidden_size) and h.dtype == np.float32
  assert np.isfinite(h).all()
  assert np.all(h[mask == 0] == 0)  # padded rows are zeroed
  # junk ids under the padding: valid outputs must not move
  junk = np.random.default_rng(5).integers(2, c.vocab_size, ids.shape).astype(np.int32)
  bi_j = None if bi is None else np.where(mask == 1, bi, junk % c.bigram_vocab_size)
  h_j = apply(enc, np.where(mask == 1, ids, junk), mask, bi_j)
  np.testing.assert_allclose(h, h_j, rtol=1e-5, atol=1e-5)
  # row 1 (7 of 12 valid) alone and unpadded gives the same valid outputs
  n = lengths[1]
  one = apply(enc, ids[1:2, :n], mask[1:2, :n], None if bi is None else bi[1:2, :n])
  np.testing.assert_allclose(h[1, :n], one[0], rtol=1e-5, atol=1e-5)


def test_positions_shift_invariance_with_attention():
  c = CONFIGS["attn"]
  enc = make(c, 2)
  enc.eval()
  ids, mask, bi, _ = batch(c)
  pos = np.broadcast_to(np.arange(12), ids.shape)
  h0 = apply(enc, ids, mask, bi, pos)
  h1 = apply(enc, ids, mask, bi, pos + 7)  # RoPE: only differences matter
  np.testing.assert_allclose(h0, h1, rtol=1e-4, atol=1e-4)
  h2 = apply(enc, ids, mask, bi, pos * 2)  # ... and differences do matter
  assert not np.allclose(h0[0], h2[0], atol=1e-3)


def test_conv_impls_agree():
  c = CONFIGS["glu"]
  enc = make(c, 6)
  enc.eval()
  ids, mask, bi, _ = batch(c)
  h_unfold = apply(enc, ids, mask, bi)
  for block in enc.convs:  # same parameters, the other implementation
    block.conv_impl = "xla"
  np.testing.assert_allclose(apply(enc, ids, mask, bi), h_unfold, rtol=1e-4, atol=1e-4)


def test_bfloat16_compute_close_to_float32():
  c = CONFIGS["glu"]
  ids, mask, bi, _ = batch(c)
  enc32, enc16 = make(c, 7), make(c, 7, jnp.bfloat16)
  enc32.eval()
  enc16.eval()
  h32, h16 = apply(enc32, ids, mask, bi), apply(enc16, ids, mask, bi)
  assert h16.dtype == jnp.bfloat16
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(nnx.state(enc16, nnx.Param)))
  np.testing.assert_allclose(h16.astype(np.float32), h32, atol=0.1)


def test_dropout_train_vs_eval():
  c = CONFIGS["glu"]
  enc = make(c, 0)
  ids, mask, bi, _ = batch(c)
  enc.eval()
  e1, e2 = apply(enc, ids, mask, bi), apply(enc, ids, mask, bi)
  np.testing.assert_array_equal(e1, e2)
  enc.train()
  t1, t2 = apply(enc, ids, mask, bi), apply(enc, ids, mask, bi)
  assert not np.allclose(t1, t2)  # fresh masks each call
  assert not np.allclose(t1, e1)
  enc.eval()
  np.testing.assert_array_equal(apply(enc, ids, mask, bi), e1)


def test_gradients_finite_and_nonzero():
  c = CONFIGS["attn"]
  enc = make(c, 3)
  ids, mask, bi, _ = batch(c)

  @nnx.jit
  def grad_fn(m):
    def loss_fn(m):
      h = m(ids, mask, bigram_ids=bi)
      return jnp.sum(jnp.sin(h) * jnp.asarray(mask)[..., None])

    return nnx.grad(loss_fn)(m)

  grads = grad_fn(enc)
  leaves = jax.tree.leaves(grads)
  assert leaves and all(np.isfinite(np.asarray(g)).all() for g in leaves)
  g_emb = np.asarray(grads["embed"]["embedding"].value)
  assert np.abs(g_emb[ids[0, 0]]).sum() > 0
  assert np.abs(g_emb[0]).sum() == 0  # [PAD] only ever appears at padded positions
  for i in range(c.num_layers):
    assert np.abs(np.asarray(grads["convs"][i]["conv"]["kernel"].value)).sum() > 0


def test_missing_bigrams_and_bad_config():
  enc = make(SMALL, 0)
  ids, mask, _, _ = batch(SMALL)
  with pytest.raises(ValueError):
    enc(ids, mask)
  with pytest.raises(ValueError):
    dataclasses.replace(SMALL, kernel_size=4)
  with pytest.raises(ValueError):
    dataclasses.replace(SMALL, block="lstm")
