"""Tag decoding/encoding: examples, conlleval repairs, scheme detection, round trips."""

import collections

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gp_jax.data import tags as T


def decode(tags, scheme):
  repairs = collections.Counter()
  return T.tags_to_spans(tags, scheme, repairs=repairs), dict(repairs)


# --- examples -----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme, tags, spans", [
    ("BIO", ["B-PER", "I-PER", "O", "B-LOC"], [(0, 2, "PER"), (3, 4, "LOC")]),
    ("BIO", ["B-PER", "B-PER", "I-PER"], [(0, 1, "PER"), (1, 3, "PER")]),
    ("IOB2", ["O", "B-ORG"], [(1, 2, "ORG")]),
    ("IOB1", ["I-PER", "I-PER", "B-PER", "O", "I-LOC"], [(0, 2, "PER"), (2, 3, "PER"), (4, 5, "LOC")]),
    ("BIOES", ["B-PER", "I-PER", "E-PER", "S-LOC", "O"], [(0, 3, "PER"), (3, 4, "LOC")]),
    ("BMES", ["B-ORG", "M-ORG", "M-ORG", "E-ORG", "S-PER"], [(0, 4, "ORG"), (4, 5, "PER")]),
    ("BMES", ["O", "B-LOC", "E-LOC"], [(1, 3, "LOC")]),
    ("BIO", [], []),
])
def test_decode_examples(scheme, tags, spans):
  assert decode(tags, scheme) == (spans, {})


@pytest.mark.parametrize("scheme, tags, spans, repairs", [
    # conlleval: an I- that continues nothing starts an entity.
    ("BIO", ["O", "I-PER", "I-PER"], [(1, 3, "PER")], {"orphan_continuation": 1}),
    ("BIO", ["I-PER"], [(0, 1, "PER")], {"orphan_continuation": 1}),
    ("BIO", ["B-PER", "I-LOC"], [(0, 1, "PER"), (1, 2, "LOC")], {"type_mismatch": 1}),
    ("IOB1", ["I-PER", "I-LOC"], [(0, 1, "PER"), (1, 2, "LOC")], {}),  # legal in IOB1
    ("IOB1", ["O", "I-LOC"], [(1, 2, "LOC")], {}),
    # BIOES/BMES: entities left open end at their last token.
    ("BIOES", ["B-PER", "O"], [(0, 1, "PER")], {"unterminated": 1}),
    ("BIOES", ["B-PER", "I-PER", "S-LOC"], [(0, 2, "PER"), (2, 3, "LOC")], {"unterminated": 1}),
    ("BIOES", ["B-PER", "I-PER"], [(0, 2, "PER")], {"unterminated": 1}),
    ("BIOES", ["S-PER", "E-PER"], [(0, 1, "PER"), (1, 2, "PER")], {"orphan_continuation": 1}),
    ("BIOES", ["B-PER", "E-PER", "I-PER", "E-PER"], [(0, 2, "PER"), (2, 4, "PER")], {"orphan_continuation": 1}),
    ("BMES", ["M-PER", "E-PER", "B-PER", "E-PER"], [(0, 2, "PER"), (2, 4, "PER")], {"orphan_continuation": 1}),
    ("BMES", ["M-ORG", "O"], [(0, 1, "ORG")], {"orphan_continuation": 1, "unterminated": 1}),
    ("BMES", ["B-ORG", "M-LOC", "E-LOC"], [(0, 1, "ORG"), (1, 3, "LOC")], {"type_mismatch": 1, "unterminated": 1}),
])
def test_decode_repairs(scheme, tags, spans, repairs):
  assert decode(tags, scheme) == (spans, repairs)


def test_repairs_accumulate_across_calls():
  repairs = collections.Counter()
  T.tags_to_spans(["I-PER"], "BIO", repairs=repairs)
  T.tags_to_spans(["O", "I-LOC"], "BIO", repairs=repairs)
  assert repairs == {"orphan_continuation": 2}


@pytest.mark.parametrize("scheme, tags, index", [
    ("BIO", ["O", "E-PER"], 1),  # E- is not BIO
    ("BIO", ["S-PER"], 0),
    ("BIOES", ["B-PER", "M-PER"], 1),
    ("BMES", ["B-PER", "I-PER"], 1),
    ("BIO", ["O", "B-"], 1),  # malformed
    ("BIO", ["X-PER"], 0),
    ("BIO", ["PER"], 0),
    ("BIO", ["o"], 0),
])
def test_bad_tags_raise_with_index(scheme, tags, index):
  with pytest.raises(T.TagError) as e:
    T.tags_to_spans(tags, scheme)
  assert e.value.index == index
  assert isinstance(e.value, ValueError)


def test_unknown_scheme():
  with pytest.raises(ValueError, match="unknown tag scheme"):
    T.tags_to_spans(["O"], "BILOU")
  assert T.normalize_scheme("iob2") == "BIO"
  assert T.normalize_scheme("iobes") == "BIOES"


@pytest.mark.parametrize("tags, scheme", [
    (["B-PER", "M-PER", "E-PER"], "BMES"),
    (["B-PER", "E-PER", "S-LOC"], "BIOES"),
    (["B-PER", "I-PER", "E-PER"], "BIOES"),
    (["B-PER", "I-PER", "O"], "BIO"),
    (["I-PER", "I-PER", "O", "I-LOC"], "IOB1"),
    (["I-PER", "B-PER", "O", "I-LOC"], "IOB1"),
    (["O", "O"], "BIO"),
    ([], "BIO"),
    ([["I-PER"], ["I-LOC", "O"], ["B-PER", "I-PER"]], "IOB1"),  # a list of sentences
    ([["B-PER"], ["O", "B-LOC", "I-LOC"]], "BIO"),
])
def test_detect_scheme(tags, scheme):
  assert T.detect_scheme(tags) == scheme


def test_detect_scheme_errors():
  with pytest.raises(ValueError, match="mix I- and M-"):
    T.detect_scheme(["B-PER", "I-PER", "M-PER"])
  with pytest.raises(T.TagError):
    T.detect_scheme(["B-PER", "Q-PER"])


def test_encode_examples():
  spans = [(0, 1, "PER"), (1, 3, "PER"), (4, 7, "LOC")]
  assert T.spans_to_tags(spans, 8, "BIO") == ["B-PER", "B-PER", "I-PER", "O", "B-LOC", "I-LOC", "I-LOC", "O"]
  assert T.spans_to_tags(spans, 8, "IOB1") == ["I-PER", "B-PER", "I-PER", "O", "I-LOC", "I-LOC", "I-LOC", "O"]
  assert T.spans_to_tags(spans, 8, "BIOES") == ["S-PER", "B-PER", "E-PER", "O", "B-LOC", "I-LOC", "E-LOC", "O"]
  assert T.spans_to_tags(spans, 8, "BMES") == ["S-PER", "B-PER", "E-PER", "O", "B-LOC", "M-LOC", "E-LOC", "O"]


def test_encode_rejects_nesting_and_range():
  with pytest.raises(ValueError, match="overlaps"):
    T.spans_to_tags([(0, 3, "A"), (1, 2, "B")], 4, "BIO")
  with pytest.raises(ValueError, match="outside"):
    T.spans_to_tags([(2, 5, "A")], 4, "BIO")
  with pytest.raises(ValueError, match="outside"):
    T.spans_to_tags([(2, 2, "A")], 4, "BIO")


# --- properties ---------------------------------------------------------------------------

TYPES = st.sampled_from(["PER", "LOC", "ORG-x", "a"])


@st.composite
def flat_spans(draw, max_len=30):
  """(length, sorted non-overlapping spans)."""
  length = draw(st.integers(0, max_len))
  cuts = sorted(draw(st.lists(st.integers(0, length), max_size=12)))
  spans, pos = [], 0
  for a, b in zip(cuts[::2], cuts[1::2]):
    a = max(a, pos)
    if a < b:
      spans.append((a, b, draw(TYPES)))
      pos = b
  return length, spans


@settings(max_examples=200, deadline=None)
@given(flat_spans(), st.sampled_from(T.SCHEMES))
def test_encode_decode_round_trip(data, scheme):
  length, spans = data
  tags = T.spans_to_tags(spans, length, scheme)
  assert len(tags) == length
  assert decode(tags, scheme) == (spans, {})
  # Whatever the detector picks decodes the same spans.
  assert T.tags_to_spans(tags, T.detect_scheme(tags)) == spans


def conlleval_chunks(tags):
  """Reference: conlleval's startOfChunk/endOfChunk (M- read as I-), as (start, end, type)."""
  chunks, start, prev_tag, prev_type = [], None, "O", ""
  for i, tag in enumerate(list(tags) + ["O"]):
    t, typ = ("O", "") if tag == "O" else (tag[0].replace("M", "I"), tag[2:])
    end = (prev_tag in "ES" or (prev_tag in "BI" and t in "BSO") or (prev_tag != "O" and prev_type != typ))
    begin = (t in "BS" or (prev_tag in "ESO" and t in "EI") or (t != "O" and prev_type != typ))
    if end and start is not None:
      chunks.append((start, i, prev_type))
      start = None
    if begin:
      start = i
    prev_tag, prev_type = t, typ
  return chunks


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(T.SCHEMES), st.data())
def test_decode_matches_conlleval(scheme, data):
  prefixes = T.PREFIXES[scheme] + "O"
  tags = data.draw(st.lists(st.builds(lambda p, t: "O" if p == "O" else f"{p}-{t}", st.sampled_from(prefixes),
                                      st.sampled_from(["PER", "LOC"])), max_size=25))
  spans, repairs = decode(tags, scheme)
  assert spans == conlleval_chunks(tags)
  # Spans are ordered, in range and disjoint.
  assert all(0 <= a < b <= len(tags) for a, b, _ in spans)
  assert all(s[1] <= t[0] for s, t in zip(spans, spans[1:]))
  # No repair <=> the tags are exactly the canonical encoding (IOB1 allows a needless B-).
  if scheme != "IOB1":
    assert (not repairs) == (T.spans_to_tags(spans, len(tags), scheme) == tags)
