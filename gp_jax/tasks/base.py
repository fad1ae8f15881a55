"""What every task shares (docs/tasks.md, "The interface"): the hit-buffer growth rule and the trimming of a buffer.

NumPy only: the host halves (`gp_jax.tasks.<name>.host`), serving and the ops import it without flax.

A task provides (the shared path calls nothing else; `tasks.get(name)` returns its class, `tasks.of(spec)` an object):
  class side: `options(config, conventions) -> dict` (kept as `RunSpec.task_options`, sorted (key, value) pairs;
    `conventions` from `data.sources.conventions`), `config_refusal(config) -> str | None`, `from_spec(spec)`;
  label space: `labels(train=, dev=, test=)`, `split_labels(prepared)`, `save_labels(workdir, labels)`,
    `load_labels(workdir)` (an opaque tuple the task alone reads; `Setup.labels`);
  data: `prepare(records, tokenizer, types, labels, **window_options)` (its window table in `PreparedSplit.table`,
    with a `stats` dict), `batch_targets(p, rows, w, span_ids_BHK, L) -> (targets, dropped)` (training batches
    only), `target_shapes(labels, *, num_types, batch, length)`;
  model: `build_model(encoder, spec, labels, *, num_types, feature_names, dtype, rngs)`;
  decoding: `initial_hits(batch) -> tuple`, `decode(model, batch, *, sizes, **options)` (inside the eval step),
    `hit_counts(out) -> tuple` (buffers grow by `grown_sizes`), `window_hits(out, *, types)`, `concat_hits`;
  results: `assemble(prepared, hits) -> [record]`, `score(prepared, predictions)` ("f1" selects), `final_fields`,
    `result_lines`, `run_fields()`, `resolved_choices()`, `threshold_refusal`;
  export: `export_forward(graphdef, params, rest, *, names, sizes)`, `export_refusal(fmt)`;
  host side (`gp_jax.tasks.<name>.host`): what export and serving call.
"""

from __future__ import annotations

import json
import logging

import numpy as np

log = logging.getLogger(__name__)

RESULT_KEYS = ("precision", "recall", "f1", "tp", "pred", "gold")  # every task's result has these ("f1": selection)


def flat_result(result: dict) -> dict:
  """The P/R/F1 and counts of a task's result (`score`): what metrics.jsonl keeps per evaluation."""
  return {k: result[k] for k in RESULT_KEYS}


def grown_sizes(sizes: tuple, counts: tuple) -> tuple[int, ...]:
  """Hit-buffer sizes that hold `counts` hits: each size below its count grows to the next power of two (few
  compiles), the others stay."""
  return tuple(size if int(count) <= size else 1 << (int(count) - 1).bit_length()
               for size, count in zip(sizes, counts, strict=True))


def trimmed(hits) -> tuple[np.ndarray, np.ndarray]:
  """One hit buffer (count, coords, scores) -> host (coords, scores) cut to count; a count above the buffer is
  refused (hits were cut: decode again with a grown buffer)."""
  count, coords, scores = hits
  count, coords, scores = int(count), np.asarray(coords), np.asarray(scores)
  if count > len(coords):
    raise ValueError(f"{count} hits in a buffer of {len(coords)}: decode again with a buffer of at least {count}")
  return coords[:count], scores[:count]


def capped_windows(window_index, rows) -> np.ndarray:
  """The windows (int64 [n], repeats kept) of the batch `rows` (int64 [m]) that decoding capped: `window_index` is
  the batch's (`window_index`, -1 on filler rows); rows past the batch and filler rows are left out."""
  window_B = np.asarray(window_index)
  capped = window_B[rows[rows < window_B.shape[0]]].astype(np.int64)
  return capped[capped >= 0]


def concat_capped(hits) -> np.ndarray:
  """The "capped" windows of every batch's hits, in one int64 array (`warn_capped` reads it)."""
  return np.concatenate([np.zeros(0, np.int64)] + [np.asarray(h["capped"], np.int64) for h in hits])


def warn_capped(prepared, windows, *, what: str, why: str, shown: int = 5) -> list[str]:
  """One warning naming the records of `prepared` that lost their `what` because decoding capped their `windows`
  (window ids, repeats allowed) for the reason `why`: how many, and the ids of the first `shown`. -> those ids."""
  windows = np.unique(np.asarray(windows, np.int64))
  windows = windows[(windows >= 0) & (windows < prepared.num_windows)]
  if not windows.size:
    return []
  records = np.unique(prepared.window_record[windows])
  ids = [prepared.record_ids[int(r)] for r in records]
  more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
  log.warning("%s: %d of %d records lost %s: %d of their windows %s, so none were assembled there (the pointers "
              "fire nearly everywhere: an untrained model, or text unlike its training data); records %s%s",
              prepared.name, len(ids), prepared.num_records, what, windows.size, why,
              ", ".join(map(repr, ids[:shown])), more)
  return ids


def output_records_of(output_record):
  """A host half's `output_records` from its `output_record` (text, prediction -> the record predict writes)."""

  def output_records(texts, predictions) -> list[dict]:
    """`output_record` of each text and its prediction: what predict writes for a chunk of texts."""
    return [output_record(t, x) for t, x in zip(texts, predictions, strict=True)]

  return output_records


def pointer_config_refusal(config, *, task: str, pointers: str) -> str | None:
  """GPLinker's pointers are span heads trained with sparse ZLPR: a tagger head or another loss is refused (one line
  naming `task` and its `pointers`). Heads are read here only (the models import flax)."""
  from gp_jax.models.heads import HEADS  # pylint: disable=g-import-not-at-top

  if config.model.head not in HEADS:
    return (f"task={task}: model.head={config.model.head!r} is a tagger; the GPLinker pointers are span heads: "
            f"set model.head to one of {sorted(HEADS)}")
  if config.loss.kind != "sparse_zlpr":
    return (f"task={task}: loss.kind={config.loss.kind!r}; the {pointers} pointers train with sparse_zlpr (flat gold "
            "ids): set loss.kind=sparse_zlpr")
  return None


def threshold_config_refusal(config, why: str | None) -> str | None:
  """tune_threshold=True refused in one line where the task says `why` it does not apply (its `threshold_refusal`),
  before training rather than after it: `factory.task_name` asks it for every task, after `config_refusal`."""
  if why and config.get("tune_threshold", False):
    return f"tune_threshold=True: {why}: set tune_threshold=False"
  return None


def count_missing_key(task: str, splits: dict, key: str) -> dict[str, int]:
  """Per split, the records without `key` (read as holding none of the task's labels: a record may have none, or
  the key may be misspelt), logged once per split that has any. -> {split: count}."""
  out = {}
  for split, records in splits.items():
    n = sum(1 for r in records if key not in r)
    if n:
      out[split] = n
      log.info('task=%s: %d of %d %s records have no "%s" key: read as no %s', task, n, len(records), split, key,
               key)
  return out


def save_label_file(workdir, filename: str, labels) -> None:
  """A task's labels as a JSON list in workdir/`filename` (beside types.json). Storage is imported here only (the
  host halves import this module and never write a workdir)."""
  from gp_jax import storage  # pylint: disable=g-import-not-at-top

  storage.write_json(storage.path(workdir) / filename, list(labels))


def load_label_file(workdir, filename: str, *, task: str, what: str) -> tuple[str, ...]:
  """The labels `save_label_file` wrote; a missing file is the user's error naming the task and `what` it keeps
  there (e.g. "relation types")."""
  from gp_jax import storage  # pylint: disable=g-import-not-at-top
  from gp_jax.errors import UserError  # pylint: disable=g-import-not-at-top

  path = storage.path(workdir) / filename
  if not path.exists():
    raise UserError(f"{path}: missing: a task={task} workdir keeps its {what} there")
  return tuple(json.loads(path.read_text()))


def pointers_run_exported(pointers: tuple[str, ...]):
  """A pointer task host's `run_exported(run, arrays, *, sizes, threshold, manifest)`: `run_grown` over `pointers`
  (the threshold is an input of the program, the manifest says nothing more)."""

  def run_exported(run, arrays, *, sizes, threshold=None, manifest=None):
    """Every hit of the pointers from an exported program, buffers grown as needed (`base.run_grown`): `run(arrays,
    sizes)` -> its outputs by name (`OUTPUTS`). -> (hits, sizes): hits as `window_hits` takes them, sizes for later
    calls."""
    return run_grown(run, arrays, sizes=sizes, pointers=pointers)

  return run_exported


class PointerTask:
  """What GPLinker's pointer tasks (relations, events) share: three hit buffers (spans, head links, tail links)
  decoded in the eval step, read by the task's host half (`host`, a module: window_hits, concat_hits, assemble,
  score), the exported program of `tasks.pointer_export`, the pointer head's loss path. A subclass sets `name`,
  `host`, `options` (the task options the host reads) and `pointer_head()` (the head class; imports flax)."""

  name: str
  host = None

  def initial_hits(self, batch_size: int) -> tuple[int, int, int]:
    size = max(64, batch_size * 32)
    return (size, size, size)

  def decode(self, model, batch, *, sizes, **options):
    """The eval step's hits: the span, head-link and tail-link buffers."""
    return model.decode_hits(batch, size=sizes, **options)

  def hit_counts(self, out) -> tuple[int, ...]:
    return tuple(int(h[0]) for h in out[:3])

  def window_hits(self, out, *, types) -> dict:
    """Eval step outputs -> the window's hits as the host half reads them (`host.window_hits`; `types`: the span
    classes)."""
    return self.host.window_hits(out[:3], out[3], types=types, options=self.options)

  def concat_hits(self, hits):
    return self.host.concat_hits(hits)

  def assemble(self, prepared, hits) -> list[dict]:
    return self.host.assemble(prepared, hits)

  def score(self, prepared, predictions) -> dict:
    return self.host.score(prepared, predictions, options=self.options)

  def run_fields(self) -> dict:
    """What results.json records of the task once per run: nothing."""
    return {}

  def export_forward(self, graphdef, params, rest, *, names, sizes):
    """`(*arrays in names order, span_buffer, head_buffer, tail_buffer, threshold) ->` the three pointers' hits
    flattened in `host.OUTPUTS` order (`sizes` is not read: the buffer inputs' shapes say them)."""
    from gp_jax.tasks import pointer_export  # pylint: disable=g-import-not-at-top (imports flax)

    return pointer_export.buffered_forward(graphdef, params, rest, names=names, num_buffers=3)

  def export_refusal(self, fmt: str) -> str | None:
    from gp_jax.tasks import pointer_export  # pylint: disable=g-import-not-at-top

    return pointer_export.onnx_refusal(fmt, task=self.name)

  @staticmethod
  def pointer_head():
    raise NotImplementedError

  def resolved_choices(self) -> dict:
    """The link pointers' loss path (the blockwise plan covers the upper triangle only)."""
    return {"pointer_loss": self.pointer_head().pointer_loss_path}


def run_grown(run, arrays, *, sizes, pointers):
  """Every hit of an exported program's pointers: `run(arrays, sizes)` -> its outputs by name ("<pointer>_count",
  "_coords", "_scores" per pointer, from buffers of `sizes`). A buffer too small for its count grows (`grown_sizes`,
  as training's decoder) and the batch runs again; the counts do not depend on the buffers, so once is enough.
  -> (hits, sizes): per pointer (count, coords, scores) trimmed to count, and the sizes for later calls."""
  sizes = tuple(sizes)
  while True:
    out = run(arrays, sizes)
    counts = tuple(int(out[f"{k}_count"]) for k in pointers)
    grown = grown_sizes(sizes, counts)
    if grown == sizes:
      break
    log.info("hit buffers (%s) %s -> %s for counts %s", ", ".join(pointers), sizes, grown, counts)
    sizes = grown
  hits = tuple((count, *trimmed((count, out[f"{k}_coords"], out[f"{k}_scores"])))
               for k, count in zip(pointers, counts))
  return hits, sizes


__all__ = ["RESULT_KEYS", "flat_result", "grown_sizes", "trimmed", "run_grown", "pointers_run_exported", "PointerTask",
           "pointer_config_refusal", "threshold_config_refusal", "capped_windows", "concat_capped", "warn_capped",
           "output_records_of", "count_missing_key", "save_label_file", "load_label_file"]
