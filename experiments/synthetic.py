"""Tiny synthetic nested-span task (BOX contains NUM / CAP): smoke runs and end-to-end tests."""

from gp_jax.configs import base


def get_config(arg=None):
  a = base.parsed_arg(arg, dataset="synthetic")
  c = base.get_config(arg, dataset="synthetic", _defer_quick=True)
  c.data.synthetic_records = 600
  c.data.max_len = 64
  c.data.buckets = (32, 64)
  c.tokenizer.lowercase = False
  c.tokenizer.bigram_min_freq = 1
  c.model.embed_dim = 32
  c.model.bigram_dim = 32
  c.model.hidden_size = 64
  c.model.num_layers = 2
  c.model.head_size = 16
  c.model.dropout = 0.0
  c.model.embed_dropout = 0.0
  c.batch_size = 16
  c.eval_batch_size = 64
  c.num_epochs = 8
  c.optimizer.lr = 5e-3
  c.optimizer.warmup_steps = 20
  c.log_every_steps = 20
  c.checkpoint_every_steps = 100
  c.progress_bar = False
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  return [{"config.model.head": h} for h in ("standard", "efficient")]
