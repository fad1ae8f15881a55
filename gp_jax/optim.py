"""Optimizer and learning-rate schedules: AdamW with a separate head learning rate."""

from __future__ import annotations

import jax
import optax


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
    raise ValueError(f"optimizer.decay must be linear, cosine or constant, got {opt_cfg.decay!r}")
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


def make_optimizer(opt_cfg, total_steps: int, params):
  """AdamW with a separate head learning rate; decay on matrices only; global-norm clipping.

  `crf_lr_multiplier` (default 1) scales the learning rate of the CRF's transition matrix (`transitions`; not its
  start/end scores) over the head's, like bert4keras' `ConditionalRandomField(lr_multiplier=1000)` in Su's CRF
  baselines. Returns (tx, encoder learning-rate schedule)."""
  enc_sched = make_schedule(opt_cfg, opt_cfg.lr, total_steps)
  head_peak = opt_cfg.head_lr or opt_cfg.lr
  head_sched = make_schedule(opt_cfg, head_peak, total_steps)
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731

  def adamw(sched):
    return optax.adamw(sched, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay,
                       mask=decay_mask)

  multiplier = float(opt_cfg.get("crf_lr_multiplier", 1.0))
  transforms = {"encoder": adamw(enc_sched), "head": adamw(head_sched)}
  if multiplier != 1.0:
    transforms["crf"] = adamw(make_schedule(opt_cfg, head_peak * multiplier, total_steps))
  tx = optax.multi_transform(transforms, param_labels(params, crf_multiplier=multiplier != 1.0))
  if opt_cfg.clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(opt_cfg.clip_norm), tx)
  return tx, enc_sched
