"""Reads a serving folder written by `gp_jax.export` back: jax and numpy only (no flax, orbax, ml_collections).

  model = load_exported(DIR)               # local or gs://
  coords_N4, scores_N = model(batch)       # batch: {name: int32 [B, L]} for the manifest's inputs
  ExportedPredictor(DIR).predict(texts)    # entity dicts, as `python -m gp_jax.predict --exported=DIR` writes

A task=relations folder (manifest "task") returns three hit buffers instead, whose sizes are inputs (grown and run
again when a count exceeds its buffer), and predicts {"entities", "relations"} per text (`gp_jax.serving_relations`).

Also the folder's format (`MANIFEST`, `FORMAT_VERSION`, `MODEL_FILES`, `OUTPUTS`, which `gp_jax.export` writes
to) and `WindowPredictor`, the texts -> windows -> hits -> entities loop that `gp_jax.predict.Predictor` shares.
Imports: storage, gp_jax.data, gp_jax.ops.relations and gp_jax.serving_relations only (no flax); neither
gp_jax.export nor gp_jax.predict (they import this module).
See docs/serving.md.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile

import jax
import numpy as np

from gp_jax import serving_relations, storage
from gp_jax.data import batching, merge, windows
from gp_jax.data.char_tokenizer import CharTokenizer
from gp_jax.data.tokenize import load_tokenizer
# UserError: bad flags, input or config; gp_jax.predict's main prints it as one line and exits with status 2.
from gp_jax.errors import UserError
from gp_jax.ops.relations import grown_sizes

# Deferred import below: onnxruntime, an optional dependency (the `onnx` extra), for ONNX folders only.

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_FILES = {"stablehlo": "model.jax_export", "onnx": "model.onnx"}
BATCH_FIELDS = ("attention_mask", "span_mask", "positions")  # the model inputs after the tokenizer's features
OUTPUTS = ("count", "coords", "hit_scores", "scores")
# task=relations: the three pointers' hit buffers. Their sizes are inputs: int32 [0, size] arrays (no data, only
# the shape) after positions, before threshold; each pointer returns (count, coords [size, 4], scores [size]).
POINTERS = ("entity", "head", "tail")
RELATION_BUFFERS = tuple(f"{k}_buffer" for k in POINTERS)
RELATION_OUTPUTS = tuple(f"{k}_{x}" for k in POINTERS for x in ("count", "coords", "scores"))

log = logging.getLogger(__name__)


class ExportError(Exception):
  """A workdir or folder that cannot be exported or loaded; the message is one line for the user."""


# ----------------------------------------------------------------------------- loading


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


def read_manifest(directory) -> dict:
  """The folder's manifest.json, checked to exist and to be of FORMAT_VERSION (ExportError otherwise)."""
  root, name = storage.path(directory), os.fspath(directory)
  if not (root / MANIFEST).exists():
    raise ExportError(f"{name}: no {MANIFEST} (not a folder written by gp_jax.export)")
  manifest = storage.read_json(root / MANIFEST)
  if manifest.get("format_version") != FORMAT_VERSION:
    raise ExportError(f"{name}: manifest format_version {manifest.get('format_version')}, this code reads "
                      f"{FORMAT_VERSION}")
  return manifest


class ExportedModel:
  """A serving folder loaded back: `model(batch)` -> (coords [N, 4] (row, type, start, end), scores [N]), every hit.

  `batch` maps the manifest's input names to int32 [B, L] arrays (extra keys are ignored). `outputs(batch)`
  gives the raw outputs (`OUTPUTS`; device arrays for StableHLO). A batch with more hits than the
  exported buffer loses none: span heads read the score output on the host (`host_span_hits`),
  taggers run again one row at a time (a row holds at most max_len <= hit_buffer hits).

  task=relations (`task`, `relation_types`): `model(batch)` -> (entity hits, head hits, tail hits), each (count,
  coords [count, 4], scores [count]) as `ops.relation_hits` gives them; a buffer too small for its count grows
  (`hit_buffers`, kept for later calls) and the batch runs again.
  """

  def __init__(self, directory, *, tokenizer=None):
    root = storage.path(directory)
    self.directory = os.fspath(directory)
    self.manifest = read_manifest(directory)
    m = self.manifest
    self.types = storage.read_json(root / "types.json")
    self.tokenizer = tokenizer or _load_tokenizer(root / "tokenizer")
    self.task = m.get("task", "entities")
    self.relation_types = tuple(m.get("relation_types") or ())
    self.hit_buffers = tuple(m["hit_buffers"]) if self.task == "relations" else None  # grown by __call__
    self.names = [x["name"] for x in m["inputs"] if x["name"] not in ("threshold", *RELATION_BUFFERS)]
    self.is_tagger = bool(m["tagger"])
    self.threshold = m["threshold"]
    blob = (root / m["file"]).read_bytes()
    if m["format"] == "stablehlo":
      exported = jax.export.deserialize(bytearray(blob))
      self._call = jax.jit(exported.call)
    elif m["format"] == "onnx":
      import onnxruntime as ort  # pylint: disable=g-import-not-at-top

      options = ort.SessionOptions()
      options.log_severity_level = 3  # errors only
      session = ort.InferenceSession(blob, options, providers=["CPUExecutionProvider"])
      self._call = lambda *arrays: session.run(None, dict(zip(self.names, arrays)))
    else:
      raise ExportError(f"{self.directory}: unknown format {m['format']!r}")

  def _arrays(self, batch):
    return [np.asarray(batch[n], np.int32) for n in self.names]

  def _pad(self, batch):
    """Inputs only, with L >= min_length: padding columns are masked out (tokenizer pad values)."""
    batch = {n: np.asarray(batch[n], np.int32) for n in self.names}
    short = int(self.manifest.get("min_length", 1)) - batch["span_mask"].shape[1]
    if short > 0:
      pad = getattr(self.tokenizer, "pad_values", {})
      batch = {n: np.pad(x, ((0, 0), (0, short)), constant_values=pad.get(n, 0)) for n, x in batch.items()}
    return batch

  def outputs(self, batch, *, threshold: float | None = None) -> dict:
    """The artifact's outputs by name (StableHLO: count, coords, hit_scores, scores; ONNX: scores;
    task=relations: `RELATION_OUTPUTS`, from buffers of `hit_buffers`)."""
    arrays = self._arrays(batch)
    if self.manifest["format"] == "onnx":
      return {"scores": self._call(*arrays)[0]}
    thr = np.float32((self.threshold or 0.0) if threshold is None else threshold)
    if self.task == "relations":
      buffers = [np.zeros((0, size), np.int32) for size in self.hit_buffers]
      return dict(zip(RELATION_OUTPUTS, self._call(*arrays, *buffers, thr)))
    return dict(zip(OUTPUTS, self._call(*arrays, thr)))

  def _relation_hits(self, batch, threshold: float):
    """Every hit of the three pointers: a buffer too small grows (powers of two, as training's HitDecoder) and the
    batch runs again; the counts do not depend on the buffers, so once is enough."""
    while True:
      out = self.outputs(batch, threshold=threshold)
      counts = tuple(int(out[f"{k}_count"]) for k in POINTERS)
      grown = grown_sizes(self.hit_buffers, counts)
      if grown == self.hit_buffers:
        break
      log.info("%s: hit buffers (entity, head, tail) %s -> %s for counts %s", self.directory, self.hit_buffers,
               grown, counts)
      self.hit_buffers = grown
    return tuple((count, np.asarray(out[f"{k}_coords"])[:count], np.asarray(out[f"{k}_scores"])[:count])
                 for k, count in zip(POINTERS, counts))

  def __call__(self, batch, *, threshold: float | None = None):
    if self.is_tagger and threshold is not None:
      raise ExportError(f"threshold applies to span heads; this model's head is {self.manifest['head']}")
    thr = float(self.threshold or 0.0) if threshold is None else float(threshold)
    batch = self._pad(batch)
    if self.task == "relations":
      return self._relation_hits(batch, thr)
    out = self.outputs(batch, threshold=thr)
    if "count" not in out:  # onnx: scores only
      return host_span_hits(out["scores"], batch["span_mask"], threshold=thr,
                            max_span_width=self.manifest["max_span_width"])
    count, size = int(out["count"]), int(self.manifest["hit_buffer"])
    if count <= size:
      return np.asarray(out["coords"])[:count], np.asarray(out["hit_scores"])[:count]
    if not self.is_tagger:
      return host_span_hits(out["scores"], batch["span_mask"], threshold=thr,
                            max_span_width=self.manifest["max_span_width"])
    coords, scores = [], []
    for b in range(np.asarray(batch["span_mask"]).shape[0]):
      c, s = self({n: np.asarray(batch[n])[b:b + 1] for n in self.names})
      coords.append(np.concatenate([np.full((c.shape[0], 1), b, np.int32), c[:, 1:]], axis=1))
      scores.append(s)
    return np.concatenate(coords).astype(np.int32), np.concatenate(scores)


def _load_tokenizer(src):
  """The saved tokenizer; the char tokenizer is read directly (no transformers)."""
  with tempfile.TemporaryDirectory(prefix="gp_jax_tok_") as tmp:
    local = storage.download_dir(src, tmp) if storage.is_url(os.fspath(src)) else os.fspath(src)
    manifest = json.loads(open(os.path.join(local, "gp_jax_tokenizer.json"), encoding="utf-8").read())
    if manifest.get("kind") == "char":
      return CharTokenizer.load(local)
    return load_tokenizer(local)


def load_exported(directory) -> ExportedModel:
  """The serving folder `directory` (local or gs://) as a callable: batch dict -> (coords [N, 4], scores [N])
  (task=relations: the three pointers' hits)."""
  return ExportedModel(directory)


# ----------------------------------------------------------------------------- predictors


def model_inputs(batch: dict) -> dict:
  """Pipeline batch -> the arrays the model reads (features, attention_mask, span_mask, positions)."""
  return {**batch["features"], **{k: batch[k] for k in BATCH_FIELDS}}


def check_threshold(threshold, *, head: str, tagger: bool):
  """`threshold`, or UserError when it is given for a tagger head."""
  if threshold is not None and tagger:
    raise UserError(f"--threshold applies to span heads (keep spans with score > threshold); this model's head "
                    f"({head}) is a tagger")
  return threshold


class WindowPredictor:
  """Texts -> windows -> batches -> `window_hits` -> merged char spans. Subclasses set tokenizer, types,
  window_options (prepare_split's max_len, stride, max_span_width), buckets, batch_size, window_hits; one that
  compiles a program per bucket sets `compiles_ahead` and overrides `ready`."""

  compiles_ahead = False  # whether `ready` compiles anything (worth knowing the buckets of a whole input first)

  def window_hits(self, batch: dict) -> dict:
    """Pipeline batch -> every hit as window columns (`merge.batch_hits`)."""
    raise NotImplementedError

  def ready(self, lengths) -> None:
    """Called with the bucket lengths of the batches about to run, before the first of them."""

  batch_targets = None  # a task's batch targets (`gp_jax.tasks`); None: span_ids

  def prepare(self, records: list[dict], name: str):
    """Records -> `windows.PreparedSplit` (a task's predictor overrides this and `assemble`)."""
    return windows.prepare_split(records, self.tokenizer, types=self.types, name=name, **self.window_options)

  def assemble(self, prepared, hits: list) -> list:
    """The window hits of every batch -> per record, entity dicts (char offsets)."""
    return merge.merge_predictions(prepared, merge.concat_hits(hits))

  def prepare_texts(self, texts: list[str], name: str = "predict"):
    """Texts -> (prepared split, its eval batches) as `predict` runs them; `batches.lengths()` names their buckets."""
    records = [{"id": str(n), "text": t, "entities": []} for n, t in enumerate(texts)]
    prepared = self.prepare(records, name)
    return prepared, batching.eval_batches(prepared, batch_size=self.batch_size, buckets=self.buckets,
                                           targets=self.batch_targets)

  def predict(self, texts: list[str], prepared=None) -> list:
    """Per text, entity dicts {"start", "end", "type", "text", "score"}; task=relations: {"entities": [...],
    "relations": [{"head", "tail", "type", "score"}]} (head and tail index the entities). `prepared`: what
    `prepare_texts(texts)` returned, when the caller has it already."""
    prepared, batches = prepared or self.prepare_texts(texts)
    self.ready(batches.lengths())
    hits = [self.window_hits(batch) for batch in batches]
    return [output_prediction(text, p) for text, p in zip(texts, self.assemble(prepared, hits))]


def _entity_rows(text: str, ents) -> list[dict]:
  return [{"start": int(e["start"]), "end": int(e["end"]), "type": e["type"], "text": text[int(e["start"]):int(e["end"])],
           "score": round(float(e["score"]), 4)} for e in ents]


def output_prediction(text: str, prediction):
  """An assembled prediction (entity dicts, or {"entities", "relations"}) as predict writes it."""
  if isinstance(prediction, dict):
    return {"entities": _entity_rows(text, prediction["entities"]),
            "relations": [{"head": int(r["head"]), "tail": int(r["tail"]), "type": r["type"],
                           "score": round(float(r["score"]), 4)} for r in prediction["relations"]]}
  return _entity_rows(text, prediction)


class ExportedPredictor(WindowPredictor):
  """A folder written by `gp_jax.export`: jax and numpy only (no flax, orbax, ml_collections). A task=relations
  folder predicts {"entities", "relations"} per text, assembled as from its workdir (`gp_jax.serving_relations`)."""

  def __init__(self, directory: str, *, batch_size: int = 0, threshold: float | None = None):
    self.model = load_exported(directory)
    m = self.model.manifest
    self.manifest, self.types, self.tokenizer = m, self.model.types, self.model.tokenizer
    self.threshold = check_threshold(threshold, head=m["head"], tagger=m["tagger"])
    self.batch_size = batch_size or m["batch_size"]
    self.window_options = dict(max_len=m["max_len"], stride=m["stride"], max_span_width=m["max_span_width"])
    self.buckets = m["buckets"]
    self.relation_types = self.model.relation_types  # () for an entity folder
    self.relations = self.model.task == "relations"

  def prepare(self, records, name):
    if not self.relations:
      return super().prepare(records, name)
    return serving_relations.prepare(records, self.tokenizer, self.types, self.relation_types, name=name,
                                     **self.window_options)

  def assemble(self, prepared, hits):
    if not self.relations:
      return super().assemble(prepared, hits)
    return serving_relations.assemble(prepared, serving_relations.concat_hits(hits))

  def window_hits(self, batch):
    hits = self.model(model_inputs(batch), threshold=self.threshold)
    if self.relations:
      return serving_relations.window_hits((*hits, batch["window_index"]))
    return merge.batch_hits(batch["window_index"], *hits)
