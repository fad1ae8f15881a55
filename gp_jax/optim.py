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


def make_optimizer(opt_cfg, total_steps: int, params):
  """AdamW with a separate head learning rate; decay on matrices only; global-norm clipping.

  Returns (tx, encoder learning-rate schedule)."""
  enc_sched = make_schedule(opt_cfg, opt_cfg.lr, total_steps)
  head_sched = make_schedule(opt_cfg, opt_cfg.head_lr or opt_cfg.lr, total_steps)
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731

  def adamw(sched):
    return optax.adamw(sched, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay,
                       mask=decay_mask)

  labels = {k: jax.tree.map(lambda _, k=k: "head" if k == "head" else "encoder", v) for k, v in params.items()}
  tx = optax.multi_transform({"encoder": adamw(enc_sched), "head": adamw(head_sched)}, labels)
  if opt_cfg.clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(opt_cfg.clip_norm), tx)
  return tx, enc_sched
