"""The BERT encoder's fused kernels (`BertConfig.kernels`): resolved per target, same parameters and function as the
reference formulation (values and gradients, float32 and bfloat16), every dropout mask's key words from one draw of
the stream, and the name checked."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax.models import bert
from gp_jax.models.bert import Bert, BertConfig

TINY = BertConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=48,
                  max_position_embeddings=64, type_vocab_size=2, hidden_dropout=0.0, attention_dropout=0.0)


def _batch():
  rng = np.random.default_rng(0)
  ids_BL = jnp.asarray(rng.integers(1, 97, (3, 11)), jnp.int32)
  mask_BL = jnp.ones((3, 11), jnp.int32).at[1, 7:].set(0).at[2, 4:].set(0)
  return ids_BL, mask_BL


def test_kernels_resolve_per_target_and_bad_names_fail():
  assert bert.resolve_kernels(TINY) == "reference"  # no target: the reference formulation
  targets = {p: bert.resolve_kernels(dataclasses.replace(TINY, target_platform=p)) for p in ("cpu", "cuda", "tpu")}
  assert targets == {"cpu": "reference", "cuda": "fused", "tpu": "reference"}
  assert bert.resolve_kernels(dataclasses.replace(TINY, target_platform="cpu", kernels="fused")) == "fused"
  with pytest.raises(ValueError, match="kernels must be one of"):
    dataclasses.replace(TINY, kernels="fast")


def _value_and_grads(kernels, dtype):
  model = Bert(dataclasses.replace(TINY, kernels=kernels), dtype=dtype, rngs=nnx.Rngs(0))
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  ids_BL, mask_BL = _batch()
  w_BLD = jnp.asarray(np.random.default_rng(1).normal(size=ids_BL.shape + (32,)), jnp.float32)

  def loss(p):
    return jnp.sum(nnx.merge(graphdef, p, rest, copy=True)(ids_BL, mask_BL).astype(jnp.float32) * w_BLD)

  return params, jax.jit(jax.value_and_grad(loss))(params)  # one program: op by op compiles each op on its own


@pytest.mark.parametrize("dtype,tol", [(jnp.float32, 2e-5), (jnp.bfloat16, 3e-2)])
def test_fused_is_the_reference_function(dtype, tol):
  ref_params, (ref_loss, ref_grads) = _value_and_grads("reference", dtype)
  params, (loss, grads) = _value_and_grads("fused", dtype)
  assert jax.tree.structure(params) == jax.tree.structure(ref_params)  # same parameters: checkpoints unchanged
  np.testing.assert_allclose(float(loss), float(ref_loss), rtol=tol)
  # Gradients against the largest one (the key bias's is zero up to rounding: softmax ignores it).
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(ref_grads))
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref_grads), jax.tree.leaves(grads)):
    assert a.dtype == b.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=tol * scale,
                               err_msg=jax.tree_util.keystr(path))


_forward = nnx.jit(lambda model, ids_BL, mask_BL: model(ids_BL, mask_BL))  # op by op, every op compiles on its own


def test_fused_dropout_draws_the_stream_once_per_call():
  cfg = dataclasses.replace(TINY, kernels="fused", hidden_dropout=0.2, attention_dropout=0.2, dropout_bits="hash")
  model = Bert(cfg, rngs=nnx.Rngs(0))
  ids_BL, mask_BL = _batch()
  model.train()
  count = int(model.embeddings_dropout.rngs.count.value)
  a = np.asarray(_forward(model, ids_BL, mask_BL))
  assert int(model.embeddings_dropout.rngs.count.value) == count + 1  # one draw for all 1 + 3 x layers masks
  b = np.asarray(_forward(model, ids_BL, mask_BL))
  assert not np.allclose(a, b) and np.isfinite(a).all()
  model.eval()
  np.testing.assert_array_equal(np.asarray(_forward(model, ids_BL, mask_BL)),
                                np.asarray(_forward(model, ids_BL, mask_BL)))
  threefry = Bert(dataclasses.replace(cfg, dropout_bits="threefry"), rngs=nnx.Rngs(0))
  threefry.train()
  assert threefry._dropout_words() is None  # threefry masks: each dropout draws its own key
