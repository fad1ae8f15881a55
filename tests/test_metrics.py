import random

import numpy as np

import pytest

from gp_jax.metrics import per_record_counts, span_prf


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


def test_per_record_counts_by_hand():
  gold = {(0, 0, 2, "PER"), (0, 3, 5, "LOC"), (2, 0, 1, "PER")}
  pred = {(0, 0, 2, "PER"), (0, 3, 5, "PER"), (1, 4, 6, "ORG")}
  c = per_record_counts(pred, gold, 4)
  assert c == {"tp": [1, 0, 0, 0], "fp": [1, 1, 0, 0], "fn": [1, 0, 1, 0]}


def test_per_record_counts_sum_to_corpus_counts():
  rng = random.Random(1)
  gold = {(rng.randrange(20), a, a + rng.randint(1, 3), rng.choice("XY")) for a in range(60)}
  pred = {s for s in gold if rng.random() < 0.6} | {(rng.randrange(20), 100 + a, 102 + a, "X") for a in range(15)}
  c, r = per_record_counts(pred, gold, 20), span_prf(pred, gold)
  assert (sum(c["tp"]), sum(c["tp"]) + sum(c["fp"]), sum(c["tp"]) + sum(c["fn"])) == (r["tp"], r["pred"], r["gold"])


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


# --- cross-check against seqeval (an independent implementation) on a real corpus ----------


def _token_spans(record):
  """CoNLL record (tokens joined by " ") -> [(start_tok, end_tok exclusive, type)], and the token count."""
  tokens = record["text"].split(" ")
  start_of, end_of, pos = {}, {}, 0
  for i, tok in enumerate(tokens):
    start_of[pos], end_of[pos + len(tok)] = i, i + 1
    pos += len(tok) + 1
  return [(start_of[e["start"]], end_of[e["end"]], e["type"]) for e in record["entities"]], len(tokens)


def _perturb(spans, n, types, rng):
  """Drops, moves a boundary of, retypes, and adds flat spans; the result stays flat (no overlaps)."""
  out = []
  for a, b, t in spans:
    u = rng.random()
    if u < 0.1:
      continue  # dropped
    if u < 0.2:
      a, b = (a + rng.choice([-1, 1]), b) if rng.random() < 0.5 else (a, b + rng.choice([-1, 1]))
    elif u < 0.3:
      t = rng.choice([x for x in types if x != t])
    out.append((a, b, t))
  if rng.random() < 0.3:
    a = rng.randrange(n)
    out.append((a, min(n, a + rng.randint(1, 3)), rng.choice(types)))
  flat, used = [], set()
  for a, b, t in out:  # keep the valid, non-overlapping ones in order
    cells = set(range(a, b))
    if 0 <= a < b <= n and not cells & used:
      flat.append((a, b, t))
      used |= cells
  return flat


def _bio(spans, n):
  tags = ["O"] * n
  for a, b, t in spans:
    tags[a:b] = [f"B-{t}"] + [f"I-{t}"] * (b - a - 1)
  return tags


def test_span_prf_matches_seqeval_on_conll2003_dev(shared_data):
  metrics = pytest.importorskip("seqeval.metrics")
  from gp_jax.data import read_conll

  path = shared_data / "conll2003" / "valid.txt"
  if not path.exists():
    pytest.skip(f"{path} not found")
  records = read_conll(path, scheme="BIO", joiner=" ")
  types = sorted({e["type"] for r in records for e in r["entities"]})
  rng = random.Random(1234)
  gold, pred, y_true, y_pred = set(), set(), [], []
  for s, rec in enumerate(records):
    spans, n = _token_spans(rec)
    noisy = _perturb(spans, n, types, rng)
    gold |= {(s, a, b, t) for a, b, t in spans}
    pred |= {(s, a, b, t) for a, b, t in noisy}
    y_true.append(_bio(spans, n))
    y_pred.append(_bio(noisy, n))
  assert len(records) == 3250 and len(gold) == 5942
  assert 0.6 < len(pred & gold) / len(gold) < 0.9  # the perturbation is neither nothing nor everything
  ours = span_prf(pred, gold)
  assert ours["precision"] == pytest.approx(metrics.precision_score(y_true, y_pred), abs=1e-9)
  assert ours["recall"] == pytest.approx(metrics.recall_score(y_true, y_pred), abs=1e-9)
  assert ours["f1"] == pytest.approx(metrics.f1_score(y_true, y_pred), abs=1e-9)
  report = metrics.classification_report(y_true, y_pred, output_dict=True)
  for t in types:
    for k in ("precision", "recall", "f1"):
      assert ours["per_type"][t][k] == pytest.approx(report[t][k.replace("f1", "f1-score")], abs=1e-9), (t, k)


# --- overlap kinds as CasRel counts them ---------------------------------------------------------------------------


def copyre_kinds(flat):
  """CopyRE's split of a sentence (the one CasRel tests on), from its definitions over [e1, e2, r, e1, e2, r, ...]:
  normal when the entities of all triples are 2n distinct ones; multi-label (EPO) when an (e1, e2) pair repeats;
  overlapping (SEO) when, the repeated pairs removed, an entity occurs in two pairs."""
  n = len(flat) // 3
  entities = {e for i, e in enumerate(flat) if i % 3 != 2}
  if len(entities) == 2 * n:
    return {"normal"}
  pairs = [tuple(flat[3 * i:3 * i + 2]) for i in range(n)]
  out = set()
  if len(pairs) != len(set(pairs)):
    out.add("epo")
  distinct = set(pairs)
  if len({e for pair in distinct for e in pair}) != 2 * len(distinct):
    out.add("seo")
  return out


def test_overlap_kinds_as_copyre_defines_them():
  from gp_jax.metrics import overlap_kinds

  assert overlap_kinds([("a", "r", "b"), ("a", "s", "b"), ("a", "r", "c")]) == {"seo", "epo"}  # both
  assert overlap_kinds([("a", "r", "b"), ("b", "s", "a")]) == {"seo"}  # a reversed pair is not the same pair
  assert overlap_kinds([("a", "r", "b"), ("a", "s", "b"), ("c", "r", "d")]) == {"epo"}
  assert overlap_kinds([]) == {"normal"}
  rng = np.random.default_rng(0)
  seen = set()
  for _ in range(300):
    triples = {(str(rng.integers(5)), str(rng.integers(2)), str(rng.integers(5))) for _ in range(rng.integers(1, 5))}
    triples = sorted(triples)
    want = copyre_kinds([x for s, r, o in triples for x in (s, o, r)])
    assert overlap_kinds(triples) == want, triples
    seen.add(frozenset(want))
  assert {frozenset({"normal"}), frozenset({"seo"}), frozenset({"seo", "epo"})} <= seen


def test_bucket_counts_count_each_item_under_every_label_of_its_record():
  from gp_jax.metrics import bucket_counts

  gold = {(0, "x"), (0, "y"), (1, "z")}
  pred = {(0, "x"), (1, "w"), (2, "v")}
  got = bucket_counts(pred, gold, [["a", "b"], ["b"], []], ["a", "b", "c"])
  assert got == {"a": {"tp": 1, "pred": 1, "gold": 2}, "b": {"tp": 1, "pred": 2, "gold": 3},
                 "c": {"tp": 0, "pred": 0, "gold": 0}}
