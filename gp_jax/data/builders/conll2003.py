"""CoNLL-2003 English NER: PER/ORG/LOC/MISC, flat, IOB2 tags.

Files (manual dir): train.txt (eng.train), valid.txt (eng.testa), test.txt (eng.testb);
or eng.train/eng.testa/eng.testb. "TOKEN POS CHUNK NER" per line, blank line between
sentences; -DOCSTART- lines skipped; the NER column (last) is decoded. Text = tokens
joined with single spaces. Splits train/dev/test = 14,041/3,250/3,453 sentences,
23,499/5,942/5,648 entities. Ids: conll2003-<split>-<sentence index>.

Citation: Erik F. Tjong Kim Sang and Fien De Meulder. 2003. Introduction to the CoNLL-2003
Shared Task: Language-Independent Named Entity Recognition. CoNLL 2003.
Licence: derived from the Reuters RCV1 corpus; the official distribution requires the
Reuters corpus licence. Internal research/evaluation only; do not re-publish.
Registered as gp_conll2003 (TFDS ships its own conll2003 builder).
"""

from __future__ import annotations

from gp_jax.data import readers
from gp_jax.data.builders import base

FILES = {"train": ("train.txt", "eng.train"), "dev": ("valid.txt", "eng.testa"), "test": ("test.txt", "eng.testb")}


class GpConll2003(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_conll2003"
  CORPUS = "conll2003"
  TYPES = ("LOC", "MISC", "ORG", "PER")
  LANGUAGE = "en"
  HOMEPAGE = "https://www.clips.uantwerpen.be/conll2003/ner/"
  CITATION = """@inproceedings{tjong-kim-sang-de-meulder-2003-introduction,
  title={Introduction to the {C}o{NLL}-2003 Shared Task: Language-Independent Named Entity Recognition},
  author={Tjong Kim Sang, Erik F. and De Meulder, Fien},
  booktitle={Proceedings of the Seventh Conference on Natural Language Learning at HLT-NAACL 2003},
  pages={142--147},
  year={2003}
}"""
  LICENSE = "Reuters RCV1 derived: needs the Reuters corpus licence; internal research use only, do not re-publish."
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put train.txt, valid.txt, test.txt (or eng.train, eng.testa,
  eng.testb) of CoNLL-2003 English in the manual dir."""

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    return {
        split: readers.read_conll(base.find_file(root, *names), scheme="BIO", joiner=" ",
                                  id_prefix=f"conll2003-{split}")
        for split, names in FILES.items()
    }
