"""Standard vs Efficient GlobalPointer head on CLUENER (the paper: 80.03 vs 80.66 dev F1 with BERT-base)."""

from experiments import rope_ablation


def get_config(arg=None):
  return rope_ablation.get_config(arg or "dataset=cluener2020")


def get_sweep(hyper=None):
  return [{"config.model.head": head, "config.seed": seed} for head in ("standard", "efficient") for seed in (0, 1)]
