"""The entity task's host half: window hits -> entity records, span P/R/F1, the exported program's call (numpy,
gp_jax.data and gp_jax.tasks.base only: no flax, orbax, ml_collections).

`gp_jax.tasks.entities.EntityTask` (training, evaluation, predict from a workdir) and `gp_jax.serving` (an exported
folder, reached through `tasks.host("entities")`) both call these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from gp_jax.data import merge, windows
from gp_jax.metrics import per_record_counts, span_prf
from gp_jax.tasks.base import output_records_of, trimmed

# The exported program (`gp_jax.tasks.entities.export`): no buffer-size inputs (its one buffer's size is fixed at
# export); outputs the hits (count, coords [size, 4] as (row, type, start, end), hit_scores [size]) and the span
# logits (span heads: [B, H, L, L]; taggers: emissions [B, L, T]), from which hits are read when the buffer is short.
BUFFERS = ()
OUTPUT_FIELDS = ("entities",)  # the fields `output_record` writes (predict's entity-only formats check them)
OUTPUTS = ("count", "coords", "hit_scores", "scores")


def labels_to_json(labels) -> list:
  """The entity task has no label space beyond the entity types (types.json)."""
  return []


def labels_from_json(value) -> tuple:
  return ()


def manifest_settings(manifest: Mapping, types: Sequence[str]) -> tuple[tuple, dict]:
  """(labels, options) of an exported folder's manifest: none."""
  return (), dict(manifest.get("task_options") or {})


def prepare(records, tokenizer, types, labels, **window_options):
  """`windows.prepare_split` (`labels`: none)."""
  return windows.prepare_split(records, tokenizer, types=types, **window_options)


def window_hits(outputs, window_index, *, types: Sequence[str] = (), options: Mapping | None = None) -> dict:
  """One hit buffer (count, coords [size, 4], scores [size]) and the batch's window index -> window hit columns
  (`merge.batch_hits`)."""
  return merge.batch_hits(np.asarray(window_index), *trimmed(outputs))


def concat_hits(hits: Sequence[dict]) -> dict:
  return merge.concat_hits(hits)


def assemble(prepared, hits) -> list[dict]:
  """Per record {"entities": [{"start", "end", "type", "score"}]} (char offsets, merged over windows)."""
  return [{"entities": ents} for ents in merge.merge_predictions(prepared, hits)]


def output_record(text: str, prediction: Mapping) -> dict:
  """The fields predict writes: {"entities": [{"start", "end", "type", "text", "score"}]}."""
  return {"entities": [{"start": int(e["start"]), "end": int(e["end"]), "type": e["type"],
                        "text": text[int(e["start"]):int(e["end"])], "score": round(float(e["score"]), 4)}
                       for e in prediction["entities"]]}


output_records = output_records_of(output_record)  # each text's `output_record`: what predict writes for a chunk


def score(prepared, predictions, *, options: Mapping | None = None) -> dict:
  """`span_prf` over whole documents plus `by_length` and `per_record` counts."""
  from gp_jax.tasks.entities import by_length  # pylint: disable=g-import-not-at-top  (the package imports this)

  pred = merge.prediction_spans([x["entities"] for x in predictions])
  gold = merge.gold_spans(prepared)
  result = span_prf(pred, gold)
  result["by_length"] = by_length(prepared, pred, gold)
  result["per_record"] = per_record_counts(pred, gold, prepared.num_records)
  return result


def host_span_hits(scores_BHLL, span_mask_BL, *, threshold: float, max_span_width=None):
  """All hits of span logits on the host: (coords [N, 4] (row, type, start, end), scores [N]), row-major."""
  scores_BHLL = np.asarray(scores_BHLL)
  valid_BL = np.asarray(span_mask_BL).astype(bool)
  L = valid_BL.shape[1]
  i, j = np.arange(L)[:, None], np.arange(L)[None, :]
  allowed_LL = j >= i
  if max_span_width is not None:
    allowed_LL &= (j - i) < max_span_width
  mask_B1LL = (valid_BL[:, :, None] & valid_BL[:, None, :] & allowed_LL)[:, None]
  coords_N4 = np.stack(np.nonzero((scores_BHLL > threshold) & mask_B1LL), axis=-1).astype(np.int32)
  return coords_N4.reshape(-1, 4), scores_BHLL[tuple(coords_N4.T)].astype(np.float32)


def _hits(coords, scores):
  return len(coords), coords, scores


def run_exported(run, arrays, *, sizes, threshold: float, manifest: Mapping):
  """Every hit from an exported program: `run(arrays, sizes)` -> its outputs by name (`OUTPUTS`; an ONNX folder:
  "scores" only). A batch with more hits than the exported buffer loses none: span heads read the scores output on
  the host (`host_span_hits`), taggers run again one row at a time (a row holds at most max_len <= the buffer's
  hits). -> ((count, coords, scores) trimmed to count, sizes)."""
  out = run(arrays, sizes)
  if "count" in out and int(out["count"]) <= sizes[0]:
    return _hits(*trimmed((out["count"], out["coords"], out["hit_scores"]))), sizes
  if not manifest["tagger"]:
    return _hits(*host_span_hits(out["scores"], arrays["span_mask"], threshold=threshold,
                                 max_span_width=manifest["max_span_width"])), sizes
  coords, scores = [], []
  for b in range(np.asarray(arrays["span_mask"]).shape[0]):
    (_, c, s), _ = run_exported(run, {n: np.asarray(x)[b:b + 1] for n, x in arrays.items()}, sizes=sizes,
                                threshold=threshold, manifest=manifest)
    coords.append(np.concatenate([np.full((c.shape[0], 1), b, np.int32), c[:, 1:]], axis=1))
    scores.append(s)
  return _hits(np.concatenate(coords).astype(np.int32), np.concatenate(scores)), sizes


__all__ = ["BUFFERS", "OUTPUTS", "OUTPUT_FIELDS", "labels_to_json", "labels_from_json", "manifest_settings", "prepare",
           "window_hits", "concat_hits", "assemble", "output_record", "output_records", "score", "host_span_hits",
           "run_exported"]
