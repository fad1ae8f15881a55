import numpy as np
import pytest

from gp_jax.data.tagging import (end_constraints, num_tags, spans_to_tags, tag_id, tags_to_spans,
                                 transition_constraints)


def random_flat_spans(rng, length, num_types):
  spans, pos = [], int(rng.integers(0, 3))
  while pos < length:
    end = min(length - 1, pos + int(rng.integers(0, 4)))
    spans.append((pos, end, int(rng.integers(num_types))))
    pos = end + 1 + int(rng.integers(0, 3))  # adjacent spans (gap 0) included
  return spans


def test_layout():
  assert num_tags(3, "BIO") == 7 and num_tags(3, "BIOES") == 13 and num_tags(2, "IOB2") == 5
  assert [tag_id(p, 1, scheme="BIO") for p in "BI"] == [3, 4]
  assert [tag_id(p, 1, scheme="BIOES") for p in "BIES"] == [5, 6, 7, 8]
  assert tag_id("O", 0) == 0
  with pytest.raises(ValueError):
    num_tags(2, "BMES")


@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
def test_round_trip_flat_spans(scheme):
  rng = np.random.default_rng(0)
  allowed, a_start = transition_constraints(3, scheme)
  a_end = end_constraints(3, scheme)
  for _ in range(200):
    length = int(rng.integers(1, 15))
    spans = random_flat_spans(rng, length, 3)
    tags, lost = spans_to_tags(np.array(spans, int).reshape(-1, 3), length=length, num_types=3, scheme=scheme)
    assert lost == 0 and tags.dtype == np.int32 and tags.shape == (length,)
    assert tags_to_spans(tags, num_types=3, scheme=scheme) == spans
    assert a_start[tags[0]] and a_end[tags[-1]] and allowed[tags[:-1], tags[1:]].all()


def test_encoding_examples():
  tags, _ = spans_to_tags([[1, 3, 1], [4, 4, 0]], length=6, num_types=2, scheme="BIO")
  assert tags.tolist() == [0, 3, 4, 4, 1, 0]
  tags, _ = spans_to_tags([[1, 3, 1], [4, 4, 0]], length=6, num_types=2, scheme="BIOES")
  assert tags.tolist() == [0, 5, 6, 7, 4, 0]
  tags, lost = spans_to_tags(np.zeros((0, 3)), length=3, num_types=2)
  assert tags.tolist() == [0, 0, 0] and lost == 0


def test_nested_keeps_outer():
  spans = [[2, 2, 0], [0, 4, 1], [1, 2, 0], [6, 7, 0]]
  tags, lost = spans_to_tags(spans, length=9, num_types=2, scheme="BIOES")
  assert lost == 2
  assert tags_to_spans(tags, num_types=2, scheme="BIOES") == [(0, 4, 1), (6, 7, 0)]


def test_crossing_and_ties():
  # Crossing: the longer wins; equal lengths: the earlier start; same span: the lower type.
  tags, lost = spans_to_tags([[2, 4, 0], [0, 3, 1]], length=6, num_types=2)
  assert lost == 1 and tags_to_spans(tags, num_types=2) == [(0, 3, 1)]
  tags, lost = spans_to_tags([[2, 4, 0], [1, 3, 1]], length=6, num_types=2)
  assert lost == 1 and tags_to_spans(tags, num_types=2) == [(1, 3, 1)]
  tags, lost = spans_to_tags([[1, 2, 1], [1, 2, 0], [1, 2, 0]], length=4, num_types=2)
  assert lost == 2 and tags_to_spans(tags, num_types=2) == [(1, 2, 0)]


def test_invalid_spans_raise():
  for bad in ([0, 3, 0], [2, 1, 0], [-1, 0, 0], [0, 0, 2]):
    with pytest.raises(ValueError):
      spans_to_tags([bad], length=3, num_types=2)


def test_lenient_decoding():
  # BIO, 2 types: O=0, B-0=1, I-0=2, B-1=3, I-1=4; negative tags read as O.
  assert tags_to_spans([2, 2, 0, 4, 2, 1, 2, -1, 2], num_types=2) == [(0, 1, 0), (3, 3, 1), (4, 4, 0), (5, 6, 0),
                                                                     (8, 8, 0)]
  # BIOES, 1 type: B=1, I=2, E=3, S=4. Open entities close at O / the end; E after E starts anew.
  assert tags_to_spans([1, 2, 0, 3, 3, 4, 2, 1], num_types=1, scheme="BIOES") == [
      (0, 1, 0), (3, 3, 0), (4, 4, 0), (5, 5, 0), (6, 6, 0), (7, 7, 0)]
  with pytest.raises(ValueError):
    tags_to_spans([5], num_types=2)


def test_constraints_bio():
  allowed, a_start = transition_constraints(2, "BIO")
  # rows: from O, B-0, I-0, B-1, I-1; columns: to the same.
  assert allowed.astype(int).tolist() == [
      [1, 1, 0, 1, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 0], [1, 1, 0, 1, 1], [1, 1, 0, 1, 1]]
  assert a_start.tolist() == [True, True, False, True, False]
  assert end_constraints(2, "BIO").all()
