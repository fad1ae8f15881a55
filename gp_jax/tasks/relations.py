"""The relation task (GPLinker, Su 2022): entity, head and tail pointers over one encoder; triple P/R/F1.

Batch targets as flat ids, -1 padded, K = L as `span_ids`: `entity_ids [B, E, K]` (the entity types' (start, end)
cells: the entity task's `span_ids`), `head_ids [B, R, K]` (subject start * L + object start) and `tail_ids
[B, R, K]` (subject end * L + object end), one id per cell (two triples sharing a cell give it once). Decoding fills
three hit buffers, grown each on its own; triples are assembled on the host (`ops.assemble_triples`) and merged
over windows: a triple counts where the window that decides the span from its first to its last token (as
`merge` decides entities) found it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import numpy as np

from gp_jax import storage
from gp_jax.data import merge, windows
from gp_jax.data.sources import relation_types as union_relation_types
from gp_jax.data.windows import _ranges
from gp_jax.metrics import per_record_counts, span_prf, triple_prf
from gp_jax.models.gplinker import GPLinkerHead
from gp_jax.models.heads import HEADS
from gp_jax.models.ner import RelationModel
from gp_jax.ops.relations import TRIPLE_COLUMNS, assemble_triples, grown_sizes
from gp_jax.tasks.entities import RESULT_KEYS

log = logging.getLogger(__name__)

RELATION_TYPES_FILE = "relation_types.json"  # a task=relations workdir's relation types, beside types.json
# (head hit, subject, object) candidates one row may take on the host. An untrained model decodes entities nearly
# everywhere, so its pointer hits join into ~R * L^2 * (entities per token)^2 candidates (minutes of Python per
# batch); such rows give no triples and are counted. A trained model's rows hold a few dozen.
MAX_CANDIDATES_PER_ROW = 1 << 15
MATCHES = ("boundaries", "strict", "string")  # triple forms; `RelationTask.match` picks the selection F1's
OVERLAP_KINDS = ("normal", "seo", "epo")
TRIPLE_COUNTS = (("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5+", 5, None))
_TRIPLE_KEYS = ("window", "relation", "subject_type", "subject_start", "subject_end", "object_type", "object_start",
                "object_end")


def relation_targets(p, rows: np.ndarray, w: np.ndarray, span_ids_BHK: np.ndarray, L: int) -> tuple[dict, int]:
  """The relation batch's targets for the rows `rows` holding windows `w` (`data.batching._Assembler`) -> (targets,
  ids dropped beyond K = L of one relation in one window)."""
  B = span_ids_BHK.shape[0]
  table = p.relations
  if table is None:
    raise ValueError(f"{p.name} was prepared without relation types")
  R = len(table.types)
  n = table.ptr[w + 1] - table.ptr[w]
  q = table.pairs_Q5[_ranges(table.ptr[w], n)].astype(np.int64)
  row = np.repeat(rows, n).astype(np.int64)
  out, over = {"entity_ids": span_ids_BHK}, 0
  for name, a, b in (("head_ids", 0, 2), ("tail_ids", 1, 3)):
    key = np.unique(np.stack([row, q[:, 4], q[:, a] * L + q[:, b]], 1).reshape(-1, 3), axis=0)
    group = key[:, 0] * max(R, 1) + key[:, 1]
    rank = np.arange(group.shape[0]) - np.searchsorted(group, group, side="left")
    keep = rank < L
    ids = np.full((B, R, L), -1, np.int32)
    ids[key[keep, 0], key[keep, 1], rank[keep]] = key[keep, 2]
    out[name] = ids
    over += int((~keep).sum())
  return out, over


def _triple_columns(triples_N8: np.ndarray, scores_N: np.ndarray, window_B: np.ndarray) -> dict[str, np.ndarray]:
  """`assemble_triples` rows -> window columns; filler rows dropped."""
  triples_N8 = np.asarray(triples_N8, np.int64).reshape(-1, len(TRIPLE_COLUMNS))
  window = window_B[triples_N8[:, 0]] if triples_N8.size else np.zeros(0, np.int64)
  keep = window >= 0
  out = {"window": window[keep].astype(np.int64)}
  for i, k in enumerate(_TRIPLE_KEYS[1:], start=1):
    out[k] = triples_N8[keep, i]
  out["score"] = np.asarray(scores_N, np.float64)[keep]
  return out


def _concat_columns(parts: Sequence[dict], keys) -> dict[str, np.ndarray]:
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


def save_relation_types(workdir, relation_types) -> None:
  """Writes workdir/relation_types.json (nothing for none: an entity workdir has no such file)."""
  if relation_types:
    storage.write_json(storage.path(workdir) / RELATION_TYPES_FILE, list(relation_types))


def load_relation_types(workdir) -> tuple[str, ...]:
  """The relation types a task=relations run trained on; () for an entity workdir."""
  path = storage.path(workdir) / RELATION_TYPES_FILE
  return tuple(json.loads(path.read_text())) if path.exists() else ()


def overlap_kind(triples) -> str:
  """CasRel's classes of a sentence's gold triples (spans as keys): "epo" when two triples share their entity pair,
  else "seo" when two share an entity, else "normal"."""
  pairs = [(s, o) for s, _, o in triples]
  if len(set(frozenset(x) for x in pairs)) < len(pairs):
    return "epo"
  entities = [e for pair in set(pairs) for e in pair]
  return "seo" if len(entities) != len(set(entities)) else "normal"


class RelationTask:
  """Relations: what the trainer, the steps, the compiler and evaluation call for `task=relations`.

  `match`: the triple form whose F1 selects checkpoints ("string" on CasRel-format corpora, else "boundaries").
  """

  name = "relations"
  threshold_refusal = "task=relations decodes three pointers at one threshold; tuning it is not built"

  def __init__(self, match: str = "boundaries"):
    if match not in MATCHES:
      raise ValueError(f"match must be one of {MATCHES}, got {match!r}")
    self.match = match

  def relation_types(self, *, train, dev, test):
    return union_relation_types(train=train, dev=dev, test=test)

  def split_relation_types(self, prepared) -> tuple[str, ...]:
    return tuple(prepared.relations.types)

  def prepare(self, records, tokenizer, types, relation_types, **options):
    """`windows.prepare_split` with relations; the texts kept (`record_texts`) for the string form."""
    records = list(records)
    prepared = windows.prepare_split(records, tokenizer, types=types, relation_types=relation_types, **options)
    prepared.record_texts = tuple(r["text"] for r in records)
    return prepared

  @staticmethod
  def batch_targets(p, rows, w, span_ids_BHK, L):
    return relation_targets(p, rows, w, span_ids_BHK, L)

  def target_shapes(self, *, num_types: int, num_relations: int, batch: int, length: int) -> dict[str, tuple]:
    return {"entity_ids": (batch, num_types, length), "head_ids": (batch, num_relations, length),
            "tail_ids": (batch, num_relations, length)}

  def build_model(self, encoder, *, head: str, num_types: int, num_relations: int, feature_names, tag_scheme: str,
                  loss_implementation: str, head_size: int, use_rope: bool, pointer_rope: bool,
                  max_span_width, dtype, rngs):
    if head not in HEADS:
      raise ValueError(f"task=relations: model.head must be one of {sorted(HEADS)}, got {head!r}")
    module = GPLinkerHead(encoder.hidden_size, num_types, num_relations, head_size=head_size,
                          efficient=head == "efficient", use_rope=use_rope, pointer_rope=pointer_rope,
                          max_span_width=max_span_width, dtype=dtype, rngs=rngs)
    return RelationModel(encoder, module, feature_names, loss_implementation=loss_implementation)

  # Device decoding: three hit buffers (entity, head, tail).
  def initial_hits(self, batch_size: int) -> tuple[int, int, int]:
    size = max(64, batch_size * 32)
    return (size, size, size)

  def hit_counts(self, out) -> tuple[int, ...]:
    return tuple(int(h[0]) for h in out[:3])

  def grown(self, size, counts):
    return grown_sizes(size, counts)

  def window_hits(self, out) -> dict:
    """Eval step outputs -> {"entities": window hit columns, "triples": window triple columns}."""
    *hits, window_B = out
    window_B = np.asarray(window_B)
    ec, eco, es = int(hits[0][0]), np.asarray(hits[0][1]), np.asarray(hits[0][2])
    head, tail, dropped = bounded_rows(*hits)
    if dropped:
      log.warning("%d rows of a batch hold more than %d candidate triples (an untrained model's pointers fire "
                  "nearly everywhere): no triples assembled for them", dropped, MAX_CANDIDATES_PER_ROW)
    triples, scores = assemble_triples(hits[0], head, tail)
    return {"entities": merge.batch_hits(window_B, eco[:ec], es[:ec]),
            "triples": _triple_columns(triples, scores, window_B)}

  def concat_hits(self, hits):
    return {"entities": merge.concat_hits([h["entities"] for h in hits]),
            "triples": _concat_columns([h["triples"] for h in hits], _TRIPLE_KEYS + ("score",))}

  # Host: records, metric, results.
  def assemble(self, prepared, hits) -> list[dict]:
    """Per record {"entities": [entity dicts], "relations": [{"head", "tail", "type", "score"}]}, head and tail
    indexing the record's entities (a triple's entity that merging dropped is added with the triple's score)."""
    p = prepared
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

  def triples(self, p, predictions, form: str) -> tuple[set, set]:
    """(predicted, gold) triples of `form`, as (record, subject, object, relation type) tuples."""
    texts = getattr(p, "record_texts", None)
    if form == "string" and texts is None:
      raise ValueError(f"{p.name}: the string form needs the texts (prepare with RelationTask.prepare)")

    def entity(r, a, b, etype):
      return {"boundaries": (a, b), "strict": (a, b, etype), "string": texts[r][a:b] if texts else None}[form]

    pred = set()
    for r, x in enumerate(predictions):
      ents = x["entities"]
      for rel in x["relations"]:
        s, o = ents[rel["head"]], ents[rel["tail"]]
        pred.add((r, entity(r, s["start"], s["end"], s["type"]), entity(r, o["start"], o["end"], o["type"]),
                  rel["type"]))
    t = p.relations
    ch, et = p.entity_char_E2, p.entity_type
    gold = {(int(r), entity(int(r), int(ch[h, 0]), int(ch[h, 1]), p.types[et[h]]),
             entity(int(r), int(ch[o, 0]), int(ch[o, 1]), p.types[et[o]]), t.types[ty])
            for r, h, o, ty in zip(t.record.tolist(), t.head.tolist(), t.tail.tolist(), t.type.tolist())}
    return pred, gold

  def score(self, prepared, predictions) -> dict:
    """Triple P/R/F1 of the selection form (`match`; "f1" chooses checkpoints), per relation ("per_type"), micro and
    macro; every form under "triples"; entity F1 under "entities"; by overlap kind and triples per sentence (gold
    triples' sentences); per-record counts."""
    p = prepared
    forms = [f for f in MATCHES if f != "string" or getattr(p, "record_texts", None) is not None]
    by_form = {f: self.triples(p, predictions, f) for f in forms}
    pred, gold = by_form[self.match]
    result = triple_prf(pred, gold)
    result["match"] = self.match
    result["triples"] = {f: {k: v for k, v in span_prf(*by_form[f]).items() if k in RESULT_KEYS} for f in forms}
    ent_pred = {(r, int(e["start"]), int(e["end"]), str(e["type"])) for r, x in enumerate(predictions)
                for e in x["entities"]}
    ents = span_prf(ent_pred, merge.gold_spans(p))
    result["entities"] = {k: ents[k] for k in RESULT_KEYS}
    result["per_record"] = per_record_counts(pred, gold, p.num_records)
    result["by_overlap"], result["by_triples"] = self.breakdowns(p, pred, gold)
    return result

  def breakdowns(self, p, pred, gold) -> tuple[dict, dict]:
    """tp / pred / gold by the gold sentence's overlap kind and by its number of gold triples (CasRel, TPLinker):
    a sentence's predictions count in its class."""
    gold_by = [[] for _ in range(p.num_records)]
    for x in gold:
      gold_by[x[0]].append((x[1], x[3], x[2]))
    kind = [overlap_kind(g) for g in gold_by]
    count = [len(g) for g in gold_by]
    overlap = {k: {"tp": 0, "pred": 0, "gold": 0} for k in OVERLAP_KINDS}
    by_count = {label: {"tp": 0, "pred": 0, "gold": 0} for label, *_ in TRIPLE_COUNTS}

    def label_of(n):
      return next((lab for lab, lo, hi in TRIPLE_COUNTS if n >= lo and (hi is None or n <= hi)), None)

    for field, triples in (("gold", gold), ("pred", pred), ("tp", pred & gold)):
      for x in triples:
        r = x[0]
        overlap[kind[r]][field] += 1
        lab = label_of(count[r])
        if lab is not None:
          by_count[lab][field] += 1
    return overlap, by_count

  def final_fields(self, result: dict) -> dict:
    return dict({k: result[k] for k in RESULT_KEYS}, per_type=result["per_type"], per_record=result["per_record"],
                match=result["match"], macro_f1=result["macro_f1"], triples=result["triples"],
                entities=result["entities"], by_overlap=result["by_overlap"], by_triples=result["by_triples"])

  def result_lines(self, result: dict) -> list[str]:
    """Every triple form, macro F1 and the entity F1 beside the selection F1."""
    forms = ", ".join(f"{f} {v['f1']:.4f}" for f, v in result["triples"].items())
    return [f"triple F1 by form: {forms} (selection: {result['match']}); macro over relations {result['macro_f1']:.4f}; "
            f"entity F1 {result['entities']['f1']:.4f}"]

  def resolved_choices(self) -> dict:
    """The head and tail pointers' loss path (the blockwise plan covers the upper triangle only)."""
    return {"pointer_loss": GPLinkerHead.pointer_loss_path}


__all__ = ["RelationTask", "relation_targets", "bounded_rows", "overlap_kind", "save_relation_types",
           "load_relation_types", "MATCHES", "MAX_CANDIDATES_PER_ROW", "RELATION_TYPES_FILE"]
