"""Windows, length buckets and batches for span NER; merging window hits back into documents.

Flow: records -> `prepare_split` (tokenise once, align entities, cut sliding windows)
-> `train_batches` / `eval_batches` (padded numpy batches, layout in `gp_jax.data.types`)
-> model hits per window (`batch_hits`) -> `merge_predictions` (char spans per record)
-> `prediction_spans` / `gold_spans` -> `gp_jax.metrics.span_prf`.

Coordinates (P = tokenizer.num_prefix):
  content index c   index into a record's content tokens (no specials), 0 .. n-1
  window token t    column in a window row: t = c - window_start + P
  position          document position of a window column: window_start + t (= c + P for
                    content tokens), so RoPE sees document offsets across windows.

Batch fields (numpy, B rows of this process, L = bucket length, H = len(types)):
  features         dict name -> int32 [B, L]  padded with tokenizer.pad_values
  attention_mask   int32 [B, L]   1 on every real token (specials included)
  span_mask        int32 [B, L]   1 on content tokens only
  positions        int32 [B, L]   document positions (0 on padding)
  span_ids         int32 [B, H, L] flat i * L + j of gold spans (K = L), -1 padded
  example_index    int32 [B]      record index in the split, -1 on filler rows
  window_start     int32 [B]      content-token offset of the window in its record (0 on filler)
  window_index     int32 [B]      window index in the PreparedSplit, -1 on filler rows
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from gp_jax.data.types import Record, Tokenizer

# Per-entity status in PreparedSplit.entity_status (exclusive; checked in this order).
OK = 0  # a training target in at least one window
MISALIGNED = 1  # a bound falls inside a token (never moved)
TOO_LONG = 2  # wider than max_span_width tokens (not a training target)
DUPLICATE = 3  # same token span and type as an earlier entity of the record (kept once)
LOST = 4  # aligned, but no window holds it whole (truncation by windowing)


@dataclasses.dataclass(frozen=True)
class SplitStats:
  """What `prepare_split` saw; every entity is in exactly one of the entity counts."""

  records: int
  windows: int
  tokens: int  # content tokens over all records
  entities: int  # = targets + misaligned + too_long + duplicates + lost_to_truncation
  targets: int  # entities that are training targets in some window
  misaligned: int
  too_long: int
  duplicates: int
  lost_to_truncation: int
  empty_records: int  # records whose text gave zero tokens (no window)
  split_records: int  # records cut into more than one window
  max_spans_per_type: int  # most targets of one type in one window (K = L caps this per batch)


@dataclasses.dataclass
class PreparedSplit:
  """A tokenised split cut into windows. Ragged data is stored flat with `*_ptr` row starts."""

  name: str
  types: tuple[str, ...]
  feature_names: tuple[str, ...]
  pad_values: dict[str, int]
  num_prefix: int
  num_suffix: int
  max_len: int
  stride: int
  max_span_width: int | None
  record_ids: list[str]
  # Content tokens of each record: offsets_T2[token_ptr[r]:token_ptr[r + 1]].
  token_ptr: np.ndarray  # int64 [R + 1]
  offsets_T2: np.ndarray  # int32 [T, 2] char [start, end) per content token
  # Windows.
  window_record: np.ndarray  # int32 [N]
  window_start: np.ndarray  # int32 [N] content-token offset
  window_content_len: np.ndarray  # int32 [N]
  window_len: np.ndarray  # int32 [N] with specials
  window_ptr: np.ndarray  # int64 [N + 1] rows of window_features
  window_features: dict[str, np.ndarray]  # name -> int32 [sum(window_len)], specials included
  span_ptr: np.ndarray  # int64 [N + 1] rows of spans_S3
  spans_S3: np.ndarray  # int32 [S, 3] (start, end inclusive, type) in window tokens, sorted
  # Every gold entity of the split (evaluation scores whole documents).
  entity_record: np.ndarray  # int32 [E]
  entity_char_E2: np.ndarray  # int32 [E, 2]
  entity_type: np.ndarray  # int32 [E]
  entity_token_E2: np.ndarray  # int32 [E, 2] content tokens (start, end inclusive), -1 if misaligned
  entity_status: np.ndarray  # int8 [E], OK / MISALIGNED / TOO_LONG / DUPLICATE / LOST
  stats: SplitStats

  @property
  def num_records(self) -> int:
    return len(self.record_ids)

  @property
  def num_windows(self) -> int:
    return int(self.window_record.shape[0])

  def record_offsets(self, r: int) -> np.ndarray:
    """int32 [n, 2] char offsets of record r's content tokens."""
    return self.offsets_T2[self.token_ptr[r]:self.token_ptr[r + 1]]

  def window_token_features(self, w: int) -> dict[str, np.ndarray]:
    a, b = self.window_ptr[w], self.window_ptr[w + 1]
    return {k: v[a:b] for k, v in self.window_features.items()}

  def window_positions(self, w: int) -> np.ndarray:
    return (self.window_start[w] + np.arange(self.window_len[w])).astype(np.int32)

  def window_spans(self, w: int) -> np.ndarray:
    """int32 [k, 3] (start, end inclusive, type id) targets in window-token coordinates."""
    return self.spans_S3[self.span_ptr[w]:self.span_ptr[w + 1]]


def _ranges(starts: np.ndarray, lens: np.ndarray) -> np.ndarray:
  """Concatenation of arange(s, s + n) for each (s, n); int64."""
  lens = np.asarray(lens, np.int64)
  total = int(lens.sum())
  if total == 0:
    return np.zeros(0, np.int64)
  ends = np.cumsum(lens)
  base = np.repeat(np.asarray(starts, np.int64) - (ends - lens), lens)
  return base + np.arange(total, dtype=np.int64)


def _ptr(counts: np.ndarray) -> np.ndarray:
  ptr = np.zeros(len(counts) + 1, np.int64)
  np.cumsum(counts, out=ptr[1:])
  return ptr


def _align(token_ptr, offsets_T2, ent_record, ent_char_E2):
  """Per entity: (first content token starting at entity.start, last ending at entity.end).

  -1 when either is missing or they cross (misaligned); zero-width tokens are skipped. Same rule
  as `gp_jax.data.tokenize.char_to_token_spans`, vectorised over the split.
  """
  E = ent_record.shape[0]
  tok_E2 = np.full((E, 2), -1, np.int64)
  real = np.nonzero(offsets_T2[:, 1] > offsets_T2[:, 0])[0]  # tokens that cover characters
  if E == 0 or real.size == 0:
    return tok_E2
  R = token_ptr.shape[0] - 1
  tok_record = np.repeat(np.arange(R, dtype=np.int64), np.diff(token_ptr))[real]
  off = offsets_T2[real].astype(np.int64)
  span = int(max(off.max(), ent_char_E2.max(), 0)) + 2
  key_start = tok_record * span + off[:, 0]
  key_end = tok_record * span + off[:, 1]
  ent_key = ent_record.astype(np.int64)[:, None] * span + ent_char_E2
  if np.all(np.diff(key_start) >= 0) and np.all(np.diff(key_end) >= 0):
    # Offsets are monotone within records: one global binary search.
    s = np.searchsorted(key_start, ent_key[:, 0], side="left")
    e = np.searchsorted(key_end, ent_key[:, 1], side="right") - 1
    s_ok = (s < real.size) & (key_start[np.minimum(s, real.size - 1)] == ent_key[:, 0])
    e_ok = (e >= 0) & (key_end[np.maximum(e, 0)] == ent_key[:, 1])
    tok_E2[:, 0] = np.where(s_ok, real[np.minimum(s, real.size - 1)], -1)
    tok_E2[:, 1] = np.where(e_ok, real[np.maximum(e, 0)], -1)
  else:
    # Unusual tokenizer (offsets not monotone): per-record dictionaries.
    for r in np.unique(ent_record):
      a, b = int(token_ptr[r]), int(token_ptr[r + 1])
      first, last = {}, {}
      for t, (cs, ce) in enumerate(offsets_T2[a:b].tolist()):
        if ce > cs:
          first.setdefault(cs, a + t)
          last[ce] = a + t
      for i in np.nonzero(ent_record == r)[0]:
        tok_E2[i] = (first.get(int(ent_char_E2[i, 0]), -1), last.get(int(ent_char_E2[i, 1]), -1))
  found = (tok_E2 >= 0).all(1) & (tok_E2[:, 0] <= tok_E2[:, 1])
  # Back to per-record content indices.
  return np.where(found[:, None], tok_E2 - token_ptr[ent_record][:, None], -1)


_ENCODE_CHUNK = 4096  # texts per encode_batch call


def _encode_all(records: Iterable[Record], tokenizer):
  """Yields (record, Encoding); uses the tokenizer's `encode_batch` when it has one."""
  batch_fn = getattr(tokenizer, "encode_batch", None)
  chunk = _ENCODE_CHUNK
  if batch_fn is None:
    for rec in records:
      yield rec, tokenizer.encode(rec["text"])
    return
  buf = []
  for rec in records:
    buf.append(rec)
    if len(buf) == chunk:
      yield from zip(buf, batch_fn([r["text"] for r in buf]), strict=True)
      buf = []
  if buf:
    yield from zip(buf, batch_fn([r["text"] for r in buf]), strict=True)


def prepare_split(
    records: Iterable[Record],
    tokenizer: Tokenizer,
    *,
    types: Sequence[str],
    max_len: int,
    stride: int | None = None,
    max_span_width: int | None = None,
    name: str = "split",
) -> PreparedSplit:
  """Tokenises every record once and cuts texts into windows of at most `max_len` tokens.

  A window holds W = max_len - num_prefix - num_suffix content tokens; consecutive windows start
  `stride` (default W // 2) apart and the last one ends at the text end. Entities whose char
  bounds are not token bounds are counted as misaligned and kept only in the gold set.
  Raises ValueError on an entity type not in `types`. Uses `tokenizer.encode_batch(texts)` when
  the tokenizer has it (e.g. CharTokenizer), else `encode` per text.
  """
  types = tuple(types)
  type_to_id = {t: i for i, t in enumerate(types)}
  if len(type_to_id) != len(types):
    raise ValueError(f"duplicate entity types in {types}")
  names = tuple(tokenizer.feature_names)
  P, S = int(tokenizer.num_prefix), int(tokenizer.num_suffix)
  W = int(max_len) - P - S
  if W < 1:
    raise ValueError(f"max_len={max_len} leaves no content tokens after {P}+{S} specials")
  stride = max(1, W // 2) if stride is None else int(stride)
  if not 1 <= stride <= W:
    raise ValueError(f"stride={stride} must be in [1, {W}] (window content length) or windows leave gaps")
  if max_span_width is not None and max_span_width < 1:
    raise ValueError(f"max_span_width={max_span_width} must be >= 1")

  # 1) Tokenise once; collect entities.
  record_ids, n_list, offsets_list = [], [], []
  feats_list = {k: [] for k in names}
  ent_record, ent_char, ent_type = [], [], []
  for r, (rec, enc) in enumerate(_encode_all(records, tokenizer)):
    rid = str(rec.get("id", r))
    record_ids.append(rid)
    off = np.asarray(enc.offsets, np.int32).reshape(-1, 2)
    n_list.append(off.shape[0])
    offsets_list.append(off)
    for k in names:
      f = np.asarray(enc.features[k], np.int32)
      if f.shape != (off.shape[0],):
        raise ValueError(f"{name}: record {rid!r}: feature {k!r} has shape {f.shape}, offsets {off.shape}")
      feats_list[k].append(f)
    for ent in rec.get("entities", ()):
      t = type_to_id.get(ent["type"])
      if t is None:
        raise ValueError(f"{name}: record {rid!r} has entity type {ent['type']!r}, not one of {types}")
      ent_record.append(r)
      ent_char.append((ent["start"], ent["end"]))
      ent_type.append(t)

  R = len(record_ids)
  n_R = np.asarray(n_list, np.int64)
  token_ptr = _ptr(n_R)
  offsets_T2 = np.concatenate(offsets_list) if R else np.zeros((0, 2), np.int32)
  feats_T = {k: (np.concatenate(v) if R else np.zeros(0, np.int32)) for k, v in feats_list.items()}
  ent_record = np.asarray(ent_record, np.int64)
  ent_char_E2 = np.asarray(ent_char, np.int64).reshape(-1, 2)
  ent_type = np.asarray(ent_type, np.int64)
  E = ent_record.shape[0]

  # 2) Windows: starts 0, S, 2S, ... while start + W < n, then n - W.
  nwin_R = np.where(n_R == 0, 0, np.where(n_R <= W, 1, -(-(n_R - W) // stride) + 1))
  win_first_R = _ptr(nwin_R)
  N = int(win_first_R[-1])
  window_record = np.repeat(np.arange(R, dtype=np.int64), nwin_R)
  k_N = np.arange(N, dtype=np.int64) - win_first_R[window_record]
  window_start = np.minimum(k_N * stride, np.maximum(n_R[window_record] - W, 0))
  window_content_len = np.minimum(n_R[window_record], W)
  window_len = window_content_len + P + S

  # 3) Entities: align, classify, place in windows.
  tok_E2 = _align(token_ptr, offsets_T2, ent_record, ent_char_E2)
  status = np.where(tok_E2[:, 0] >= 0, OK, MISALIGNED).astype(np.int8)
  if max_span_width is not None:
    status[(status == OK) & (tok_E2[:, 1] - tok_E2[:, 0] + 1 > max_span_width)] = TOO_LONG
  cand = np.nonzero(status == OK)[0]
  if cand.size:
    order = np.lexsort((tok_E2[cand, 1], tok_E2[cand, 0], ent_type[cand], ent_record[cand]))
    c = cand[order]
    key = np.stack([ent_record[c], ent_type[c], tok_E2[c, 0], tok_E2[c, 1]], 1)
    dup = np.zeros(c.shape[0], bool)
    dup[1:] = (key[1:] == key[:-1]).all(1)
    status[c[dup]] = DUPLICATE
    cand = np.sort(c[~dup])
  # Every (candidate entity, window of its record) pair; keep the windows that hold it whole.
  pair_n = nwin_R[ent_record[cand]]
  pair_e = np.repeat(cand, pair_n)
  pair_w = _ranges(win_first_R[ent_record[cand]], pair_n)
  ws = window_start[pair_w]
  inside = (tok_E2[pair_e, 0] >= ws) & (tok_E2[pair_e, 1] < ws + window_content_len[pair_w])
  pair_e, pair_w = pair_e[inside], pair_w[inside]
  held = np.zeros(E, bool)
  held[pair_e] = True
  status[cand[~held[cand]]] = LOST
  off_w = P - window_start[pair_w]
  sp_start, sp_end, sp_type = tok_E2[pair_e, 0] + off_w, tok_E2[pair_e, 1] + off_w, ent_type[pair_e]
  order = np.lexsort((sp_end, sp_start, sp_type, pair_w))
  spans_S3 = np.stack([sp_start, sp_end, sp_type], 1)[order].astype(np.int32).reshape(-1, 3)
  span_ptr = _ptr(np.bincount(pair_w, minlength=N))
  H = max(len(types), 1)
  per_type = np.bincount(pair_w * H + sp_type, minlength=N * H) if pair_w.size else np.zeros(1, np.int64)

  # 4) Window features with specials (the tokenizer decides what they are).
  content_idx = _ranges(token_ptr[window_record] + window_start, window_content_len)
  win_feats = {k: v[content_idx] for k, v in feats_T.items()}
  if P == 0 and S == 0:
    window_features = win_feats  # add_special_tokens is the identity without specials
  else:
    content_ptr = _ptr(window_content_len)
    parts = {k: [] for k in names}
    for w in range(N):
      a, b = content_ptr[w], content_ptr[w + 1]
      out = tokenizer.add_special_tokens({k: v[a:b] for k, v in win_feats.items()})
      for k in names:
        f = np.asarray(out[k], np.int32)
        if f.shape != (b - a + P + S,):
          raise ValueError(f"add_special_tokens gave {k!r} of shape {f.shape}, expected ({b - a + P + S},)")
        parts[k].append(f)
    window_features = {k: (np.concatenate(v) if v else np.zeros(0, np.int32)) for k, v in parts.items()}

  count = lambda s: int(np.sum(status == s))  # noqa: E731
  stats = SplitStats(
      records=R,
      windows=N,
      tokens=int(n_R.sum()),
      entities=E,
      targets=count(OK),
      misaligned=count(MISALIGNED),
      too_long=count(TOO_LONG),
      duplicates=count(DUPLICATE),
      lost_to_truncation=count(LOST),
      empty_records=int(np.sum(n_R == 0)),
      split_records=int(np.sum(nwin_R > 1)),
      max_spans_per_type=int(per_type.max()) if per_type.size else 0,
  )
  logging.info("prepare_split %s (max_len=%d, stride=%d): %s", name, max_len, stride, stats)
  i32 = lambda x: np.asarray(x, np.int32)  # noqa: E731
  return PreparedSplit(
      name=name,
      types=types,
      feature_names=names,
      pad_values={k: int(tokenizer.pad_values[k]) for k in names},
      num_prefix=P,
      num_suffix=S,
      max_len=int(max_len),
      stride=stride,
      max_span_width=max_span_width,
      record_ids=record_ids,
      token_ptr=token_ptr,
      offsets_T2=offsets_T2,
      window_record=i32(window_record),
      window_start=i32(window_start),
      window_content_len=i32(window_content_len),
      window_len=i32(window_len),
      window_ptr=_ptr(window_len),
      window_features=window_features,
      span_ptr=span_ptr,
      spans_S3=spans_S3,
      entity_record=i32(ent_record),
      entity_char_E2=i32(ent_char_E2).reshape(-1, 2),
      entity_type=i32(ent_type),
      entity_token_E2=i32(tok_E2).reshape(-1, 2),
      entity_status=status,
      stats=stats,
  )


# ----------------------------------------------------------------------------- batches


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


class _Assembler:
  """Builds the rows [lo, hi) of a global batch of window indices (-1 = filler)."""

  def __init__(self, prepared: PreparedSplit, buckets, batch_size, process_index, process_count):
    _check_hosts(batch_size, process_index, process_count)
    self.p = prepared
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

  def __call__(self, win_B: np.ndarray) -> dict[str, Any]:
    p = self.p
    L = self.bucket(win_B)
    win_B = win_B[self.lo:self.hi]
    B, H = win_B.shape[0], len(p.types)
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
    # Targets: spans are sorted by (window, type, start, end), rows ascend -> groups are contiguous.
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
    example_index_B = np.full(B, -1, np.int32)
    example_index_B[rows] = p.window_record[w]
    window_start_B = np.zeros(B, np.int32)
    window_start_B[rows] = p.window_start[w]
    return {
        "features": features,
        "attention_mask": attention_mask_BL,
        "span_mask": span_mask_BL,
        "positions": positions_BL,
        "span_ids": span_ids_BHK,
        "example_index": example_index_B,
        "window_start": window_start_B,
        "window_index": win_B.astype(np.int32),
    }


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
  """

  def __init__(self, prepared: PreparedSplit, *, batch_size: int, buckets, seed: int,
               process_index: int = 0, process_count: int = 1, chunk_batches: int = 100):
    if prepared.num_windows == 0:
      raise ValueError(f"{prepared.name}: no windows to train on")
    self._assemble = _Assembler(prepared, buckets, batch_size, process_index, process_count)
    self.prepared = prepared
    self.batch_size = batch_size
    self.chunk = chunk_batches * batch_size
    self.seed = int(seed)
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
    self._cache = (epoch, batches)
    return batches

  def __next__(self) -> dict[str, Any]:
    if self._index >= self.steps_per_epoch:
      self._epoch, self._index = self._epoch + 1, 0
    win_B = self.epoch_batches(self._epoch)[self._index]
    self._index += 1
    return self._assemble(win_B)

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
                  process_index: int = 0, process_count: int = 1) -> BatchIterator:
  """Infinite, resumable training batches; `batch_size` is global, each process gets its rows."""
  return BatchIterator(prepared, batch_size=batch_size, buckets=buckets, seed=seed,
                       process_index=process_index, process_count=process_count)


class EvalBatches:
  """Every window exactly once, sorted by length; re-iterable; the last batch may hold filler."""

  def __init__(self, prepared: PreparedSplit, *, batch_size: int, buckets, process_index: int = 0,
               process_count: int = 1):
    self._assemble = _Assembler(prepared, buckets, batch_size, process_index, process_count)
    order = np.argsort(prepared.window_len, kind="stable")
    self.batches = _to_batches(order, batch_size)

  def __len__(self) -> int:
    return self.batches.shape[0]

  def __iter__(self) -> Iterator[dict[str, Any]]:
    for win_B in self.batches:
      yield self._assemble(win_B)


def eval_batches(prepared: PreparedSplit, *, batch_size: int, buckets: Sequence[int] | None,
                 process_index: int = 0, process_count: int = 1) -> EvalBatches:
  return EvalBatches(prepared, batch_size=batch_size, buckets=buckets, process_index=process_index,
                     process_count=process_count)


# ----------------------------------------------------------------------------- merge


def batch_hits(window_index_B: np.ndarray, coords_M4: np.ndarray, scores_M: np.ndarray) -> dict[str, np.ndarray]:
  """Hits of `gp_jax.ops.decode.decode_hits` ((row, type, start, end), score) -> window hits.

  Returns columns {"window", "start", "end", "type", "score"} for `merge_predictions`;
  filler rows and padding coordinates (-1) are dropped.
  """
  coords_M4 = np.asarray(coords_M4).reshape(-1, 4)
  scores_M = np.asarray(scores_M, np.float64).reshape(-1)
  window_index_B = np.asarray(window_index_B)
  b = coords_M4[:, 0]
  keep = (b >= 0) & (coords_M4 >= 0).all(1)
  keep[keep] = window_index_B[b[keep]] >= 0
  c = coords_M4[keep]
  return {"window": window_index_B[c[:, 0]].astype(np.int64), "start": c[:, 2].astype(np.int64),
          "end": c[:, 3].astype(np.int64), "type": c[:, 1].astype(np.int64), "score": scores_M[keep]}


def concat_hits(hits: Sequence[Mapping[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Joins the `batch_hits` of several batches."""
  keys = ("window", "start", "end", "type", "score")
  if not hits:
    return {k: np.zeros(0, np.float64 if k == "score" else np.int64) for k in keys}
  return {k: np.concatenate([np.asarray(h[k]) for h in hits]) for k in keys}


def _hit_columns(hits):
  if isinstance(hits, Mapping):
    cols = [np.asarray(hits[k]) for k in ("window", "start", "end", "type")]
    score = np.asarray(hits.get("score", np.ones(cols[0].shape[0])), np.float64)
  else:
    a = np.asarray(list(hits) if not isinstance(hits, np.ndarray) else hits, np.float64)
    a = a.reshape(-1, 5) if a.size else np.zeros((0, 5))
    cols, score = [a[:, i] for i in range(4)], a[:, 4]
  return [c.astype(np.int64).reshape(-1) for c in cols], score.reshape(-1)


def merge_predictions(prepared: PreparedSplit, hits) -> list[list[dict[str, Any]]]:
  """Window hits -> per record, entity dicts {"start", "end", "type", "score"} in char offsets.

  `hits`: (window_index, start_tok, end_tok, type_id, score) tuples or an array [M, 5], or
  columns {"window", "start", "end", "type", "score"} (`batch_hits`), in window-token
  coordinates. The same span from overlapping windows is kept once with its highest score.
  Hits outside a window's content tokens are dropped (counted in a warning).
  """
  p = prepared
  (w, s, e, t), score = _hit_columns(hits)
  ok = (w >= 0) & (w < p.num_windows) & (t >= 0) & (t < len(p.types))
  wc = np.where(ok, w, 0)
  ok &= (s >= p.num_prefix) & (s <= e) & (e < p.num_prefix + p.window_content_len[wc])
  if not ok.all():
    logging.warning("merge_predictions %s: dropped %d hits outside window content", p.name, int((~ok).sum()))
  w, s, e, t, score = w[ok], s[ok], e[ok], t[ok], score[ok]
  rec = p.window_record[w].astype(np.int64)
  shift = p.window_start[w].astype(np.int64) - p.num_prefix + p.token_ptr[rec]
  start = p.offsets_T2[s + shift, 0].astype(np.int64)
  end = p.offsets_T2[e + shift, 1].astype(np.int64)
  # Dedupe on the char span (what is scored), keeping the max score.
  order = np.lexsort((-score, t, end, start, rec))
  rec, start, end, t, score = rec[order], start[order], end[order], t[order], score[order]
  first = np.ones(rec.shape[0], bool)
  key = np.stack([rec, start, end, t], 1)
  first[1:] = (key[1:] != key[:-1]).any(1)
  out: list[list[dict[str, Any]]] = [[] for _ in range(p.num_records)]
  for r, a, b, ti, sc in zip(rec[first].tolist(), start[first].tolist(), end[first].tolist(),
                             t[first].tolist(), score[first].tolist()):
    out[r].append({"start": a, "end": b, "type": p.types[ti], "score": sc})
  return out


def prediction_spans(merged: Sequence[Sequence[Mapping[str, Any]]]) -> set[tuple[int, int, int, str]]:
  """`merge_predictions` output -> {(record_index, start, end, type)} for `span_prf`."""
  return {(r, int(x["start"]), int(x["end"]), str(x["type"])) for r, ents in enumerate(merged) for x in ents}


def gold_spans(prepared: PreparedSplit) -> set[tuple[int, int, int, str]]:
  """Every gold entity of the split (misaligned, too long and lost ones included)."""
  p = prepared
  return {(r, a, b, p.types[t]) for r, (a, b), t in
          zip(p.entity_record.tolist(), p.entity_char_E2.tolist(), p.entity_type.tolist())}
