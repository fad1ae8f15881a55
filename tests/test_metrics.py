import random

import pytest

from gp_jax.metrics import span_prf


def test_micro_prf_and_per_type():
  gold = {(0, 0, 2, "PER"), (0, 3, 5, "LOC"), (1, 0, 1, "PER"), (1, 2, 4, "ORG")}
  pred = {(0, 0, 2, "PER"), (0, 3, 5, "PER"), (1, 2, 4, "ORG")}
  r = span_prf(pred, gold)
  assert (r["tp"], r["pred"], r["gold"]) == (2, 3, 4)
  assert r["precision"] == pytest.approx(2 / 3) and r["recall"] == pytest.approx(0.5)
  assert r["f1"] == pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5))
  assert r["per_type"]["PER"]["tp"] == 1 and r["per_type"]["PER"]["pred"] == 2 and r["per_type"]["PER"]["gold"] == 2
  assert r["per_type"]["LOC"]["recall"] == 0.0 and r["per_type"]["LOC"]["precision"] == 0.0
  assert r["per_type"]["ORG"]["f1"] == 1.0


def test_empty_sides():
  assert span_prf([], [])["f1"] == 0.0
  assert span_prf([(0, 0, 1, "A")], [])["precision"] == 0.0
  assert span_prf([], [(0, 0, 1, "A")])["recall"] == 0.0


def test_corpus_level_not_batch_average():
  """Pooling counts differs from averaging per-batch F1 (the mistake in public ports)."""
  rng = random.Random(0)
  gold, pred, batches = set(), set(), []
  for b in range(5):
    g = {(b, i, i + 1, "X") for i in range(rng.randint(1, 10))}
    p = {s for s in g if rng.random() < 0.5} | {(b, 100 + i, 101 + i, "X") for i in range(rng.randint(0, 3))}
    gold |= g
    pred |= p
    batches.append(span_prf(p, g)["f1"])
  pooled = span_prf(pred, gold)
  tp = len(pred & gold)
  p_, r_ = tp / len(pred), tp / len(gold)
  assert pooled["f1"] == pytest.approx(2 * p_ * r_ / (p_ + r_))
  assert pooled["f1"] != pytest.approx(sum(batches) / len(batches))
