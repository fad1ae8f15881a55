"""Optimizer and learning-rate schedules: AdamW with a separate head learning rate.

`make_optimizer` builds optax's AdamW (its state is what checkpoints hold) and pairs it with `apply`, the train step's
whole update: (grads, opt_state, params) -> (params, opt_state, global gradient norm). `optimizer.update_impl` picks how
`apply` computes it:
- "optax": tx.update, optax.apply_updates, optax.global_norm.
- "fused": the same formulas on the same state, written for XLA:GPU, which launches every small op as a kernel of its
  own: the gradients of the replicated vectors (biases, LayerNorm parameters) are concatenated once and each vector's
  update reads its slice, which XLA fuses into a few multi-output kernels; the global norm (`global_norm`) is a few
  reductions, shared by the clip and the metric.
- "auto" (the default): fused in a program compiled for cuda, optax elsewhere, picked when the step is lowered
  (`lax.platform_dependent`): CPU runs keep optax's float rounding; TPU is not measured.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import PartitionSpec as P

from gp_jax import sharding as shd
from gp_jax.errors import UserError

UPDATES = ("auto", "fused", "optax")
DECAYS = ("linear", "cosine", "constant")
FUSED_ON = ("cuda",)  # where "auto" takes the fused update (docs/benchmarks/gpu_compiled.md)


def make_schedule(opt_cfg, peak: float, total_steps: int):
  warmup = min(int(opt_cfg.warmup_steps), max(total_steps - 1, 0))
  decay_steps = max(total_steps - warmup, 1)
  if opt_cfg.decay == "linear":
    after = optax.linear_schedule(peak, 0.0, decay_steps)
  elif opt_cfg.decay == "cosine":
    after = optax.cosine_decay_schedule(peak, decay_steps)
  elif opt_cfg.decay == "constant":
    after = optax.constant_schedule(peak)
  else:
    raise UserError(f"optimizer.decay must be one of {DECAYS}, got {opt_cfg.decay!r}")
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


CRF_TRANSITIONS = ("head", "transitions")  # path of CrfTagger's [T, T] transition matrix in the params dict


def param_labels(params, *, crf_multiplier: bool = False):
  """'encoder' / 'head' per leaf; with `crf_multiplier`, the CRF transition matrix is 'crf'."""
  def label(path, _):
    keys = tuple(getattr(p, "key", getattr(p, "name", None)) for p in path)
    if crf_multiplier and keys == CRF_TRANSITIONS:
      return "crf"
    return "head" if keys[:1] == ("head",) else "encoder"

  return jax.tree_util.tree_map_with_path(label, params)


def _update_kind(opt_cfg) -> str:
  return str(opt_cfg.get("update_impl", opt_cfg.get("update", "auto"))).strip().lower()


def resolve_update(opt_cfg, platform: str) -> str:
  """`optimizer.update_impl` for a program compiled for `platform`: "fused" or "optax" (the value resolved.json
  records). Workdirs written before the rename hold it as `optimizer.update`."""
  kind = _update_kind(opt_cfg)
  if kind not in UPDATES:
    raise ValueError(f"optimizer.update_impl must be one of {UPDATES}, got {kind!r}")
  if kind != "auto":
    return kind
  return "fused" if platform in FUSED_ON else "optax"


class AdamW(NamedTuple):
  """optax's GradientTransformation (init, update) plus `apply`, the update the train step runs."""

  init: Callable
  update: Callable
  apply: Callable  # (grads, opt_state, params) -> (params, opt_state, global gradient norm)


class _Group(NamedTuple):
  schedule: Callable
  b1: float
  b2: float
  eps: float
  weight_decay: float


def make_optimizer(opt_cfg, total_steps: int, params):
  """AdamW with a separate head learning rate; decay on matrices only; global-norm clipping.

  `crf_lr_multiplier` (default 1) scales the learning rate of the CRF's transition matrix (`transitions`; not its
  start/end scores) over the head's, like bert4keras' `ConditionalRandomField(lr_multiplier=1000)` in Su's CRF
  baselines. Returns (tx, encoder learning-rate schedule); tx is an `AdamW`."""
  enc_sched = make_schedule(opt_cfg, opt_cfg.lr, total_steps)
  head_peak = opt_cfg.head_lr or opt_cfg.lr
  head_sched = make_schedule(opt_cfg, head_peak, total_steps)
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731

  def adamw(sched):
    return optax.adamw(sched, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay,
                       mask=decay_mask)

  multiplier = float(opt_cfg.get("crf_lr_multiplier", 1.0))
  schedules = {"encoder": enc_sched, "head": head_sched}
  if multiplier != 1.0:
    schedules["crf"] = make_schedule(opt_cfg, head_peak * multiplier, total_steps)
  labels = param_labels(params, crf_multiplier=multiplier != 1.0)
  tx = optax.multi_transform({k: adamw(s) for k, s in schedules.items()}, labels)
  clip_norm = float(opt_cfg.clip_norm or 0.0)
  if clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(clip_norm), tx)
  groups = {k: _Group(s, float(opt_cfg.b1), float(opt_cfg.b2), float(opt_cfg.eps), float(opt_cfg.weight_decay))
            for k, s in schedules.items()}
  kind = _update_kind(opt_cfg)
  resolve_update(opt_cfg, "cpu")  # validates the name; "auto" is settled per platform when the step is lowered

  def optax_apply(grads, opt_state, params):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, optax.global_norm(grads)

  def fused_apply(grads, opt_state, params):
    return _fused_adamw(grads, opt_state, params, labels=labels, groups=groups, clip_norm=clip_norm)

  def apply(grads, opt_state, params):
    if kind == "auto":
      return jax.lax.platform_dependent(grads, opt_state, params, default=optax_apply,
                                        **{p: fused_apply for p in FUSED_ON})
    return (fused_apply if kind == "fused" else optax_apply)(grads, opt_state, params)

  return AdamW(tx.init, tx.update, apply), enc_sched


def apply_gradients(tx, grads, opt_state, params):
  """(params, opt_state, global gradient norm) after one update: `tx.apply` for an `AdamW`, else optax's update."""
  if isinstance(tx, AdamW):
    return tx.apply(grads, opt_state, params)
  updates, opt_state = tx.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, optax.global_norm(grads)


def _fsdp_size() -> int:
  mesh = jax.sharding.get_abstract_mesh()
  return 1 if mesh.empty else dict(mesh.shape).get("fsdp", 1)


def _is_whole(x, fsdp: int) -> bool:
  """A replicated vector (or scalar): the leaves the fused update reads from one concatenation."""
  return x.ndim <= 1 and shd.param_spec(x.shape, fsdp) == P()


def _concat_whole(leaves, fsdp: int) -> jax.Array | None:
  """The replicated vectors of `leaves`, flattened and concatenated (float32), behind a barrier: XLA then fuses every
  update that reads a slice of it into a few multi-output kernels (one per shape), where each small leaf is
  otherwise its own kernel, and it cannot fold the norm's reduction of it back into one reduction per leaf."""
  whole = [jnp.asarray(x, jnp.float32).reshape(-1) for x in leaves if _is_whole(x, fsdp)]
  return jax.lax.optimization_barrier(jnp.concatenate(whole)) if whole else None


def _norm(flat_whole: jax.Array | None, others) -> jax.Array:
  """sqrt(sum of squares) of the concatenated vectors and of `others` (their row sums of squares, one reduction per
  shape: a variadic reduce takes every same-shaped leaf in one kernel), summed once."""
  by_shape: dict[tuple, list] = {}
  for x in others:
    by_shape.setdefault(x.shape, []).append(jnp.square(jnp.asarray(x, jnp.float32)))
  pieces = [jnp.square(flat_whole)] if flat_whole is not None else []
  for shape, xs in by_shape.items():
    sums = jax.lax.reduce(tuple(xs), (jnp.float32(0),) * len(xs), lambda a, b: tuple(i + j for i, j in zip(a, b)),
                          tuple(range(1, len(shape))))
    pieces += [r.reshape(-1) for r in sums]
  if not pieces:
    return jnp.zeros((), jnp.float32)
  squares = jax.lax.optimization_barrier(jnp.concatenate(pieces))  # one sum, not one per piece
  return jnp.sqrt(jnp.sum(squares))


def global_norm(tree) -> jax.Array:
  """sqrt of the sum of squares of every leaf (float32), in a few reductions whatever the number of leaves (XLA:GPU
  launches each reduction as its own kernel). Replicated vectors (`sharding.param_spec` P()) are concatenated whole;
  sharded leaves are never gathered: only their row sums move."""
  fsdp = _fsdp_size()
  leaves = jax.tree.leaves(tree)
  return _norm(_concat_whole(leaves, fsdp), [x for x in leaves if not _is_whole(x, fsdp)])


def _fused_adamw(grads, opt_state, params, *, labels, groups: dict[str, _Group], clip_norm: float):
  """optax's clip_by_global_norm + multi_transform(adamw) on its own state, leaf by leaf with the same formulas; the
  replicated vectors' gradients read from one concatenation (`_concat_whole`), the gradient norm computed once for
  the clip and the metric."""
  inner = opt_state[1] if clip_norm else opt_state
  leaves_p, treedef = jax.tree.flatten(params)
  leaves_g = treedef.flatten_up_to(grads)
  leaves_l = treedef.flatten_up_to(labels)
  fsdp = _fsdp_size()
  flat = _concat_whole(leaves_g, fsdp)
  g_norm = _norm(flat, [g for g in leaves_g if not _is_whole(g, fsdp)])
  if flat is not None:  # every small leaf's update reads its slice of the one concatenation
    offset = 0
    for i, g in enumerate(leaves_g):
      if _is_whole(g, fsdp):
        leaves_g[i] = jax.lax.slice(flat, (offset,), (offset + g.size,)).reshape(g.shape).astype(g.dtype)
        offset += g.size
  if clip_norm:
    trigger = g_norm < clip_norm
    leaves_g = [jax.lax.select(trigger, g, (g / g_norm.astype(g.dtype)) * clip_norm) for g in leaves_g]
  new_p = list(leaves_p)
  states: dict[str, Any] = {}
  for label, masked in inner.inner_states.items():
    adam, decay_state, sched = masked.inner_state
    group = groups[label]
    count = optax.safe_increment(adam.count)
    correct1, correct2 = 1 - group.b1 ** count, 1 - group.b2 ** count
    step_size = -1 * group.schedule(sched.count)
    mu, nu = treedef.flatten_up_to(adam.mu), treedef.flatten_up_to(adam.nu)
    for i, (p, g) in enumerate(zip(leaves_p, leaves_g)):
      if leaves_l[i] != label:
        continue
      mu[i] = (1 - group.b1) * g + group.b1 * mu[i]
      nu[i] = (1 - group.b2) * (g ** 2) + group.b2 * nu[i]
      u = (mu[i] / correct1.astype(mu[i].dtype)) / (jnp.sqrt(nu[i] / correct2.astype(nu[i].dtype)) + group.eps)
      if p.ndim >= 2 and group.weight_decay:
        u = u + group.weight_decay * p
      u = jnp.array(step_size, dtype=u.dtype) * u
      new_p[i] = jnp.asarray(p + u).astype(p.dtype)
    adam = adam._replace(count=count, mu=jax.tree.unflatten(treedef, mu), nu=jax.tree.unflatten(treedef, nu))
    states[label] = masked._replace(inner_state=(adam, decay_state, sched._replace(count=optax.safe_increment(
        sched.count))))
  inner = inner._replace(inner_states=states)
  return jax.tree.unflatten(treedef, new_p), ((opt_state[0], inner) if clip_norm else inner), g_norm
