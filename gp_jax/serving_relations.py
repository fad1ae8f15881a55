"""The relation task's host side: window hits -> triples -> records (numpy and gp_jax.data only, no flax).

`gp_jax.tasks.relations.RelationTask` (training, evaluation, predict from a workdir) and
`gp_jax.serving.ExportedPredictor` (an exported folder, which must not import flax) both call these, so a folder
and its workdir assemble the same hits into the same records.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import numpy as np

from gp_jax.data import merge, windows
from gp_jax.data.relations import OBJECT, ROLES, SUBJECT
from gp_jax.ops.relations import TRIPLE_COLUMNS, assemble_triples

log = logging.getLogger(__name__)

# (head hit, subject, object) candidates one row may take on the host. An untrained model decodes entities nearly
# everywhere, so its pointer hits join into ~R * L^2 * (entities per token)^2 candidates (minutes of Python per
# batch); such rows give no triples and are counted. A trained model's rows hold a few dozen.
MAX_CANDIDATES_PER_ROW = 1 << 15
TRIPLE_KEYS = ("window", "relation", "subject_type", "subject_start", "subject_end", "object_type", "object_start",
               "object_end")


def prepare(records, tokenizer, types, relation_types, **options):
  """`windows.prepare_split` with relations; the texts kept (`record_texts`) for the string form."""
  records = list(records)
  prepared = windows.prepare_split(records, tokenizer, types=types, relation_types=relation_types, **options)
  prepared.record_texts = tuple(r["text"] for r in records)
  return prepared


def triple_columns(triples_N8: np.ndarray, scores_N: np.ndarray, window_B: np.ndarray) -> dict[str, np.ndarray]:
  """`assemble_triples` rows -> window columns; filler rows dropped."""
  triples_N8 = np.asarray(triples_N8, np.int64).reshape(-1, len(TRIPLE_COLUMNS))
  window = window_B[triples_N8[:, 0]] if triples_N8.size else np.zeros(0, np.int64)
  keep = window >= 0
  out = {"window": window[keep].astype(np.int64)}
  for i, k in enumerate(TRIPLE_KEYS[1:], start=1):
    out[k] = triples_N8[keep, i]
  out["score"] = np.asarray(scores_N, np.float64)[keep]
  return out


def concat_columns(parts: Sequence[dict], keys) -> dict[str, np.ndarray]:
  if not parts:
    return {k: np.zeros(0, np.float64 if k == "score" else np.int64) for k in keys}
  return {k: np.concatenate([np.asarray(x[k]) for x in parts]) for k in keys}


def bounded_rows(entity_hits, head_hits, tail_hits, *, budget: int = MAX_CANDIDATES_PER_ROW):
  """(head hits, tail hits, rows dropped): the pointer hits of rows whose candidates for `ops.assemble_triples`
  (per head hit: entities starting at its subject token x entities starting at its object token) exceed `budget`
  removed; hits as `ops.relation_hits` gives them, trimmed to their counts."""
  trimmed = []
  for count, coords, scores in (entity_hits, head_hits, tail_hits):
    count, coords = int(count), np.asarray(coords)
    if count > len(coords):
      raise ValueError(f"{count} hits in a buffer of {len(coords)}: decode again with a buffer of at least {count}")
    coords, scores = coords[:count].astype(np.int64), np.asarray(scores)[:count]
    trimmed.append((coords, scores))
  (ec, _), (hc, hs), (tc, ts) = trimmed
  if not hc.size:
    return (0, hc, hs), (tc.shape[0], tc, ts), 0
  width = int(max(ec[:, 2].max(initial=0), hc[:, 2:].max(initial=0))) + 1
  rows = int(max(ec[:, 0].max(initial=0), hc[:, 0].max(), tc[:, 0].max(initial=0))) + 1
  starting = np.bincount(ec[:, 0] * width + ec[:, 2], minlength=rows * width)
  cand = starting[hc[:, 0] * width + hc[:, 2]] * starting[hc[:, 0] * width + hc[:, 3]]
  over = np.bincount(hc[:, 0], weights=cand, minlength=rows) > budget
  keep_h, keep_t = ~over[hc[:, 0]], ~over[tc[:, 0]] if tc.size else np.zeros(0, bool)
  return ((int(keep_h.sum()), hc[keep_h], hs[keep_h]), (int(keep_t.sum()), tc[keep_t], ts[keep_t]),
          int(over.sum()))


def window_hits(out) -> dict:
  """(entity hits, head hits, tail hits, window_index) -> {"entities": window hit columns, "triples": window
  triple columns}; hits as `ops.relation_hits` gives them (counts within their buffers)."""
  *hits, window_B = out
  window_B = np.asarray(window_B)
  ec, eco, es = int(hits[0][0]), np.asarray(hits[0][1]), np.asarray(hits[0][2])
  head, tail, dropped = bounded_rows(*hits)
  if dropped:
    log.warning("%d rows of a batch hold more than %d candidate triples (an untrained model's pointers fire "
                "nearly everywhere): no triples assembled for them", dropped, MAX_CANDIDATES_PER_ROW)
  triples, scores = assemble_triples(hits[0], head, tail)
  return {"entities": merge.batch_hits(window_B, eco[:ec], es[:ec]),
          "triples": triple_columns(triples, scores, window_B)}


def concat_hits(hits):
  return {"entities": merge.concat_hits([h["entities"] for h in hits]),
          "triples": concat_columns([h["triples"] for h in hits], TRIPLE_KEYS + ("score",))}


def role_mask(types, subject_type: np.ndarray, object_type: np.ndarray) -> np.ndarray:
  """True where a triple's entities hold their roles: when the entity types are the roles (`data.relations.ROLES`,
  CasRel-format corpora) a subject must be decoded as "subject" and an object as "object", as GPLinker decodes
  them; with any other types every pair holds."""
  if sorted(types) != sorted(ROLES):
    return np.ones(np.shape(subject_type), bool)
  types = list(types)
  return (subject_type == types.index(SUBJECT)) & (object_type == types.index(OBJECT))


def assemble(prepared, hits) -> list[dict]:
  """Per record {"entities": [entity dicts], "relations": [{"head", "tail", "type", "score"}]}, head and tail
  indexing the record's entities (a triple's entity that merging dropped is added with the triple's score); on a
  role-typed corpus only triples whose entities hold their roles (`role_mask`)."""
  p = prepared
  entities = merge.merge_predictions(p, hits["entities"])
  t = hits["triples"]
  w = t["window"]
  ok = (w >= 0) & (w < p.num_windows) & role_mask(p.types, t["subject_type"], t["object_type"])
  w = np.where(ok, w, 0)
  content_end = p.num_prefix + p.window_content_len[w]
  for k in ("subject_start", "subject_end", "object_start", "object_end"):
    ok &= (t[k] >= p.num_prefix) & (t[k] < content_end)
  sel = {k: v[ok] for k, v in t.items()}
  w = sel["window"]
  rec = p.window_record[w].astype(np.int64)
  to_content = p.window_start[w].astype(np.int64) - p.num_prefix
  first = np.minimum(sel["subject_start"], sel["object_start"]) + to_content
  last = np.maximum(sel["subject_end"], sel["object_end"]) + to_content
  own = merge.deciding_windows(p, record_M=rec, start_M=first, end_M=last) == w
  chars = {}
  for k in ("subject", "object"):
    c0 = sel[f"{k}_start"][own] + to_content[own] + p.token_ptr[rec[own]]
    c1 = sel[f"{k}_end"][own] + to_content[own] + p.token_ptr[rec[own]]
    chars[k] = (p.offsets_T2[c0, 0].tolist(), p.offsets_T2[c1, 1].tolist(), sel[f"{k}_type"][own].tolist())
  best: dict = {}
  for n, (r, rel, score) in enumerate(zip(rec[own].tolist(), sel["relation"][own].tolist(),
                                          sel["score"][own].tolist())):
    s = (chars["subject"][0][n], chars["subject"][1][n], p.types[chars["subject"][2][n]])
    o = (chars["object"][0][n], chars["object"][1][n], p.types[chars["object"][2][n]])
    key = (r, s, rel, o)
    if key not in best or score > best[key]:
      best[key] = score
  out = [{"entities": list(ents), "relations": []} for ents in entities]
  index = [{(e["start"], e["end"], e["type"]): i for i, e in enumerate(ents)} for ents in entities]
  rel_types = p.relations.types
  for (r, s, rel, o), score in sorted(best.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2], kv[0][3])):
    ids = []
    for e in (s, o):
      if e not in index[r]:
        index[r][e] = len(out[r]["entities"])
        out[r]["entities"].append({"start": e[0], "end": e[1], "type": e[2], "score": score})
      ids.append(index[r][e])
    out[r]["relations"].append({"head": ids[0], "tail": ids[1], "type": rel_types[rel], "score": score})
  return out


__all__ = ["MAX_CANDIDATES_PER_ROW", "TRIPLE_KEYS", "prepare", "triple_columns", "concat_columns", "bounded_rows",
           "window_hits", "concat_hits", "role_mask", "assemble"]
