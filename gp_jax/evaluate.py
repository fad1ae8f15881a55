"""Evaluation shared by training and predict: a jitted eval step that returns hits, the hit buffer that
grows when a batch has more hits than it holds, window merging, and corpus-level span P/R/F1.

The model is reached only through `NerModel.decode_hits` (span heads and taggers alike).
"""

from __future__ import annotations

import logging

import jax
import numpy as np

from gp_jax import reporting
from gp_jax import sharding as shd
from gp_jax.data import batching, merge
from gp_jax.metrics import per_record_counts, span_prf
from gp_jax.steps import HitDecoder

log = logging.getLogger(__name__)

HOST_ONLY_FIELDS = ("example_index", "window_start")
LENGTH_BUCKETS = (("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-8", 5, 8), ("9+", 9, None))


def model_batch(batch: dict) -> dict:
  """Pipeline batch -> flat dict of the arrays the model and loss read."""
  out = {k: v for k, v in batch.items() if k not in HOST_ONLY_FIELDS and k != "features"}
  out.update(batch["features"])
  return out


class Evaluator:
  """Runs a model over prepared splits: hits per window, merged into documents, scored."""

  def __init__(self, setup, *, batch_size: int, progress: bool = True):
    self.setup = setup
    self.batch_size = batch_size
    self.progress = progress
    self.decoder = HitDecoder(setup, batch_size=batch_size)

  def hits(self, params, prepared, *, desc: str = "eval", threshold: float = 0.0) -> dict[str, np.ndarray]:
    """Hit columns {"window", "start", "end", "type", "score"} over every window of `prepared` (span heads: cells
    with score > threshold)."""
    s = self.setup
    batches = batching.eval_batches(prepared, batch_size=self.batch_size, buckets=s.spec.buckets,
                                    process_index=jax.process_index(), process_count=jax.process_count())
    self.decoder.name = desc
    return merge.concat_hits([self.decoder(params, shd.global_batch(model_batch(batch), s.mesh), threshold)
                              for batch in reporting.progress(batches, total=len(batches), desc=desc,
                                                              enabled=self.progress)])

  def predict(self, params, prepared, *, desc: str = "predict", threshold: float = 0.0):
    """Per record, entity dicts {"start", "end", "type", "score"} (char offsets)."""
    return merge.merge_predictions(prepared, self.hits(params, prepared, desc=desc, threshold=threshold))

  def evaluate(self, params, prepared, *, desc: str = "eval", threshold: float = 0.0):
    """(result, merged): `span_prf` over whole documents plus `by_length` and `per_record` counts, and the merged
    predictions."""
    merged = self.predict(params, prepared, desc=desc, threshold=threshold)
    pred, gold = merge.prediction_spans(merged), merge.gold_spans(prepared)
    result = span_prf(pred, gold)
    result["by_length"] = by_length(prepared, pred, gold)
    result["per_record"] = per_record_counts(pred, gold, prepared.num_records)
    return result, merged


def token_lengths(prepared, spans) -> np.ndarray:
  """Content tokens overlapping each char span (record, start, end, ...) of `spans`."""
  spans = list(spans)
  out = np.zeros(len(spans), np.int64)
  for n, (r, a, b, *_) in enumerate(spans):
    off = prepared.record_offsets(r)
    out[n] = int(np.sum((off[:, 0] < b) & (off[:, 1] > a) & (off[:, 1] > off[:, 0])))
  return out


def by_length(prepared, pred, gold) -> dict[str, dict[str, int]]:
  """tp / pred / gold counts by entity length in the encoder's tokens (buckets 1, 2, 3-4, 5-8, 9+)."""
  pred, gold = set(pred), set(gold)
  out = {}
  lengths = {}
  for name, spans in (("pred", pred), ("gold", gold)):
    spans = sorted(spans, key=str)
    lengths[name] = dict(zip(spans, token_lengths(prepared, spans).tolist()))
  tp = pred & gold
  for label, lo, hi in LENGTH_BUCKETS:
    inside = lambda n: n >= lo and (hi is None or n <= hi)  # noqa: E731
    out[label] = {"tp": sum(inside(lengths["gold"][s]) for s in tp),
                  "pred": sum(inside(n) for n in lengths["pred"].values()),
                  "gold": sum(inside(n) for n in lengths["gold"].values())}
  return out


def flat_result(result: dict) -> dict:
  return {k: result[k] for k in ("precision", "recall", "f1", "tp", "pred", "gold")}
