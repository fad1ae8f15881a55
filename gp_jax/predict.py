"""Predicts with a trained workdir or an exported folder (`gp_jax.export`), whatever the task.

  python -m gp_jax.predict --workdir=W | --exported=DIR [--input=PATH|-] [--output=PATH|-]
      [--input_format=lines|jsonl|cblue] [--output_format=jsonl|cmeee|cluener] [--split=train|dev|test]
      [--threshold=0.0] [--batch_size=N] [--chunk_size=N]

W holds everything needed (config, types, tokenizer, encoder config, parameters in best/), so the
pretrained encoder's folder is never reopened. DIR is an exported folder; predicting from it imports
neither flax, orbax nor ml_collections. Paths may be local or gs:// (probed first: storage that does not answer
within $GP_JAX_GCS_PROBE_TIMEOUT_S, default 10 s, a missing bucket, an output bucket that refuses a write).

Input formats (never guessed): `lines`, one text per line; `jsonl`, one {"id", "text"} object per line
(the id is echoed as it is); `cblue`, a CBLUE JSON array; all strict UTF-8 (a bad byte is a one-line error
naming file, line and column). `--split` reads the workdir's corpus split instead. Output `jsonl`: {"id"?,
"text"} and the task's fields (its host half's `output_record`; entities: "entities": [{"start", "end", "type",
"text", "score"}] with character offsets, end exclusive; see docs/tasks.md for the others). Outputs `cmeee` and
`cluener` (the submission files) hold entities only: a model whose records hold other fields (`host.OUTPUT_FIELDS`)
is refused before it loads. Texts longer than the model's max length go through sliding windows. Formats are the
`READERS` / `WRITERS` registries. The flags, the formats and the paths (the input read, the output's folder tried
for a write) are checked before the model loads; a mistake is one line on stderr and exit status 2.

A workdir's eval step is compiled per length bucket, only for the buckets the input's batches take: an input
file (or --split) is read whole first and its buckets compiled together before the first text; standard input
is predicted in chunks of `--chunk_size` texts, each chunk's new buckets compiled before it runs. Programs go
to jax's persistent compilation cache as training sets it (the workdir config's `compilation_cache`), so a
second call loads them. Logs (INFO) show with absl's `--verbosity=0` (`-v 0`); by default only warnings and
errors reach stderr, and stdout holds the output alone.

The exported folder is read by gp_jax.serving (`ExportedPredictor`, and `WindowPredictor`, the base this
module's `Predictor` shares with it); this module never imports gp_jax.export. `predict.ExportedPredictor`
and `predict.model_inputs` are re-exported from gp_jax.serving for compatibility; import them from there.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence

import jax
from absl import app, flags, logging

from gp_jax import runtime
from gp_jax import sharding as shd
from gp_jax import storage
from gp_jax.data import batching, cblue
from gp_jax.data.readers import DataError, text_lines
from gp_jax.data.sources import USER_FORMATS, load_records
from gp_jax.errors import help_exits_zero
from gp_jax.serving import MANIFEST, ExportedPredictor, ExportError, UserError, WindowPredictor, check_threshold
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
_OUTPUT_FORMAT = flags.DEFINE_string("output_format", "jsonl", "Output format: jsonl (ours, every task), cmeee (the "
                                      "CMeEE submission array) or cluener (the CLUENER submission lines); cmeee and "
                                      "cluener hold entities only (task=entities models).")
_SPLIT = flags.DEFINE_string("split", None, "Predict the workdir's corpus split (train, dev or test) instead "
                             "of --input.")
_THRESHOLD = flags.DEFINE_float("threshold", None, "Span heads and every task's GPLinker pointers: keep cells with "
                                "score > threshold (a finite float32). predict's default: the exported folder's, or "
                                "the workdir's dev-tuned value (tune_threshold), else 0; export writes it as the "
                                "folder's default (unset: the workdir's dev-tuned value, else 0). An error with a "
                                "tagger head.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Windows per batch (0 = the training config's eval_batch_size).",
                              lower_bound=0)
_CHUNK = flags.DEFINE_integer("chunk_size", 1000, "Texts predicted at a time (standard input is also read a chunk at "
                              "a time; an input file is read whole first).", lower_bound=1)


# ----------------------------------------------------------------------------- formats


def read_lines(f, *, source: str) -> Iterator[dict]:
  """One text per line (the line break is not part of the text); strict UTF-8 (`readers.text_lines`)."""
  for _, line in text_lines(f, source):
    yield {"text": line}


def read_jsonl(f, *, source: str) -> Iterator[dict]:
  """One {"id", "text"} object per line; blank lines are skipped; the id keeps its JSON type."""
  want = 'a JSON object {"id": ..., "text": "..."}'
  for n, line in text_lines(f, source):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(source, n, f"not JSON ({e.msg}); expected {want}", reason="bad_json") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
      raise DataError(source, n, f"expected {want}, got {line.strip()[:80]}", reason="bad_value")
    yield {"id": obj["id"], "text": obj["text"]} if "id" in obj else {"text": obj["text"]}


def write_jsonl(dst, rows: Iterable[tuple[dict, dict]]) -> None:
  """One {"id"?, "text", ...} object per record (id only when the input had one), then the task's fields
  (`host.output_record`; entities: "entities")."""
  for record, fields in rows:
    out = {"id": record["id"]} if "id" in record else {}
    out.update(text=record["text"], **fields)
    dst.write(json.dumps(out, ensure_ascii=False) + "\n")


def read_cblue(f, *, source: str) -> Iterator[dict]:
  """A CBLUE/CMeEE JSON array (e.g. CMeEE_test.json), streamed record by record (`data.cblue.iter_cblue_file`, which
  decodes a binary file, or a text file's byte buffer, as strict UTF-8); the input record is kept whole for the
  cmeee writer."""
  for index, obj in cblue.iter_cblue_file(f, source=source):
    yield {"id": index, "text": obj["text"], "record": obj}


def write_cmeee(dst, rows: Iterable[tuple[dict, dict]]) -> None:
  """The CMeEE submission: the input records, same count and order, with "entities" filled (end_idx inclusive)."""
  dst.write("[")
  for n, (record, fields) in enumerate(rows):
    out = cblue.to_cmeee(record.get("record", {"text": record["text"]}), fields["entities"])
    dst.write(("," if n else "") + "\n" + json.dumps(out, ensure_ascii=False))
  dst.write("\n]\n")


def write_cluener(dst, rows: Iterable[tuple[dict, dict]]) -> None:
  """The CLUENER submission: one {"id", "label": {type: {mention: [[start, end_inclusive], ...]}}} per line."""
  for n, (record, fields) in enumerate(rows):
    dst.write(cblue.cluener_line(record.get("id", n), record["text"], fields["entities"]) + "\n")


# reader(binary or text file, source=name) -> iterator of {"text", "id"?}: a text file with a byte buffer
# (sys.stdin) is read through it; writer(text file, iterator of (record, the task's fields)); cmeee and cluener
# write the "entities" field.
READERS = {"lines": read_lines, "jsonl": read_jsonl, "cblue": read_cblue}
WRITERS = {"jsonl": write_jsonl, "cmeee": write_cmeee, "cluener": write_cluener}
# The file written when --output is a folder.
OUTPUT_NAMES = {"jsonl": "predictions.jsonl", "cmeee": "CMeEE_test.json", "cluener": "cluener_predict.json"}
# The fields a writer reads of the task's records (None: any task's); the task's host half says which it writes
# (`OUTPUT_FIELDS`), so an entity-only format is refused for a task with other fields before the model loads.
WRITER_FIELDS = {"jsonl": None, "cmeee": ("entities",), "cluener": ("entities",)}


# ----------------------------------------------------------------------------- predictors


class Predictor(WindowPredictor):
  """A trained model restored from a workdir: parameters only (best by dev F1, else the latest). The eval step is
  compiled per length bucket when a batch first needs it (`ready`), not for every bucket up front."""

  compiles_ahead = True

  def __init__(self, workdir: str, *, batch_size: int = 0, threshold: float | None = None,
               platform: str | None = None, attention: str | None = None):
    """`platform`: the target the precision policy resolves for (default this machine's backend); `attention`:
    overrides the run's model.attention (export takes "xla", the path every platform lowers)."""
    # pylint: disable=g-import-not-at-top
    from gp_jax import aot, factory, tasks
    from gp_jax import checkpoint as ckpt_lib
    from gp_jax import state as state_lib
    from gp_jax import workdir as wd
    from gp_jax.steps import HitDecoder
    from gp_jax.threshold import tuned_threshold

    self.config = wd.load_config(workdir)
    # tune_threshold is training's (its value is in threshold.json, read below): a workdir trained with it before its
    # task refused it (`config_refusal`) still loads.
    self.config.tune_threshold = False
    if attention is not None:
      self.config.model.attention = attention
    self.types = wd.load_types(workdir)
    self.tokenizer = wd.load_tokenizer(workdir)
    target = factory.target_platform(platform)
    self.task = tasks.of(factory.run_spec(self.config, target))
    self.labels = self.task.load_labels(workdir)
    mesh = shd.make_mesh(-1, 1)
    # Parameters abstract (they are restored next): no random init of the whole model to throw away.
    setup = aot.target_setup(self.config, self.tokenizer, self.types, mesh, target,
                             encoder_config=wd.load_encoder_config(workdir) or factory.encoder_config(self.config),
                             labels=self.labels)
    self.setup = dataclasses.replace(setup, rest=jax.device_put(setup.rest, shd.replicated(mesh)))
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
    self.host, self.options = tasks.host(spec.task), dict(spec.task_options)  # WindowPredictor's prepare / assemble
    self._compiled: set[tuple[int, int]] = set()  # (hit buffers, bucket length) compiled ahead

  def compile_ahead(self, lengths: Iterable[int] | None = None) -> None:
    """The eval step for each bucket length in `lengths` (default every bucket) not compiled yet, compiled
    concurrently (`aot`) at the decoder's current hit buffer."""
    from gp_jax import aot  # pylint: disable=g-import-not-at-top

    d = self.decoder
    if lengths is None:
      lengths = batching.normalize_buckets(self.buckets, self.setup.spec.max_len)
    todo = [L for L in sorted(set(lengths)) if (d.size, L) not in self._compiled]
    if not todo:
      return
    programs = [aot.eval_program(d.fn(d.size), self.setup, batch=self.batch_size, length=L, hits=d.size)
                for L in todo]
    aot.compile_for_run(programs)
    d.adopt(programs)
    self._compiled.update((d.size, L) for L in todo)

  def ready(self, lengths) -> None:
    self.compile_ahead(lengths)

  def window_hits(self, batch):
    """The task's window hits of a batch, decoded as evaluation decodes (`steps.HitDecoder`)."""
    from gp_jax.evaluate import model_batch  # pylint: disable=g-import-not-at-top

    return self.decoder(self.params, shd.global_batch(model_batch(batch), self.setup.mesh), self.threshold or 0.0)


def predict_stream(predictor: WindowPredictor, records: Iterable[dict], *,
                   chunk_size: int = 1000) -> Iterator[tuple[dict, dict]]:
  """(record, the task's fields) per record, reading `records` lazily, `chunk_size` at a time."""
  it = iter(records)
  while chunk := list(itertools.islice(it, max(1, chunk_size))):
    yield from zip(chunk, predictor.predict([r["text"] for r in chunk]))


def predict_records(predictor: WindowPredictor, records: Sequence[dict], *,
                    chunk_size: int = 1000) -> Iterator[tuple[dict, dict]]:
  """`predict_stream` over records already read: each chunk is prepared once, and a predictor that compiles per
  bucket first compiles, together, the buckets that every chunk's batches take."""
  if not predictor.compiles_ahead:
    return predict_stream(predictor, records, chunk_size=chunk_size)
  n = max(1, chunk_size)
  chunks = [[r["text"] for r in records[i:i + n]] for i in range(0, len(records), n)]
  prepared = [predictor.prepare_texts(texts) for texts in chunks]
  predictor.ready(sorted({L for _, batches in prepared for L in batches.lengths()}))
  return (row for i, (texts, p) in enumerate(zip(chunks, prepared))
          for row in zip(records[i * n:(i + 1) * n], predictor.predict(texts, p)))


def configure_compilation_cache(workdir: str) -> str | None:
  """jax's persistent compilation cache as the run that trained `workdir` set it (its config's `compilation_cache`,
  resolved by `runtime.configure_compilation_cache` as training resolves it); returns the folder."""
  from gp_jax import workdir as wd  # pylint: disable=g-import-not-at-top

  path = runtime.configure_compilation_cache(wd.load_config(workdir).get("compilation_cache", "auto"))
  logging.info("Compilation cache: %s", path or "off")
  return path


# ----------------------------------------------------------------------------- CLI


SPLITS = ("train", "dev", "test")


def _split_records(workdir: str, split: str) -> list[dict]:
  """The texts of the workdir's corpus split; a split its config does not have is the user's error."""
  # pylint: disable=g-import-not-at-top
  from gp_jax import workdir as wd

  if split not in SPLITS:
    raise UserError(f"--split must be one of {sorted(SPLITS)}, got {split!r}")
  config = wd.load_config(workdir)
  train, dev, test, _ = load_records(config.data, seed=config.seed)
  records = {"train": train, "dev": dev, "test": test}[split]
  if not records:
    d = config.data
    key = f"{split}_file" if d.name in USER_FORMATS else f"{split}_split"
    raise UserError(f"--split={split}: the workdir's config has no {split} split (data.{key}="
                    f"{str(d.get(key, '') or '')!r}, data.name={d.name!r}): give --input instead")
  return [{"id": r["id"], "text": r["text"]} for r in records]


def _open(path: str, mode: str):
  if storage.is_url(path):
    return storage.path(path).open(mode)
  if "w" in mode:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return open(path, mode, **({} if "b" in mode else {"encoding": "utf-8"}))


def check_writable(folder: str, *, flag: str, value: str) -> None:
  """UserError unless files can be written in the local `folder` (created on write when missing: its nearest
  existing ancestor is tried): checked before a model loads, without leaving anything behind."""
  probe = os.path.abspath(folder)
  while not os.path.exists(probe):
    probe = os.path.dirname(probe)
  if not os.path.isdir(probe):
    raise UserError(f"--{flag}={value}: {probe} is a file, not a folder")
  try:
    with tempfile.TemporaryFile(dir=probe):
      pass
  except OSError as e:
    raise UserError(f"--{flag}={value}: cannot write in {probe} ({e.strerror or e})") from None


def _output_path(output: str, fmt: str) -> str:
  """--output resolved ('-', a file, or the format's file in an existing folder) and checked writable."""
  if output == "-":
    return output
  if storage.path(output).is_dir():
    output = os.fspath(storage.path(output) / OUTPUT_NAMES[fmt])
  elif output.endswith(("/", os.sep)):
    raise UserError(f"--output={output}: no such folder (a path ending in / names a folder): create it, or give a "
                    f"file path")
  if not storage.is_url(output):  # a gs:// output was tried for a write by `storage.check_bucket`
    check_writable(os.path.dirname(os.path.abspath(output)), flag="output", value=_OUTPUT.value)
  return output


def _check_format_fits(fmt: str, marker, where: str) -> None:
  """An entity-only --output_format refused for a model whose task writes other fields (`WRITER_FIELDS`); `marker`:
  the model folder's config.json or manifest (`_check_folder`), read only here, where the format needs its task."""
  # pylint: disable=g-import-not-at-top
  from gp_jax import tasks

  needs = WRITER_FIELDS[fmt]
  if needs is None:
    return
  name = storage.read_json(marker).get("task") or tasks.DEFAULT
  fields = tasks.host(name).OUTPUT_FIELDS
  if tuple(fields) != needs:
    raise UserError(f"--output_format={fmt} holds {', '.join(needs)} only; the {where}'s model is task={name}, whose "
                    f"records hold {', '.join(fields)}: use --output_format=jsonl")


def _check_folder():
  """(the model folder's marker file, what messages call the folder): --workdir's config.json or --exported's
  manifest, which must exist."""
  flag, path, marker, where = (("workdir", _WORKDIR.value, "config.json", "workdir") if _WORKDIR.value else
                               ("exported", _EXPORTED.value, MANIFEST, "exported folder"))
  at = storage.path(path) / marker
  if not at.exists():
    raise UserError(f"--{flag}={path}: no such folder, or it has no {marker}")
  return at, where


def _read_input(path: str, fmt: str) -> list[dict]:
  """Every record of the input file (read in binary: the readers decode strict UTF-8)."""
  if not storage.path(path).exists():
    raise UserError(f"--input={path}: no such file")
  if storage.path(path).is_dir():
    raise UserError(f"--input={path} is a folder: give a file ({fmt}), or '-' for standard input")
  with _open(path, "rb") as src:
    return list(READERS[fmt](src, source=path))


def _checked_output(argv) -> str:
  """The checks made before the input is read or the model loads (arguments, flags, formats, paths and buckets, the
  model folder, --threshold, the output format against the model's task) -> the output path (`_output_path`)."""
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
  paths = {"workdir": _WORKDIR.value, "exported": _EXPORTED.value, "input": _INPUT.value, "output": _OUTPUT.value}
  paths = {flag: value for flag, value in paths.items() if value and value != "-"}
  for flag, value in paths.items():
    storage.check_path(value, flag=flag)
  for flag, value in paths.items():  # gs://: storage answers and the buckets exist, before any read
    storage.check_bucket(value, flag=flag, write=flag == "output")
  marker, where = _check_folder()
  check_threshold(_THRESHOLD.value)
  _check_format_fits(_OUTPUT_FORMAT.value, marker, where)
  return _output_path(_OUTPUT.value, _OUTPUT_FORMAT.value)


def run(argv) -> None:
  """Checks (`_checked_output`), reads the input, predicts, writes."""
  output = _checked_output(argv)
  # An input file (or split) is read whole before the model loads: its buckets are known before compiling any.
  if _SPLIT.value:
    records = _split_records(_WORKDIR.value, _SPLIT.value)
  elif _INPUT.value in (None, "-"):
    records = None
  else:
    records = _read_input(_INPUT.value, _INPUT_FORMAT.value)
  if _WORKDIR.value:
    configure_compilation_cache(_WORKDIR.value)
    predictor = Predictor(_WORKDIR.value, batch_size=_BATCH.value, threshold=_THRESHOLD.value)
  else:
    predictor = ExportedPredictor(_EXPORTED.value, batch_size=_BATCH.value, threshold=_THRESHOLD.value)
  if records is None:  # standard input, chunk by chunk
    rows = predict_stream(predictor, READERS[_INPUT_FORMAT.value](sys.stdin, source="<stdin>"),
                          chunk_size=_CHUNK.value)
  else:
    rows = predict_records(predictor, records, chunk_size=_CHUNK.value)

  try:
    dst = sys.stdout if output == "-" else _open(output, "w")
  except OSError as e:
    raise UserError(f"--output={_OUTPUT.value}: cannot write {output} ({e.strerror or e})") from None
  try:
    WRITERS[_OUTPUT_FORMAT.value](dst, rows)
  finally:
    if dst is sys.stdout:
      dst.flush()
    else:
      dst.close()


def main(argv):
  if not flags.FLAGS["verbosity"].present:  # quiet unless asked (-v / --verbosity): warnings and errors only
    logging.set_verbosity(logging.WARNING)
  runtime.configure()  # process settings before jax starts a backend (libtpu without a TPU: CPU, silently)
  try:
    run(argv)
  except (UserError, ExportError) as e:
    print(f"gp_jax.predict: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=help_exits_zero(app.parse_flags_with_usage))
