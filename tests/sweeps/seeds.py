"""experiments/synthetic.py at two seeds: two points that build one program (the launch tests' preflight)."""

from experiments import synthetic

get_config = synthetic.get_config


def get_sweep(arg=None):
  del arg
  return [{"config.seed": s} for s in (0, 1)]
