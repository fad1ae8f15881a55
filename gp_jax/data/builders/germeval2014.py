"""GermEval 2014 German NER, NESTED (2 levels: outer + inner), 12 types.

Files (manual dir): GermEval2014.zip holding GermEval2014/germ.{train,dev,test}.iob2, or
those files extracted (GermEval2014/germ.*.iob2 or germ.*.iob2). "TOKEN\\tOUTER\\tINNER"
per line, BIO tags, blank line between sentences; both levels are decoded into one
entity list (inner spans lie inside outer ones). Text = tokens joined with single spaces.
Counts: train 24,000 sentences, 29,078 outer + 2,467 inner; dev 2,200, 2,674 + 212;
test 5,100, 6,178 + 515. Ids: germeval2014-<split>-<sentence index>.

Citation: Darina Benikova, Chris Biemann, Marc Reznicek. 2014. NoSta-D Named Entity
Annotation for German: Guidelines and Dataset. LREC 2014. (Preprocessed copy from
github.com/thecharm/boundary-aware-nested-ner, Zheng et al., EMNLP-IJCNLP 2019.)
Licence: the GermEval 2014 NER data (NoSta-D) is believed to be CC BY 4.0; the copy used
does not state it: verify before publishing.
"""

from __future__ import annotations

import os

from gp_jax.data import readers
from gp_jax.data.builders import base

ZIP = "GermEval2014.zip"
MEMBERS = {"train": "GermEval2014/germ.train.iob2", "dev": "GermEval2014/germ.dev.iob2",
           "test": "GermEval2014/germ.test.iob2"}


class GpGermeval2014(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_germeval2014"
  CORPUS = "germeval2014"
  TYPES = tuple(f"{t}{s}" for t in ("LOC", "ORG", "OTH", "PER") for s in ("", "deriv", "part"))
  LANGUAGE = "de"
  NESTED = True
  HOMEPAGE = "https://sites.google.com/site/germeval2014ner/"
  CITATION = """@inproceedings{benikova-etal-2014-nosta,
  title={{N}o{S}ta-{D} Named Entity Annotation for {G}erman: Guidelines and Dataset},
  author={Benikova, Darina and Biemann, Chris and Reznicek, Marc},
  booktitle={Proceedings of the Ninth International Conference on Language Resources and Evaluation (LREC'14)},
  pages={2524--2531},
  year={2014}
}"""
  LICENSE = "CC BY 4.0 (NoSta-D / GermEval 2014, not stated in the copy used: verify before publishing)."
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put GermEval2014.zip (with GermEval2014/germ.{train,dev,test}.iob2,
  "token<TAB>outer<TAB>inner" BIO) in the manual dir, or those files extracted."""

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    zip_path = os.path.join(root, ZIP)
    out = {}
    for split, member in MEMBERS.items():
      if os.path.isfile(zip_path):
        f, name = base.read_member(zip_path, member)
      else:
        f = name = base.find_file(root, member, os.path.basename(member))
      out[split] = readers.read_conll(f, scheme="BIO", tag_cols=(1, 2), sep="\t", joiner=" ",
                                      id_prefix=f"germeval2014-{split}", name=name)
    return out
