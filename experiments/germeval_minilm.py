"""GermEval 2014 (nested, 2 levels) with the MiniLM encoder: nested decoding on real data.

MiniLM is English-uncased, so German F1 is a lower bound on what a German encoder would give.
"""

from experiments import conll_minilm


def get_config(arg=None):
  return conll_minilm.get_config(arg, dataset="germeval2014")


def get_sweep(arg=None):
  return []
