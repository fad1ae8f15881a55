"""Entity length in encoder tokens (`token_lengths`, `by_length`) against a reference written from the definition: a
span's length is the number of the record's non-empty content tokens [s, e) whose chars overlap its chars [a, b)."""

import numpy as np

from gp_jax.tasks.entities import LENGTH_BUCKETS, by_length, token_lengths


class Offsets:
  """Per-record [n, 2] char offsets, as `PreparedSplit.record_offsets` gives them."""

  def __init__(self, per_record):
    self.per_record = per_record

  def record_offsets(self, r):
    return self.per_record[r]


def reference_length(offsets, a, b):
  return sum(1 for s, e in offsets.tolist() if e > s and s < b and e > a)


def random_records(rng, n):
  records = []
  for _ in range(n):
    cuts = np.sort(rng.choice(np.arange(1, 60), size=rng.integers(2, 20), replace=False))
    tokens = np.stack([cuts[:-1], cuts[1:]], 1)
    tokens = np.concatenate([[[0, 0]], tokens, [[0, 0]]])  # special tokens: empty offsets
    if rng.random() < 0.3:  # two tokens on the same chars (a char split into sub-tokens)
      tokens = np.insert(tokens, 2, tokens[1], axis=0)
    records.append(tokens.astype(np.int32))
  return records


def test_token_lengths_match_the_definition():
  rng = np.random.default_rng(0)
  prepared = Offsets(random_records(rng, 30))
  spans = []
  for _ in range(2000):
    r = int(rng.integers(30))
    a, b = sorted(rng.integers(0, 62, size=2).tolist())
    spans.append((r, a, b + int(rng.integers(0, 2)), "T"))  # a few empty spans (a == b) too
  got = token_lengths(prepared, spans)
  want = [reference_length(prepared.record_offsets(r), a, b) for r, a, b, _ in spans]
  assert got.tolist() == want
  assert token_lengths(prepared, []).shape == (0,)


def test_by_length_counts_match_the_definition():
  rng = np.random.default_rng(1)
  prepared = Offsets(random_records(rng, 10))
  spans = set()
  while len(spans) < 400:
    r = int(rng.integers(10))
    a = int(rng.integers(0, 58))
    spans.add((r, a, a + int(rng.integers(1, 12)), str(rng.integers(3))))
  spans = sorted(spans)
  gold = spans[:250]
  pred = spans[150:]
  got = by_length(prepared, pred, gold)
  for label, lo, hi in LENGTH_BUCKETS:
    inside = lambda s: lo <= reference_length(prepared.record_offsets(s[0]), s[1], s[2]) <= (hi or 10**9)  # noqa: E731
    assert got[label] == {"tp": sum(map(inside, set(pred) & set(gold))), "pred": sum(map(inside, pred)),
                          "gold": sum(map(inside, gold))}, label
  assert by_length(prepared, [], []) == {label: {"tp": 0, "pred": 0, "gold": 0} for label, _, _ in LENGTH_BUCKETS}
