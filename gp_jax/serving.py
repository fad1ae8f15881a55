"""Reads a serving folder written by `gp_jax.export` back: jax and numpy only (no flax, orbax, ml_collections).

  model = load_exported(DIR)               # local or gs://
  hits = model(batch)                      # batch: {name: int32 [B, L]} for the manifest's inputs
  ExportedPredictor(DIR).predict(texts)    # records, as `python -m gp_jax.predict --exported=DIR` writes them

The folder's task (manifest "task") is reached through `gp_jax.tasks.host(name)`, its host half: the program's
outputs and buffer inputs, how a call is run (`run_exported`: fallbacks, grown hit buffers), window hits, records
and the fields predict writes. Nothing here branches on the task.

Also the folder's format (`MANIFEST`, `FORMAT_VERSION`, `MODEL_FILES`, which `gp_jax.export` writes to) and
`WindowPredictor`, the texts -> windows -> hits -> records loop that `gp_jax.predict.Predictor` shares.
Imports: storage, gp_jax.data, gp_jax.tasks (the registry and host halves: no flax); neither gp_jax.export nor
gp_jax.predict (they import this module). See docs/serving.md.
"""

from __future__ import annotations

import json
import math
import os
import tempfile

import jax
import numpy as np

from gp_jax import storage, tasks
from gp_jax.data import batching
from gp_jax.data.char_tokenizer import CharTokenizer
from gp_jax.data.tokenize import load_tokenizer
# UserError: bad flags, input or config; gp_jax.predict's main prints it as one line and exits with status 2.
from gp_jax.errors import UserError

# Deferred import below: onnxruntime, an optional dependency (the `onnx` extra), for ONNX folders only.

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
MODEL_FILES = {"stablehlo": "model.jax_export", "onnx": "model.onnx"}
BATCH_FIELDS = ("attention_mask", "span_mask", "positions")  # the model inputs after the tokenizer's features

class ExportError(Exception):
  """A workdir or folder that cannot be exported or loaded; the message is one line for the user."""


# ----------------------------------------------------------------------------- loading


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
  """A serving folder loaded back: `model(batch)` -> every hit, as its task's host half gives them to `window_hits`
  (per hit buffer: (count, coords [count, 4], scores [count]); entities: one buffer, coords (row, type, start, end)).

  `batch` maps the manifest's input names to int32 [B, L] arrays (extra keys are ignored). `outputs(batch)` gives
  the raw outputs by name (the host's `OUTPUTS`; ONNX: "scores"). No hit is lost: the host's `run_exported` falls
  back (entities: the scores output, or a row at a time) or grows a buffer (`hit_buffers`, kept for later calls)
  and runs the batch again.
  """

  def __init__(self, directory, *, tokenizer=None):
    root = storage.path(directory)
    self.directory = os.fspath(directory)
    self.manifest = read_manifest(directory)
    m = self.manifest
    self.types = storage.read_json(root / "types.json")
    self.tokenizer = tokenizer or _load_tokenizer(root / "tokenizer")
    self.task = m.get("task", tasks.DEFAULT)
    self.host = tasks.host(self.task)
    self.labels, self.options = self.host.manifest_settings(m, self.types)
    # A folder written before "hit_buffers" was a list: an entity folder's one "hit_buffer".
    self.hit_buffers = tuple(int(x) for x in (m.get("hit_buffers") or [m.get("hit_buffer")]))
    self.names = [x["name"] for x in m["inputs"] if x["name"] not in ("threshold", *self.host.BUFFERS)]
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

  def _pad(self, batch):
    """Inputs only, with L >= min_length: padding columns are masked out (tokenizer pad values)."""
    batch = {n: np.asarray(batch[n], np.int32) for n in self.names}
    short = int(self.manifest.get("min_length", 1)) - batch["span_mask"].shape[1]
    if short > 0:
      pad = getattr(self.tokenizer, "pad_values", {})
      batch = {n: np.pad(x, ((0, 0), (0, short)), constant_values=pad.get(n, 0)) for n, x in batch.items()}
    return batch

  def _run(self, batch, sizes, threshold: float) -> dict:
    arrays = [np.asarray(batch[n], np.int32) for n in self.names]
    if self.manifest["format"] == "onnx":
      return {"scores": self._call(*arrays)[0]}
    buffers = [np.zeros((0, size), np.int32) for size in sizes[:len(self.host.BUFFERS)]]
    return dict(zip(self.host.OUTPUTS, self._call(*arrays, *buffers, np.float32(threshold))))

  def _threshold(self, threshold: float | None) -> float:
    return float(self.threshold or 0.0) if threshold is None else float(threshold)

  def outputs(self, batch, *, threshold: float | None = None) -> dict:
    """The artifact's outputs by name (the host's `OUTPUTS`; ONNX: scores), from buffers of `hit_buffers`."""
    return self._run(batch, self.hit_buffers, self._threshold(threshold))

  def __call__(self, batch, *, threshold: float | None = None):
    if self.is_tagger and threshold is not None:
      raise ExportError(f"threshold applies to span heads; this model's head is {self.manifest['head']}")
    thr = self._threshold(threshold)
    hits, self.hit_buffers = self.host.run_exported(lambda arrays, sizes: self._run(arrays, sizes, thr),
                                                    self._pad(batch), sizes=self.hit_buffers, threshold=thr,
                                                    manifest=self.manifest)
    return hits


def _load_tokenizer(src):
  """The saved tokenizer; the char tokenizer is read directly (no transformers)."""
  with tempfile.TemporaryDirectory(prefix="gp_jax_tok_") as tmp:
    local = storage.download_dir(src, tmp) if storage.is_url(os.fspath(src)) else os.fspath(src)
    manifest = json.loads(open(os.path.join(local, "gp_jax_tokenizer.json"), encoding="utf-8").read())
    if manifest.get("kind") == "char":
      return CharTokenizer.load(local)
    return load_tokenizer(local)


def load_exported(directory) -> ExportedModel:
  """The serving folder `directory` (local or gs://) as a callable: batch dict -> its task's hits."""
  return ExportedModel(directory)


# ----------------------------------------------------------------------------- predictors


def model_inputs(batch: dict) -> dict:
  """Pipeline batch -> the arrays the model reads (features, attention_mask, span_mask, positions)."""
  return {**batch["features"], **{k: batch[k] for k in BATCH_FIELDS}}


FLOAT32_MAX = float(np.finfo(np.float32).max)  # the program compares float32 scores with a float32 threshold


def _float32(x) -> bool:
  return math.isfinite(x) and abs(x) <= FLOAT32_MAX


def check_threshold(threshold, *, head: str = "", tagger: bool = False):
  """`threshold`, or UserError when it is not a finite float32 (a larger one overflows to inf in the program) or
  is given for a tagger head."""
  if threshold is not None and not _float32(threshold):
    raise UserError(f"--threshold={threshold}: expected a finite number within float32's range (|threshold| <= "
                    f"{FLOAT32_MAX:.4g}; spans with score > threshold are kept)")
  if threshold is not None and tagger:
    raise UserError(f"--threshold applies to span heads (keep spans with score > threshold); this model's head "
                    f"({head}) is a tagger")
  return threshold


class WindowPredictor:
  """Texts -> windows -> batches -> `window_hits` -> records, through the task's host half (`host`, with `labels`
  and `options`). Subclasses set host, labels, options, tokenizer, types, window_options (prepare_split's max_len,
  stride, max_span_width), buckets, batch_size, window_hits; one that compiles a program per bucket sets
  `compiles_ahead` and overrides `ready`."""

  compiles_ahead = False  # whether `ready` compiles anything (worth knowing the buckets of a whole input first)

  def window_hits(self, batch: dict):
    """Pipeline batch -> the task's window hits (`host.window_hits`)."""
    raise NotImplementedError

  def ready(self, lengths) -> None:
    """Called with the bucket lengths of the batches about to run, before the first of them."""

  def prepare(self, records: list[dict], name: str):
    """Records -> the task's prepared split (`host.prepare`)."""
    return self.host.prepare(records, self.tokenizer, self.types, self.labels, name=name, **self.window_options)

  def assemble(self, prepared, hits: list) -> list[dict]:
    """The window hits of every batch -> per record, the task's prediction (`host.assemble`)."""
    return self.host.assemble(prepared, self.host.concat_hits(hits))

  def prepare_texts(self, texts: list[str], name: str = "predict"):
    """Texts -> (prepared split, its eval batches) as `predict` runs them; `batches.lengths()` names their buckets."""
    records = [{"id": str(n), "text": t, "entities": []} for n, t in enumerate(texts)]
    prepared = self.prepare(records, name)
    return prepared, batching.eval_batches(prepared, batch_size=self.batch_size, buckets=self.buckets)

  def predict(self, texts: list[str], prepared=None) -> list[dict]:
    """Per text, the fields predict writes (`host.output_records`; entities: {"entities": [{"start", "end", "type",
    "text", "score"}]}). `prepared`: what `prepare_texts(texts)` returned, when the caller has it already."""
    prepared, batches = prepared or self.prepare_texts(texts)
    self.ready(batches.lengths())
    hits = [self.window_hits(batch) for batch in batches]
    return self.host.output_records(texts, self.assemble(prepared, hits))


class ExportedPredictor(WindowPredictor):
  """A folder written by `gp_jax.export`: jax and numpy only (no flax, orbax, ml_collections); its records are
  assembled as from its workdir (the task's host half)."""

  def __init__(self, directory: str, *, batch_size: int = 0, threshold: float | None = None):
    self.model = load_exported(directory)
    m = self.model.manifest
    self.manifest, self.types, self.tokenizer = m, self.model.types, self.model.tokenizer
    self.host, self.labels, self.options = self.model.host, self.model.labels, self.model.options
    self.threshold = check_threshold(threshold, head=m["head"], tagger=m["tagger"])
    if threshold is None and m["threshold"] is not None and not _float32(m["threshold"]):  # an older export's
      raise ExportError(f"{directory}: the {MANIFEST} threshold {m['threshold']} is not a finite float32 (|threshold| "
                        f"<= {FLOAT32_MAX:.4g}): pass --threshold")
    self.batch_size = batch_size or m["batch_size"]
    self.window_options = dict(max_len=m["max_len"], stride=m["stride"], max_span_width=m["max_span_width"])
    self.buckets = m["buckets"]

  def window_hits(self, batch):
    hits = self.model(model_inputs(batch), threshold=self.threshold)
    return self.host.window_hits(hits, batch["window_index"], types=self.types, options=self.options)
