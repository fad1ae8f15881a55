"""Corpus-level span (and relation triple) precision / recall / F1."""

from __future__ import annotations

import collections
from typing import Hashable, Iterable


def _prf(tp: int, n_pred: int, n_gold: int) -> dict[str, float]:
  precision = tp / n_pred if n_pred else 0.0
  recall = tp / n_gold if n_gold else 0.0
  f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
  return {"precision": precision, "recall": recall, "f1": f1, "tp": tp, "pred": n_pred, "gold": n_gold}


def span_prf(pred: Iterable[tuple[Hashable, int, int, Hashable]], gold: Iterable[tuple[Hashable, int, int, Hashable]]):
  """Micro P/R/F1 over sets of `(example_id, start, end, type)`, plus per-type figures.

  Counts are pooled over the whole corpus (never averaged per batch). Empty sides give 0.0, not an
  error. Returns {"precision", "recall", "f1", "tp", "pred", "gold", "per_type": {type: {...}}}.
  """
  pred, gold = set(pred), set(gold)
  tp_set = pred & gold
  result = _prf(len(tp_set), len(pred), len(gold))
  counts = collections.defaultdict(lambda: [0, 0, 0])
  for span in tp_set:
    counts[span[3]][0] += 1
  for span in pred:
    counts[span[3]][1] += 1
  for span in gold:
    counts[span[3]][2] += 1
  result["per_type"] = {t: _prf(*c) for t, c in sorted(counts.items(), key=lambda kv: str(kv[0]))}
  return result


def per_record_counts(pred: Iterable[tuple[int, int, int, Hashable]], gold: Iterable[tuple[int, int, int, Hashable]],
                      num_records: int) -> dict[str, list[int]]:
  """{"tp", "fp", "fn"}: one int per record 0..num_records-1 (spans are `(record_index, start, end, type)`).

  Summed over records they give `span_prf`'s counts; resampling records gives bootstrap F1s."""
  pred, gold = set(pred), set(gold)
  out = {k: [0] * num_records for k in ("tp", "fp", "fn")}
  for span in pred:
    out["tp" if span in gold else "fp"][span[0]] += 1
  for span in gold - pred:
    out["fn"][span[0]] += 1
  return out


def triple_prf(pred: Iterable[tuple[Hashable, Hashable, Hashable, Hashable]],
               gold: Iterable[tuple[Hashable, Hashable, Hashable, Hashable]]):
  """Relation triples `(example_id, subject, object, relation)` as sets: `span_prf`'s micro figures and per relation
  ("per_type"), plus "macro_f1", the mean F1 over the relations with gold triples (0.0 when none has)."""
  result = span_prf(pred, gold)
  f1s = [r["f1"] for r in result["per_type"].values() if r["gold"]]
  result["macro_f1"] = sum(f1s) / len(f1s) if f1s else 0.0
  return result


__all__ = ["per_record_counts", "span_prf", "triple_prf"]
