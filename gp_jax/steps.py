"""The jitted steps: `make_train_step` is the only place the train step is jitted, `make_eval_step` the
only place the eval step is (`HitDecoder` wraps it with a growing hit buffer). Training, evaluation, predict, tests and benchmarks call these.

The step bodies are pure functions of (state, batch) with the model's graph and non-parameter variables
bound by `functools.partial`; `setup` is a `state.Setup` (graphdef, rest, mesh, shardings).

Two training tricks live in the train step, both read from the setup's run spec (`factory.RunSpec`) by
`make_train_step`:
- EMA (`optimizer.ema_decay` > 0): after the update, state["ema"] <- decay * ema + (1 - decay) * params
  (initialised to the starting parameters, no bias correction, as the public PyTorch `EMA` class).
- Adversarial training (`adversarial.*`, `adversarial.Adversarial`): a perturbation r of the word-embedding output
  (`batch["embed_delta"]`, see `models.ner.NerModel.encode`), the adversarial loss at r added to the clean loss,
  one optimizer update. Norms are L2 over the whole global batch's [B, L, E] tensor (one number per batch).
"""

from __future__ import annotations

import functools
import logging

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gp_jax import optim
from gp_jax.adversarial import ADVERSARIAL_KINDS, Adversarial  # noqa: F401 (steps.Adversarial stays importable)
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import tasks
from gp_jax.tasks.base import grown_sizes

log = logging.getLogger(__name__)


def _l2(x):
  return jnp.sqrt(jnp.sum(jnp.square(x.astype(jnp.float32))))


def _scaled_unit(g, scale: float):
  """scale * g / ||g||, zeros when g is all zero."""
  norm = _l2(g)
  return jnp.where(norm > 0, scale * g / jnp.where(norm > 0, norm, 1.0), 0.0)


def _project(r, epsilon: float):
  """r scaled back to norm epsilon when ||r|| > epsilon, else r unchanged."""
  norm = _l2(r)
  return jnp.where(norm > epsilon, epsilon * r / jnp.where(norm > 0, norm, 1.0), r)


def perturbation(g, adv: Adversarial, delta_grad):
  """r of `adv` from the clean gradient `g`; `delta_grad(r)` is the loss's gradient w.r.t. the delta at r (pgd)."""
  if adv.kind == "fgm":
    return _scaled_unit(g, adv.epsilon)
  r = jnp.zeros_like(g)
  for t in range(adv.steps):
    if t:
      g = delta_grad(r)
    r = _project(r + _scaled_unit(g, adv.alpha), adv.epsilon)
  return r


def adversarial_grads(loss_fn, params, delta0, adv: Adversarial):
  """`loss_fn(params, embed_delta)` -> (clean loss, adversarial loss, clean + adversarial parameter gradients, r);
  `delta0` zeros of the embedding output's shape (and sharding)."""
  loss, (grads, g) = jax.value_and_grad(loss_fn, argnums=(0, 1))(params, delta0)
  delta_grad = jax.grad(loss_fn, argnums=1)
  r = jax.lax.stop_gradient(perturbation(g, adv, lambda r: delta_grad(params, r)))
  adv_loss, adv_grads = jax.value_and_grad(loss_fn)(params, r)
  return loss, adv_loss, jax.tree.map(jnp.add, grads, adv_grads), r


def ema_decay_at(decay: float, step, *, warmup: bool):
  """The decay of the update after `step` earlier updates: `decay`, or with `warmup` min(decay, (1+step)/(10+step))
  (tf.train.ExponentialMovingAverage's num_updates form: early averages forget the random init fast)."""
  if not warmup:
    return decay
  t = jnp.asarray(step, jnp.float32)
  return jnp.minimum(jnp.float32(decay), (1.0 + t) / (10.0 + t))


def ema_update(ema, params, decay):
  """decay * ema + (1 - decay) * params, leaf by leaf."""
  return jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, ema, params)


def train_step(state, batch, *, graphdef, rest, tx, loss_kind, block_size=None, step_transform=None,
               ema_decay: float = 0.0, ema_warmup: bool = False, adversarial: Adversarial | None = None,
               delta_sharding=None):
  """One optimizer step; `state` = {params, opt_state, step, rng} (+ ema when `ema_decay`). Pure: jit it
  (`make_train_step`). With `adversarial`, loss = clean + adversarial loss (metrics["adv_loss"] the latter).

  metrics["finite"] is False when the loss or the gradient norm is not finite (an inf gradient gives NaN
  parameters with a finite loss; finite gradients keep AdamW's update finite, so the parameters are not read
  again for the check)."""
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
  rest = jax.tree.map(jnp.asarray, rest)  # fresh variables owned by this trace
  seeded = nnx.merge(graphdef, nnx.State(state["params"]), rest)
  nnx.reseed(seeded, dropout=dropout_key)
  rest = nnx.split(seeded, nnx.Param, ...)[2]

  def loss_fn(params, embed_delta=None):
    # copy=True: fresh Variables in this trace (the RNG counters dropout advances were made outside it).
    model = nnx.merge(graphdef, nnx.State(params), rest, copy=True)
    model.train()
    inputs = batch if embed_delta is None else dict(batch, embed_delta=embed_delta)
    return model.loss(inputs, loss_kind=loss_kind, block_size=block_size)

  extra = {}
  if adversarial is None:
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  else:
    delta0_BLE = jnp.zeros(batch["attention_mask"].shape + (seeded.encoder.embed_width,), jnp.float32)
    if delta_sharding is not None:
      delta0_BLE = jax.lax.with_sharding_constraint(delta0_BLE, delta_sharding)
    clean, adv_loss, grads, _ = adversarial_grads(loss_fn, state["params"], delta0_BLE, adversarial)
    loss, extra = clean + adv_loss, {"adv_loss": adv_loss}
  if step_transform is not None:
    loss, grads = step_transform(loss, grads, state["step"])
  params, opt_state, grad_norm = optim.apply_gradients(tx, grads, state["opt_state"], state["params"])
  finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
  new_state = dict(state, params=params, opt_state=opt_state, step=state["step"] + 1)
  if ema_decay:
    new_state["ema"] = ema_update(state["ema"], params, ema_decay_at(ema_decay, state["step"], warmup=ema_warmup))
  return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite, **extra}


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


def train_steps(state, batches, **step_kwargs):
  """`train_step` over a stack of batches [k, B, ...] of one bucket, in order (`lax.scan`): k optimizer steps in one
  call, metrics stacked [k]. The host pays for one dispatch instead of k."""
  return jax.lax.scan(lambda s, batch: train_step(s, batch, **step_kwargs), state, batches)


def _train_fn(body, setup, tx, *, loss_kind: str, step_transform=None, donate: bool = True):
  state_shard = state_lib.state_shardings(setup, tx)
  fn = functools.partial(body, graphdef=setup.graphdef, rest=setup.rest, tx=tx, loss_kind=loss_kind,
                         block_size=setup.block_size, step_transform=step_transform, ema_decay=setup.ema_decay,
                         ema_warmup=setup.spec.ema_warmup, adversarial=setup.spec.adversarial,
                         delta_sharding=shd.batch_sharding(setup.mesh, 3))
  return jax.jit(under_mesh(fn, setup.mesh), in_shardings=(state_shard, None),
                 out_shardings=(state_shard, shd.replicated(setup.mesh)), donate_argnums=0 if donate else ())


def make_train_step(setup, tx, *, loss_kind: str, step_transform=None, donate: bool = True):
  """`train_step` jitted with the state's shardings: (state, global batch) -> (state, metrics).

  EMA and adversarial training follow the setup's run spec (`setup.spec.ema_decay`, `setup.spec.adversarial`).
  The state is donated (its buffers are reused for the new state) unless `donate=False`.
  `step_transform(loss, grads, step) -> (loss, grads)` is traced inside the step, before the update."""
  return _train_fn(train_step, setup, tx, loss_kind=loss_kind, step_transform=step_transform, donate=donate)


def make_train_steps(setup, tx, *, loss_kind: str, step_transform=None, donate: bool = True):
  """`train_steps` jitted as `make_train_step` jits one step: (state, stacked global batches [k, B, ...]) ->
  (state, metrics [k]); one program per k that occurs."""
  return _train_fn(train_steps, setup, tx, loss_kind=loss_kind, step_transform=step_transform, donate=donate)


def eval_step(params, batch, threshold=0.0, *, graphdef, rest, decode, sizes, block_size=None, hit_sharding=None):
  """Hits on device, then the batch's window_index [B]: `decode` (the task's) gives its hit buffers at `sizes`, each
  (count, coords [size, 4] (row, class, i, j), scores [size]) (entities: the one buffer's three arrays). Span heads
  keep cells with score > threshold. Rows become windows on the host (the task's `window_hits`)."""
  model = nnx.merge(graphdef, nnx.State(params), rest)
  model.eval()
  hits = decode(model, batch, sizes=sizes, block_size=block_size, threshold=threshold, hit_sharding=hit_sharding)
  return (*hits, batch["window_index"])


def make_eval_step(setup, *, size: tuple):
  """`eval_step` jitted for the hit buffer sizes `size` (the task's tuple, `initial_hits`): (params, global batch,
  threshold) -> its outputs."""
  repl = shd.replicated(setup.mesh)
  fn = functools.partial(eval_step, graphdef=setup.graphdef, rest=setup.rest, decode=tasks.of(setup.spec).decode,
                         sizes=tuple(size), block_size=setup.block_size, hit_sharding=repl)
  return jax.jit(under_mesh(fn, setup.mesh), out_shardings=repl)


def shape_label(step: str, shape: tuple, hits: tuple = ()) -> str:
  """How the log names a program: "train L64 B16", "train L64 B16 x4" (4 steps a call), "eval L64 B32 hits 2048"
  (one size per hit buffer: "hits 2048/2048/2048")."""
  *k, B, L = shape
  return f"{step} L{L} B{B}" + (f" x{k[0]}" if k else "") + (f" hits {_numbers(hits)}" if hits else "")


class Dispatch:
  """Calls the executable compiled ahead (`aot`) for the batch argument's shape; another shape goes to the jitted
  function `fn` (compiled on first use, logged once per shape when programs were compiled ahead)."""

  def __init__(self, fn, step: str, *, hits: tuple = (), name: str = ""):
    self.fn, self.step, self.hits, self.name = fn, step, hits, name or step
    self.table: dict = {}  # ([steps,] rows, length) -> executable
    self.expect_ahead = False
    self._late: set = set()

  def adopt(self, programs) -> None:
    """Programs compiled ahead (`aot.Program`), used from now on."""
    for p in programs:
      if p.compiled is not None:
        self.table[p.shape] = p.compiled
        self.expect_ahead = True

  def __call__(self, *args):
    shape = tuple(args[1]["attention_mask"].shape)
    compiled = self.table.get(shape)
    if compiled is not None:
      return compiled(*args)
    if self.expect_ahead and shape not in self._late:
      self._late.add(shape)
      log.info("%s: %s not compiled ahead; compiling on first use", self.name, shape_label(self.step, shape,
                                                                                          self.hits))
    return self.fn(*args)


class HitDecoder:
  """Every hit of a batch, whatever their number: the eval step with hit buffers that grow (powers of two, so
  few compiles, each buffer on its own) when a batch has more hits than one holds. The task (`gp_jax.tasks`) says
  how many buffers, their first size, and how hits become window columns. Programs compiled ahead (`aot`) are
  used where one matches the hit buffers and the batch's shape."""

  def __init__(self, setup, *, batch_size: int, name: str = "eval"):
    self.setup, self.name = setup, name
    self.task = tasks.of(setup.spec)
    self.size = self.task.initial_hits(batch_size)
    self._calls: dict = {}  # hit buffer(s) -> its eval step
    self._adopted = False

  def _call(self, size) -> Dispatch:
    if size not in self._calls:
      self._calls[size] = Dispatch(make_eval_step(self.setup, size=size), "eval", hits=size)
      self._calls[size].expect_ahead = self._adopted
    return self._calls[size]

  def fn(self, size):
    """The jitted eval step at a hit buffer of `size`."""
    return self._call(size).fn

  def adopt(self, programs) -> None:
    """Eval programs compiled ahead (`aot.eval_program`), used from now on."""
    for p in programs:
      self._call(p.hits).adopt([p])
    self._adopted = True
    for call in self._calls.values():
      call.expect_ahead = True

  def _run(self, size, params, global_batch, thr):
    call = self._call(size)
    call.name = self.name
    return call(params, global_batch, thr)

  def __call__(self, params, global_batch, threshold: float = 0.0):
    """The task's window hits of the global batch (`Task.window_hits`)."""
    thr = np.float32(threshold)
    out = self._run(self.size, params, global_batch, thr)
    counts = self.task.hit_counts(out)
    grown = grown_sizes(self.size, counts)
    if grown != self.size:
      self.size = grown
      log.info("%s: %s hits in one batch, growing the hit buffer to %s", self.name, _numbers(counts),
               _numbers(grown))
      out = self._run(self.size, params, global_batch, thr)
    return self.task.window_hits(out, types=self.setup.types)


def _numbers(x: tuple) -> str:
  """(5,) -> "5"; (5, 7) -> "5/7" (one per hit buffer)."""
  return "/".join(str(int(v)) for v in x)
