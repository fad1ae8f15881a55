"""Corpus-level span (and relation triple) precision / recall / F1, and their counts by sentence class."""

from __future__ import annotations

import collections
from typing import Hashable, Iterable, Sequence

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


def overlap_kinds(triples: Iterable[tuple[Hashable, Hashable, Hashable]]) -> set[str]:
  """The overlap classes of one sentence's (subject, relation, object) triples as CasRel counts them (the CopyRE
  split it tests on): "normal" when its triples' 2n entity mentions are n * 2 distinct entities; otherwise "epo"
  when an ordered (subject, object) pair repeats, and "seo" when the distinct pairs share an entity. A sentence may
  be both SEO and EPO."""
  triples = list(triples)
  pairs = [(s, o) for s, _, o in triples]
  if len({e for pair in pairs for e in pair}) == 2 * len(pairs):
    return {"normal"}
  kinds = {"epo"} if len(set(pairs)) < len(pairs) else set()
  distinct = set(pairs)
  if len({e for pair in distinct for e in pair}) != 2 * len(distinct):
    kinds.add("seo")
  return kinds


def bucket_counts(pred: Iterable[tuple], gold: Iterable[tuple], labels_of_record: Sequence[Iterable[str]],
                  labels: Sequence[str]) -> dict[str, dict[str, int]]:
  """{label: {"tp", "pred", "gold"}}: each item (record index first) counted under every label of its record
  (`labels_of_record[record]`); a record's predictions count in its classes."""
  pred, gold = set(pred), set(gold)
  out = {label: {"tp": 0, "pred": 0, "gold": 0} for label in labels}
  for field, items in (("gold", gold), ("pred", pred), ("tp", pred & gold)):
    for x in items:
      for label in labels_of_record[x[0]]:
        out[label][field] += 1
  return out


__all__ = ["bucket_counts", "overlap_kinds", "per_record_counts", "span_prf", "triple_prf"]
