"""Public access to the corpora: `load_split(name, split)` -> a sequence of Records.

The first call builds the TFDS dataset (array_record) from the manual dir into data_dir;
later calls read it back with `builder.as_data_source()` (no TensorFlow). The manual dir is
only read while building: delete `<data_dir>/gp_<name>` to rebuild from new files.
"""

from __future__ import annotations

import importlib
import logging
import operator
import os
import pathlib
import sys
from collections.abc import Sequence
from typing import Any

from gp_jax.data.builders import BUILDERS
from gp_jax.data.types import Record
from gp_jax.errors import UserError

# Deferred imports below: tensorflow_datasets is slow to import and only building or reading a corpus needs it, so
# `import gp_jax.data` stays light (tests/data/test_builders.py).

log = logging.getLogger(__name__)

NAMES = tuple(BUILDERS)
SPLIT_ALIASES = {"validation": "dev", "valid": "dev", "val": "dev", "testa": "dev", "testb": "test"}


def _check_name(name: str) -> None:
  if name not in BUILDERS:
    raise UserError(f"unknown corpus {name!r}; expected one of {', '.join(NAMES)}")


def builder_class(name: str):
  _check_name(name)
  module, cls = BUILDERS[name]
  return getattr(importlib.import_module(module), cls)


def default_manual_dir(name: str) -> pathlib.Path:
  """`$GP_JAX_DATA/<name>`, else `<repo>/../shared/data/<name>`."""
  root = os.environ.get("GP_JAX_DATA")
  if root:
    return pathlib.Path(root) / name
  return pathlib.Path(__file__).resolve().parents[3] / "shared" / "data" / name


def default_data_dir() -> pathlib.Path:
  """`$GP_JAX_TFDS_DIR`, else `~/.cache/gp_jax/tfds`."""
  root = os.environ.get("GP_JAX_TFDS_DIR")
  return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "gp_jax" / "tfds"


def corpus_types(name: str) -> tuple[str, ...]:
  """The entity types (label set) of a corpus, sorted."""
  return tuple(builder_class(name).TYPES)


def get_builder(name: str, *, manual_dir: str | os.PathLike | None = None,
                data_dir: str | os.PathLike | None = None):
  """The prepared TFDS builder of a corpus (built on first use)."""
  import tensorflow_datasets as tfds  # noqa: PLC0415

  cls = builder_class(name)
  data_dir = pathlib.Path(data_dir) if data_dir else default_data_dir()
  manual_dir = pathlib.Path(manual_dir) if manual_dir else default_manual_dir(name)
  builder = cls(data_dir=os.fspath(data_dir), file_format="array_record")
  if not builder.is_prepared():
    # The files read are logged by the builder as it reads them: MSRA may come from the package index.
    log.info("Building %s into %s (first use)", name, builder.data_dir)
    if not sys.stderr.isatty():  # tqdm's bars are escape codes and carriage returns in a log file
      tfds.display_progress_bar(False)
    builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=os.fspath(manual_dir)))
  return builder


def load_split(name: str, split: str, *, manual_dir: str | os.PathLike | None = None,
               data_dir: str | os.PathLike | None = None) -> RecordSource:
  """Records of one split of `name` in msra, cluener2020, conll2003, germeval2014, people_daily, cmeee, cmeee_v2,
  webnlg_star (records with relations, types.py), phee (records with events).

  split: train/dev/test (validation/valid are aliases of dev). manual_dir: the raw files
  (default $GP_JAX_DATA/<name> else ../shared/data/<name> beside the repo); data_dir:
  where the TFDS dataset is built (default $GP_JAX_TFDS_DIR else ~/.cache/gp_jax/tfds).
  """
  builder = get_builder(name, manual_dir=manual_dir, data_dir=data_dir)
  split = SPLIT_ALIASES.get(split, split)
  available = sorted(builder.info.splits.keys())
  if split not in available:
    optional = getattr(builder, "OPTIONAL_FILES", {})
    if split in optional:
      raise UserError(missing_optional_split(name, split, optional[split], manual_dir=manual_dir,
                                             cache=pathlib.Path(builder.data_dir).parent))
    raise UserError(f"corpus {name} has no split {split!r}; available: {', '.join(available)}")
  return RecordSource(builder.as_data_source(split), name=name, split=split,
                      metadata=dict(builder.info.metadata), data_dir=builder.data_dir)


def missing_optional_split(name: str, split: str, fname: str, *, manual_dir, cache: pathlib.Path) -> str:
  """One line: the split's file, where to put it, and the TFDS cache folder to delete (it is built once)."""
  folder = pathlib.Path(manual_dir) if manual_dir else default_manual_dir(name)
  if (folder / fname).is_file():
    return (f"corpus {name} has no {split} split although {folder / fname} exists: the TFDS cache {cache} was "
            f"built before it was there; delete {cache} to rebuild")
  return (f"corpus {name} has no {split} split: put {fname} in {folder} (or point data.manual_dir at its folder), "
          f"then delete the TFDS cache {cache} (built once, without {fname}) so it is rebuilt")


def _text(x: Any) -> str:
  return x.decode("utf-8") if isinstance(x, bytes) else str(x)


def _events(types, trigger_starts, trigger_ends, arg_event, arg_start, arg_end, arg_role) -> list[dict]:
  """The flat `events` / `event_arguments` features (builders/phee.py `example_events`) -> the record's events."""
  events = [{"type": _text(k), "trigger": None if s < 0 else {"start": int(s), "end": int(e)}, "arguments": []}
            for k, s, e in zip(types, trigger_starts, trigger_ends)]
  for k, s, e, role in zip(arg_event, arg_start, arg_end, arg_role):
    events[int(k)]["arguments"].append({"start": int(s), "end": int(e), "role": _text(role)})
  return events


def to_record(example: dict) -> Record:
  """A decoded TFDS example (bytes, numpy scalars) -> a plain Record (with "relations" or "events" when the corpus
  has them)."""
  ents = example["entities"]
  record = {
      "id": _text(example["id"]),
      "text": _text(example["text"]),
      "entities": [{"start": int(s), "end": int(e), "type": _text(t)}
                   for s, e, t in zip(ents["start"], ents["end"], ents["type"])],
  }
  if "relations" in example:
    rels = example["relations"]
    record["relations"] = [{"head": int(h), "tail": int(t), "type": _text(k)}
                           for h, t, k in zip(rels["head"], rels["tail"], rels["type"])]
  if "events" in example:
    evs, args = example["events"], example["event_arguments"]
    record["events"] = _events(evs["type"], evs["trigger_start"], evs["trigger_end"], args["event"], args["start"],
                               args["end"], args["role"])
  return record


def _fast_record(serialized: bytes) -> Record:
  """Decodes one stored tf.train.Example straight from its proto, faster than TFDS's decoder (docs/design.md,
  "Data")."""
  from tensorflow_datasets.core import example_parser  # noqa: PLC0415

  f = example_parser.tf_example_pb2.Example.FromString(serialized).features.feature
  record = {
      "id": f["id"].bytes_list.value[0].decode("utf-8"),
      "text": f["text"].bytes_list.value[0].decode("utf-8"),
      "entities": [{"start": s, "end": e, "type": t.decode("utf-8")}
                   for s, e, t in zip(f["entities/start"].int64_list.value, f["entities/end"].int64_list.value,
                                      f["entities/type"].bytes_list.value)],
  }
  if "relations/head" in f:
    heads, tails = f["relations/head"].int64_list.value, f["relations/tail"].int64_list.value
    record["relations"] = [{"head": h, "tail": t, "type": k.decode("utf-8")}
                           for h, t, k in zip(heads, tails, f["relations/type"].bytes_list.value)]
  if "events/type" in f:
    ints = lambda key: f[key].int64_list.value  # noqa: E731
    record["events"] = _events(f["events/type"].bytes_list.value, ints("events/trigger_start"),
                               ints("events/trigger_end"), ints("event_arguments/event"),
                               ints("event_arguments/start"), ints("event_arguments/end"),
                               f["event_arguments/role"].bytes_list.value)
  return record


def _raw_source(source):
  """The undecoded array_record source when `_fast_record` agrees with TFDS on it, else None."""
  raw = getattr(source, "data_source", None)
  if raw is None or not len(source):
    return None
  try:
    if _fast_record(raw[0]) == to_record(source[0]):
      return raw
  except Exception as e:  # noqa: BLE001  (layout changed in a new TFDS: use its decoder)
    log.debug("fast decoding unavailable: %r", e)
  return None


class RecordSource(Sequence):
  """Random-access Records of one split (also usable as a grain data source)."""

  chunk = 1024  # records decoded per read when iterating

  def __init__(self, source, *, name: str, split: str, metadata: dict, data_dir: str = ""):
    self._source = source
    self._raw = _raw_source(source)
    self.name, self.split, self.metadata, self.data_dir = name, split, metadata, data_dir
    self.labelled = split not in metadata.get("unlabelled_splits", [])

  def origin(self) -> str:
    """Where the records came from: the file the split was built from (when the build recorded it), and the
    TFDS folder they are read from."""
    built = self.metadata.get("sources", {}).get(self.split)
    return f"{self.name}/{self.split} " + (f"built from {built}, " if built else "") + f"read from {self.data_dir}"

  def __len__(self) -> int:
    return len(self._source)

  def _index(self, index) -> int:
    n = len(self)
    i = operator.index(index)
    i = i + n if i < 0 else i
    if not 0 <= i < n:
      raise IndexError(f"index {index} out of range for {self.name}/{self.split} of length {n}")
    return i

  def __getitems__(self, indices: Sequence[int]) -> list[Record]:
    indices = [self._index(i) for i in indices]
    if self._raw is not None:
      return [_fast_record(x) for x in self._raw.__getitems__(indices)]
    return [to_record(x) for x in self._source.__getitems__(indices)]

  def __getitem__(self, index):
    if isinstance(index, slice):
      return self.__getitems__(range(*index.indices(len(self))))
    return self.__getitems__([index])[0]

  def __iter__(self):
    for start in range(0, len(self), self.chunk):
      yield from self.__getitems__(range(start, min(start + self.chunk, len(self))))

  def __repr__(self) -> str:
    return f"RecordSource({self.name}/{self.split}, {len(self)} records)"
