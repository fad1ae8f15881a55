"""Tests for gp_jax.data.windows: window starts, alignment, entity status counts, features."""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gp_jax.data import batching, merge, sources, windows
from gp_jax.data.types import Tokenizer
from gp_jax.errors import UserError
from tests.data.fakes import TYPES, CharTok, EchoTok, window_positions, window_token_features, WordTok, ZeroWidthTok, random_records, ref_windows
from tests.data.reference_align import char_to_token_spans


def test_char_tok_is_a_tokenizer():
  assert isinstance(CharTok(), Tokenizer)


# ----------------------------------------------------------------------------- windows + merge


@st.composite
def split_case(draw):
  specials = draw(st.booleans())
  texts = draw(st.lists(st.text(alphabet="ab c", max_size=40), min_size=1, max_size=4))
  records = []
  for r, text in enumerate(texts):
    ents = []
    if text:
      for _ in range(draw(st.integers(0, 6))):
        a = draw(st.integers(0, len(text) - 1))
        b = draw(st.integers(a + 1, len(text)))
        ents.append({"start": a, "end": b, "type": draw(st.sampled_from(TYPES))})
    records.append({"id": f"doc{r}", "text": text, "entities": ents})
  P = int(specials)
  max_len = draw(st.integers(2 * P + 1, 2 * P + 15))
  W = max_len - 2 * P
  stride = draw(st.one_of(st.none(), st.integers(1, W)))
  return specials, records, max_len, stride


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(split_case())
def test_windows_then_merge_recover_the_whole_text(case):
  specials, records, max_len, stride = case
  tok = CharTok(specials)
  p = windows.prepare_split(records, tok, types=TYPES, max_len=max_len, stride=stride)
  P = int(specials)
  W = max_len - 2 * P
  S = max(1, W // 2) if stride is None else stride

  # Reference: windows, aligned entities and which ones fit a window, computed naively.
  want, aligned, aligned_occ, misaligned = set(), set(), 0, 0
  for r, rec in enumerate(records):
    char_to_tok = {int(a): t for t, (a, _) in enumerate(tok.encode(rec["text"]).offsets)}
    n = len(char_to_tok)
    starts = ref_windows(n, W, S)
    got_starts = p.window_start[p.window_record == r].tolist()
    assert got_starts == starts
    if starts:
      assert starts[-1] + min(n, W) == n  # the last window ends at the text end
    for e in rec["entities"]:
      a, b = char_to_tok.get(e["start"]), char_to_tok.get(e["end"] - 1)
      if a is None or b is None:
        misaligned += 1
        continue
      key = (r, e["start"], e["end"], e["type"])
      aligned.add(key)
      aligned_occ += 1
      if any(s <= a and b < s + W for s in starts):
        want.add(key)
      else:
        assert b - a + 1 > W - S + 1  # short entities are never lost

  hits = [(w, s, e, t, 1.0) for w in range(p.num_windows) for s, e, t in p.window_spans(w).tolist()]
  merged = merge.merge_predictions(p, hits)
  assert len(merged) == len(records)
  assert merge.prediction_spans(merged) == want
  st_ = p.stats
  assert st_.misaligned == misaligned
  assert st_.entities == sum(len(r["entities"]) for r in records)
  assert st_.targets == len(want) and st_.lost_to_truncation == len(aligned) - len(want)
  assert st_.targets + st_.duplicates + st_.lost_to_truncation == aligned_occ
  assert st_.entities == st_.targets + st_.misaligned + st_.too_long + st_.duplicates + st_.lost_to_truncation
  assert merge.gold_spans(p) == {(r, e["start"], e["end"], e["type"])
                                    for r, rec in enumerate(records) for e in rec["entities"]}
  # Window tokens: features carry the specials, positions are document positions.
  for w in range(p.num_windows):
    r, ws, n_c = int(p.window_record[w]), int(p.window_start[w]), int(p.window_content_len[w])
    enc = tok.encode(records[r]["text"])
    content = {k: v[ws:ws + n_c] for k, v in enc.features.items()}
    full = tok.add_special_tokens(content)
    for k, v in window_token_features(p, w).items():
      np.testing.assert_array_equal(v, full[k])
    np.testing.assert_array_equal(window_positions(p, w)[P:P + n_c], np.arange(ws, ws + n_c) + P)


def test_every_entity_is_in_a_window_or_counted():
  records = random_records(0, n=80, max_chars=80)
  p = windows.prepare_split(records, CharTok(), types=TYPES, max_len=8, stride=4, max_span_width=6)
  in_window = set()
  for w in range(p.num_windows):
    r, ws = int(p.window_record[w]), int(p.window_start[w])
    for s, e, t in p.window_spans(w).tolist():
      in_window.add((r, s + ws - 1, e + ws - 1, t))  # content tokens
  counts = dict.fromkeys(range(5), 0)
  for i in range(p.entity_record.shape[0]):
    status = int(p.entity_status[i])
    counts[status] += 1
    key = (int(p.entity_record[i]), *p.entity_token_E2[i].tolist(), int(p.entity_type[i]))
    if status in (windows.OK, windows.DUPLICATE):
      assert key in in_window
    else:
      assert key not in in_window
  s = p.stats
  assert (counts[windows.OK], counts[windows.MISALIGNED], counts[windows.TOO_LONG],
          counts[windows.DUPLICATE], counts[windows.LOST]) == (
              s.targets, s.misaligned, s.too_long, s.duplicates, s.lost_to_truncation)
  assert s.misaligned > 0 and s.too_long > 0 and s.lost_to_truncation > 0  # the data exercises them
  assert len(in_window) == s.targets


def test_word_alignment_counts_misaligned_and_never_moves():
  rec = {"id": "x", "text": "New York is big", "entities": [
      {"start": 0, "end": 8, "type": "LOC"},  # "New York"
      {"start": 1, "end": 8, "type": "LOC"},  # inside "New"
      {"start": 0, "end": 7, "type": "LOC"},  # ends inside "York"
      {"start": 12, "end": 15, "type": "ORG"},  # "big"
  ]}
  p = windows.prepare_split([rec], WordTok(), types=TYPES, max_len=10)
  assert p.stats.misaligned == 2 and p.stats.targets == 2
  assert sorted(p.window_spans(0).tolist()) == [[1, 2, 1], [4, 4, 2]]
  assert p.record_offsets(0).tolist() == [[0, 3], [4, 8], [9, 11], [12, 15]]


@pytest.mark.parametrize("odd_tok", [ZeroWidthTok, EchoTok])
def test_alignment_with_zero_width_and_non_monotone_offsets(odd_tok):
  records = random_records(5, n=30)
  for r in records:
    r["text"] = r["text"].replace("d", "c")
  a = windows.prepare_split(records, CharTok(), types=TYPES, max_len=400)
  b = windows.prepare_split(records, odd_tok(), types=TYPES, max_len=400)
  assert b.stats.tokens > a.stats.tokens
  np.testing.assert_array_equal(a.entity_status, b.entity_status)
  merged = []
  for p in (a, b):
    hits = [(w, s, e, t, 1.0) for w in range(p.num_windows) for s, e, t in p.window_spans(w).tolist()]
    merged.append(merge.prediction_spans(merge.merge_predictions(p, hits)))
  assert merged[0] == merged[1] and len(merged[0]) == a.stats.targets


@pytest.mark.parametrize("tok", [CharTok(), WordTok(), ZeroWidthTok(), EchoTok()])
def test_alignment_agrees_with_reference(tok):
  records = random_records(6, n=40)
  p = windows.prepare_split(records, tok, types=TYPES, max_len=400)
  type_to_id = {t: i for i, t in enumerate(TYPES)}
  for r, rec in enumerate(records):
    spans, misaligned = char_to_token_spans(tok.encode(rec["text"]).offsets, rec["entities"],
                                     type_to_id=type_to_id)
    mine = p.entity_record == r
    got = [(s, e, t) for (s, e), t in zip(p.entity_token_E2[mine].tolist(), p.entity_type[mine].tolist())
           if s >= 0]
    assert got == spans
    assert int((p.entity_status[mine] == windows.MISALIGNED).sum()) == len(misaligned)


def test_char_tokenizer_encode_batch_path(monkeypatch):
  ct = pytest.importorskip("gp_jax.data.char_tokenizer")
  monkeypatch.setattr(windows, "_ENCODE_CHUNK", 7)  # several encode_batch calls
  records = random_records(7, n=50)
  tok = ct.CharTokenizer.build([r["text"] for r in records])
  p = windows.prepare_split(records, tok, types=TYPES, max_len=16, stride=5)
  for w in (0, p.num_windows // 2, p.num_windows - 1):
    r, ws, n = int(p.window_record[w]), int(p.window_start[w]), int(p.window_content_len[w])
    enc = tok.encode(records[r]["text"])
    for k, v in window_token_features(p, w).items():
      np.testing.assert_array_equal(v, enc.features[k][ws:ws + n])
  ref = windows.prepare_split(records, CharTok(False), types=TYPES, max_len=16, stride=5)
  np.testing.assert_array_equal(p.spans_S3, ref.spans_S3)
  assert p.stats == ref.stats


def test_empty_records_and_errors():
  recs = [{"id": "e", "text": "   ", "entities": [{"start": 0, "end": 1, "type": "PER"}]},
          {"id": "f", "text": "ab", "entities": []}]
  p = windows.prepare_split(recs, CharTok(), types=TYPES, max_len=8)
  assert p.stats.empty_records == 1 and p.num_windows == 1 and p.stats.misaligned == 1
  assert merge.merge_predictions(p, []) == [[], []]
  bad = [{"id": "doc-7", "text": "abc", "entities": [{"start": 0, "end": 1, "type": "GPE"}]}]
  with pytest.raises(ValueError, match=r"doc-7.*GPE"):
    windows.prepare_split(bad, CharTok(), types=TYPES, max_len=8)
  with pytest.raises(UserError, match=r"^data\.stride=7 must be in \[1, 6\]"):  # a config's value: one line
    windows.prepare_split(recs, CharTok(), types=TYPES, max_len=8, stride=7)
  with pytest.raises(UserError, match=r"^data\.max_len=2 leaves no content tokens after 1\+1 special tokens"):
    windows.prepare_split(recs, CharTok(True), types=TYPES, max_len=2)
  with pytest.raises(ValueError, match="buckets"):
    batching.train_batches(p, batch_size=2, buckets=(16,), seed=0)
  with pytest.raises(ValueError, match="process_count"):
    batching.train_batches(p, batch_size=3, buckets=None, seed=0, process_count=2)


def test_stats_are_logged(caplog):
  with caplog.at_level(logging.INFO):
    windows.prepare_split(random_records(1, n=3), CharTok(), types=TYPES, max_len=16, name="devsplit")
  assert any("devsplit" in r.getMessage() and "misaligned" in r.getMessage() for r in caplog.records)


def test_relations_leave_the_entity_arrays_byte_identical():
  """The relation task's prepare (windows.prepare_split + its window table) changes nothing of the split itself:
  every entity array, the window features and the statistics (and their log line) are the same bytes as without
  relations; the relations are in the table alone."""
  from gp_jax.tasks.relations import table

  records = sources.synthetic_records(400, seed=0)
  rng = np.random.default_rng(0)
  with_rel = [dict(r, relations=[{"head": int(i), "tail": int(rng.integers(len(r["entities"]))),
                                  "type": str(rng.choice(["near", "in"]))} for i in range(len(r["entities"]))])
              for r in records]
  tok = CharTok()
  for kw in (dict(max_len=12, stride=4, max_span_width=6), dict(max_len=12, truncate=True)):
    plain = windows.prepare_split(records, tok, types=sources.SYNTHETIC_TYPES, **kw)
    ignored = windows.prepare_split(with_rel, tok, types=sources.SYNTHETIC_TYPES, **kw)
    rel = table.prepare(with_rel, tok, sources.SYNTHETIC_TYPES, ("in", "near"), **kw)
    stats = rel.table.stats
    assert stats["relations"] == sum(len(r["entities"]) for r in records) > stats["relation_targets"] > 0
    assert plain.table is None and ignored.table is None and rel.texts == tuple(r["text"] for r in records)
    assert rel.all_stats() == dict(dataclasses.asdict(rel.stats), **stats)
    for other in (ignored, rel):
      for f in dataclasses.fields(plain):
        a, b = getattr(plain, f.name), getattr(other, f.name)
        if f.name == "table":
          continue
        if f.name == "stats":
          assert repr(a) == repr(b) and a == b  # the entity log line
          assert len(dataclasses.asdict(a)) == 13
        elif isinstance(a, np.ndarray):
          assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f.name
        elif f.name == "window_features":
          assert all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a) and a.keys() == b.keys()
        else:
          assert a == b, f.name
