"""CLUENER2020: Chinese fine-grained NER, 10 types, flat.

Files (manual dir): train.json, dev.json, test.json, JSON lines
{"text", "label": {type: {entity_text: [[start, end], ...]}}} with INCLUSIVE end
offsets, converted here to exclusive ends. Each span is checked against its entity text.
Counts: train 10,748 sentences / 23,971 spans; dev 1,343 / 3,072; test 1,345.

The test split is UNLABELLED (official test set, {"id", "text"} only): it is exposed with
empty entities and listed in metadata["unlabelled_splits"]; its ids are the official ids.
Train/dev ids are cluener2020-<split>-<line index>.

Citation: Liang Xu et al. 2020. CLUENER2020: Fine-grained Named Entity Recognition Dataset
and Benchmark for Chinese. arXiv:2001.04351.
Licence: the CLUEbenchmark/CLUENER2020 repository states no licence for the data (text from
THUCTC, Sina News RSS); the copy used (cn-spacy-lm/how-to-make-chinese-models-for-spacy)
is CC BY-SA 4.0 for its own content. Treat as research-use benchmark data with attribution.
"""

from __future__ import annotations

from gp_jax.data import readers
from gp_jax.data.builders import base

FILES = {"train": "train.json", "dev": "dev.json", "test": "test.json"}


class GpCluener2020(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_cluener2020"
  CORPUS = "cluener2020"
  TYPES = ("address", "book", "company", "game", "government", "movie", "name", "organization", "position",
           "scene")
  LANGUAGE = "zh"
  UNLABELLED_SPLITS = ("test",)
  HOMEPAGE = "https://github.com/CLUEbenchmark/CLUENER2020"
  CITATION = """@article{xu2020cluener2020,
  title={{CLUENER2020}: Fine-grained Named Entity Recognition Dataset and Benchmark for {C}hinese},
  author={Xu, Liang and Dong, Qianqian and Liao, Yixuan and Yu, Cong and Tian, Yin and Liu, Weitang and Li, Lu and Liu, Caiquan and Zhang, Xuanwei},
  journal={arXiv preprint arXiv:2001.04351},
  year={2020}
}"""
  LICENSE = "No data licence stated by CLUEbenchmark; research-use benchmark data with attribution."
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put train.json, dev.json and test.json (the unzipped
  cluener_public.zip of github.com/CLUEbenchmark/CLUENER2020) in the manual dir."""

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    out = {}
    for split, fname in FILES.items():
      path = base.find_file(root, fname)
      unlabelled = split in self.UNLABELLED_SPLITS
      records = readers.read_jsonl(path, allow_unlabelled=unlabelled, id_prefix=f"cluener2020-{split}")
      if unlabelled and records.report.entities:
        raise readers.DataError(path, None, f"the {split} split is documented as unlabelled but has "
                                f"{records.report.entities} entities", reason="unexpected_labels")
      out[split] = records
    return out
