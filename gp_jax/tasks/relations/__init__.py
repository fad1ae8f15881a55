"""The relation task (GPLinker, Su 2022): entity, head and tail pointers over one encoder; triple P/R/F1 (model side;
the host half, `host`, assembles and scores; the window table is `table`).

Batch targets as flat ids, -1 padded, K = L as `span_ids`: `entity_ids [B, E, K]` (the entity types' (start, end)
cells: the entity task's `span_ids`), `head_ids [B, R, K]` (subject start * L + object start) and `tail_ids
[B, R, K]` (subject end * L + object end), one id per cell (two triples sharing a cell give it once). Decoding fills
three hit buffers, grown each on its own; triples are assembled on the host (`ops.assemble_triples`) and merged
over windows: a triple counts where the window that decides the span from its first to its last token (as
`merge` decides entities) found it.
"""

from __future__ import annotations

import numpy as np

from gp_jax.data.sources import relation_types as union_relation_types
from gp_jax.data.windows import _ranges
from gp_jax.errors import UserError
from gp_jax.tasks.base import (RESULT_KEYS, PointerTask, count_missing_key, load_label_file, pointer_config_refusal,
                               save_label_file)
from gp_jax.tasks.relations import host, table

RELATION_TYPES_FILE = "relation_types.json"  # a task=relations workdir's relation types, beside types.json


def relation_targets(p, rows: np.ndarray, w: np.ndarray, span_ids_BHK: np.ndarray, L: int) -> tuple[dict, int]:
  """The relation batch's targets for the rows `rows` holding windows `w` (`data.batching._Assembler`) -> (targets,
  ids dropped beyond K = L of one relation in one window)."""
  B = span_ids_BHK.shape[0]
  t = p.table  # `table.RelationTable`
  R = len(t.types)
  n = t.ptr[w + 1] - t.ptr[w]
  q = t.pairs_Q5[_ranges(t.ptr[w], n)].astype(np.int64)
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


def check_roles(roles, entity_types) -> None:
  """UserError unless `roles` (data.roles, or the corpus's) are two of the data's `entity_types` ((): no roles)."""
  missing = [r for r in roles if r not in entity_types]
  if missing:
    types = list(entity_types)
    example = f" (e.g. data.roles={types[0]},{types[1]})" if len(types) > 1 else ""
    what = "is not an entity type" if len(missing) == 1 else "are not entity types"
    raise UserError(f"data.roles={','.join(roles)}: {', '.join(map(repr, missing))} {what} of the data "
                    f"{tuple(types)}: expected the subject's then the object's entity type{example}")


class RelationTask(PointerTask):
  """Relations: what the trainer, the steps, the compiler and evaluation call for `task=relations`.

  `match`: the triple form whose F1 selects checkpoints; `roles`: the entity types that are the subject and the
  object, in that order (() : any entity may take either side); `pointer_rope`: RoPE on the head / tail pointers.
  """

  name = "relations"
  host = host  # the host half (`PointerTask` reads it)
  threshold_refusal = "task=relations decodes three pointers at one threshold; tuning it is not built"

  def __init__(self, match: str = "boundaries", roles: tuple = (), pointer_rope: bool = False):
    if match not in host.MATCHES:
      raise ValueError(f"match must be one of {host.MATCHES}, got {match!r}")
    if roles and len(roles) != 2:
      raise ValueError(f"roles must be (subject type, object type) or (), got {roles!r}")
    self.match, self.roles, self.pointer_rope = match, tuple(roles), bool(pointer_rope)
    self.options = {"match": self.match, "roles": self.roles, "pointer_rope": self.pointer_rope}

  # Construction: the options a run spec keeps (`RunSpec.task_options`).
  @classmethod
  def options(cls, config, conventions) -> dict:
    """The selection form and the roles as the corpus's conventions say (`data.sources.conventions`);
    model.pointer_rope."""
    return {"match": conventions["match"], "roles": tuple(conventions["roles"] or ()),
            "pointer_rope": bool(config.model.get("pointer_rope", False))}

  @classmethod
  def config_refusal(cls, config) -> str | None:
    """A tagger head or a loss other than sparse ZLPR is refused (`base.pointer_config_refusal`); tune_threshold is
    refused by `factory.task_name` (`threshold_refusal`)."""
    return pointer_config_refusal(config, task="relations", pointers="relation")

  @classmethod
  def from_spec(cls, spec) -> RelationTask:
    return cls(**dict(spec.task_options))

  # Label space: the relation types (relation_types.json beside types.json, the name older workdirs have).
  def labels(self, *, train, dev, test) -> tuple[str, ...]:
    """The union over labelled splits; none is the user's error (the corpus holds no relations), as are roles
    that are not two of the records' entity types (refused here, before anything compiles). Records without a
    "relations" key are read as holding none, counted in the log."""
    splits = {"train": train, "dev": dev, "test": test}
    out = tuple(union_relation_types(**splits))
    if not out:
      raise UserError('task=relations: the corpus holds no relations: expected records with "relations": '
                      '[{"head", "tail", "type"}] (jsonl), a casrel file, webnlg_star or synthetic_relations')
    check_roles(self.roles, sorted({e["type"] for recs in splits.values() for r in recs for e in r["entities"]}))
    count_missing_key("relations", splits, "relations")
    return out

  def split_labels(self, prepared) -> tuple[str, ...]:
    return tuple(prepared.table.types)

  def save_labels(self, workdir, labels) -> None:
    save_label_file(workdir, RELATION_TYPES_FILE, labels)

  def load_labels(self, workdir) -> tuple[str, ...]:
    return load_label_file(workdir, RELATION_TYPES_FILE, task="relations", what="relation types")

  def prepare(self, records, tokenizer, types, labels, **options):
    """`windows.prepare_split` and the split's relation table (`PreparedSplit.table`)."""
    return table.prepare(records, tokenizer, types, labels, **options)

  @staticmethod
  def batch_targets(p, rows, w, span_ids_BHK, L):
    return relation_targets(p, rows, w, span_ids_BHK, L)

  def target_shapes(self, labels, *, num_types: int, batch: int, length: int) -> dict[str, tuple]:
    R = len(labels)
    return {"entity_ids": (batch, num_types, length), "head_ids": (batch, R, length), "tail_ids": (batch, R, length)}

  def build_model(self, encoder, spec, labels, *, num_types: int, feature_names, dtype, rngs):
    """`RelationModel` around `GPLinkerHead`: the entity pointer as `spec.head` / `spec.use_rope`, the head and tail
    pointers one head per relation type, RoPE from `pointer_rope`."""
    from gp_jax.models.gplinker import GPLinkerHead  # the model side imports flax here only (see entities)
    from gp_jax.models.heads import HEADS
    from gp_jax.models.ner import RelationModel

    if spec.head not in HEADS:
      raise UserError(f"task=relations: model.head must be one of {sorted(HEADS)}, got {spec.head!r}")
    module = GPLinkerHead(encoder.hidden_size, num_types, len(labels), head_size=spec.head_size,
                          efficient=spec.head == "efficient", use_rope=spec.use_rope, pointer_rope=self.pointer_rope,
                          max_span_width=spec.max_span_width, dtype=dtype, rngs=rngs)
    return RelationModel(encoder, module, feature_names, loss_implementation=spec.loss_implementation)

  # Device decoding: three hit buffers (entity, head, tail), read by `host` (`PointerTask`).
  # Host: records ({"entities", "relations": [{"head", "tail", "type", "score"}]}), the triple metric, results.
  def final_fields(self, result: dict) -> dict:
    return dict({k: result[k] for k in RESULT_KEYS}, per_type=result["per_type"], per_record=result["per_record"],
                match=result["match"], macro_f1=result["macro_f1"], triples=result["triples"],
                entities=result["entities"], by_overlap=result["by_overlap"], by_triples=result["by_triples"])

  def result_lines(self, result: dict) -> list[str]:
    """Every triple form, macro F1 and the entity F1 beside the selection F1."""
    forms = ", ".join(f"{f} {v['f1']:.4f}" for f, v in result["triples"].items())
    return [f"triple F1 by form: {forms} (selection: {result['match']}); macro over relations {result['macro_f1']:.4f}; "
            f"entity F1 {result['entities']['f1']:.4f}"]

  @staticmethod
  def pointer_head():
    from gp_jax.models.gplinker import GPLinkerHead  # pylint: disable=g-import-not-at-top

    return GPLinkerHead


TASK = RelationTask

__all__ = ["TASK", "RelationTask", "relation_targets", "check_roles", "RELATION_TYPES_FILE"]
