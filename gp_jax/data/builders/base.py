"""Shared parts of the corpus builders: features, metadata, checks and build logging.

Every builder writes array_record files and is read with `builder.as_data_source()`,
so TensorFlow is never imported. Examples keep the file order (shuffling disabled).
"""

from __future__ import annotations

import codecs
import collections
import io
import logging
import os
import zipfile
from collections.abc import Iterator, Mapping

import numpy as np
import tensorflow_datasets as tfds

from gp_jax.data import readers

log = logging.getLogger(__name__)


def features() -> tfds.features.FeaturesDict:
  return tfds.features.FeaturesDict({
      "id": tfds.features.Text(),
      "text": tfds.features.Text(),
      # Character offsets into text, end exclusive; nested spans allowed.
      "entities": tfds.features.Sequence({
          "start": np.int32,
          "end": np.int32,
          "type": tfds.features.Text(),
      }),
  })


def read_member(path: str | os.PathLike, member: str) -> tuple[io.StringIO, str]:
  """A zip member as text, with the name "<zip>!<member>" for error messages (a bad byte: its line and column)."""
  name = f"{os.fspath(path)}!{member}"
  try:
    with zipfile.ZipFile(path) as zf:
      data = zf.read(member)
  except KeyError:
    raise readers.DataError(os.fspath(path), None, f"no member {member!r} in the zip: expected the archive as "
                            "published (re-download it)", reason="missing_file") from None
  except zipfile.BadZipFile as e:
    raise readers.DataError(os.fspath(path), None, f"not a readable zip file ({e}): re-download it",
                            reason="bad_file") from None
  data = data.removeprefix(codecs.BOM_UTF8)
  try:
    return io.StringIO(data.decode("utf-8"), newline=None), name
  except UnicodeDecodeError as e:
    raise readers.utf8_error(name, data, e) from None


def find_file(root: os.PathLike, *names: str) -> str:
  """First of `names` under `root` (relative paths), else DataError listing what was tried."""
  for n in names:
    p = os.path.join(os.fspath(root), n)
    if os.path.isfile(p):
      return p
  raise readers.DataError(os.fspath(root), None, f"none of {list(names)} found", reason="missing_file")


class CorpusBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Base: subclasses set the class constants and implement `_read_splits`."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}
  CORPUS = ""  # public name used by gp_jax.data.load_split
  TYPES: tuple[str, ...] = ()  # the label set (entity types)
  LANGUAGE = ""
  NESTED = False
  UNLABELLED_SPLITS: tuple[str, ...] = ()
  HOMEPAGE = ""
  CITATION = ""
  LICENSE = ""
  SPLIT_NOTE = ""  # how splits were made, when not as shipped

  def _info(self) -> tfds.core.DatasetInfo:
    doc = (self.__class__.__doc__ or "").strip()
    return tfds.core.DatasetInfo(
        builder=self,
        description=doc,
        features=features(),
        homepage=self.HOMEPAGE,
        citation=self.CITATION,
        disable_shuffling=True,
        license=self.LICENSE,
        metadata=tfds.core.MetadataDict(
            corpus=self.CORPUS,
            types=list(self.TYPES),
            language=self.LANGUAGE,
            nested=self.NESTED,
            unlabelled_splits=list(self.UNLABELLED_SPLITS),
            split_note=self.SPLIT_NOTE,
            license=self.LICENSE,
            reports={},  # split -> ReadReport.as_dict(), filled while building
            sources={},  # split -> the file it was read from, filled while building
        ),
    )

  def _read_splits(self, dl_manager) -> Mapping[str, readers.Records]:
    raise NotImplementedError

  def _manual_dir(self, dl_manager) -> str:
    try:
      return os.fspath(dl_manager.manual_dir)
    except AssertionError as e:  # TFDS raises this for a missing/empty manual dir
      raise readers.DataError(str(getattr(dl_manager, "_manual_dir", "?")), None,
                              f"manual data for {self.CORPUS} not found: {' '.join(str(e).split())}",
                              reason="missing_file") from None  # one line: TFDS's message spans several

  def _split_generators(self, dl_manager):
    splits = dict(self._read_splits(dl_manager))
    reports, sources = {}, {}
    for split, records in splits.items():
      self._check(split, records)
      reports[split], sources[split] = records.report.as_dict(), records.report.path
      log.info("%s/%s from %s: %d records, %d entities, skipped %s, tag repairs %s", self.CORPUS, split,
               records.report.path, records.report.records, records.report.entities, dict(records.report.skipped),
               dict(records.report.repairs))
    self.info.metadata["reports"] = reports
    self.info.metadata["sources"] = sources
    return {split: self._generate_examples(records) for split, records in splits.items()}

  def _check(self, split: str, records: readers.Records) -> None:
    """Not empty, every type in the label set, ids unique, offsets valid."""
    if not records:
      raise readers.DataError(records.report.path, None, f"split {split} of {self.CORPUS} has no records: "
                              "expected at least one", reason="empty_split")
    seen, ids = collections.Counter(), set()
    for r in records:
      if r["id"] in ids:
        raise readers.DataError(records.report.path, None, f"duplicate id {r['id']!r} in split {split}",
                                reason="duplicate_id")
      ids.add(r["id"])
      readers.check_entities(r["text"], r["entities"], where=records.report.path, line=None)
      seen.update(e["type"] for e in r["entities"])
    unknown = sorted(set(seen) - set(self.TYPES))
    if unknown:
      raise readers.DataError(records.report.path, None, f"types {unknown} are not in the label set of "
                              f"{self.CORPUS}: expected {list(self.TYPES)}", reason="unknown_type")

  def _generate_examples(self, records: readers.Records) -> Iterator[tuple[int, dict]]:
    for i, r in enumerate(records):
      yield i, {"id": r["id"], "text": r["text"], "entities": [dict(e) for e in r["entities"]]}
