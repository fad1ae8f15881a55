"""Model hits per window -> character spans per record, and the span sets that `span_prf` scores.

Flow: decoded batch coordinates -> `batch_hits` (window-token hits; the jitted eval step maps rows to windows
on device) -> `concat_hits`
-> `merge_predictions` (char spans per record) -> `prediction_spans` / `gold_spans`
-> `gp_jax.metrics.span_prf`. Coordinates as in `gp_jax.data.windows`.

Overlapping windows (the most central window decides). A record longer than one window is seen
by several overlapping windows, and a span near a window edge is judged with little context on
one side. Each span (record, token start, token end, type) is therefore decided by one window:
among the windows that hold the span's tokens whole, the one maximising
min(content tokens left of the span, content tokens right of it) inside the window, where a
window edge at the start or end of the document counts as unlimited context; ties go to the
earlier window. The span is predicted iff that window predicted it, with that window's score.
A span that only an edge window fires on is dropped when the window where it sits in the middle
rejects it. A record with one window is unaffected.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from gp_jax.data.windows import PreparedSplit, _ranges

_HIT_KEYS = ("window", "start", "end", "type", "score")


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
  """Joins the hit columns of several batches."""
  if not hits:
    return {k: np.zeros(0, np.float64 if k == "score" else np.int64) for k in _HIT_KEYS}
  return {k: np.concatenate([np.asarray(h[k]) for h in hits]) for k in _HIT_KEYS}


def _hit_columns(hits):
  if isinstance(hits, Mapping):
    cols = [np.asarray(hits[k]) for k in _HIT_KEYS[:4]]
    score = np.asarray(hits.get("score", np.ones(cols[0].shape[0])), np.float64)
  else:
    a = np.asarray(list(hits) if not isinstance(hits, np.ndarray) else hits, np.float64)
    a = a.reshape(-1, 5) if a.size else np.zeros((0, 5))
    cols, score = [a[:, i] for i in range(4)], a[:, 4]
  return [c.astype(np.int64).reshape(-1) for c in cols], score.reshape(-1)


def deciding_windows(prepared: PreparedSplit, *, record_M: np.ndarray, start_M: np.ndarray,
                     end_M: np.ndarray) -> np.ndarray:
  """int64 [M]: the window that decides each span (record, content start, content end inclusive).

  Every span must lie inside some window of its record (true for any hit inside a window's
  content). Uses that windows are sorted by (record, start) and a record's windows share one
  content length (see `gp_jax.data.windows`), so the candidates form a contiguous run.
  """
  p = prepared
  M = record_M.shape[0]
  if M == 0:
    return np.zeros(0, np.int64)
  rec_N = p.window_record.astype(np.int64)
  start_N = p.window_start.astype(np.int64)
  clen_N = p.window_content_len.astype(np.int64)
  big = int(start_N.max(initial=0)) + int(end_M.max(initial=0)) + 2
  key_N = rec_N * big + start_N  # ascending
  first_M = np.searchsorted(rec_N, record_M, side="left")
  W_M = clen_N[first_M]  # content length of this record's windows
  # Candidates v: end_M - W + 1 <= start_v <= start_M.
  lo_M = np.searchsorted(key_N, record_M * big + np.maximum(end_M - W_M + 1, 0), side="left")
  hi_M = np.searchsorted(key_N, record_M * big + start_M, side="right")
  count_M = hi_M - lo_M
  if (count_M < 1).any():
    raise ValueError(f"{p.name}: a span lies in no window of its record")
  pair_h = np.repeat(np.arange(M, dtype=np.int64), count_M)
  pair_v = _ranges(lo_M, count_M)
  n_tok = (p.token_ptr[1:] - p.token_ptr[:-1]).astype(np.int64)
  vs, ve = start_N[pair_v], start_N[pair_v] + clen_N[pair_v]  # window content [vs, ve)
  unlimited = np.iinfo(np.int64).max
  left = np.where(vs == 0, unlimited, start_M[pair_h] - vs)
  right = np.where(ve == n_tok[record_M[pair_h]], unlimited, ve - 1 - end_M[pair_h])
  context = np.minimum(left, right)
  # Per hit: the most context, then the earliest window.
  order = np.lexsort((pair_v, -context, pair_h))
  best = order[np.searchsorted(pair_h[order], np.arange(M), side="left")]
  return pair_v[best]


def merge_predictions(prepared: PreparedSplit, hits) -> list[list[dict[str, Any]]]:
  """Window hits -> per record, entity dicts {"start", "end", "type", "score"} in char offsets.

  `hits`: (window_index, start_tok, end_tok, type_id, score) tuples or an array [M, 5], or
  columns {"window", "start", "end", "type", "score"} (`concat_hits`), in window-token
  coordinates. A hit is kept only when its window is the span's deciding window (module doc).
  Hits outside a window's content tokens are dropped (counted in a warning); hits that map to
  the same char span and type are kept once with the highest score.
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
  to_content = p.window_start[w].astype(np.int64) - p.num_prefix
  c_start, c_end = s + to_content, e + to_content  # content tokens of the record
  own = deciding_windows(p, record_M=rec, start_M=c_start, end_M=c_end) == w
  rec, c_start, c_end, t, score = rec[own], c_start[own], c_end[own], t[own], score[own]
  start = p.offsets_T2[c_start + p.token_ptr[rec], 0].astype(np.int64)
  end = p.offsets_T2[c_end + p.token_ptr[rec], 1].astype(np.int64)
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
