"""GermEval 2014 (nested, 2 levels) with the MiniLM encoder: nested decoding on real data.

MiniLM is English-uncased, so German F1 is a lower bound on what a German encoder would give.
"""

from experiments import conll_minilm


def get_config(arg=None):
  c = conll_minilm.get_config(arg)
  c.data.name = "germeval2014"
  return c


def get_sweep(hyper=None):
  return []
