"""Padded numpy batches of windows: length buckets, resumable shuffled training order, eval order.

Batch fields (numpy, B rows of this process, L = bucket length, H = len(types)); coordinates as
in `gp_jax.data.windows`:
  features         dict name -> int32 [B, L]  padded with tokenizer.pad_values
  attention_mask   int32 [B, L]   1 on every real token (specials included)
  span_mask        int32 [B, L]   1 on content tokens only
  positions        int32 [B, L]   document positions (0 on padding)
  span_ids         int32 [B, H, L] flat i * L + j of gold spans (K = L), -1 padded (training batches only)
  example_index    int32 [B]      record index in the split, -1 on filler rows
  window_start     int32 [B]      content-token offset of the window in its record (0 on filler)
  window_index     int32 [B]      window index in the PreparedSplit, -1 on filler rows
Training batches carry the targets of their task's `batch_targets` (`gp_jax.tasks`), built from the span_ids above
(`span_targets`: span_ids alone; task=relations: entity_ids [B, H, L], head_ids and tail_ids [B, R, L]); eval and
predict batches carry none.

`batch_size` is global; with several processes each one builds its rows [i * B / n, (i + 1) * B / n)
of the same global batch, and all of them pick the same bucket.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gp_jax.data.tagging import spans_to_tags
from gp_jax.data.windows import PreparedSplit, _ranges


def normalize_buckets(buckets: Sequence[int] | None, max_len: int) -> tuple[int, ...]:
  """Sorted unique bucket lengths, each <= max_len, with max_len appended as the last."""
  out = sorted({int(b) for b in (buckets or ())})
  if out and (out[0] < 1 or out[-1] > max_len):
    raise ValueError(f"buckets {tuple(out)} must lie in [1, max_len={max_len}]")
  if not out or out[-1] != max_len:
    out.append(int(max_len))
  return tuple(out)


def _check_hosts(batch_size: int, process_index: int, process_count: int) -> None:
  if batch_size < 1 or process_count < 1 or batch_size % process_count:
    raise ValueError(f"global batch_size={batch_size} must be a positive multiple of process_count={process_count}")
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index={process_index} not in [0, {process_count})")


def span_targets(p: PreparedSplit, rows: np.ndarray, w: np.ndarray, span_ids_BHK: np.ndarray, L: int):
  """The span classes' targets alone: ({"span_ids": span_ids_BHK}, 0 dropped) (a task's `batch_targets`)."""
  return {"span_ids": span_ids_BHK}, 0


class _Assembler:
  """Builds the rows [lo, hi) of a global batch of window indices (-1 = filler); with `targets` (training) the
  task's target arrays too."""

  def __init__(self, prepared: PreparedSplit, buckets, batch_size, process_index, process_count,
               tag_scheme: str | None = None, targets=None):
    _check_hosts(batch_size, process_index, process_count)
    self.p = prepared
    self.tag_scheme = tag_scheme
    # targets(prepared, rows, windows, span_ids_BHK, L) -> (the batch's target arrays, targets dropped); None: eval
    self.targets = targets
    self.buckets = np.asarray(normalize_buckets(buckets, prepared.max_len), np.int64)
    self.batch_size = batch_size
    local = batch_size // process_count
    self.lo, self.hi = process_index * local, (process_index + 1) * local
    self.span_overflow = 0  # targets beyond K = L of one type in one window, over all batches

  def bucket(self, win_B: np.ndarray) -> int:
    """Smallest bucket >= longest window in the global batch (all processes agree)."""
    real = win_B[win_B >= 0]
    longest = int(self.p.window_len[real].max()) if real.size else 1
    return int(self.buckets[np.searchsorted(self.buckets, longest, side="left")])

  def buckets_of(self, win_SB: np.ndarray) -> np.ndarray:
    """int64 [S]: `bucket` of each of S global batches, vectorised."""
    if win_SB.size == 0:
      return np.zeros(win_SB.shape[0], np.int64)
    lens_SB = np.where(win_SB >= 0, self.p.window_len[np.maximum(win_SB, 0)], 1)
    return self.buckets[np.searchsorted(self.buckets, lens_SB.max(axis=1), side="left")]

  def filler(self, length: int) -> dict[str, Any]:
    """A batch of filler rows at bucket `length`: the fields, dtypes and shapes of every batch of that bucket."""
    return self(np.full(self.batch_size, -1, np.int64), length=length)

  def __call__(self, win_B: np.ndarray, *, length: int | None = None) -> dict[str, Any]:
    p = self.p
    L = length or self.bucket(win_B)
    win_B = win_B[self.lo:self.hi]
    B = win_B.shape[0]
    rows = np.nonzero(win_B >= 0)[0]
    w = win_B[rows]
    # Tokens: flat (row, col) of every real token of the rows.
    lens = p.window_len[w]
    src = _ranges(p.window_ptr[w], lens)
    row_f = np.repeat(rows, lens)
    col_f = _ranges(np.zeros_like(lens), lens)
    features = {}
    for k in p.feature_names:
      f_BL = np.full((B, L), p.pad_values[k], np.int32)
      f_BL[row_f, col_f] = p.window_features[k][src]
      features[k] = f_BL
    attention_mask_BL = np.zeros((B, L), np.int32)
    attention_mask_BL[row_f, col_f] = 1
    content_end = np.repeat(p.num_prefix + p.window_content_len[w], lens)
    span_mask_BL = np.zeros((B, L), np.int32)
    span_mask_BL[row_f, col_f] = (col_f >= p.num_prefix) & (col_f < content_end)
    positions_BL = np.zeros((B, L), np.int32)
    positions_BL[row_f, col_f] = np.repeat(p.window_start[w], lens) + col_f
    example_index_B = np.full(B, -1, np.int32)
    example_index_B[rows] = p.window_record[w]
    window_start_B = np.zeros(B, np.int32)
    window_start_B[rows] = p.window_start[w]
    extra = {}
    if self.tag_scheme is not None:
      tags_BL = np.full((B, L), -1, np.int32)
      for r, wi in zip(rows.tolist(), w.tolist()):
        tags_BL[r, :p.window_len[wi]] = window_tags(p, wi, scheme=self.tag_scheme)[0]
      extra["tags"] = tags_BL
    targets = {}
    if self.targets is not None:
      targets, over = self.targets(p, rows, w, self.span_ids(rows, w, B=B, L=L), L)
      if over:
        self.span_overflow += over
        logging.warning("%s: %d gold targets dropped: more than K=L=%d of one type in a window", p.name, over, L)
    return {
        **extra,
        "features": features,
        "attention_mask": attention_mask_BL,
        "span_mask": span_mask_BL,
        "positions": positions_BL,
        **targets,
        "example_index": example_index_B,
        "window_start": window_start_B,
        "window_index": win_B.astype(np.int32),
    }


  def span_ids(self, rows: np.ndarray, w: np.ndarray, *, B: int, L: int) -> np.ndarray:
    """int32 [B, H, L]: flat i * L + j of each row's gold spans per class (K = L), -1 padded; spans beyond K are
    dropped, counted and logged."""
    p = self.p
    H = len(p.types)
    # Spans are sorted by (window, type, start, end), rows ascend -> groups are contiguous.
    n_sp = p.span_ptr[w + 1] - p.span_ptr[w]
    sp = p.spans_S3[_ranges(p.span_ptr[w], n_sp)].astype(np.int64)
    sp_row = np.repeat(rows, n_sp)
    group = sp_row * max(H, 1) + sp[:, 2]
    rank = np.arange(group.shape[0]) - np.searchsorted(group, group, side="left")
    keep = rank < L
    span_ids_BHK = np.full((B, H, L), -1, np.int32)
    span_ids_BHK[sp_row[keep], sp[keep, 2], rank[keep]] = sp[keep, 0] * L + sp[keep, 1]
    over = int((~keep).sum())
    if over:
      self.span_overflow += over
      logging.warning("%s: %d gold spans dropped: more than K=L=%d of one type in a window", p.name, over, L)
    return span_ids_BHK


def window_tags(p: PreparedSplit, w: int, *, scheme: str) -> tuple[np.ndarray, int]:
  """One tag layer (outermost entity wins) for window `w` in window-token columns, -1 outside content;
  and how many of its gold spans that layer cannot hold (nested or crossing)."""
  length = int(p.window_len[w])
  tags, unrepresentable = spans_to_tags(p.window_spans(w), length=length, num_types=len(p.types), scheme=scheme)
  content = np.arange(length)
  tags = np.where((content >= p.num_prefix) & (content < p.num_prefix + p.window_content_len[w]), tags, -1)
  return tags.astype(np.int32), unrepresentable


def count_unrepresentable(p: PreparedSplit, *, scheme: str) -> int:
  """Gold window spans a single tag layer cannot hold, over the split."""
  return sum(window_tags(p, w, scheme=scheme)[1] for w in range(p.num_windows))


def _to_batches(win: np.ndarray, batch_size: int) -> np.ndarray:
  """[n] window indices -> [ceil(n / B), B], the last row filled with -1."""
  steps = -(-win.shape[0] // batch_size)
  out = np.full(steps * batch_size, -1, np.int64)
  out[:win.shape[0]] = win
  return out.reshape(steps, batch_size)


class BatchIterator(Iterator[dict[str, Any]]):
  """Infinite training batches; epoch e is a pure function of (seed, e).

  Per epoch: shuffle windows, sort chunks of 100 * batch_size by length, cut into batches,
  shuffle the batch order. Only the last batch of an epoch can hold filler rows.

  `bucket_run` R > 0: then cut each bucket's batches (in that shuffled order) into runs of R (a bucket's last
  run may be shorter) and shuffle the runs, so a k-step call (lax.scan over same-bucket batches) rarely ends
  early. 0 = the interleaved order above.
  """

  def __init__(self, prepared: PreparedSplit, *, batch_size: int, buckets, seed: int,
               process_index: int = 0, process_count: int = 1, chunk_batches: int = 100,
               tag_scheme: str | None = None, bucket_run: int = 0, targets=span_targets):
    if bucket_run < 0:
      raise ValueError(f"bucket_run={bucket_run} must be >= 0 (0 = interleaved buckets)")
    if prepared.num_windows == 0:
      raise ValueError(f"{prepared.name}: no windows to train on")
    self._assemble = _Assembler(prepared, buckets, batch_size, process_index, process_count, tag_scheme, targets)
    self.prepared = prepared
    self.batch_size = batch_size
    self.chunk = chunk_batches * batch_size
    self.seed = int(seed)
    self.bucket_run = int(bucket_run)
    self.steps_per_epoch = -(-prepared.num_windows // batch_size)
    self._epoch, self._index = 0, 0
    self._cache = (None, None)

  @property
  def epoch(self) -> int:
    """Epoch of the next batch."""
    return self._epoch + (self._index >= self.steps_per_epoch)

  @property
  def span_overflow(self) -> int:
    return self._assemble.span_overflow

  def epoch_batches(self, epoch: int) -> np.ndarray:
    """int64 [steps_per_epoch, batch_size] global window indices of an epoch (-1 = filler)."""
    if self._cache[0] == epoch:
      return self._cache[1]
    rng = np.random.default_rng([self.seed, epoch])
    perm = rng.permutation(self.prepared.num_windows)
    lens = self.prepared.window_len[perm]
    parts = []
    for a in range(0, perm.shape[0], self.chunk):
      order = np.argsort(lens[a:a + self.chunk], kind="stable")
      parts.append(perm[a:a + self.chunk][order])
    batches = _to_batches(np.concatenate(parts), self.batch_size)
    batches = batches[rng.permutation(batches.shape[0])]
    if self.bucket_run:
      batches = batches[self._run_order(self._assemble.buckets_of(batches), rng)]
    self._cache = (epoch, batches)
    return batches

  def _run_order(self, bucket_S: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """int64 [S] batch order: each bucket's batches, in their order, cut into runs of `bucket_run`; the runs
    shuffled by `rng` (the epoch's stream, so the order stays a pure function of (seed, epoch))."""
    by_bucket_S = np.argsort(bucket_S, kind="stable")
    sorted_S = bucket_S[by_bucket_S]
    rank_S = np.arange(sorted_S.shape[0]) - np.searchsorted(sorted_S, sorted_S, side="left")
    run_S = np.cumsum(rank_S % self.bucket_run == 0) - 1
    slot_R = np.argsort(rng.permutation(int(run_S[-1]) + 1))  # run r goes to place slot_R[r]
    return by_bucket_S[np.argsort(slot_R[run_S], kind="stable")]

  def __next__(self) -> dict[str, Any]:
    if self._index >= self.steps_per_epoch:
      self._epoch, self._index = self._epoch + 1, 0
    win_B = self.epoch_batches(self._epoch)[self._index]
    self._index += 1
    return self._assemble(win_B)

  def lengths_ahead(self, steps: int) -> list[int]:
    """The bucket lengths of the next `steps` batches, from the current position (the programs a run needs)."""
    return sorted(set(self.upcoming_lengths(steps).tolist()))

  def filler(self, length: int) -> dict[str, Any]:
    """`_Assembler.filler`: a batch's structure at bucket `length`."""
    return self._assemble.filler(length)

  def upcoming_lengths(self, steps: int) -> np.ndarray:
    """int64 [steps]: the bucket length of each of the next `steps` batches, in order."""
    parts, epoch, index = [], self._epoch, self._index
    while steps > 0:
      if index >= self.steps_per_epoch:
        epoch, index = epoch + 1, 0
      rows = self.epoch_batches(epoch)[index:index + steps]
      parts.append(self._assemble.buckets_of(rows))
      steps, index = steps - rows.shape[0], index + rows.shape[0]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)

  def skip(self, steps: int) -> None:
    """Moves the position `steps` batches on without building them (the batches were built elsewhere)."""
    for _ in range(steps):
      if self._index >= self.steps_per_epoch:
        self._epoch, self._index = self._epoch + 1, 0
      self._index += 1

  def add_span_overflow(self, n: int) -> None:
    """Gold spans dropped in batches built elsewhere (`clone`) and trained on."""
    self._assemble.span_overflow += int(n)

  def clone(self) -> BatchIterator:
    """An iterator at the same position with its own overflow count: builds batches ahead without moving this
    one."""
    other = copy.copy(self)
    other._assemble = copy.copy(self._assemble)
    other._assemble.span_overflow = 0
    return other

  def get_state(self) -> dict[str, int]:
    """JSON-serialisable position: the next batch is batch `index` of epoch `epoch`."""
    epoch, index = self._epoch, self._index
    if index >= self.steps_per_epoch:
      epoch, index = epoch + 1, 0
    return {"epoch": epoch, "index": index, "seed": self.seed, "num_windows": self.prepared.num_windows}

  def set_state(self, state: Mapping[str, int]) -> None:
    n = state.get("num_windows", self.prepared.num_windows)
    if n != self.prepared.num_windows:
      raise ValueError(f"iterator state is for {n} windows, this split has {self.prepared.num_windows}")
    if not 0 <= int(state["index"]) <= self.steps_per_epoch:
      raise ValueError(f"iterator state index {state['index']} outside [0, {self.steps_per_epoch}]")
    self.seed, self._epoch, self._index = int(state["seed"]), int(state["epoch"]), int(state["index"])
    self._cache = (None, None)


def train_batches(prepared: PreparedSplit, *, batch_size: int, buckets: Sequence[int] | None, seed: int,
                  process_index: int = 0, process_count: int = 1, tag_scheme: str | None = None,
                  bucket_run: int = 0, targets=span_targets) -> BatchIterator:
  """Infinite, resumable training batches; `batch_size` is global, each process gets its rows.

  `tag_scheme` (BIO/BIOES): batches also carry `tags` [B, L] for tagger heads (see `window_tags`).
  `bucket_run` > 0: batches of one bucket come in runs of this many (see `BatchIterator`).
  `targets`: the task's `batch_targets` (`_Assembler`); `span_targets`: span_ids alone."""
  return BatchIterator(prepared, batch_size=batch_size, buckets=buckets, seed=seed,
                       process_index=process_index, process_count=process_count, tag_scheme=tag_scheme,
                       bucket_run=bucket_run, targets=targets)


class EvalBatches:
  """Every window exactly once, sorted by length, without targets (evaluation and predict); re-iterable; the last
  batch may hold filler."""

  def __init__(self, prepared: PreparedSplit, *, batch_size: int, buckets, process_index: int = 0,
               process_count: int = 1):
    self._assemble = _Assembler(prepared, buckets, batch_size, process_index, process_count)
    order = np.argsort(prepared.window_len, kind="stable")
    self.batches = _to_batches(order, batch_size)

  def __len__(self) -> int:
    return self.batches.shape[0]

  def lengths(self) -> list[int]:
    """The bucket lengths these batches take."""
    return sorted(set(self._assemble.buckets_of(self.batches).tolist()))

  def filler(self, length: int) -> dict[str, Any]:
    return self._assemble.filler(length)

  def __iter__(self) -> Iterator[dict[str, Any]]:
    for win_B in self.batches:
      yield self._assemble(win_B)


def eval_batches(prepared: PreparedSplit, *, batch_size: int, buckets: Sequence[int] | None,
                 process_index: int = 0, process_count: int = 1) -> EvalBatches:
  return EvalBatches(prepared, batch_size=batch_size, buckets=buckets, process_index=process_index,
                     process_count=process_count)
