"""The jitted steps: `make_train_step` is the only place the train step is jitted, `make_eval_step` the
only place the eval step is (`HitDecoder` wraps it with a growing hit buffer). Training, evaluation, predict, tests and benchmarks call these.

The step bodies are pure functions of (state, batch) with the model's graph and non-parameter variables
bound by `functools.partial`; `setup` is a `state.Setup` (graphdef, rest, mesh, shardings).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.data import merge

log = logging.getLogger(__name__)


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


def under_mesh(fn, mesh):
  """`fn` traced with `mesh` as the context (abstract) mesh, so kernels that must run under `jax.shard_map` (splash
  attention in `ops.attention`) find the batch axes. A one-device mesh needs none: `fn` is returned as is."""
  if mesh.size == 1:
    return fn

  @functools.wraps(getattr(fn, "func", fn))  # the step's name stays the program's name
  def traced(*args, **kwargs):
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
      return fn(*args, **kwargs)

  return traced


def make_train_step(setup, tx, *, loss_kind: str, step_transform=None, donate: bool = True):
  """`train_step` jitted with the state's shardings: (state, global batch) -> (state, metrics).

  The state is donated (its buffers are reused for the new state) unless `donate=False`.
  `step_transform(loss, grads, step) -> (loss, grads)` is traced inside the step, before the update."""
  state_shard = state_lib.state_shardings(setup, tx)
  fn = functools.partial(train_step, graphdef=setup.graphdef, rest=setup.rest, tx=tx, loss_kind=loss_kind,
                         block_size=setup.block_size, step_transform=step_transform)
  return jax.jit(under_mesh(fn, setup.mesh), in_shardings=(state_shard, None),
                 out_shardings=(state_shard, shd.replicated(setup.mesh)), donate_argnums=0 if donate else ())


def eval_step(params, batch, threshold=0.0, *, graphdef, rest, size: int, block_size=None, hit_sharding=None):
  """Hits on device: (count, coords [size, 4] (row, type, start, end), scores [size], the batch's window_index
  [B]); span heads keep cells with score > threshold. Rows become windows on the host (`merge.batch_hits`)."""
  model = nnx.merge(graphdef, nnx.State(params), rest)
  model.eval()
  count, coords, scores = model.decode_hits(batch, size=size, block_size=block_size, threshold=threshold,
                                            hit_sharding=hit_sharding)
  return count, coords, scores, batch["window_index"]


def make_eval_step(setup, *, size: int):
  """`eval_step` jitted for a hit buffer of `size`: (params, global batch, threshold) -> its four outputs."""
  repl = shd.replicated(setup.mesh)
  fn = functools.partial(eval_step, graphdef=setup.graphdef, rest=setup.rest, size=size,
                         block_size=setup.block_size, hit_sharding=repl)
  return jax.jit(under_mesh(fn, setup.mesh), out_shardings=repl)


class HitDecoder:
  """Every hit of a batch, whatever their number: the eval step with a hit buffer that grows (powers of two, so
  few compiles) when a batch has more hits than it holds."""

  def __init__(self, setup, *, batch_size: int, name: str = "eval"):
    self.setup, self.name = setup, name
    self.size = max(64, batch_size * 32)
    self._fns = {}

  def _fn(self, size: int):
    if size not in self._fns:
      self._fns[size] = make_eval_step(self.setup, size=size)
    return self._fns[size]

  def __call__(self, params, global_batch, threshold: float = 0.0) -> dict[str, np.ndarray]:
    """Window hit columns {"window", "start", "end", "type", "score"} (`merge.batch_hits`) of the global batch."""
    thr = np.float32(threshold)
    out = self._fn(self.size)(params, global_batch, thr)
    if int(out[0]) > self.size:
      self.size = 1 << int(int(out[0]) - 1).bit_length()
      log.info("%s: %d hits in one batch, growing the hit buffer to %d", self.name, int(out[0]), self.size)
      out = self._fn(self.size)(params, global_batch, thr)
    count, coords, scores, window_B = out
    count = int(count)
    return merge.batch_hits(np.asarray(window_B), np.asarray(coords)[:count], np.asarray(scores)[:count])
