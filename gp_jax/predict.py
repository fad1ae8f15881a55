"""Predicts entities with a trained workdir or an exported folder (`gp_jax.export`).

  python -m gp_jax.predict --workdir=W | --exported=DIR [--input=PATH|-] [--output=PATH|-]
      [--input_format=lines|jsonl] [--output_format=jsonl] [--split=test] [--threshold=0.0]
      [--batch_size=N] [--chunk_size=N]

W holds everything needed (config, types, tokenizer, encoder config, parameters in best/), so the
pretrained encoder's folder is never reopened. DIR is an exported folder; predicting from it imports
neither flax, orbax nor ml_collections. Paths may be local or gs://.

Input formats (never guessed): `lines`, one text per line; `jsonl`, one {"id", "text"} object per line
(the id is echoed as it is). `--split` reads the workdir's corpus split instead. Input is read and
predicted in chunks of `--chunk_size` texts. Output `jsonl`: {"id"?, "text", "entities": [{"start",
"end", "type", "text", "score"}]} with character offsets (end exclusive). Texts longer than the
model's max length go through sliding windows. Formats are the `READERS` / `WRITERS` registries.

The exported folder is read by gp_jax.serving (`ExportedPredictor`, and `WindowPredictor`, the base this
module's `Predictor` shares with it); this module never imports gp_jax.export. `predict.ExportedPredictor`
and `predict.model_inputs` are re-exported from gp_jax.serving for compatibility; import them from there.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterable, Iterator

from absl import app, flags, logging

from gp_jax import sharding as shd
from gp_jax import storage
from gp_jax.data import batching, cblue
from gp_jax.data.sources import load_records
from gp_jax.errors import help_exits_zero
from gp_jax.serving import ExportedPredictor, ExportError, UserError, WindowPredictor, check_threshold
# Re-exported for compatibility; import it from gp_jax.serving.
from gp_jax.serving import model_inputs  # noqa: F401  pylint: disable=unused-import

# Deferred imports below: predicting from an exported folder must not import flax, orbax or ml_collections, which
# the workdir path's modules (checkpoint, state, workdir, steps, threshold, aot, evaluate) import.

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir, local or gs:// (config.json, types.json, "
                               "tokenizer/, best/ or ckpt/).")
_EXPORTED = flags.DEFINE_string("exported", None, "Folder written by `python -m gp_jax.export`, local or gs://.")
_INPUT = flags.DEFINE_string("input", None, "Input file, local or gs://; '-' or unset: standard input.")
_OUTPUT = flags.DEFINE_string("output", "-", "Output file, local or gs://; '-': standard output; an existing folder: "
                               "the format's file in it (CMeEE_test.json, cluener_predict.json, predictions.jsonl).")
_INPUT_FORMAT = flags.DEFINE_string("input_format", "lines", "Input format: lines (one text per line), jsonl "
                                     "({\"id\", \"text\"} per line) or cblue (a CBLUE/CMeEE JSON array).")
_OUTPUT_FORMAT = flags.DEFINE_string("output_format", "jsonl", "Output format: jsonl (ours), cmeee (the CMeEE "
                                      "submission array) or cluener (the CLUENER submission lines).")
_SPLIT = flags.DEFINE_string("split", None, "Predict the workdir's corpus split (train, dev or test) instead "
                             "of --input.")
_THRESHOLD = flags.DEFINE_float("threshold", None, "Span heads: keep spans with score > threshold (default: the "
                                "workdir's dev-tuned value when trained with tune_threshold, else the export's, else 0). "
                                "An error with a tagger head.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Windows per batch (0 = the training config's eval_batch_size).")
_CHUNK = flags.DEFINE_integer("chunk_size", 1000, "Texts read and predicted at a time.")


# ----------------------------------------------------------------------------- formats


def read_lines(f: Iterable[str], *, source: str) -> Iterator[dict]:
  """One text per line (the line break is not part of the text)."""
  del source
  for line in f:
    yield {"text": line.rstrip("\n").rstrip("\r")}


def read_jsonl(f: Iterable[str], *, source: str) -> Iterator[dict]:
  """One {"id", "text"} object per line; blank lines are skipped; the id keeps its JSON type."""
  want = 'a JSON object {"id": ..., "text": "..."}'
  for n, line in enumerate(f, 1):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{source}:{n}: not JSON ({e.msg}); expected {want}") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
      raise UserError(f"{source}:{n}: expected {want}, got {line.strip()[:80]}")
    yield {"id": obj["id"], "text": obj["text"]} if "id" in obj else {"text": obj["text"]}


def write_jsonl(dst, rows: Iterable[tuple[dict, list[dict]]]) -> None:
  """One {"id"?, "text", "entities"} object per record (id only when the input had one)."""
  for record, entities in rows:
    out = {"id": record["id"]} if "id" in record else {}
    out.update(text=record["text"], entities=entities)
    dst.write(json.dumps(out, ensure_ascii=False) + "\n")


def read_cblue(f: Iterable[str], *, source: str) -> Iterator[dict]:
  """A CBLUE/CMeEE JSON array (e.g. CMeEE_test.json), streamed record by record (`data.cblue.iter_cblue_file`);
  the input record is kept whole for the cmeee writer."""
  for index, obj in cblue.iter_cblue_file(f, source=source):
    yield {"id": index, "text": obj["text"], "record": obj}


def write_cmeee(dst, rows: Iterable[tuple[dict, list[dict]]]) -> None:
  """The CMeEE submission: the input records, same count and order, with "entities" filled (end_idx inclusive)."""
  dst.write("[")
  for n, (record, entities) in enumerate(rows):
    out = cblue.to_cmeee(record.get("record", {"text": record["text"]}), entities)
    dst.write(("," if n else "") + "\n" + json.dumps(out, ensure_ascii=False))
  dst.write("\n]\n")


def write_cluener(dst, rows: Iterable[tuple[dict, list[dict]]]) -> None:
  """The CLUENER submission: one {"id", "label": {type: {mention: [[start, end_inclusive], ...]}}} per line."""
  for n, (record, entities) in enumerate(rows):
    dst.write(cblue.cluener_line(record.get("id", n), record["text"], entities) + "\n")


# reader(text file, source=name) -> iterator of {"text", "id"?}; writer(text file, iterator of (record, entities)).
READERS = {"lines": read_lines, "jsonl": read_jsonl, "cblue": read_cblue}
WRITERS = {"jsonl": write_jsonl, "cmeee": write_cmeee, "cluener": write_cluener}
# The file written when --output is a folder.
OUTPUT_NAMES = {"jsonl": "predictions.jsonl", "cmeee": "CMeEE_test.json", "cluener": "cluener_predict.json"}


# ----------------------------------------------------------------------------- predictors


class Predictor(WindowPredictor):
  """A trained model restored from a workdir: parameters only (best by dev F1, else the latest)."""

  def __init__(self, workdir: str, *, batch_size: int = 0, threshold: float | None = None,
               platform: str | None = None, attention: str | None = None):
    """`platform`: the target the precision policy resolves for (default this machine's backend); `attention`:
    overrides the run's model.attention (export takes "xla", the path every platform lowers)."""
    # pylint: disable=g-import-not-at-top
    from gp_jax import checkpoint as ckpt_lib
    from gp_jax import state as state_lib
    from gp_jax import workdir as wd
    from gp_jax.steps import HitDecoder
    from gp_jax.threshold import tuned_threshold

    self.config = wd.load_config(workdir)
    if attention is not None:
      self.config.model.attention = attention
    self.types = wd.load_types(workdir)
    self.tokenizer = wd.load_tokenizer(workdir)
    mesh = shd.make_mesh(-1, 1)
    self.setup, _ = state_lib.init_model(self.config, self.tokenizer, self.types, mesh, load_weights=False,
                                         encoder_config=wd.load_encoder_config(workdir), platform=platform)
    mngr = ckpt_lib.make_manager(ckpt_lib.find_checkpoint_dir(workdir), keep=1)
    self.step, self.params = ckpt_lib.restore_params(mngr, state_lib.abstract_params(self.setup))
    spec = self.setup.spec  # what predict reads of the run from here on
    tagger = spec.tag_scheme is not None
    self.threshold = check_threshold(threshold, head=spec.head, tagger=tagger)
    if self.threshold is None and not tagger:
      self.threshold = tuned_threshold(workdir)
      if self.threshold is not None:
        logging.info("Threshold %.2f: tuned on dev by training (threshold.json); --threshold overrides it",
                     self.threshold)
    batch_size = batch_size or spec.eval_batch_size
    self.batch_size = batch_size + -batch_size % mesh.size  # a multiple of the devices
    self.window_options = spec.window_options
    self.buckets = spec.buckets
    self.decoder = HitDecoder(self.setup, batch_size=self.batch_size, name="predict")
    self.compile_ahead()

  def compile_ahead(self) -> None:
    """The eval step for every bucket, compiled concurrently before the first text (the texts are not known yet)."""
    from gp_jax import aot  # pylint: disable=g-import-not-at-top

    d = self.decoder
    programs = [aot.eval_program(d.fn(d.size), self.setup, batch=self.batch_size, length=L, hits=d.size)
                for L in batching.normalize_buckets(self.buckets, self.setup.spec.max_len)]
    aot.compile_for_run(programs)
    d.adopt(programs)

  def window_hits(self, batch):
    from gp_jax.evaluate import model_batch  # pylint: disable=g-import-not-at-top

    return self.decoder(self.params, shd.global_batch(model_batch(batch), self.setup.mesh), self.threshold or 0.0)


def predict_stream(predictor: WindowPredictor, records: Iterable[dict], *,
                   chunk_size: int = 1000) -> Iterator[tuple[dict, list[dict]]]:
  """(record, entities) per record, reading `records` lazily, `chunk_size` at a time."""
  it = iter(records)
  while chunk := list(itertools.islice(it, max(1, chunk_size))):
    yield from zip(chunk, predictor.predict([r["text"] for r in chunk]))


# ----------------------------------------------------------------------------- CLI


def _split_records(workdir: str, split: str) -> list[dict]:
  # pylint: disable=g-import-not-at-top
  from gp_jax import workdir as wd

  config = wd.load_config(workdir)
  train, dev, test, _ = load_records(config.data, seed=config.seed)
  splits = {"train": train, "dev": dev, "test": test}
  if split not in splits:
    raise UserError(f"--split must be one of {sorted(splits)}, got {split!r}")
  return [{"id": r["id"], "text": r["text"]} for r in splits[split]]


def _open(path: str, mode: str):
  if storage.is_url(path):
    return storage.path(path).open(mode)
  if "w" in mode:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return open(path, mode, encoding="utf-8")


def _check_folder(path: str, marker: str, flag: str) -> None:
  if not (storage.path(path) / marker).exists():
    raise UserError(f"--{flag}={path}: no such folder, or it has no {marker}")


def run(argv) -> None:
  if len(argv) > 1:
    raise UserError(f"unexpected arguments: {argv[1:]}")
  if bool(_WORKDIR.value) == bool(_EXPORTED.value):
    raise UserError("give exactly one of --workdir and --exported")
  if _INPUT_FORMAT.value not in READERS:
    raise UserError(f"--input_format must be one of {sorted(READERS)}, got {_INPUT_FORMAT.value!r}")
  if _OUTPUT_FORMAT.value not in WRITERS:
    raise UserError(f"--output_format must be one of {sorted(WRITERS)}, got {_OUTPUT_FORMAT.value!r}")
  if _SPLIT.value and (_EXPORTED.value or _INPUT.value):
    raise UserError("--split reads the workdir's corpus: give --workdir and no --input")
  if _WORKDIR.value:
    _check_folder(_WORKDIR.value, "config.json", "workdir")
    predictor = Predictor(_WORKDIR.value, batch_size=_BATCH.value, threshold=_THRESHOLD.value)
  else:
    _check_folder(_EXPORTED.value, "manifest.json", "exported")
    predictor = ExportedPredictor(_EXPORTED.value, batch_size=_BATCH.value, threshold=_THRESHOLD.value)

  src = None
  if _SPLIT.value:
    records = _split_records(_WORKDIR.value, _SPLIT.value)
  elif _INPUT.value in (None, "-"):
    records = READERS[_INPUT_FORMAT.value](sys.stdin, source="<stdin>")
  else:
    if not storage.path(_INPUT.value).exists():
      raise UserError(f"--input={_INPUT.value}: no such file")
    src = _open(_INPUT.value, "r")
    records = READERS[_INPUT_FORMAT.value](src, source=_INPUT.value)
  output = _OUTPUT.value
  if output != "-" and storage.path(output).is_dir():
    output = os.fspath(storage.path(output) / OUTPUT_NAMES[_OUTPUT_FORMAT.value])
  dst = sys.stdout if output == "-" else _open(output, "w")
  try:
    WRITERS[_OUTPUT_FORMAT.value](dst, predict_stream(predictor, records, chunk_size=_CHUNK.value))
  finally:
    if src is not None:
      src.close()
    if dst is sys.stdout:
      dst.flush()
    else:
      dst.close()


def main(argv):
  try:
    run(argv)
  except (UserError, ExportError) as e:
    print(f"gp_jax.predict: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=help_exits_zero(app.parse_flags_with_usage))
