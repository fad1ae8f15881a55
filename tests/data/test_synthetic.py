"""The synthetic corpora (gp_jax.data.sources): deterministic, and in `synthetic_distance` the distance between
brackets alone decides which bracket pair is an entity, beyond what the RoPE ablation's encoder sees."""

from __future__ import annotations

import itertools
import string

import pytest

from gp_jax.configs.base import get_config
from gp_jax.data import sources
from gp_jax.data.sources import distance_records, load_records
from gp_jax.metrics import span_prf


def bracket_pairs(text: str) -> list[tuple[int, int]]:
  """Every ("[" at i, "]" at j > i) pair of a text as a span [i, j + 1)."""
  opens = [i for i, c in enumerate(text) if c == "["]
  closes = [j for j, c in enumerate(text) if c == "]"]
  return [(i, j + 1) for i, j in itertools.product(opens, closes) if j > i]


def spans(records, rule) -> set:
  """(record, start, end, "SPAN") of every bracket pair whose length passes `rule`."""
  return {(k, s, e, "SPAN") for k, r in enumerate(records) for s, e in bracket_pairs(r["text"]) if rule(e - s)}


def gold(records) -> set:
  return {(k, e["start"], e["end"], e["type"]) for k, r in enumerate(records) for e in r["entities"]}


@pytest.mark.parametrize("name", sorted(sources.SYNTHETIC_CORPORA))
def test_deterministic_per_seed(name):
  make, _ = sources.SYNTHETIC_CORPORA[name]
  assert make(200, seed=5, prefix="t") == make(200, seed=5, prefix="t")
  assert make(200, seed=5, prefix="t") != make(200, seed=6, prefix="t")
  c = get_config(f"dataset={name}").data
  c.synthetic_records = 40
  train, dev, test, types = load_records(c, seed=2)
  assert (train, dev, test, types) == load_records(c, seed=2)
  assert (len(train), len(dev), len(test)) == (40, 10, 10)
  assert {e["type"] for r in train + dev + test for e in r["entities"]} <= set(types)


def test_synthetic_is_the_nested_box_task():
  """The tests' corpus is kept: BOX spans "[...]" holding NUM and CAP spans."""
  recs = sources.synthetic_records(300, seed=0)
  assert sources.SYNTHETIC_CORPORA["synthetic"][1] == ("BOX", "NUM", "CAP")
  for r in recs:
    for e in r["entities"]:
      piece = r["text"][e["start"]:e["end"]]
      assert {"BOX": piece[:1] + piece[-1:] == "[]", "NUM": piece.isdigit(), "CAP": piece[:1].isupper()}[e["type"]]


def test_distance_alone_decides_the_entities():
  recs = distance_records(3000, seed=0)
  for r in recs:
    text = r["text"]
    assert set(text) <= set(string.ascii_lowercase + "[]") and len(text) <= 62  # one window of max_len 64
    for e in r["entities"]:
      assert text[e["start"]] == "[" and text[e["end"] - 1] == "]" and "[" not in text[e["start"] + 1:e["end"]]
  # Every pair 12 characters long or shorter is an entity, every longer one is not, and nothing lies between:
  # the rule "a pair of length <= 12" scores F1 1, and pairs are never 13-19 characters long.
  assert span_prf(spans(recs, lambda n: n <= 12), gold(recs))["f1"] == 1.0
  lengths = {e - s for r in recs for s, e in bracket_pairs(r["text"])}
  assert min(lengths) >= 9 and not lengths & set(range(13, 20))
  # The 2-layer CNN of experiments/rope_ablation.py:dataset=synthetic_distance sees 3 characters left and 4 right
  # of a bracket (kernel 3, dilations 1 and 2, plus the next character's bigram): never the other bracket.
  reach = (3 // 2) * (1 + 2) + 1
  assert min(lengths) - 1 > reach


def test_without_distance_the_best_is_every_bracket_pair():
  """A span score blind to distance sees the same "[" and "]" in a gold pair and a cross pair: its best is to
  predict every pair (or none). With one to three entities per text, equally likely, that is precision
  E[k] / E[k (k + 1) / 2] = 2 / (10 / 3) = 0.6, F1 0.75, the ceiling that the RoPE-off runs reach."""
  recs = distance_records(6000, seed=1)
  prf = span_prf(spans(recs, lambda n: True), gold(recs))
  assert prf["recall"] == 1.0
  assert prf["precision"] == pytest.approx(0.6, abs=0.02) and prf["f1"] == pytest.approx(0.75, abs=0.02)
  # Every bracket is the end of exactly one entity, so a cross pair is made of the very brackets of two gold pairs:
  # the characters round its ends are those round gold ends.
  for r in recs:
    ends = sorted(p for e in r["entities"] for p in (e["start"], e["end"] - 1))
    assert ends == [i for i, c in enumerate(r["text"]) if c in "[]"]
