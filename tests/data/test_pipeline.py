"""Tests for gp_jax.data.pipeline: windows, alignment counts, batches, resume, multi-host, merge."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gp_jax.data import pipeline
from gp_jax.data.types import Encoding, Tokenizer

TYPES = ("PER", "LOC", "ORG")


class CharTok:
  """One token per non-space char (spaces leave gaps in offsets); optional [CLS]/[SEP]."""

  feature_names = ("input_ids", "aux_ids")
  pad_values = {"input_ids": 0, "aux_ids": 7}

  def __init__(self, specials: bool = True):
    self.specials = specials
    self.num_prefix = self.num_suffix = int(specials)

  def encode(self, text: str) -> Encoding:
    idx = [i for i, c in enumerate(text) if not c.isspace()]
    ids = np.array([ord(text[i]) for i in idx], np.int32)
    offsets = np.array([[i, i + 1] for i in idx], np.int32).reshape(-1, 2)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, offsets)

  def add_special_tokens(self, features):
    if not self.specials:
      return dict(features)
    return {"input_ids": np.concatenate([[1], features["input_ids"], [2]]).astype(np.int32),
            "aux_ids": np.concatenate([[20], features["aux_ids"], [21]]).astype(np.int32)}

  def save(self, directory: str) -> None:
    pass


class WordTok(CharTok):
  """Whitespace words, [CLS]/[SEP]."""

  def encode(self, text: str) -> Encoding:
    offs, i = [], 0
    for word in text.split():
      i = text.index(word, i)
      offs.append((i, i + len(word)))
      i += len(word)
    ids = np.array([hash(text[a:b]) % 1000 + 30 for a, b in offs], np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 3}, np.array(offs, np.int32).reshape(-1, 2))


def ref_windows(n: int, W: int, S: int) -> list[int]:
  """Reference window starts, written independently of the vectorised version."""
  if n == 0:
    return []
  if n <= W:
    return [0]
  starts = list(range(0, n - W, S))
  return starts + [n - W]


def random_records(seed: int, n: int = 40, max_chars: int = 50) -> list[dict]:
  rng = np.random.default_rng(seed)
  out = []
  for r in range(n):
    length = int(rng.integers(0, max_chars))
    text = "".join(rng.choice(list("abcdefg h"), size=length))
    ents = []
    for _ in range(int(rng.integers(0, 6))):
      if length == 0:
        break
      a = int(rng.integers(0, length))
      b = int(rng.integers(a + 1, min(length, a + 8) + 1))
      ents.append({"start": a, "end": b, "type": TYPES[int(rng.integers(0, 3))]})
    out.append({"id": f"r{r}", "text": text, "entities": ents})
  return out


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
  p = pipeline.prepare_split(records, tok, types=TYPES, max_len=max_len, stride=stride)
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
  merged = pipeline.merge_predictions(p, hits)
  assert len(merged) == len(records)
  assert pipeline.prediction_spans(merged) == want
  st_ = p.stats
  assert st_.misaligned == misaligned
  assert st_.entities == sum(len(r["entities"]) for r in records)
  assert st_.targets == len(want) and st_.lost_to_truncation == len(aligned) - len(want)
  assert st_.targets + st_.duplicates + st_.lost_to_truncation == aligned_occ
  assert st_.entities == st_.targets + st_.misaligned + st_.too_long + st_.duplicates + st_.lost_to_truncation
  assert pipeline.gold_spans(p) == {(r, e["start"], e["end"], e["type"])
                                    for r, rec in enumerate(records) for e in rec["entities"]}
  # Window tokens: features carry the specials, positions are document positions.
  for w in range(p.num_windows):
    r, ws, n_c = int(p.window_record[w]), int(p.window_start[w]), int(p.window_content_len[w])
    enc = tok.encode(records[r]["text"])
    content = {k: v[ws:ws + n_c] for k, v in enc.features.items()}
    full = tok.add_special_tokens(content)
    for k, v in p.window_token_features(w).items():
      np.testing.assert_array_equal(v, full[k])
    np.testing.assert_array_equal(p.window_positions(w)[P:P + n_c], np.arange(ws, ws + n_c) + P)


def test_every_entity_is_in_a_window_or_counted():
  records = random_records(0, n=80, max_chars=80)
  p = pipeline.prepare_split(records, CharTok(), types=TYPES, max_len=8, stride=4, max_span_width=6)
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
    if status in (pipeline.OK, pipeline.DUPLICATE):
      assert key in in_window
    else:
      assert key not in in_window
  s = p.stats
  assert (counts[pipeline.OK], counts[pipeline.MISALIGNED], counts[pipeline.TOO_LONG],
          counts[pipeline.DUPLICATE], counts[pipeline.LOST]) == (
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
  p = pipeline.prepare_split([rec], WordTok(), types=TYPES, max_len=10)
  assert p.stats.misaligned == 2 and p.stats.targets == 2
  assert sorted(p.window_spans(0).tolist()) == [[1, 2, 1], [4, 4, 2]]
  assert p.record_offsets(0).tolist() == [[0, 3], [4, 8], [9, 11], [12, 15]]


class ZeroWidthTok(CharTok):
  """CharTok plus a zero-width (b, b) token after every "c" at [a, b) (skipped by alignment)."""

  def encode(self, text: str) -> Encoding:
    enc = super().encode(text)
    ids, offs = [], []
    for i, (a, b) in zip(enc.features["input_ids"].tolist(), enc.offsets.tolist()):
      ids.append(i)
      offs.append((a, b))
      if text[a] == "c":
        ids.append(99)
        offs.append((b, b))
    ids = np.array(ids, np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, np.array(offs, np.int32).reshape(-1, 2))


class EchoTok(ZeroWidthTok):
  """ZeroWidthTok plus, after every "a", a copy of the previous token: offsets are not monotone."""

  def encode(self, text: str) -> Encoding:
    enc = super().encode(text)
    ids, offs = [], []
    for i, (a, b) in zip(enc.features["input_ids"].tolist(), enc.offsets.tolist()):
      prev = offs[-1] if offs else None
      ids.append(i)
      offs.append((a, b))
      if a < b and text[a] == "a" and prev is not None:
        ids.append(98)
        offs.append(prev)
    ids = np.array(ids, np.int32)
    return Encoding({"input_ids": ids, "aux_ids": ids % 5 + 10}, np.array(offs, np.int32).reshape(-1, 2))


@pytest.mark.parametrize("odd_tok", [ZeroWidthTok, EchoTok])
def test_alignment_with_zero_width_and_non_monotone_offsets(odd_tok):
  records = random_records(5, n=30)
  for r in records:
    r["text"] = r["text"].replace("d", "c")
  a = pipeline.prepare_split(records, CharTok(), types=TYPES, max_len=400)
  b = pipeline.prepare_split(records, odd_tok(), types=TYPES, max_len=400)
  assert b.stats.tokens > a.stats.tokens
  np.testing.assert_array_equal(a.entity_status, b.entity_status)
  merged = []
  for p in (a, b):
    hits = [(w, s, e, t, 1.0) for w in range(p.num_windows) for s, e, t in p.window_spans(w).tolist()]
    merged.append(pipeline.prediction_spans(pipeline.merge_predictions(p, hits)))
  assert merged[0] == merged[1] and len(merged[0]) == a.stats.targets


@pytest.mark.parametrize("tok", [CharTok(), WordTok(), ZeroWidthTok(), EchoTok()])
def test_alignment_agrees_with_tokenize_module(tok):
  tokenize = pytest.importorskip("gp_jax.data.tokenize")
  records = random_records(6, n=40)
  p = pipeline.prepare_split(records, tok, types=TYPES, max_len=400)
  type_to_id = {t: i for i, t in enumerate(TYPES)}
  for r, rec in enumerate(records):
    spans, misaligned = tokenize.char_to_token_spans(tok.encode(rec["text"]).offsets, rec["entities"],
                                                     type_to_id=type_to_id)
    mine = p.entity_record == r
    got = [(s, e, t) for (s, e), t in zip(p.entity_token_E2[mine].tolist(), p.entity_type[mine].tolist())
           if s >= 0]
    assert got == spans
    assert int((p.entity_status[mine] == pipeline.MISALIGNED).sum()) == len(misaligned)


def test_char_tokenizer_encode_batch_path(monkeypatch):
  ct = pytest.importorskip("gp_jax.data.char_tokenizer")
  monkeypatch.setattr(pipeline, "_ENCODE_CHUNK", 7)  # several encode_batch calls
  records = random_records(7, n=50)
  tok = ct.CharTokenizer.build([r["text"] for r in records])
  p = pipeline.prepare_split(records, tok, types=TYPES, max_len=16, stride=5)
  for w in (0, p.num_windows // 2, p.num_windows - 1):
    r, ws, n = int(p.window_record[w]), int(p.window_start[w]), int(p.window_content_len[w])
    enc = tok.encode(records[r]["text"])
    for k, v in p.window_token_features(w).items():
      np.testing.assert_array_equal(v, enc.features[k][ws:ws + n])
  ref = pipeline.prepare_split(records, CharTok(False), types=TYPES, max_len=16, stride=5)
  np.testing.assert_array_equal(p.spans_S3, ref.spans_S3)
  assert p.stats == ref.stats


def test_empty_records_and_errors():
  recs = [{"id": "e", "text": "   ", "entities": [{"start": 0, "end": 1, "type": "PER"}]},
          {"id": "f", "text": "ab", "entities": []}]
  p = pipeline.prepare_split(recs, CharTok(), types=TYPES, max_len=8)
  assert p.stats.empty_records == 1 and p.num_windows == 1 and p.stats.misaligned == 1
  assert pipeline.merge_predictions(p, []) == [[], []]
  bad = [{"id": "doc-7", "text": "abc", "entities": [{"start": 0, "end": 1, "type": "GPE"}]}]
  with pytest.raises(ValueError, match=r"doc-7.*GPE"):
    pipeline.prepare_split(bad, CharTok(), types=TYPES, max_len=8)
  with pytest.raises(ValueError, match="stride"):
    pipeline.prepare_split(recs, CharTok(), types=TYPES, max_len=8, stride=7)
  with pytest.raises(ValueError, match="buckets"):
    pipeline.train_batches(p, batch_size=2, buckets=(16,), seed=0)
  with pytest.raises(ValueError, match="process_count"):
    pipeline.train_batches(p, batch_size=3, buckets=None, seed=0, process_count=2)


def test_stats_are_logged(caplog):
  with caplog.at_level(logging.INFO):
    pipeline.prepare_split(random_records(1, n=3), CharTok(), types=TYPES, max_len=16, name="devsplit")
  assert any("devsplit" in r.getMessage() and "misaligned" in r.getMessage() for r in caplog.records)


def test_merge_dedupes_overlapping_windows_keeping_max_score():
  rec = {"id": "a", "text": "abcdefghij", "entities": [{"start": 4, "end": 6, "type": "PER"}]}
  p = pipeline.prepare_split([rec], CharTok(), types=TYPES, max_len=8, stride=2)  # W = 6
  holders = [w for w in range(p.num_windows) if len(p.window_spans(w))]
  assert len(holders) >= 2
  hits = [(w, *p.window_spans(w)[0][:2].tolist(), 0, 0.5 + w) for w in holders]
  merged = pipeline.merge_predictions(p, hits)
  assert merged == [[{"start": 4, "end": 6, "type": "PER", "score": 0.5 + max(holders)}]]
  # Hits on specials or padding are dropped, not mapped.
  assert pipeline.merge_predictions(p, [(0, 0, 1, 0, 1.0), (0, 3, 7, 0, 1.0)]) == [[]]


def test_batch_hits_maps_rows_to_windows():
  window_index_B = np.array([5, -1, 2])
  coords = np.array([[0, 1, 2, 3], [1, 0, 1, 1], [2, 2, 4, 4], [-1, -1, -1, -1]])
  h = pipeline.batch_hits(window_index_B, coords, np.array([1.0, 2.0, 3.0, 0.0]))
  assert h["window"].tolist() == [5, 2] and h["type"].tolist() == [1, 2]
  assert h["start"].tolist() == [2, 4] and h["end"].tolist() == [3, 4] and h["score"].tolist() == [1.0, 3.0]


# ----------------------------------------------------------------------------- batches


@pytest.fixture(scope="module")
def prepared():
  return pipeline.prepare_split(random_records(3, n=150, max_chars=70), CharTok(), types=TYPES,
                                max_len=32, stride=10)


BUCKETS = (8, 16, 24)


def decode_batch(batch, p):
  """Checks one batch row by row against the prepared windows; returns the window indices."""
  B, L = batch["attention_mask"].shape
  assert batch["span_ids"].shape == (B, len(TYPES), L)
  for k in p.feature_names:
    assert batch["features"][k].shape == (B, L) and batch["features"][k].dtype == np.int32
  for key in ("attention_mask", "span_mask", "positions", "span_ids", "example_index", "window_start",
              "window_index"):
    assert batch[key].dtype == np.int32, key
  real = batch["window_index"][batch["window_index"] >= 0]
  assert L == min(b for b in (*BUCKETS, 32) if b >= p.window_len[real].max())
  for row in range(B):
    w = int(batch["window_index"][row])
    if w < 0:  # filler
      assert batch["example_index"][row] == -1
      assert not batch["attention_mask"][row].any() and not batch["span_mask"][row].any()
      assert (batch["span_ids"][row] == -1).all()
      for k in p.feature_names:
        assert (batch["features"][k][row] == p.pad_values[k]).all()
      continue
    n, n_c = int(p.window_len[w]), int(p.window_content_len[w])
    assert batch["example_index"][row] == p.window_record[w]
    assert batch["window_start"][row] == p.window_start[w]
    for k, v in p.window_token_features(w).items():
      np.testing.assert_array_equal(batch["features"][k][row, :n], v)
      assert (batch["features"][k][row, n:] == p.pad_values[k]).all()
    assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (L - n)
    assert batch["span_mask"][row].tolist() == [0] + [1] * n_c + [0] * (L - n_c - 1)
    np.testing.assert_array_equal(batch["positions"][row, :n], p.window_positions(w))
    ids = batch["span_ids"][row]
    got = {(int(x) // L, int(x) % L, h) for h in range(len(TYPES)) for x in ids[h] if x >= 0}
    assert got == {tuple(s) for s in p.window_spans(w).tolist()}
    assert (ids >= 0).sum() == len(p.window_spans(w))
  return real.tolist()


def test_train_batches_shapes_buckets_and_epoch_coverage(prepared):
  it = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=0)
  assert it.steps_per_epoch == -(-prepared.num_windows // 8)
  seen, lengths = [], set()
  for _ in range(it.steps_per_epoch):
    assert it.epoch == 0
    batch = next(it)
    seen += decode_batch(batch, prepared)
    lengths.add(batch["attention_mask"].shape[1])
  assert sorted(seen) == list(range(prepared.num_windows))  # one epoch = every window once
  assert len(lengths) > 1  # bucketing actually varies L
  assert it.epoch == 1


def test_batches_are_length_homogeneous(prepared):
  it = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=0)
  spread = []
  for _ in range(it.steps_per_epoch):
    w = next(it)["window_index"]
    lens = prepared.window_len[w[w >= 0]]
    spread.append(lens.max() - lens.min())
  rng = np.random.default_rng(0)
  rand = [np.ptp(prepared.window_len[rng.permutation(prepared.num_windows)[:8]]) for _ in range(50)]
  assert np.mean(spread) < 0.5 * np.mean(rand)


def _take(it, n):
  return [next(it) for _ in range(n)]


def _same(a, b):
  for x, y in zip(a, b, strict=True):
    assert x.keys() == y.keys()
    for k in x:
      if k == "features":
        for f in x[k]:
          np.testing.assert_array_equal(x[k][f], y[k][f])
      else:
        np.testing.assert_array_equal(x[k], y[k])


def test_determinism_and_seed(prepared):
  a = _take(pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1), 5)
  b = _take(pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1), 5)
  c = _take(pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=2), 5)
  _same(a, b)
  assert any(not np.array_equal(x["window_index"], y["window_index"]) for x, y in zip(a, c))
  it = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1)
  e0 = it.epoch_batches(0).copy()
  assert not np.array_equal(e0, it.epoch_batches(1))  # epochs differ


@pytest.mark.parametrize("skip", [3, "end-1", "end", "end+2"])
def test_resume_matches_uninterrupted(prepared, skip):
  ref = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=4)
  spe = ref.steps_per_epoch
  k = skip if isinstance(skip, int) else spe + int(skip[3:] or 0)
  _take(ref, k)
  state = json.loads(json.dumps(ref.get_state()))
  assert state["epoch"] == k // spe and state["index"] == k % spe and state["seed"] == 4
  resumed = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=999)
  resumed.set_state(state)
  assert resumed.epoch == ref.epoch
  _same(_take(ref, spe + 2), _take(resumed, spe + 2))  # crosses an epoch boundary


def test_multi_host_rows_concatenate_to_global_batch(prepared):
  glob = pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=5)
  hosts = [pipeline.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=5, process_index=i,
                                  process_count=2) for i in range(2)]
  for _ in range(glob.steps_per_epoch + 1):
    g, h0, h1 = next(glob), next(hosts[0]), next(hosts[1])
    assert h0["attention_mask"].shape[0] == 4
    for k in g:
      if k == "features":
        for f in g[k]:
          np.testing.assert_array_equal(np.concatenate([h0[k][f], h1[k][f]]), g[k][f])
      else:
        np.testing.assert_array_equal(np.concatenate([h0[k], h1[k]]), g[k])
  ev = [list(pipeline.eval_batches(prepared, batch_size=8, buckets=BUCKETS, process_index=i, process_count=2))
        for i in range(2)]
  ev_g = list(pipeline.eval_batches(prepared, batch_size=8, buckets=BUCKETS))
  for g, h0, h1 in zip(ev_g, *ev, strict=True):
    np.testing.assert_array_equal(np.concatenate([h0["span_ids"], h1["span_ids"]]), g["span_ids"])


def test_eval_batches_cover_every_window_once(prepared):
  ev = pipeline.eval_batches(prepared, batch_size=16, buckets=BUCKETS)
  seen = []
  for batch in ev:
    seen += decode_batch(batch, prepared)
  assert len(ev) == -(-prepared.num_windows // 16)
  assert sorted(seen) == list(range(prepared.num_windows)) and len(seen) == len(set(seen))
  assert [b["window_index"].tolist() for b in ev] == [b["window_index"].tolist() for b in ev]  # re-iterable


def test_gold_through_batches_round_trips_to_gold_spans(prepared):
  """span_ids of eval batches, decoded and merged, give back every target entity."""
  hits = []
  for batch in pipeline.eval_batches(prepared, batch_size=16, buckets=BUCKETS):
    L = batch["attention_mask"].shape[1]
    b, h, k = np.nonzero(batch["span_ids"] >= 0)
    ids = batch["span_ids"][b, h, k]
    coords = np.stack([b, h, ids // L, ids % L], 1)
    hits.append(pipeline.batch_hits(batch["window_index"], coords, np.ones(len(b))))
  pred = pipeline.prediction_spans(pipeline.merge_predictions(prepared, pipeline.concat_hits(hits)))
  ok = prepared.entity_status == pipeline.OK
  want = {(int(r), int(a), int(e), TYPES[t]) for r, (a, e), t in
          zip(prepared.entity_record[ok], prepared.entity_char_E2[ok], prepared.entity_type[ok])}
  assert pred == want
  assert pred <= pipeline.gold_spans(prepared)


def test_span_overflow_is_counted_and_logged(caplog):
  text = "abcdefgh"
  ents = [{"start": a, "end": b, "type": "PER"} for a in range(8) for b in range(a + 1, 9)]  # 36 spans
  p = pipeline.prepare_split([{"id": "n", "text": text, "entities": ents}], CharTok(False), types=TYPES,
                             max_len=8)
  assert p.stats.max_spans_per_type == 36
  it = pipeline.train_batches(p, batch_size=1, buckets=None, seed=0)
  with caplog.at_level(logging.WARNING):
    batch = next(it)
  assert it.span_overflow == 36 - 8 and (batch["span_ids"] >= 0).sum() == 8
  assert any("28 gold spans dropped" in r.getMessage() for r in caplog.records)
