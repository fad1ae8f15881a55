"""The entity task: span targets `span_ids [B, H, K]`, one span head, one hit buffer, span P/R/F1.

The entity path as it was before the task seam: the span targets are `data.batching`'s (every task has span
classes), the programs are the ones they were; this object names the parts the shared path calls.
"""

from __future__ import annotations

import numpy as np

from gp_jax.data import batching
from gp_jax.data.jsonl import UNTYPED_AT
from gp_jax.data.readers import DataError
from gp_jax.errors import UserError
from gp_jax.tasks.base import flat_result
from gp_jax.tasks.entities import host

LENGTH_BUCKETS = (("1", 1, 1), ("2", 2, 2), ("3-4", 3, 4), ("5-8", 5, 8), ("9+", 9, None))


def token_lengths(prepared, spans) -> np.ndarray:
  """Content tokens overlapping each char span (record, start, end, ...) of `spans`."""
  spans = list(spans)
  out = np.zeros(len(spans), np.int64)
  rows_by_record: dict[int, list[tuple[int, int, int]]] = {}
  for n, (r, a, b, *_) in enumerate(spans):
    rows_by_record.setdefault(r, []).append((n, a, b))
  for r, rows in rows_by_record.items():
    off = prepared.record_offsets(r)
    off = off[off[:, 1] > off[:, 0]]
    starts, ends = np.sort(off[:, 0]), np.sort(off[:, 1])
    n, a, b = np.asarray(rows, np.int64).T
    # A token [s, e) with s < e overlaps [a, b) iff s < b and e > a; when a < b every token with e <= a also has
    # s < b, so the count is #(s < b) - #(e <= a).
    out[n] = np.searchsorted(starts, b, "left") - np.searchsorted(ends, a, "right")
    for i in np.flatnonzero(a >= b):
      out[n[i]] = int(np.sum((off[:, 0] < b[i]) & (off[:, 1] > a[i])))
  return out


def by_length(prepared, pred, gold) -> dict[str, dict[str, int]]:
  """tp / pred / gold counts by entity length in the encoder's tokens (buckets 1, 2, 3-4, 5-8, 9+)."""
  pred_set, gold = set(pred), list(set(gold))
  gold_n, pred_n = token_lengths(prepared, gold), token_lengths(prepared, pred_set)
  tp_n = gold_n[np.array([s in pred_set for s in gold], bool)]
  out = {}
  for label, lo, hi in LENGTH_BUCKETS:
    top = np.inf if hi is None else hi
    out[label] = {name: int(np.sum((n >= lo) & (n <= top))) for name, n in (("tp", tp_n), ("pred", pred_n),
                                                                            ("gold", gold_n))}
  return out


class EntityTask:
  """Entities: what the trainer, the steps, the compiler and evaluation call for `task=entities`."""

  name = "entities"
  threshold_refusal = None  # tune_threshold applies (span heads)

  # Construction: no options, every head.
  @classmethod
  def options(cls, config, conventions) -> dict:
    return {}

  @classmethod
  def config_refusal(cls, config) -> str | None:
    return None

  @classmethod
  def from_spec(cls, spec) -> EntityTask:
    return cls()

  # Label space beyond the span classes: none.
  def labels(self, *, train, dev, test) -> tuple:
    """None; an entity without a type (which a jsonl record with "relations" may hold, for task=relations) is the
    data's error, naming its file and line (`jsonl.UNTYPED_AT`)."""
    for split, records in (("train", train), ("dev", dev), ("test", test)):
      for r in records:
        if any(not e["type"] for e in r["entities"]):
          at = r.get(UNTYPED_AT) or {"path": f"{split} record {r['id']!r}", "line": None}
          raise DataError(at["path"], at["line"], 'an entity without a "type": task=entities trains entity types; '
                          'give every entity a type (untyped entities serve task=relations only)',
                          reason="untyped_entity")
    return ()

  def split_labels(self, prepared) -> tuple:
    return ()

  def save_labels(self, workdir, labels) -> None:
    """Nothing to write (an entity workdir holds types.json only)."""

  def load_labels(self, workdir) -> tuple:
    return ()

  def prepare(self, records, tokenizer, types, labels, **options):
    return host.prepare(records, tokenizer, types, labels, **options)

  # Batches: the span classes' targets alone (`data.batching`).
  batch_targets = staticmethod(batching.span_targets)

  def target_shapes(self, labels, *, num_types: int, batch: int, length: int) -> dict[str, tuple]:
    return {"span_ids": (batch, num_types, length)}

  def build_model(self, encoder, spec, labels, *, num_types: int, feature_names, dtype, rngs):
    """`NerModel` with the span head or tagger `spec.head`."""
    from gp_jax.models.heads import HEADS  # the model side imports flax here only (the host half imports this file)
    from gp_jax.models.ner import NerModel
    from gp_jax.models.taggers import TAGGERS

    if spec.head in TAGGERS:
      module = TAGGERS[spec.head](encoder.hidden_size, num_types, scheme=spec.tag_scheme, dtype=dtype, rngs=rngs)
    elif spec.head in HEADS:
      module = HEADS[spec.head](encoder.hidden_size, num_types, head_size=spec.head_size, use_rope=spec.use_rope,
                                max_span_width=spec.max_span_width, dtype=dtype, rngs=rngs)
    else:
      raise UserError(f"model.head must be one of {sorted(HEADS) + sorted(TAGGERS)}, got {spec.head!r}")
    return NerModel(encoder, module, feature_names, loss_implementation=spec.loss_implementation)

  # Device decoding: one hit buffer.
  def initial_hits(self, batch_size: int) -> tuple[int]:
    return (max(64, batch_size * 32),)

  def decode(self, model, batch, *, sizes, **options):
    """The eval step's hits: (count, coords, scores) of the one buffer."""
    (size,) = sizes
    return model.decode_hits(batch, size=size, **options)

  def hit_counts(self, out) -> tuple[int]:
    return (int(out[0]),)

  def window_hits(self, out, *, types) -> dict[str, np.ndarray]:
    """Eval step outputs -> window hit columns (`host.window_hits`)."""
    return host.window_hits(out[:3], out[3])

  def concat_hits(self, hits):
    return host.concat_hits(hits)

  # Host: records, metric, results.
  def assemble(self, prepared, hits) -> list[dict]:
    """Per record {"entities": [{"start", "end", "type", "score"}]} (char offsets; `host.assemble`)."""
    return host.assemble(prepared, hits)

  def score(self, prepared, predictions) -> dict:
    """`span_prf` over whole documents plus `by_length` and `per_record` counts (`host.score`)."""
    return host.score(prepared, predictions)

  def final_fields(self, result: dict) -> dict:
    """What results.json keeps of a final split's result."""
    return dict(flat_result(result), per_type=result["per_type"], by_length=result["by_length"],
                per_record=result["per_record"])

  def result_lines(self, result: dict) -> list[str]:
    """Log lines beside a final split's P/R/F1 and per-type line: none."""
    return []

  def run_fields(self) -> dict:
    """What results.json records of the task once per run: the by-length bucket labels (launch.report)."""
    return {"length_buckets": [label for label, *_ in LENGTH_BUCKETS]}

  # Export (`gp_jax.export`): the program and what it refuses (`export.py`, imports flax: loaded here only).
  def export_forward(self, graphdef, params, rest, *, names, sizes):
    from gp_jax.tasks.entities import export  # pylint: disable=g-import-not-at-top

    return export.export_forward(graphdef, params, rest, names=names, sizes=sizes)

  def export_refusal(self, fmt: str) -> str | None:
    from gp_jax.tasks.entities import export  # pylint: disable=g-import-not-at-top

    return export.export_refusal(fmt)

  def resolved_choices(self) -> dict:
    """What resolved.json records of the task per program: nothing (entity runs' records unchanged)."""
    return {}


TASK = EntityTask

__all__ = ["TASK", "EntityTask", "LENGTH_BUCKETS", "by_length", "token_lengths", "flat_result"]
