"""The relation task's window table: every gold relation of a split, and the relations each window holds.

Built from the records and the split's public fields (`windows.PreparedSplit`: entity tokens and statuses, windows),
so `data.windows` knows no task. A window holds a relation when it holds both its entities whole; one that no window
holds (split across windows) stays in the gold table and is counted. NumPy only: the host half (`host.prepare`)
builds it too.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np

from gp_jax.data import windows
from gp_jax.data.windows import DUPLICATE, LOST, MISALIGNED, OK, TOO_LONG, _ptr, _ranges


@dataclasses.dataclass
class RelationTable:
  """Gold relations of a split (document level) and the relation targets of each window (`PreparedSplit.table`)."""

  types: tuple[str, ...]
  record: np.ndarray  # int32 [G] record of each gold relation
  head: np.ndarray  # int32 [G] subject: index into the split's entity table
  tail: np.ndarray  # int32 [G] object: index into the split's entity table
  type: np.ndarray  # int32 [G] relation type id
  status: np.ndarray  # int8 [G]: OK / MISALIGNED / TOO_LONG (an entity's) / DUPLICATE / LOST (split)
  ptr: np.ndarray  # int64 [N + 1] rows of pairs_Q5 per window
  # (subject start, subject end, object start, object end, type) in window tokens, ends inclusive, sorted.
  pairs_Q5: np.ndarray  # int32 [Q, 5]
  # relations = relation_targets + relations_misaligned + relations_too_long + relation_duplicates + relations_split;
  # max_relations_per_type: most targets of one type in one window (results.json's split_stats).
  stats: dict = dataclasses.field(default_factory=dict)

  def window_relations(self, w: int) -> np.ndarray:
    """int32 [q, 5] (subject start, end, object start, end (inclusive), type id) targets of window `w`."""
    return self.pairs_Q5[self.ptr[w]:self.ptr[w + 1]]


def read_relations(records: Sequence, p: windows.PreparedSplit, types: tuple[str, ...]):
  """The records' relations -> (record, head, tail, type) int64 arrays, head and tail indexing the split's entity
  table; an unknown type or an index outside the record's entities is refused (ValueError)."""
  type_to_id = {t: i for i, t in enumerate(types)}
  if len(type_to_id) != len(types):
    raise ValueError(f"duplicate relation types in {types}")
  counts = np.bincount(p.entity_record, minlength=p.num_records)
  first = _ptr(counts)
  rows = []
  for r, rec in enumerate(records):
    rid, n = p.record_ids[r], int(counts[r])
    for rel in rec.get("relations", ()):
      t = type_to_id.get(rel["type"])
      if t is None:
        raise ValueError(f"{p.name}: record {rid!r} has relation type {rel['type']!r}, not one of {types}")
      if not (0 <= rel["head"] < n and 0 <= rel["tail"] < n):
        raise ValueError(f"{p.name}: record {rid!r} has a relation ({rel['head']}, {rel['tail']}) outside its "
                         f"{n} entities")
      rows.append((r, first[r] + rel["head"], first[r] + rel["tail"], t))
  out = np.asarray(rows, np.int64).reshape(-1, 4)
  return out[:, 0], out[:, 1], out[:, 2], out[:, 3]


def relation_table(records: Sequence, p: windows.PreparedSplit, types: Sequence[str]) -> RelationTable:
  """Classifies every gold relation of `records` (prepared as `p`) and lists the relations of each window, in
  window tokens."""
  types = tuple(types)
  rec, head, tail, rtype = read_relations(records, p, types)
  tok_E2 = p.entity_token_E2.astype(np.int64)
  status_E = p.entity_status
  nwin_R = np.bincount(p.window_record, minlength=p.num_records).astype(np.int64)
  first_R = _ptr(nwin_R)
  start_N, content_N = p.window_start.astype(np.int64), p.window_content_len.astype(np.int64)
  G = rec.shape[0]
  status = np.full(G, OK, np.int8)
  for s in (TOO_LONG, MISALIGNED):  # an entity's status, MISALIGNED first
    status[(status_E[head] == s) | (status_E[tail] == s)] = s
  cand = np.nonzero(status == OK)[0]
  if cand.size:  # same record, type and token spans as an earlier relation: kept once
    key = np.stack([rec[cand], rtype[cand], tok_E2[head[cand], 0], tok_E2[head[cand], 1], tok_E2[tail[cand], 0],
                    tok_E2[tail[cand], 1]], 1)
    order = np.lexsort((cand, *key.T[::-1]))
    dup = np.zeros(cand.size, bool)
    dup[1:] = (key[order][1:] == key[order][:-1]).all(1)
    status[cand[order][dup]] = DUPLICATE
    cand = np.sort(cand[order][~dup])
  # Every (candidate relation, window of its record) pair; keep the windows that hold both entities whole.
  pair_n = nwin_R[rec[cand]]
  pair_g = np.repeat(cand, pair_n)
  pair_w = _ranges(first_R[rec[cand]], pair_n)
  ws, we = start_N[pair_w], start_N[pair_w] + content_N[pair_w]
  h, t = head[pair_g], tail[pair_g]
  inside = (tok_E2[h, 0] >= ws) & (tok_E2[h, 1] < we) & (tok_E2[t, 0] >= ws) & (tok_E2[t, 1] < we)
  pair_g, pair_w = pair_g[inside], pair_w[inside]
  held = np.zeros(G, bool)
  held[pair_g] = True
  status[cand[~held[cand]]] = LOST
  off = (p.num_prefix - start_N[pair_w])[:, None]
  h, t = head[pair_g], tail[pair_g]
  cols = np.concatenate([tok_E2[h] + off, tok_E2[t] + off, rtype[pair_g][:, None]], 1)
  order = np.lexsort((*cols[:, :4].T[::-1], cols[:, 4], pair_w))
  per_type = np.bincount(pair_w * max(len(types), 1) + cols[:, 4]) if pair_w.size else np.zeros(1, np.int64)
  count = lambda s: int(np.sum(status == s))  # noqa: E731
  stats = dict(relations=G, relation_targets=count(OK), relations_misaligned=count(MISALIGNED),
               relations_too_long=count(TOO_LONG), relation_duplicates=count(DUPLICATE), relations_split=count(LOST),
               max_relations_per_type=int(per_type.max()))
  logging.info("prepare_split %s: %d relations of %d types: %d targets, %d misaligned, %d too long, %d duplicates, "
               "%d split across windows (most of one type in a window: %d)", p.name, G, len(types),
               *(stats[k] for k in ("relation_targets", "relations_misaligned", "relations_too_long",
                                    "relation_duplicates", "relations_split", "max_relations_per_type")))
  i32 = lambda x: np.asarray(x, np.int32)  # noqa: E731
  return RelationTable(types=types, record=i32(rec), head=i32(head), tail=i32(tail), type=i32(rtype), status=status,
                       ptr=_ptr(np.bincount(pair_w, minlength=p.num_windows)),
                       pairs_Q5=i32(cols[order]).reshape(-1, 5), stats=stats)


def prepare(records, tokenizer, types, labels, **window_options) -> windows.PreparedSplit:
  """`windows.prepare_split` and its relation table of `labels` (the relation types) as `PreparedSplit.table`."""
  records = list(records)
  p = windows.prepare_split(records, tokenizer, types=types, **window_options)
  return dataclasses.replace(p, table=relation_table(records, p, labels))


__all__ = ["RelationTable", "read_relations", "relation_table", "prepare"]
