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

import numpy as np

from gp_jax import serving_relations, storage
from gp_jax.data import merge
from gp_jax.data.sources import relation_types as union_relation_types
from gp_jax.data.windows import _ranges
from gp_jax.metrics import per_record_counts, span_prf, triple_prf
from gp_jax.tasks.base import grown_sizes
# The host side lives in serving_relations (no flax: an exported folder's predictor uses it too).
from gp_jax.serving_relations import MAX_CANDIDATES_PER_ROW, bounded_rows  # noqa: F401
from gp_jax.tasks.entities import RESULT_KEYS

RELATION_TYPES_FILE = "relation_types.json"  # a task=relations workdir's relation types, beside types.json
MATCHES = ("boundaries", "strict", "string")  # triple forms; `RelationTask.match` picks the selection F1's
OVERLAP_KINDS = ("normal", "seo", "epo")
TRIPLE_COUNTS = (("1", 1, 1), ("2", 2, 2), ("3", 3, 3), ("4", 4, 4), ("5+", 5, None))


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

  @classmethod
  def from_spec(cls, spec) -> RelationTask:
    return cls(match=spec.triple_match)

  def relation_types(self, *, train, dev, test):
    return union_relation_types(train=train, dev=dev, test=test)

  def split_relation_types(self, prepared) -> tuple[str, ...]:
    return tuple(prepared.relations.types)

  def prepare(self, records, tokenizer, types, relation_types, **options):
    """`windows.prepare_split` with relations; the texts kept (`record_texts`) for the string form."""
    return serving_relations.prepare(records, tokenizer, types, relation_types, **options)

  @staticmethod
  def batch_targets(p, rows, w, span_ids_BHK, L):
    return relation_targets(p, rows, w, span_ids_BHK, L)

  def target_shapes(self, *, num_types: int, num_relations: int, batch: int, length: int) -> dict[str, tuple]:
    return {"entity_ids": (batch, num_types, length), "head_ids": (batch, num_relations, length),
            "tail_ids": (batch, num_relations, length)}

  def build_model(self, encoder, *, head: str, num_types: int, num_relations: int, feature_names, tag_scheme: str,
                  loss_implementation: str, head_size: int, use_rope: bool, pointer_rope: bool,
                  max_span_width, dtype, rngs):
    from gp_jax.models.gplinker import GPLinkerHead  # the model side imports flax here only (see entities)
    from gp_jax.models.heads import HEADS
    from gp_jax.models.ner import RelationModel

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
    return serving_relations.window_hits(out)

  def concat_hits(self, hits):
    return serving_relations.concat_hits(hits)

  # Host: records, metric, results.
  def assemble(self, prepared, hits) -> list[dict]:
    """Per record {"entities": [entity dicts], "relations": [{"head", "tail", "type", "score"}]}, head and tail
    indexing the record's entities (`serving_relations.assemble`)."""
    return serving_relations.assemble(prepared, hits)

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
    from gp_jax.models.gplinker import GPLinkerHead

    return {"pointer_loss": GPLinkerHead.pointer_loss_path}


TASK = RelationTask

__all__ = ["TASK", "RelationTask", "relation_targets", "bounded_rows", "overlap_kind", "save_relation_types",
           "load_relation_types", "MATCHES", "MAX_CANDIDATES_PER_ROW", "RELATION_TYPES_FILE"]
