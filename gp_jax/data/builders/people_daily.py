"""People's Daily 1998 Chinese NER (china-people-daily-ner-corpus), character BIO; LOC/ORG/PER.

Files (manual dir): example.dev and example.test (and example.train when present: then a
train split is built too; the staged copy lacks it). One "char TAG" per line, blank line
between sentences. Text = characters joined with "". Counts: dev 2,318 sentences /
3,819 entities; test 4,636 / 7,707; train (absent here) 20,864 sentences.
Ids: people_daily-<split>-<sentence index>. The TFDS dataset is built once: a build without example.train
has no train split, and loading it fails in one line naming the file, the folder to put it in and the cache
folder to delete (gp_jax.data.corpora.load_split).

Source: github.com/zjy-ucas/ChineseNER data/example.{dev,test} (same files as kashgari's
china-people-daily-ner-corpus.tar.gz used by GlobalPointer / bert4keras).
Citation: the 1998 People's Daily corpus (Peking University ICL annotation); cite the
repository zjy-ucas/ChineseNER.
Licence: none stated in the repository; widely redistributed for research. Research use.
"""

from __future__ import annotations

import os

from gp_jax.data import readers
from gp_jax.data.builders import base

FILES = {"train": "example.train", "dev": "example.dev", "test": "example.test"}
REQUIRED = ("dev", "test")


class GpPeopleDaily(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_people_daily"
  CORPUS = "people_daily"
  TYPES = ("LOC", "ORG", "PER")
  LANGUAGE = "zh"
  HOMEPAGE = "https://github.com/zjy-ucas/ChineseNER"
  CITATION = """@misc{zjy-ucas-chinesener,
  title={ChineseNER: People's Daily 1998 NER data (example.train/dev/test)},
  author={zjy-ucas},
  howpublished={\\url{https://github.com/zjy-ucas/ChineseNER}},
  year={2017}
}"""
  LICENSE = "None stated; the 1998 People's Daily corpus is redistributed for research use."
  SPLIT_NOTE = "dev/test as shipped; train only when example.train is in the manual dir."
  OPTIONAL_FILES = {"train": FILES["train"]}  # split -> file; a missing split's error says where to put it
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put example.dev and example.test (optionally example.train) of
  github.com/zjy-ucas/ChineseNER data/ in the manual dir."""

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    out = {}
    for split, fname in FILES.items():
      if split not in REQUIRED and not os.path.isfile(os.path.join(root, fname)):
        continue
      out[split] = readers.read_conll(base.find_file(root, fname), scheme="BIO", joiner="",
                                      id_prefix=f"people_daily-{split}")
    return out
