"""Tests for gp_jax.data.batching: shapes, buckets, epoch coverage, determinism, resume, multi-host."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from gp_jax.data import batching, merge, windows
from tests.data.fakes import TYPES, CharTok, random_records, window_positions, window_token_features


@pytest.fixture(scope="module")
def prepared():
  return windows.prepare_split(random_records(3, n=150, max_chars=70), CharTok(), types=TYPES,
                                max_len=32, stride=10)


BUCKETS = (8, 16, 24)


def decode_batch(batch, p, *, targets=True):
  """Checks one batch row by row against the prepared windows (a training batch's span_ids too; an eval batch has
  none); returns the window indices."""
  B, L = batch["attention_mask"].shape
  if targets:
    assert batch["span_ids"].shape == (B, len(TYPES), L)
  else:
    assert "span_ids" not in batch
  for k in p.feature_names:
    assert batch["features"][k].shape == (B, L) and batch["features"][k].dtype == np.int32
  for key in ("attention_mask", "span_mask", "positions", *(("span_ids",) if targets else ()), "example_index",
              "window_start", "window_index"):
    assert batch[key].dtype == np.int32, key
  real = batch["window_index"][batch["window_index"] >= 0]
  assert L == min(b for b in (*BUCKETS, 32) if b >= p.window_len[real].max())
  for row in range(B):
    w = int(batch["window_index"][row])
    if w < 0:  # filler
      assert batch["example_index"][row] == -1
      assert not batch["attention_mask"][row].any() and not batch["span_mask"][row].any()
      assert not targets or (batch["span_ids"][row] == -1).all()
      for k in p.feature_names:
        assert (batch["features"][k][row] == p.pad_values[k]).all()
      continue
    n, n_c = int(p.window_len[w]), int(p.window_content_len[w])
    assert batch["example_index"][row] == p.window_record[w]
    assert batch["window_start"][row] == p.window_start[w]
    for k, v in window_token_features(p, w).items():
      np.testing.assert_array_equal(batch["features"][k][row, :n], v)
      assert (batch["features"][k][row, n:] == p.pad_values[k]).all()
    assert batch["attention_mask"][row].tolist() == [1] * n + [0] * (L - n)
    assert batch["span_mask"][row].tolist() == [0] + [1] * n_c + [0] * (L - n_c - 1)
    np.testing.assert_array_equal(batch["positions"][row, :n], window_positions(p, w))
    if not targets:
      continue
    ids = batch["span_ids"][row]
    got = {(int(x) // L, int(x) % L, h) for h in range(len(TYPES)) for x in ids[h] if x >= 0}
    assert got == {tuple(s) for s in p.window_spans(w).tolist()}
    assert (ids >= 0).sum() == len(p.window_spans(w))
  return real.tolist()


def test_train_batches_shapes_buckets_and_epoch_coverage(prepared):
  it = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=0)
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
  it = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=0)
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
  a = _take(batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1), 5)
  b = _take(batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1), 5)
  c = _take(batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=2), 5)
  _same(a, b)
  assert any(not np.array_equal(x["window_index"], y["window_index"]) for x, y in zip(a, c))
  it = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=1)
  e0 = it.epoch_batches(0).copy()
  assert not np.array_equal(e0, it.epoch_batches(1))  # epochs differ


@pytest.mark.parametrize("skip", [3, "end-1", "end", "end+2"])
def test_resume_matches_uninterrupted(prepared, skip):
  ref = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=4)
  spe = ref.steps_per_epoch
  k = skip if isinstance(skip, int) else spe + int(skip[3:] or 0)
  _take(ref, k)
  state = json.loads(json.dumps(ref.get_state()))
  assert state["epoch"] == k // spe and state["index"] == k % spe and state["seed"] == 4
  resumed = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=999)
  resumed.set_state(state)
  assert resumed.epoch == ref.epoch
  _same(_take(ref, spe + 2), _take(resumed, spe + 2))  # crosses an epoch boundary


def test_multi_host_rows_concatenate_to_global_batch(prepared):
  glob = batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=5)
  hosts = [batching.train_batches(prepared, batch_size=8, buckets=BUCKETS, seed=5, process_index=i,
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
  ev = [list(batching.eval_batches(prepared, batch_size=8, buckets=BUCKETS, process_index=i, process_count=2))
        for i in range(2)]
  ev_g = list(batching.eval_batches(prepared, batch_size=8, buckets=BUCKETS))
  for g, h0, h1 in zip(ev_g, *ev, strict=True):
    for k in ("window_index", "attention_mask", "positions"):
      np.testing.assert_array_equal(np.concatenate([h0[k], h1[k]]), g[k])
    assert "span_ids" not in g  # eval batches carry no targets


def test_eval_batches_cover_every_window_once(prepared):
  ev = batching.eval_batches(prepared, batch_size=16, buckets=BUCKETS)
  seen = []
  for batch in ev:
    seen += decode_batch(batch, prepared, targets=False)
  assert len(ev) == -(-prepared.num_windows // 16)
  assert sorted(seen) == list(range(prepared.num_windows)) and len(seen) == len(set(seen))
  assert [b["window_index"].tolist() for b in ev] == [b["window_index"].tolist() for b in ev]  # re-iterable


def test_gold_through_batches_round_trips_to_gold_spans(prepared):
  """span_ids of training batches over every window, decoded and merged, give back every target entity."""
  hits = []
  assemble = batching._Assembler(prepared, BUCKETS, 16, 0, 1, targets=batching.span_targets)
  for win_B in batching._to_batches(np.arange(prepared.num_windows), 16):
    batch = assemble(win_B)
    L = batch["attention_mask"].shape[1]
    b, h, k = np.nonzero(batch["span_ids"] >= 0)
    ids = batch["span_ids"][b, h, k]
    coords = np.stack([b, h, ids // L, ids % L], 1)
    hits.append(merge.batch_hits(batch["window_index"], coords, np.ones(len(b))))
  pred = merge.prediction_spans(merge.merge_predictions(prepared, merge.concat_hits(hits)))
  ok = prepared.entity_status == windows.OK
  want = {(int(r), int(a), int(e), TYPES[t]) for r, (a, e), t in
          zip(prepared.entity_record[ok], prepared.entity_char_E2[ok], prepared.entity_type[ok])}
  assert pred == want
  assert pred <= merge.gold_spans(prepared)


def test_span_overflow_is_counted_and_logged(caplog):
  text = "abcdefgh"
  ents = [{"start": a, "end": b, "type": "PER"} for a in range(8) for b in range(a + 1, 9)]  # 36 spans
  p = windows.prepare_split([{"id": "n", "text": text, "entities": ents}], CharTok(False), types=TYPES,
                             max_len=8)
  assert p.stats.max_spans_per_type == 36
  it = batching.train_batches(p, batch_size=1, buckets=None, seed=0)
  with caplog.at_level(logging.WARNING):
    batch = next(it)
  assert it.span_overflow == 36 - 8 and (batch["span_ids"] >= 0).sum() == 8
  assert any("28 gold spans dropped" in r.getMessage() for r in caplog.records)


def _interleaved_order(p, batch_size, seed, epoch, chunk_batches=100):
  """The interleaved order written out from its description (BatchIterator docstring), independently."""
  rng = np.random.default_rng([seed, epoch])
  perm = rng.permutation(p.num_windows)
  win = []
  for a in range(0, len(perm), chunk_batches * batch_size):
    chunk = perm[a:a + chunk_batches * batch_size]
    win += sorted(chunk.tolist(), key=lambda w: p.window_len[w])  # Python's sort is stable
  win += [-1] * (-len(win) % batch_size)
  batches = [win[i:i + batch_size] for i in range(0, len(win), batch_size)]
  return np.asarray([batches[i] for i in rng.permutation(len(batches))], np.int64)


@pytest.mark.parametrize("chunk_batches", [100, 3])
def test_bucket_run_off_is_the_interleaved_order(prepared, chunk_batches):
  for seed, epoch in ((0, 0), (3, 2)):
    it = batching.BatchIterator(prepared, batch_size=8, buckets=BUCKETS, seed=seed, chunk_batches=chunk_batches)
    np.testing.assert_array_equal(it.epoch_batches(epoch), _interleaved_order(prepared, 8, seed, epoch, chunk_batches))


@pytest.fixture(scope="module")
def varied():
  """Unsplit records of many lengths, so several buckets hold several batches each."""
  return windows.prepare_split(random_records(3, n=150, max_chars=70), CharTok(), types=TYPES, max_len=80)


RUN_BUCKETS, RUN = (16, 32, 48, 64), 3


def _runs(bucket_S):
  """[(bucket, length)] of maximal same-bucket stretches."""
  out = []
  for b in bucket_S.tolist():
    if out and out[-1][0] == b:
      out[-1][1] += 1
    else:
      out.append([b, 1])
  return [tuple(r) for r in out]


def test_bucket_run_groups_each_bucket_into_runs(varied):
  it = batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=0, bucket_run=RUN)
  ref = batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=0)
  for epoch in range(3):
    win_SB = it.epoch_batches(epoch)
    assert win_SB.shape == (it.steps_per_epoch, 4)
    real = win_SB[win_SB >= 0]
    assert sorted(real.tolist()) == list(range(varied.num_windows))  # every window exactly once
    assert ((win_SB >= 0).sum(1) < 4).sum() <= 1  # at most one batch holds filler
    # The interleaved order's batches: each bucket's, in that order, cut into runs of RUN that stay contiguous.
    bucket_S, ref_SB = it._assemble.buckets_of(win_SB), ref.epoch_batches(epoch)
    ref_S = ref._assemble.buckets_of(ref_SB)
    first = {int(row[0]): s for s, row in enumerate(win_SB)}
    for b in set(ref_S.tolist()):
      mine = ref_SB[ref_S == b]
      for a in range(0, len(mine), RUN):
        run = mine[a:a + RUN]
        s = first[int(run[0, 0])]
        np.testing.assert_array_equal(win_SB[s:s + len(run)], run)
    assert sorted(map(tuple, win_SB.tolist())) == sorted(map(tuple, ref_SB.tolist()))
    # Split maximal stretches into runs of RUN: each bucket's runs are RUN long except at most one.
    counts = {b: int((bucket_S == b).sum()) for b in set(bucket_S.tolist())}
    assert max(counts.values()) > RUN and sum(c > 1 for c in counts.values()) >= 3  # the fixture exercises runs
    stretches = _runs(bucket_S)
    assert len(stretches) < len(_runs(ref_S))
    for b, c in counts.items():
      lengths = [n for bb, n in stretches if bb == b]
      assert sum(lengths) == c
      assert sum(n % RUN for n in lengths) == c % RUN  # a stretch is whole runs plus at most the one short run
      assert len(lengths) <= -(-c // RUN)


def test_bucket_run_order_is_reproducible_and_varies(varied):
  make = lambda seed: batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=seed,  # noqa: E731
                                             bucket_run=RUN)
  a, b, c = make(1), make(1), make(2)
  np.testing.assert_array_equal(a.epoch_batches(0), b.epoch_batches(0))
  np.testing.assert_array_equal(a.epoch_batches(4), b.epoch_batches(4))
  assert not np.array_equal(a.epoch_batches(0), a.epoch_batches(1))
  assert not np.array_equal(a.epoch_batches(0), c.epoch_batches(0))
  _same(_take(make(1), 5), _take(make(1), 5))
  with pytest.raises(ValueError, match="bucket_run"):
    batching.BatchIterator(varied, batch_size=4, buckets=RUN_BUCKETS, seed=0, bucket_run=-1)


@pytest.mark.parametrize("skip", [1, 4, "end-1", "end+2"])
def test_bucket_run_resume_mid_run(varied, skip):
  make = lambda seed: batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=seed,  # noqa: E731
                                             bucket_run=RUN)
  ref = make(6)
  spe = ref.steps_per_epoch
  k = skip if isinstance(skip, int) else spe + int(skip[3:])
  _take(ref, k)
  resumed = make(999)
  resumed.set_state(json.loads(json.dumps(ref.get_state())))
  _same(_take(ref, spe + 2), _take(resumed, spe + 2))


@pytest.mark.parametrize("bucket_run", [0, RUN])
def test_lengths_ahead_matches_the_batches_produced(varied, bucket_run):
  it = batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=2, bucket_run=bucket_run)
  spe = it.steps_per_epoch
  _take(it, spe - 5)
  for steps in (1, 2, 4, 7, spe + 3):
    ahead = it.lengths_ahead(steps)
    probe = batching.train_batches(varied, batch_size=4, buckets=RUN_BUCKETS, seed=0, bucket_run=bucket_run)
    probe.set_state(it.get_state())
    assert ahead == sorted({b["attention_mask"].shape[1] for b in _take(probe, steps)}), steps
