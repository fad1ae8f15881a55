"""Model and train-state construction shared by training, evaluation and predict.

Shardings are decided on abstract shapes before anything is allocated; parameters are created
directly with their shardings (jit with out_shardings) or loaded from a pretrained checkpoint.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import sharding as shd
from gp_jax.models.ner import build_model, load_encoder_config


@dataclasses.dataclass
class Setup:
  """Everything built from a config that training, evaluation and predict share."""

  config: object
  types: list
  tokenizer: object
  mesh: object
  graphdef: object
  rest: object  # non-parameter variables (RNG streams), replicated
  abstract_params: dict
  param_shardings: dict
  encoder_config: dict | None = None  # bert: the HF config.json dict (saved into the workdir)

  @property
  def block_size(self):
    return int(self.config.loss.block_size) or None


def init_model(config, tokenizer, types, mesh, *, load_weights=True, encoder_config=None):
  """Returns (Setup, params). `load_weights=False` skips pretrained weights (they will be restored)."""
  num_types = len(types)
  seed = int(config.seed)
  encoder_config = encoder_config or load_encoder_config(config)

  def build(weights):
    return build_model(config, tokenizer, num_types, seed=seed, load_weights=weights, encoder_config=encoder_config)

  abstract_model = nnx.eval_shape(lambda: build(False))
  graphdef, abs_params, abs_rest = nnx.split(abstract_model, nnx.Param, ...)
  abs_params = nnx.to_pure_dict(abs_params)
  p_shard = shd.tree_shardings(mesh, abs_params)
  rest_shard = jax.tree.map(lambda _: shd.replicated(mesh), abs_rest)

  def create():
    _, params, rest = nnx.split(build(False), nnx.Param, ...)
    return nnx.to_pure_dict(params), rest

  if config.model.encoder == "bert" and load_weights:
    # Only the RNG state comes from `create` (XLA drops the unused random init); weights from disk.
    rest = jax.jit(lambda: create()[1], out_shardings=rest_shard)()
    params = jax.device_put(nnx.to_pure_dict(nnx.state(build(True), nnx.Param)), p_shard)
  else:
    params, rest = jax.jit(create, out_shardings=(p_shard, rest_shard))()
  setup = Setup(config, list(types), tokenizer, mesh, graphdef, rest, abs_params, p_shard, encoder_config)
  return setup, params


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))


def abstract_params(setup: Setup):
  """ShapeDtypeStructs with shardings of the parameters: the target of a params-only restore."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), setup.abstract_params,
                      setup.param_shardings)


def state_shardings(setup: Setup, tx):
  """Shardings of the train state {params, opt_state, step, rng}."""
  repl = shd.replicated(setup.mesh)
  opt_shard = shd.tree_shardings(setup.mesh, jax.eval_shape(tx.init, setup.abstract_params))
  return {"params": setup.param_shardings, "opt_state": opt_shard, "step": repl, "rng": repl}


def abstract_state(setup: Setup, tx):
  """ShapeDtypeStructs (with shardings) of the train state, the target of a checkpoint restore."""
  shapes = {
      "params": setup.abstract_params,
      "opt_state": jax.eval_shape(tx.init, setup.abstract_params),
      "step": jax.ShapeDtypeStruct((), jnp.int32),
      "rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))),
  }
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      state_shardings(setup, tx))


def init_train_state(setup: Setup, params, tx, *, seed: int):
  """{params, opt_state, step, rng} placed with `state_shardings`."""
  shardings = state_shardings(setup, tx)
  opt_state = jax.jit(tx.init, out_shardings=shardings["opt_state"])(params)
  rng = jax.random.key_data(jax.random.key(seed))
  state = {"params": params, "opt_state": opt_state, "step": jnp.zeros((), jnp.int32), "rng": rng}
  return jax.device_put(state, shardings)
