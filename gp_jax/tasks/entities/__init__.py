"""The entity task: span targets `span_ids [B, H, K]`, one span head, one hit buffer, span P/R/F1.

The entity path as it was before the task seam: batches, the model and its programs are unchanged (the batch
targets stay in `data.batching`, the head in `factory`); this object only names the parts the shared path calls.
"""

from __future__ import annotations

import numpy as np

from gp_jax.data import merge, windows
from gp_jax.metrics import per_record_counts, span_prf

LENGTH_BUCKETS = (("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-8", 5, 8), ("9+", 9, None))
RESULT_KEYS = ("precision", "recall", "f1", "tp", "pred", "gold")


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
  return {k: result[k] for k in RESULT_KEYS}


def grown_size(size: int, count: int) -> int:
  """A hit buffer that holds `count` hits: the next power of two when `size` is too small (few compiles)."""
  return size if count <= size else 1 << int(count - 1).bit_length()


class EntityTask:
  """Entities: what the trainer, the steps, the compiler and evaluation call for `task=entities`."""

  name = "entities"
  threshold_refusal = None  # tune_threshold applies (span heads)

  @classmethod
  def from_spec(cls, spec) -> EntityTask:
    return cls()

  def relation_types(self, *, train, dev, test):
    """The task's label space beyond the entity types: none (None: prepare splits without relations)."""
    return None

  def split_relation_types(self, prepared) -> tuple[str, ...]:
    return ()

  def prepare(self, records, tokenizer, types, relation_types, **options):
    return windows.prepare_split(records, tokenizer, types=types, **options)

  # Batches (`data.batching`): None keeps the entity targets `span_ids` as the assembler builds them.
  batch_targets = None

  def target_shapes(self, *, num_types: int, num_relations: int, batch: int, length: int) -> dict[str, tuple]:
    return {"span_ids": (batch, num_types, length)}

  def build_model(self, encoder, *, head: str, num_types: int, num_relations: int, feature_names, tag_scheme: str,
                  loss_implementation: str, head_size: int, use_rope: bool, pointer_rope: bool,
                  max_span_width, dtype, rngs):
    from gp_jax.models.heads import HEADS  # the model side imports flax here only (the host half imports this file)
    from gp_jax.models.ner import NerModel
    from gp_jax.models.taggers import TAGGERS

    if head in TAGGERS:
      module = TAGGERS[head](encoder.hidden_size, num_types, scheme=tag_scheme, dtype=dtype, rngs=rngs)
    elif head in HEADS:
      module = HEADS[head](encoder.hidden_size, num_types, head_size=head_size, use_rope=use_rope,
                           max_span_width=max_span_width, dtype=dtype, rngs=rngs)
    else:
      raise ValueError(f"model.head must be one of {sorted(HEADS) + sorted(TAGGERS)}, got {head!r}")
    return NerModel(encoder, module, feature_names, loss_implementation=loss_implementation)

  # Device decoding: one hit buffer.
  def initial_hits(self, batch_size: int) -> int:
    return max(64, batch_size * 32)

  def hit_counts(self, out) -> tuple[int, ...]:
    return (int(out[0]),)

  def grown(self, size: int, counts) -> int:
    return grown_size(size, counts[0])

  def window_hits(self, out) -> dict[str, np.ndarray]:
    """Eval step outputs -> window hit columns (`merge.batch_hits`)."""
    count, coords, scores, window_B = out
    count = int(count)
    return merge.batch_hits(np.asarray(window_B), np.asarray(coords)[:count], np.asarray(scores)[:count])

  def concat_hits(self, hits):
    return merge.concat_hits(hits)

  # Host: records, metric, results.
  def assemble(self, prepared, hits):
    """Per record, entity dicts {"start", "end", "type", "score"} (char offsets)."""
    return merge.merge_predictions(prepared, hits)

  def score(self, prepared, merged) -> dict:
    """`span_prf` over whole documents plus `by_length` and `per_record` counts."""
    pred, gold = merge.prediction_spans(merged), merge.gold_spans(prepared)
    result = span_prf(pred, gold)
    result["by_length"] = by_length(prepared, pred, gold)
    result["per_record"] = per_record_counts(pred, gold, prepared.num_records)
    return result

  def final_fields(self, result: dict) -> dict:
    """What results.json keeps of a final split's result."""
    return dict(flat_result(result), per_type=result["per_type"], by_length=result["by_length"],
                per_record=result["per_record"])

  def result_lines(self, result: dict) -> list[str]:
    """Log lines beside a final split's P/R/F1 and per-type line: none."""
    return []

  def resolved_choices(self) -> dict:
    """What resolved.json records of the task per program: nothing (entity runs' records unchanged)."""
    return {}


TASK = EntityTask

__all__ = ["TASK", "EntityTask", "LENGTH_BUCKETS", "by_length", "token_lengths", "flat_result", "grown_size"]
