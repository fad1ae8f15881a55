"""The relation task's host half: window hits -> triples -> records, the triple metric, the exported program's call
(numpy, gp_jax.data, gp_jax.ops, gp_jax.tasks.base and the task's window table only: no flax, orbax, ml_collections;
tests/test_import_graph.py checks it).

`gp_jax.tasks.relations.RelationTask` (training, evaluation, predict from a workdir) and `gp_jax.serving` (an
exported folder, reached through `tasks.host("relations")`) both call these, so a folder and its workdir assemble
the same hits into the same records.

The run's settings (`RunSpec.task_options`, written to an exported folder's manifest as "task_options") reach the
functions that need them as `options`: "roles" (the entity types that are the subject and object roles, subject
first, or (): any entity may take either side) and "match" (the triple form whose F1 selects checkpoints).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np

from gp_jax.data import merge
from gp_jax.data.relations import ROLES
from gp_jax.metrics import bucket_counts, overlap_kinds, per_record_counts, span_prf, triple_prf
from gp_jax.ops.relations import TRIPLE_COLUMNS, assemble_triples
from gp_jax.tasks.base import (RESULT_KEYS, capped_windows, concat_capped, output_records_of, pointers_run_exported,
                               trimmed, warn_capped)
from gp_jax.tasks.relations import table

log = logging.getLogger(__name__)

# The exported program (`gp_jax.tasks.pointer_export`): hit-buffer sizes are inputs, int32 [0, size] arrays (no
# data, only the shape) after the model's arrays and before threshold; each pointer returns (count, coords
# [size, 4], scores [size]) as `ops.relation_hits` gives them.
POINTERS = ("entity", "head", "tail")
BUFFERS = tuple(f"{k}_buffer" for k in POINTERS)
OUTPUT_FIELDS = ("entities", "relations")  # the fields `output_record` writes
OUTPUTS = tuple(f"{k}_{x}" for k in POINTERS for x in ("count", "coords", "scores"))

# (head hit, subject, object) candidates one row may take on the host. An untrained model decodes entities nearly
# everywhere, so its pointer hits join into ~R * L^2 * (entities per token)^2 candidates (minutes of Python per
# batch); such rows give no triples, and `assemble` names their records in one warning (a trained model on text
# unlike its training data may fire as widely). A trained model's rows hold a few dozen.
MAX_CANDIDATES_PER_ROW = 1 << 15
TRIPLE_KEYS = ("window", "relation", "subject_type", "subject_start", "subject_end", "object_type", "object_start",
               "object_end")
MATCHES = ("boundaries", "strict", "string")  # triple forms; options["match"] picks the selection F1's
OVERLAP_KINDS = ("normal", "seo", "epo")
TRIPLE_COUNTS = (("0", 0, 0), ("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5+", 5, None))


# ----------------------------------------------------------------------------- label space and settings


def labels_to_json(labels) -> list[str]:
  """The relation types, as the manifest's "labels" holds them."""
  return list(labels)


def labels_from_json(value) -> tuple[str, ...]:
  return tuple(value or ())


def manifest_settings(manifest: Mapping, types: Sequence[str]) -> tuple[tuple[str, ...], dict]:
  """(labels, options) of an exported folder's manifest and entity types. A folder written before "labels" holds
  its relation types under "relation_types", and its entities held their roles when its entity types were the
  CasRel roles (what that code decided from the type names)."""
  if "labels" in manifest:
    return labels_from_json(manifest["labels"]), dict(manifest.get("task_options") or {})
  roles = ROLES if sorted(types) == sorted(ROLES) else ()
  return labels_from_json(manifest.get("relation_types")), {"roles": roles}


def role_ids(types: Sequence[str], roles: Sequence[str]) -> tuple[set[int] | None, set[int] | None]:
  """(subject type ids, object type ids) for `ops.assemble_triples`; (None, None) without roles (any pair)."""
  if not roles:
    return None, None
  if not types:
    raise ValueError(f"roles {tuple(roles)} need the entity types to find their ids: pass types=")
  missing = [r for r in roles if r not in types]
  if len(roles) != 2 or missing:
    raise ValueError(f"roles {tuple(roles)}: expected (subject type, object type), two of the entity types "
                     f"{tuple(types)}")
  return {list(types).index(roles[0])}, {list(types).index(roles[1])}


# ----------------------------------------------------------------------------- prepared splits
# prepare(records, tokenizer, types, labels, **window_options): `windows.prepare_split` and the split's relation
# table of `labels` (the relation types) as `PreparedSplit.table` (`table.prepare`).
prepare = table.prepare


# ----------------------------------------------------------------------------- window hits


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


def _concat_columns(parts: Sequence[dict], keys) -> dict[str, np.ndarray]:
  if not parts:
    return {k: np.zeros(0, np.float64 if k == "score" else np.int64) for k in keys}
  return {k: np.concatenate([np.asarray(x[k]) for x in parts]) for k in keys}


def bounded_rows(entity_hits, head_hits, tail_hits, *, subject_types=None, object_types=None,
                 budget: int = MAX_CANDIDATES_PER_ROW):
  """(head hits, tail hits, the rows dropped: their indices, int64 [n]): the pointer hits of rows whose candidates
  for `ops.assemble_triples` (per head hit: the subjects starting at its subject token x the objects starting at its
  object token, each side of its role's types, None: any) exceed `budget` removed; hits as `ops.relation_hits`
  gives them, trimmed."""
  (ec, _), (hc, hs), (tc, ts) = (trimmed(h) for h in (entity_hits, head_hits, tail_hits))
  ec, hc, tc = (np.asarray(c, np.int64).reshape(-1, 4) for c in (ec, hc, tc))
  if not hc.size:
    return (0, hc, hs), (tc.shape[0], tc, ts), np.zeros(0, np.int64)
  width = int(max(ec[:, 2].max(initial=0), hc[:, 2:].max(initial=0))) + 1
  rows = int(max(ec[:, 0].max(initial=0), hc[:, 0].max(), tc[:, 0].max(initial=0))) + 1

  def starting(types):
    e = ec if types is None else ec[np.isin(ec[:, 1], sorted(types))]
    return np.bincount(e[:, 0] * width + e[:, 2], minlength=rows * width)

  cand = (starting(subject_types)[hc[:, 0] * width + hc[:, 2]] * starting(object_types)[hc[:, 0] * width + hc[:, 3]])
  over = np.bincount(hc[:, 0], weights=cand, minlength=rows) > budget
  keep_h, keep_t = ~over[hc[:, 0]], ~over[tc[:, 0]] if tc.size else np.zeros(0, bool)
  return ((int(keep_h.sum()), hc[keep_h], hs[keep_h]), (int(keep_t.sum()), tc[keep_t], ts[keep_t]),
          np.flatnonzero(over).astype(np.int64))


def window_hits(outputs, window_index, *, types: Sequence[str] = (), options: Mapping | None = None) -> dict:
  """(entity hits, head hits, tail hits) as `ops.relation_hits` gives them (counts within their buffers) and the
  batch's window index -> {"entities": window hit columns, "triples": window triple columns, "capped": the windows
  whose rows held more than MAX_CANDIDATES_PER_ROW candidates, so gave no triples (`assemble` names their records
  in the log)}. `types`: the entity types, which options["roles"] names (the subject and object sides; budget and
  join respect them)."""
  subject_types, object_types = role_ids(types, (options or {}).get("roles", ()))
  window_B = np.asarray(window_index)
  entity = trimmed(outputs[0])
  head, tail, rows = bounded_rows(*outputs, subject_types=subject_types, object_types=object_types,
                                  budget=MAX_CANDIDATES_PER_ROW)  # read at the call (tests lower it)
  triples, scores = assemble_triples((len(entity[0]), *entity), head, tail, subject_types=subject_types,
                                     object_types=object_types)
  return {"entities": merge.batch_hits(window_B, *entity), "triples": triple_columns(triples, scores, window_B),
          "capped": capped_windows(window_B, rows)}


def concat_hits(hits: Sequence[dict]) -> dict:
  return {"entities": merge.concat_hits([h["entities"] for h in hits]),
          "triples": _concat_columns([h["triples"] for h in hits], TRIPLE_KEYS + ("score",)),
          "capped": concat_capped(hits)}


# ----------------------------------------------------------------------------- records


def assemble(prepared, hits) -> list[dict]:
  """Per record {"entities": [entity dicts], "relations": [{"head", "tail", "type", "score"}], "decoded": n}: head
  and tail index the record's entities; the first n entities are the entity pointer's (merged over windows), a
  triple's entity that merging dropped is added after them with the triple's score."""
  p = prepared
  warn_capped(p, hits.get("capped", ()), what="relations",
              why=f"held more than {MAX_CANDIDATES_PER_ROW} candidate triples")
  entities = merge.merge_predictions(p, hits["entities"])
  t = hits["triples"]
  w = t["window"]
  ok = (w >= 0) & (w < p.num_windows)
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
  out = [{"entities": list(ents), "relations": [], "decoded": len(ents)} for ents in entities]
  index = [{(e["start"], e["end"], e["type"]): i for i, e in enumerate(ents)} for ents in entities]
  rel_types = p.table.types
  for (r, s, rel, o), score in sorted(best.items()):
    ids = []
    for e in (s, o):
      if e not in index[r]:
        index[r][e] = len(out[r]["entities"])
        out[r]["entities"].append({"start": e[0], "end": e[1], "type": e[2], "score": score})
      ids.append(index[r][e])
    out[r]["relations"].append({"head": ids[0], "tail": ids[1], "type": rel_types[rel], "score": score})
  return out


def _entity_rows(text: str, ents) -> list[dict]:
  return [{"start": int(e["start"]), "end": int(e["end"]), "type": e["type"], "text": text[int(e["start"]):int(e["end"])],
           "score": round(float(e["score"]), 4)} for e in ents]


def output_record(text: str, prediction: Mapping) -> dict:
  """The fields predict writes: {"entities": [{"start", "end", "type", "text", "score"}], "relations": [{"head",
  "tail", "type", "score"}]}, head and tail indexing "entities"."""
  return {"entities": _entity_rows(text, prediction["entities"]),
          "relations": [{"head": int(r["head"]), "tail": int(r["tail"]), "type": r["type"],
                         "score": round(float(r["score"]), 4)} for r in prediction["relations"]]}


output_records = output_records_of(output_record)  # each text's `output_record`: what predict writes for a chunk


# ----------------------------------------------------------------------------- the metric


def triples(p, predictions, form: str) -> tuple[set, set]:
  """(predicted, gold) triples of `form`, as (record, subject, object, relation type) tuples."""
  texts = p.texts

  def entity(r, a, b, etype):
    return {"boundaries": (a, b), "strict": (a, b, etype), "string": texts[r][a:b]}[form]

  pred = set()
  for r, x in enumerate(predictions):
    ents = x["entities"]
    for rel in x["relations"]:
      s, o = ents[rel["head"]], ents[rel["tail"]]
      pred.add((r, entity(r, s["start"], s["end"], s["type"]), entity(r, o["start"], o["end"], o["type"]),
                rel["type"]))
  t = p.table
  ch, et = p.entity_char_E2, p.entity_type
  gold = {(int(r), entity(int(r), int(ch[h, 0]), int(ch[h, 1]), p.types[et[h]]),
           entity(int(r), int(ch[o, 0]), int(ch[o, 1]), p.types[et[o]]), t.types[ty])
          for r, h, o, ty in zip(t.record.tolist(), t.head.tolist(), t.tail.tolist(), t.type.tolist())}
  return pred, gold


def breakdowns(num_records: int, pred, gold) -> tuple[dict, dict]:
  """tp / pred / gold by the gold sentence's overlap kinds (CasRel's: a sentence may be both SEO and EPO; its
  triples count in each) and by its number of gold triples ("0": sentences without gold, their false positives):
  a sentence's predictions count in its classes."""
  gold_by = [[] for _ in range(num_records)]
  for r, s, o, rel in gold:
    gold_by[r].append((s, rel, o))
  kinds = [overlap_kinds(g) for g in gold_by]
  return (bucket_counts(pred, gold, [sorted(k) for k in kinds], OVERLAP_KINDS),
          bucket_counts(pred, gold, [[lab for lab, lo, hi in TRIPLE_COUNTS if len(g) >= lo and (hi is None or
                                                                                            len(g) <= hi)]
                                     for g in gold_by], [lab for lab, *_ in TRIPLE_COUNTS]))


def score(prepared, predictions, *, options: Mapping | None = None) -> dict:
  """Triple P/R/F1 of the selection form (options["match"]; "f1" chooses checkpoints), per relation ("per_type"),
  micro and macro; every form under "triples"; the entity pointer's F1 under "entities" (the entities it decoded,
  not those assembly added from triples); by overlap kind and triples per sentence; per-record counts."""
  p = prepared
  match = (options or {}).get("match", "boundaries")
  if match not in MATCHES:
    raise ValueError(f"match must be one of {MATCHES}, got {match!r}")
  by_form = {f: triples(p, predictions, f) for f in MATCHES}
  pred, gold = by_form[match]
  result = triple_prf(pred, gold)
  result["match"] = match
  result["triples"] = {f: {k: v for k, v in span_prf(*by_form[f]).items() if k in RESULT_KEYS} for f in MATCHES}
  ent_pred = {(r, int(e["start"]), int(e["end"]), str(e["type"])) for r, x in enumerate(predictions)
              for e in x["entities"][:x["decoded"]]}
  ents = span_prf(ent_pred, merge.gold_spans(p))
  result["entities"] = {k: ents[k] for k in RESULT_KEYS}
  result["per_record"] = per_record_counts(pred, gold, p.num_records)
  result["by_overlap"], result["by_triples"] = breakdowns(p.num_records, pred, gold)
  return result


# ----------------------------------------------------------------------------- the exported program


run_exported = pointers_run_exported(POINTERS)


__all__ = ["POINTERS", "BUFFERS", "OUTPUTS", "MAX_CANDIDATES_PER_ROW", "TRIPLE_KEYS", "MATCHES", "OVERLAP_KINDS",
           "TRIPLE_COUNTS", "labels_to_json", "labels_from_json", "manifest_settings", "role_ids", "prepare",
           "triple_columns", "bounded_rows", "window_hits", "concat_hits", "assemble", "output_record",
           "output_records", "OUTPUT_FIELDS", "triples", "breakdowns", "score", "run_exported"]
