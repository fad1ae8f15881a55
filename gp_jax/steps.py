"""The jitted steps: `make_train_step` is the only place the train step is jitted, `make_eval_step` the
only place the eval step is. Training, evaluation, predict, tests and benchmarks call these.

The step bodies are pure functions of (state, batch) with the model's graph and non-parameter variables
bound by `functools.partial`; `setup` is a `state.Setup` (graphdef, rest, mesh, shardings).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from gp_jax import sharding as shd
from gp_jax import state as state_lib


def train_step(state, batch, *, graphdef, rest, tx, loss_kind, block_size=None, step_transform=None):
  """One optimizer step; `state` = {params, opt_state, step, rng}. Pure: jit it (`make_train_step`).

  metrics["finite"] is False when the loss or the gradient norm is not finite (an inf gradient gives NaN
  parameters with a finite loss; finite gradients keep AdamW's update finite, so the parameters are not read
  again for the check)."""
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
  rest = jax.tree.map(jnp.asarray, rest)  # fresh variables owned by this trace
  seeded = nnx.merge(graphdef, nnx.State(state["params"]), rest)
  nnx.reseed(seeded, dropout=dropout_key)
  rest = nnx.split(seeded, nnx.Param, ...)[2]

  def loss_fn(params):
    # copy=True: fresh Variables in this trace (the RNG counters dropout advances were made outside it).
    model = nnx.merge(graphdef, nnx.State(params), rest, copy=True)
    model.train()
    return model.loss(batch, loss_kind=loss_kind, block_size=block_size)

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  if step_transform is not None:
    loss, grads = step_transform(loss, grads, state["step"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  grad_norm = optax.global_norm(grads)
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  new_state = dict(state, params=params, opt_state=opt_state, step=state["step"] + 1)
  return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite}


def make_train_step(setup, tx, *, loss_kind: str, step_transform=None, donate: bool = True):
  """`train_step` jitted with the state's shardings: (state, global batch) -> (state, metrics).

  The state is donated (its buffers are reused for the new state) unless `donate=False`.
  `step_transform(loss, grads, step) -> (loss, grads)` is traced inside the step, before the update."""
  state_shard = state_lib.state_shardings(setup, tx)
  fn = functools.partial(train_step, graphdef=setup.graphdef, rest=setup.rest, tx=tx, loss_kind=loss_kind,
                         block_size=setup.block_size, step_transform=step_transform)
  return jax.jit(fn, in_shardings=(state_shard, None), out_shardings=(state_shard, shd.replicated(setup.mesh)),
                 donate_argnums=0 if donate else ())


def eval_step(params, batch, *, graphdef, rest, size: int, block_size=None, hit_sharding=None):
  """Hits on device: (count, [size, 4] (window, start, end, type), scores [size])."""
  model = nnx.merge(graphdef, nnx.State(params), rest)
  model.eval()
  count, coords, scores = model.decode_hits(batch, size=size, block_size=block_size, hit_sharding=hit_sharding)
  b, h, i, j = coords.T
  return count, jnp.stack([batch["window_index"][b], i, j, h], axis=-1), scores


def make_eval_step(setup, *, size: int):
  """`eval_step` jitted for a hit buffer of `size`: (params, global batch) -> (count, coords, scores)."""
  repl = shd.replicated(setup.mesh)
  fn = functools.partial(eval_step, graphdef=setup.graphdef, rest=setup.rest, size=size,
                         block_size=setup.block_size, hit_sharding=repl)
  return jax.jit(fn, out_shardings=repl)
