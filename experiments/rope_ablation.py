"""RoPE on/off in the GlobalPointer head (the paper's People's Daily collapse: 96.25 vs 54.35 dev F1).

People's Daily has no train split here, so the ablation runs on MSRA (char CNN encoder) and, with
`dataset=cluener2020`, on CLUENER.
  python -m launch.local --config=experiments/rope_ablation.py --workdir=runs/rope
"""

from gp_jax.configs import base
from experiments import msra_scratch


def get_config(arg=None):
  a = base.parse_arg(arg, **base.ARG_DEFAULTS)
  c = msra_scratch.get_config(arg)
  if a.dataset == "cluener2020":
    c.data.name = "cluener2020"
    c.data.max_len = 64
    c.data.buckets = (32, 64)
    c.data.test_split = ""  # CLUENER test is unlabelled
    if not a.epochs:
      c.num_epochs = 10.0
  return c


def get_sweep(hyper=None):
  return [{"config.model.use_rope": rope, "config.seed": seed} for rope in (True, False) for seed in (0, 1)]
