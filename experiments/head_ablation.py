"""Standard vs Efficient GlobalPointer head (the paper, CLUENER dev F1 with BERT-base: 80.03 vs 80.66).

Same settings as experiments/rope_ablation.py (default dataset=cluener2020), RoPE on, seeds 0-1.
"""

from experiments import rope_ablation


def get_config(arg=None):
  return rope_ablation.get_config(_with_default_dataset(arg))


def _with_default_dataset(arg):
  return arg if "dataset=" in (arg or "") else ",".join(filter(None, ["dataset=cluener2020", arg]))


def get_sweep(arg=None):
  return [{"config.model.head": head, "config.seed": seed} for head in ("standard", "efficient") for seed in (0, 1)]
