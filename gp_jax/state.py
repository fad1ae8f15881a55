"""Model and train-state construction shared by training, evaluation and predict.

Shardings are decided on abstract shapes before anything is allocated; parameters are initialised eagerly on the
host CPU (no device program to compile: a jitted init of a large encoder costs minutes of compilation) and
placed with their shardings, or loaded from a pretrained checkpoint.
"""

from __future__ import annotations

import dataclasses
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gp_jax import sharding as shd
from gp_jax import factory
from gp_jax.data import batching

log = logging.getLogger("gp_jax.train")


@dataclasses.dataclass
class Setup:
  """Everything built from a config that training, evaluation and predict share; what they read of the config is
  `spec` (`factory.RunSpec`, resolved once for the platform the model was built for), never the ConfigDict."""

  spec: factory.RunSpec
  types: list
  tokenizer: object
  mesh: object
  graphdef: object
  rest: object  # non-parameter variables (RNG streams), replicated
  abstract_params: dict
  param_shardings: dict
  encoder_config: dict | None = None  # bert: the HF config.json dict (saved into the workdir)
  labels: tuple = ()  # the task's label space beyond `types` (`Task.labels`; entities: ())

  @property
  def block_size(self) -> int | None:
    return self.spec.block_size

  @property
  def ema_decay(self) -> float:
    """`optimizer.ema_decay`: > 0 keeps state["ema"], the weights evaluation and best/ use; 0 = off."""
    return self.spec.ema_decay


def init_model(config, tokenizer, types, mesh, *, load_weights=True, encoder_config=None, platform=None, labels=()):
  """Returns (Setup, params). `load_weights=False` skips pretrained weights (they will be restored); `platform`:
  the target the precision policy is resolved for (`factory.precision`; default this machine's backend);
  `labels`: the task's label space (`Task.labels`)."""
  num_types = len(types)
  spec = factory.run_spec(config, platform)  # the setup keeps this, not the config
  seed = spec.seed
  encoder_config = encoder_config or factory.encoder_config(config)

  def build(weights, abstract_encoder=None):
    return factory.build_model(config, tokenizer, num_types, seed=seed, load_weights=weights,
                               encoder_config=encoder_config, platform=platform, labels=labels,
                               abstract_encoder=abstract_encoder)

  abstract_model = nnx.eval_shape(lambda: build(False))
  graphdef, abs_params, abs_rest = nnx.split(abstract_model, nnx.Param, ...)
  abs_params = nnx.to_pure_dict(abs_params)
  p_shard = shd.tree_shardings(mesh, abs_params)
  rest_shard = jax.tree.map(lambda _: shd.replicated(mesh), abs_rest)

  def create():
    _, params, rest = nnx.split(build(False), nnx.Param, ...)
    return nnx.to_pure_dict(params), rest

  if spec.encoder == "bert" and load_weights:
    # Only the RNG state comes from `create` (jitted: the random weights are dead code, never drawn); weights from
    # disk.
    rest = place(on_host(jax.jit(lambda: create()[1])), rest_shard)
    params = place(on_host(lambda: nnx.to_pure_dict(nnx.state(build(True, abstract_model.encoder), nnx.Param))),
                   p_shard)
  else:
    params, rest = place(on_host(create), (p_shard, rest_shard))
  setup = Setup(spec, list(types), tokenizer, mesh, graphdef, rest, abs_params, p_shard, encoder_config,
                tuple(labels))
  return setup, params


def on_host(fn):
  """`fn()` run eagerly on the host CPU (random init): no accelerator program is compiled for it, and the values are
  the same whatever the target. The caller places the result with its shardings."""
  with jax.default_device(jax.local_devices(backend="cpu")[0]):
    return fn()


def place(tree, shardings):
  """Host values (the same on every process) placed with `shardings`: each process fills its own shards
  (`jax.make_array_from_callback`), so no process waits on another."""
  if jax.process_count() == 1:
    return jax.device_put(tree, shardings)

  def one(x, sharding):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      data = np.asarray(jax.random.key_data(x))
      placed = jax.make_array_from_callback(data.shape, sharding, lambda index: data[index])
      return jax.random.wrap_key_data(placed, impl=jax.random.key_impl(x))
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])

  return jax.tree.map(one, tree, shardings)


def param_count(params) -> int:
  return sum(int(x.size) for x in jax.tree.leaves(params))


def abstract_params(setup: Setup):
  """ShapeDtypeStructs with shardings of the parameters: the target of a params-only restore."""
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), setup.abstract_params,
                      setup.param_shardings)


def state_shardings(setup: Setup, tx):
  """Shardings of the train state {params, opt_state, step, rng} (+ ema, sharded like params)."""
  repl = shd.replicated(setup.mesh)
  opt_shard = shd.tree_shardings(setup.mesh, jax.eval_shape(tx.init, setup.abstract_params))
  out = {"params": setup.param_shardings, "opt_state": opt_shard, "step": repl, "rng": repl}
  if setup.ema_decay:
    out["ema"] = setup.param_shardings
  return out


def abstract_state(setup: Setup, tx):
  """ShapeDtypeStructs (with shardings) of the train state, the target of a checkpoint restore."""
  shapes = {
      "params": setup.abstract_params,
      "opt_state": jax.eval_shape(tx.init, setup.abstract_params),
      "step": jax.ShapeDtypeStruct((), jnp.int32),
      "rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))),
  }
  if setup.ema_decay:
    shapes["ema"] = setup.abstract_params
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      state_shardings(setup, tx))


def init_train_state(setup: Setup, params, tx, *, seed: int):
  """{params, opt_state, step, rng} (+ ema: a copy of params) placed with `state_shardings`."""
  shardings = state_shardings(setup, tx)
  opt_state = jax.jit(tx.init, out_shardings=shardings["opt_state"])(params)
  rng = jax.random.key_data(jax.random.key(seed))
  state = {"params": params, "opt_state": opt_state, "step": jnp.zeros((), jnp.int32), "rng": rng}
  if setup.ema_decay:  # own buffers: the step donates both
    state["ema"] = jax.jit(lambda p: jax.tree.map(jnp.copy, p), out_shardings=shardings["ema"])(params)
  return jax.device_put(state, shardings)


def eval_params(state):
  """The weights dev/test evaluation and best/ use: the EMA when the state keeps one, else the parameters."""
  return state["ema"] if "ema" in state else state["params"]


@dataclasses.dataclass
class Training:
  """What the training loop works on: the model setup, optimizer and train state, the data iterator, and the
  resume / best checkpoint managers (`train.build_training`)."""

  setup: Setup
  state: dict
  tx: object
  lr_schedule: object
  train_it: batching.BatchIterator
  start_step: int
  total_steps: int
  mngr: object
  best_mngr: object
  n_params: int
