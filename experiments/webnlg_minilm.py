"""WebNLG* joint entity-relation extraction (GPLinker, task=relations) with the pretrained all-MiniLM-L6-v2 encoder.

Needs ../shared/data/webnlg_star (or --config.data.manual_dir; TFDS builder webnlg_star, val = dev). Triple F1 in
the string form (subject text, relation, object text) selects checkpoints, as the published tables compare
(docs/tasks.md). Entities are typed subject / object (the CasRel reader), so the entity pointer has the two roles.
The settings below are starting points, not yet chosen on dev (issue 54: run one epoch first, write its time and
dev F1 here, then choose lr, epochs or early stopping and EMA on dev). `quick` is a one-minute smoke run.
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
