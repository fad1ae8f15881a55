"""The training feed's plan (groups of k same-bucket steps, aligned to the absolute step) and its prefetch thread."""

import jax
import numpy as np
import pytest

from gp_jax import feed
from gp_jax import sharding as shd
from gp_jax.data import batching, windows
from tests.data.fakes import CharTok, TYPES, random_records


@pytest.fixture(scope="module")
def tiny_prepared():
  return windows.prepare_split(random_records(5, n=60, max_chars=30), CharTok(), types=TYPES, max_len=16, stride=8)


def _groups(lengths, *, start=0, k=4, every=(), total=None):
  lengths = np.asarray(lengths)
  return feed.plan(lengths, start=start, k=k, every=every, total=total or start + len(lengths))


def test_plan_covers_every_step_once_in_order():
  lengths = [32, 32, 32, 32, 64, 64, 32, 32, 32, 32, 32, 64]
  groups = _groups(lengths)
  steps = [s for g in groups for s in range(g.first, g.end)]
  assert steps == list(range(12))
  for g in groups:
    assert {lengths[s] for s in range(g.first, g.end)} == {g.length}


def test_groups_are_k_or_one_and_aligned_to_multiples_of_k():
  lengths = [32] * 3 + [64] * 9 + [32] * 6
  groups = _groups(lengths, k=4)
  assert all(g.size in (1, 4) for g in groups)
  assert all(g.first % 4 == 0 for g in groups if g.size == 4)
  # 0-2: one bucket, then 64 from 3: steps 3 alone (next multiple of 4 is 4), 4-7 and 8-11 full, 12-15 and 16-17
  assert [(g.first, g.size) for g in groups if g.size == 4] == [(4, 4), (8, 4), (12, 4)]


def test_groups_end_at_evaluation_checkpoint_and_epoch_steps():
  groups = _groups([16] * 24, k=8, every=(6, 10))
  ends = {g.end for g in groups}
  assert {6, 10, 12, 18, 20, 24} <= ends | {24}
  assert all(not (g.first < b < g.end) for g in groups for b in (6, 10, 12, 18, 20))


def test_a_resumed_plan_groups_as_the_unresumed_one():
  rng = np.random.default_rng(0)
  lengths = np.repeat(rng.choice([16, 32, 64], size=30), rng.integers(1, 9, size=30))
  full = _groups(lengths, k=4, every=(7,))
  for start in (5, 8, 13, 21):
    resumed = feed.plan(lengths[start:], start=start, k=4, every=(7,), total=len(lengths))
    if start in {g.first for g in full}:  # a checkpoint lies between groups
      assert resumed == [g for g in full if g.first >= start]


def test_steps_per_execution_auto_and_bad_values():
  assert feed.steps_per_execution(4, "cpu") == 4
  assert feed.steps_per_execution(0, "tpu") == feed.AUTO_STEPS["tpu"]
  with pytest.raises(ValueError, match="steps_per_execution must be >= 0"):
    feed.steps_per_execution(-1, "cpu")


def test_feed_builds_the_planned_batches_without_moving_the_iterator(tiny_prepared):
  it = batching.train_batches(tiny_prepared, batch_size=4, buckets=(8, 16), seed=3, bucket_run=2)
  ref = batching.train_batches(tiny_prepared, batch_size=4, buckets=(8, 16), seed=3, bucket_run=2)
  n = 3 * it.steps_per_epoch
  groups = feed.plan(it.upcoming_lengths(n), start=0, k=2, every=(it.steps_per_epoch,), total=n)
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  fed = feed.Feed(it, groups, mesh, depth=2)
  try:
    got = list(fed)
  finally:
    fed.close()
  assert it.get_state()["index"] == 0 and it.get_state()["epoch"] == 0
  assert [f.group for f in got] == groups
  for f in got:
    want = [next(ref) for _ in range(f.group.size)]
    ids = np.asarray(f.batch["input_ids"])
    ids = ids[None] if f.group.size == 1 else ids
    for i, w in enumerate(want):
      np.testing.assert_array_equal(ids[i], w["features"]["input_ids"])
    assert f.tokens == sum(int(w["attention_mask"].sum()) for w in want)


def test_feed_reraises_an_error_of_its_thread(tiny_prepared):
  it = batching.train_batches(tiny_prepared, batch_size=4, buckets=(8, 16), seed=0)
  wrong = [feed.Group(0, 1, 12345)]
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  fed = feed.Feed(it, wrong, mesh)
  with pytest.raises(RuntimeError, match="got buckets"):
    list(fed)
  fed.close()
