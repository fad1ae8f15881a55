"""flax.nnx modules: span heads, tagger heads (baselines) and encoders. The classes load on first access, so that
`gp_jax.models.locate` (where pretrained encoders come from) is read without jax."""

import importlib

_WHERE = {"GPLinkerHead": "gplinker", "HEADS": "heads", "EfficientGlobalPointer": "heads", "GlobalPointer": "heads",
          "TAGGERS": "taggers", "CrfTagger": "taggers", "SoftmaxTagger": "taggers"}

__all__ = ["GlobalPointer", "EfficientGlobalPointer", "HEADS", "SoftmaxTagger", "CrfTagger", "TAGGERS", "GPLinkerHead"]


def __getattr__(name):
  if name in _WHERE:
    return getattr(importlib.import_module(f"gp_jax.models.{_WHERE[name]}"), name)
  raise AttributeError(f"module 'gp_jax.models' has no attribute {name!r}")
