"""Tiny synthetic nested-span task (BOX contains NUM / CAP): smoke runs and end-to-end tests."""

from gp_jax.configs import base


def get_config(arg=None):
  a = base.parsed_arg(arg, dataset="synthetic")
  c = base.get_config(arg, dataset="synthetic", _defer_quick=True)
  base.tiny_char_model(c)
  c.data.synthetic_records = 600
  c.data.max_len = 64
  c.data.buckets = (32, 64)
  c.batch_size = 16
  c.eval_batch_size = 64
  c.num_epochs = 8
  c.log_every_steps = 20
  c.checkpoint_every_steps = 100
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  return [{"config.model.head": h} for h in ("standard", "efficient")]
