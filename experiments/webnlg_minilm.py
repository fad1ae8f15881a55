"""WebNLG* joint entity-relation extraction (GPLinker, task=relations) with the pretrained all-MiniLM-L6-v2 encoder.

Needs ../shared/data/webnlg_star (or --config.data.manual_dir; TFDS builder webnlg_star, val = dev). Triple F1 in
the string form (subject text, relation, object text) selects checkpoints, as the published tables compare
(docs/tasks.md). Entities are typed subject / object (the CasRel reader), so the entity pointer has the two roles.
Settings, measured on this 2-core CPU (2026-11-27, docs/studies/webnlg.md): one epoch first (`:epochs=1`): 148 s
whole command, dev triple F1 0.226 (the 300 warmup steps take most of its 314). Then these settings, 10 epochs:
dev F1 by epoch 0.213 / 0.623 / 0.742 / 0.830 / 0.848 / 0.853 / 0.876 / 0.879 / 0.890 / 0.891, best at the last
epoch, test 0.890 (string form), 887 s. Encoder lr 5e-5, head lr 1e-3 (the BERT defaults of configs/base.py), linear
decay after 300 warmup steps, no EMA; early stopping (3 epochs) never fired. Not yet compared on dev: a higher lr,
more epochs (dev still rose at epoch 10), EMA 0.999 as Su uses it. `quick` is a one-minute smoke run.
"""

from gp_jax.configs import base


def get_config(arg=None, dataset="webnlg_star"):
  a = base.parsed_arg(arg, dataset=dataset, encoder="bert", head="efficient")
  c = base.get_config(arg, dataset=dataset, encoder="bert", head="efficient", _defer_quick=True)
  c.task = "relations"
  c.data.max_len = 128  # WebNLG* sentences are short: nearly all fit one window
  c.data.buckets = (32, 64, 128)
  c.model.pretrained = "minilm"
  c.model.dropout = 0.1
  c.model.pointer_rope = False  # as Su: no RoPE on the head and tail pointers
  c.batch_size = 16
  c.num_epochs = a.epochs or 10.0
  c.early_stop_patience = 3
  c.optimizer.ema_decay = 0.0  # Su's scripts use EMA 0.999 on some corpora: to try on dev
  c.checkpoint_every_steps = 1000
  c.log_every_steps = 100
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  """The relations study: RoPE on the head/tail pointers x on the entity pointer, efficient head, 3 seeds."""
  return [{"config.model.pointer_rope": p, "config.model.use_rope": e, "config.seed": s}
          for p in (False, True) for e in (True, False) for s in (0, 1, 2)]
