"""Data: corpora (TFDS builders), readers for user files, shared contracts (types.py).

Stages, left to right: `corpora` / `readers` / `sources` (records) -> `windows` (tokenise, align
entities, cut sliding windows: `prepare_split`) -> `batching` (padded batches: `train_batches`,
`eval_batches`) -> model -> `merge` (window hits -> char spans: `merge_predictions`, scored with
`gp_jax.metrics.span_prf`). Import the stage modules directly: `from gp_jax.data import windows`.

Imports are lazy so that `import gp_jax.data` does not pull in tensorflow_datasets.
"""

from __future__ import annotations

import importlib

__all__ = ["load_split", "corpus_types", "read_jsonl", "read_conll", "DataError"]

_WHERE = {
    "load_split": "gp_jax.data.corpora",
    "corpus_types": "gp_jax.data.corpora",
    "read_jsonl": "gp_jax.data.readers",
    "read_conll": "gp_jax.data.readers",
    "DataError": "gp_jax.data.readers",
}


def __getattr__(name: str):
  if name in _WHERE:
    return getattr(importlib.import_module(_WHERE[name]), name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(list(globals()) + __all__)
