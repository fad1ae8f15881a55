"""Records -> sliding windows of tokens with aligned span targets (`prepare_split`).

Flow: records -> `prepare_split` (tokenise once, align entities, cut sliding windows)
-> `gp_jax.data.batching` (padded numpy batches) -> model hits per window
-> `gp_jax.data.merge` (char spans per record) -> `gp_jax.metrics.span_prf`.

Coordinates (P = tokenizer.num_prefix):
  content index c   index into a record's content tokens (no specials), 0 .. n-1
  window token t    column in a window row: t = c - window_start + P
  position          document position of a window column: window_start + t (= c + P for
                    content tokens), so RoPE sees document offsets across windows.

Windows of a record: W = max_len - num_prefix - num_suffix content tokens each, starts
0, stride, 2 * stride, ... while start + W < n, then n - W (the last window ends at the text end).
Starts strictly increase within a record and every window of a record has the same content length.

A task's own targets beyond the spans (relations, events) are its window table (`PreparedSplit.table`), built by
the task (`gp_jax.tasks.<name>`) from the split's public fields.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from gp_jax.data.types import Record, Tokenizer
from gp_jax.errors import UserError

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
  truncated_records: int = 0  # truncate=True: records longer than one window, cut to their first window


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
  texts: tuple[str, ...] = ()  # each record's text
  table: Any = None  # the task's window table (relations: `tasks.relations.table.RelationTable`); None: spans only

  @property
  def num_records(self) -> int:
    return len(self.record_ids)

  @property
  def num_windows(self) -> int:
    return int(self.window_record.shape[0])

  def record_offsets(self, r: int) -> np.ndarray:
    """int32 [n, 2] char offsets of record r's content tokens."""
    return self.offsets_T2[self.token_ptr[r]:self.token_ptr[r + 1]]

  def window_spans(self, w: int) -> np.ndarray:
    """int32 [k, 3] (start, end inclusive, type id) targets in window-token coordinates."""
    return self.spans_S3[self.span_ptr[w]:self.span_ptr[w + 1]]

  def all_stats(self) -> dict:
    """`stats` and the window table's (`table.stats`, a dict) in one dict (results.json's split_stats)."""
    return {**dataclasses.asdict(self.stats), **(self.table.stats if self.table is not None else {})}


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

  -1 when either is missing or they cross (misaligned); zero-width tokens are skipped. The one
  char -> token alignment rule of the package (tests check it against an independent reference).
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


# ----------------------------------------------------------------------------- prepare_split stages


class _Tokens(NamedTuple):
  """Every record tokenised once, stored flat; entities in char offsets."""

  record_ids: list[str]
  n_R: np.ndarray  # int64 [R] content tokens per record
  token_ptr: np.ndarray  # int64 [R + 1]
  offsets_T2: np.ndarray  # int32 [T, 2]
  feats_T: dict[str, np.ndarray]  # name -> int32 [T]
  ent_record: np.ndarray  # int64 [E]
  ent_char_E2: np.ndarray  # int64 [E, 2]
  ent_type: np.ndarray  # int64 [E]
  texts: tuple[str, ...]


class _Windows(NamedTuple):
  nwin_R: np.ndarray  # int64 [R] windows per record
  first_R: np.ndarray  # int64 [R + 1] first window of each record
  record_N: np.ndarray  # int64 [N]
  start_N: np.ndarray  # int64 [N]
  content_len_N: np.ndarray  # int64 [N]


class _Targets(NamedTuple):
  status_E: np.ndarray  # int8 [E]
  spans_S3: np.ndarray  # int32 [S, 3] sorted by (window, type, start, end)
  span_ptr: np.ndarray  # int64 [N + 1]
  max_spans_per_type: int


def _check_args(tokenizer, *, max_len, stride, max_span_width) -> tuple[int, int]:
  """-> (W content tokens per window, stride)."""
  P, S = int(tokenizer.num_prefix), int(tokenizer.num_suffix)
  W = int(max_len) - P - S
  if W < 1:
    raise UserError(f"data.max_len={max_len} leaves no content tokens after {P}+{S} special tokens: give a larger one")
  stride = max(1, W // 2) if stride is None else int(stride)
  if not 1 <= stride <= W:
    raise UserError(f"data.stride={stride} must be in [1, {W}] (window content length) or windows leave gaps")
  if max_span_width is not None and max_span_width < 1:
    raise ValueError(f"max_span_width={max_span_width} must be >= 1")
  return W, stride


def _tokenise(records, tokenizer, *, type_to_id, names, name) -> _Tokens:
  """Encodes every text once; checks feature shapes and entity types."""
  record_ids, n_list, offsets_list, texts = [], [], [], []
  feats_list = {k: [] for k in names}
  ent_record, ent_char, ent_type = [], [], []
  for r, (rec, enc) in enumerate(_encode_all(records, tokenizer)):
    texts.append(rec["text"])
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
        raise ValueError(f"{name}: record {rid!r} has entity type {ent['type']!r}, not one of {tuple(type_to_id)}")
      ent_record.append(r)
      ent_char.append((ent["start"], ent["end"]))
      ent_type.append(t)
  R = len(record_ids)
  n_R = np.asarray(n_list, np.int64)
  return _Tokens(
      record_ids=record_ids,
      n_R=n_R,
      token_ptr=_ptr(n_R),
      offsets_T2=np.concatenate(offsets_list) if R else np.zeros((0, 2), np.int32),
      feats_T={k: (np.concatenate(v) if R else np.zeros(0, np.int32)) for k, v in feats_list.items()},
      ent_record=np.asarray(ent_record, np.int64),
      ent_char_E2=np.asarray(ent_char, np.int64).reshape(-1, 2),
      ent_type=np.asarray(ent_type, np.int64),
      texts=tuple(texts),
  )


def _cut_windows(n_R: np.ndarray, *, W: int, stride: int, truncate: bool = False) -> _Windows:
  """Starts 0, stride, 2 * stride, ... while start + W < n, then n - W; none for an empty record.

  truncate: one window per record, its first W tokens (the rest of the record is dropped)."""
  if truncate:
    nwin_R = (n_R > 0).astype(np.int64)
    first_R = _ptr(nwin_R)
    record_N = np.nonzero(nwin_R)[0].astype(np.int64)
    return _Windows(nwin_R, first_R, record_N, np.zeros_like(record_N), np.minimum(n_R[record_N], W))
  nwin_R = np.where(n_R == 0, 0, np.where(n_R <= W, 1, -(-(n_R - W) // stride) + 1))
  first_R = _ptr(nwin_R)
  N = int(first_R[-1])
  record_N = np.repeat(np.arange(n_R.shape[0], dtype=np.int64), nwin_R)
  k_N = np.arange(N, dtype=np.int64) - first_R[record_N]
  start_N = np.minimum(k_N * stride, np.maximum(n_R[record_N] - W, 0))
  return _Windows(nwin_R, first_R, record_N, start_N, np.minimum(n_R[record_N], W))


def _place_entities(tok: _Tokens, win: _Windows, tok_E2: np.ndarray, *, P: int, num_types: int,
                    max_span_width: int | None) -> _Targets:
  """Classifies every entity (OK / MISALIGNED / ...) and lists the targets of each window."""
  status = np.where(tok_E2[:, 0] >= 0, OK, MISALIGNED).astype(np.int8)
  if max_span_width is not None:
    status[(status == OK) & (tok_E2[:, 1] - tok_E2[:, 0] + 1 > max_span_width)] = TOO_LONG
  ent_record, ent_type = tok.ent_record, tok.ent_type
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
  pair_n = win.nwin_R[ent_record[cand]]
  pair_e = np.repeat(cand, pair_n)
  pair_w = _ranges(win.first_R[ent_record[cand]], pair_n)
  ws = win.start_N[pair_w]
  inside = (tok_E2[pair_e, 0] >= ws) & (tok_E2[pair_e, 1] < ws + win.content_len_N[pair_w])
  pair_e, pair_w = pair_e[inside], pair_w[inside]
  held = np.zeros(status.shape[0], bool)
  held[pair_e] = True
  status[cand[~held[cand]]] = LOST
  off_w = P - win.start_N[pair_w]
  sp_start, sp_end, sp_type = tok_E2[pair_e, 0] + off_w, tok_E2[pair_e, 1] + off_w, ent_type[pair_e]
  order = np.lexsort((sp_end, sp_start, sp_type, pair_w))
  spans_S3 = np.stack([sp_start, sp_end, sp_type], 1)[order].astype(np.int32).reshape(-1, 3)
  N = win.record_N.shape[0]
  H = max(num_types, 1)
  per_type = np.bincount(pair_w * H + sp_type, minlength=N * H) if pair_w.size else np.zeros(1, np.int64)
  return _Targets(status, spans_S3, _ptr(np.bincount(pair_w, minlength=N)),
                  int(per_type.max()) if per_type.size else 0)


def _window_features(tokenizer, tok: _Tokens, win: _Windows, *, names) -> dict[str, np.ndarray]:
  """Flat features of every window with its specials (the tokenizer decides what they are)."""
  P, S = int(tokenizer.num_prefix), int(tokenizer.num_suffix)
  content_idx = _ranges(tok.token_ptr[win.record_N] + win.start_N, win.content_len_N)
  win_feats = {k: v[content_idx] for k, v in tok.feats_T.items()}
  if P == 0 and S == 0:
    return win_feats  # add_special_tokens is the identity without specials
  content_ptr = _ptr(win.content_len_N)
  parts = {k: [] for k in names}
  for w in range(win.record_N.shape[0]):
    a, b = content_ptr[w], content_ptr[w + 1]
    out = tokenizer.add_special_tokens({k: v[a:b] for k, v in win_feats.items()})
    for k in names:
      f = np.asarray(out[k], np.int32)
      if f.shape != (b - a + P + S,):
        raise ValueError(f"add_special_tokens gave {k!r} of shape {f.shape}, expected ({b - a + P + S},)")
      parts[k].append(f)
  return {k: (np.concatenate(v) if v else np.zeros(0, np.int32)) for k, v in parts.items()}


def _split_stats(tok: _Tokens, win: _Windows, targets: _Targets, *, W: int, truncate: bool) -> SplitStats:
  status = targets.status_E
  count = lambda s: int(np.sum(status == s))  # noqa: E731
  return SplitStats(
      records=len(tok.record_ids),
      windows=int(win.record_N.shape[0]),
      tokens=int(tok.n_R.sum()),
      entities=int(status.shape[0]),
      targets=count(OK),
      misaligned=count(MISALIGNED),
      too_long=count(TOO_LONG),
      duplicates=count(DUPLICATE),
      lost_to_truncation=count(LOST),
      empty_records=int(np.sum(tok.n_R == 0)),
      split_records=int(np.sum(win.nwin_R > 1)),
      truncated_records=int(np.sum(tok.n_R > W)) if truncate else 0,
      max_spans_per_type=targets.max_spans_per_type,
  )


def prepare_split(
    records: Iterable[Record],
    tokenizer: Tokenizer,
    *,
    types: Sequence[str],
    max_len: int,
    stride: int | None = None,
    max_span_width: int | None = None,
    truncate: bool = False,
    name: str = "split",
) -> PreparedSplit:
  """Tokenises every record once and cuts texts into windows of at most `max_len` tokens.

  A window holds W = max_len - num_prefix - num_suffix content tokens; consecutive windows start
  `stride` (default W // 2) apart and the last one ends at the text end. Entities whose char
  bounds are not token bounds are counted as misaligned and kept only in the gold set.
  truncate=True: one window per record, its first W tokens, as Su's scripts train (bert4keras'
  `tokenize(text, maxlen=maxlen)`); entities not wholly inside it count as lost_to_truncation (kept in the
  gold set), and the numbers of truncated records and dropped entities are logged.
  Raises ValueError on an entity type not in `types`. Uses `tokenizer.encode_batch(texts)` when
  the tokenizer has it (e.g. CharTokenizer), else `encode` per text. A task's window table (`table`) is its own:
  none here.
  """
  types = tuple(types)
  type_to_id = {t: i for i, t in enumerate(types)}
  if len(type_to_id) != len(types):
    raise ValueError(f"duplicate entity types in {types}")
  names = tuple(tokenizer.feature_names)
  P, S = int(tokenizer.num_prefix), int(tokenizer.num_suffix)
  W, stride = _check_args(tokenizer, max_len=max_len, stride=stride, max_span_width=max_span_width)

  tok = _tokenise(records, tokenizer, type_to_id=type_to_id, names=names, name=name)
  win = _cut_windows(tok.n_R, W=W, stride=stride, truncate=truncate)
  tok_E2 = _align(tok.token_ptr, tok.offsets_T2, tok.ent_record, tok.ent_char_E2)
  targets = _place_entities(tok, win, tok_E2, P=P, num_types=len(types), max_span_width=max_span_width)
  window_features = _window_features(tokenizer, tok, win, names=names)
  stats = _split_stats(tok, win, targets, W=W, truncate=truncate)
  if truncate:
    logging.info("prepare_split %s: truncate=True: %d of %d records cut to their first %d content tokens, "
                 "%d of %d entities dropped with the rest", name, stats.truncated_records, stats.records, W,
                 stats.lost_to_truncation, stats.entities)
  logging.info("prepare_split %s (max_len=%d, stride=%d): %s", name, max_len, stride, stats)

  i32 = lambda x: np.asarray(x, np.int32)  # noqa: E731
  window_len = win.content_len_N + P + S
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
      record_ids=tok.record_ids,
      token_ptr=tok.token_ptr,
      offsets_T2=tok.offsets_T2,
      window_record=i32(win.record_N),
      window_start=i32(win.start_N),
      window_content_len=i32(win.content_len_N),
      window_len=i32(window_len),
      window_ptr=_ptr(window_len),
      window_features=window_features,
      span_ptr=targets.span_ptr,
      spans_S3=targets.spans_S3,
      entity_record=i32(tok.ent_record),
      entity_char_E2=i32(tok.ent_char_E2).reshape(-1, 2),
      entity_type=i32(tok.ent_type),
      entity_token_E2=i32(tok_E2).reshape(-1, 2),
      entity_status=targets.status_E,
      stats=stats,
      texts=tok.texts,
  )
