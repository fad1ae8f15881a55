"""WebNLG*: English joint entity-relation extraction (the CasRel "partial match" version), 171 relations.

Files (manual dir): train_triples.json, val_triples.json (the dev split), test_triples.json and rel2id.json, as
github.com/hy-struggle/PRGC data/WebNLG-star/ ships them: each a JSON array {"text", "triple_list": [[subject,
relation, object], ...]}, read by gp_jax.data.relations (subjects and objects aligned to whole words, the first
occurrence when a string occurs more than once, counted in the build log and metadata["reports"]). Entities are
typed by their role, "subject" or "object" (the corpus has no entity types); relations index them (types.py).
Counts: train 5,019 sentences / 11,776 triples (11,687 after merging repeated ones); dev 500 / 1,118; test 703 /
1,591. rel2id.json's relations are metadata["relation_types"]; train uses 170 of them. Ids:
webnlg_star-<split>-<record index>.

Citation: Zhepei Wei et al. 2020. A Novel Cascade Binary Tagging Framework for Relational Triple Extraction.
ACL 2020 (CasRel, this version); Claire Gardent et al. 2017. The WebNLG Challenge. INLG 2017.
Licence: WebNLG is distributed under CC BY-NC-SA 4.0; the repositories state no licence for this version.
Research use with attribution; never committed to the project.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow_datasets as tfds

from gp_jax.data import readers, relations
from gp_jax.data.builders import base

FILES = {"train": "train_triples.json", "dev": "val_triples.json", "test": "test_triples.json"}
RELATIONS_FILE = "rel2id.json"


def features() -> tfds.features.FeaturesDict:
  """The entity features of every corpus, plus relations indexing the entities."""
  return tfds.features.FeaturesDict({
      **base.features(),
      "relations": tfds.features.Sequence({
          "head": np.int32,
          "tail": np.int32,
          "type": tfds.features.Text(),
      }),
  })


def read_relation_names(path: str) -> tuple[str, ...]:
  """The relations of rel2id.json ([{id: relation}, {relation: id}]), sorted."""
  try:
    with open(path, encoding="utf-8") as f:
      id2rel, rel2id = json.load(f)
  except (ValueError, TypeError) as e:  # bad JSON or bytes, or not two elements
    raise readers.DataError(path, None, f"not a rel2id file ({e}): expected [{{id: relation}}, {{relation: id}}] "
                            "as published", reason="bad_json") from None
  if not (isinstance(id2rel, dict) and isinstance(rel2id, dict) and set(id2rel.values()) == set(rel2id)):
    raise readers.DataError(path, None, "the two maps disagree: expected [{id: relation}, {relation: id}] as "
                            "published (re-download it)", reason="bad_value")
  return tuple(sorted(rel2id))


class GpWebnlgStar(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_webnlg_star"
  CORPUS = "webnlg_star"
  TYPES = relations.ROLES
  LANGUAGE = "en"
  HOMEPAGE = "https://github.com/hy-struggle/PRGC"
  CITATION = """@inproceedings{wei2020casrel,
  title={A Novel Cascade Binary Tagging Framework for Relational Triple Extraction},
  author={Wei, Zhepei and Su, Jianlin and Wang, Yue and Tian, Yuan and Chang, Yi},
  booktitle={Proceedings of ACL 2020},
  pages={1476--1488},
  year={2020}
}
@inproceedings{gardent2017webnlg,
  title={The {WebNLG} Challenge: Generating Text from {RDF} Data},
  author={Gardent, Claire and Shimorina, Anastasia and Narayan, Shashi and Perez-Beltrachini, Laura},
  booktitle={Proceedings of INLG 2017},
  pages={124--133},
  year={2017}
}"""
  LICENSE = "WebNLG: CC BY-NC-SA 4.0; this version states no licence. Research use with attribution."
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put train_triples.json, val_triples.json, test_triples.json and rel2id.json
  (data/WebNLG-star/ of github.com/hy-struggle/PRGC) in the manual dir."""

  def _info(self) -> tfds.core.DatasetInfo:
    info = super()._info()  # the metadata every corpus has
    metadata = info.metadata
    metadata["relation_types"] = []  # rel2id.json's relations, filled while building
    return tfds.core.DatasetInfo(builder=self, description=info.description, features=features(),
                                 homepage=self.HOMEPAGE, citation=self.CITATION, disable_shuffling=True,
                                 license=self.LICENSE, metadata=metadata)

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    self._relation_types = read_relation_names(base.find_file(root, RELATIONS_FILE))
    self.info.metadata["relation_types"] = list(self._relation_types)
    return {split: relations.read_casrel(base.find_file(root, fname), id_prefix=f"{self.CORPUS}-{split}")
            for split, fname in FILES.items()}

  def _check(self, split: str, records: readers.Records) -> None:
    """The entity checks, and every relation indexing an entity with a type of rel2id.json."""
    super()._check(split, records)
    where, known = records.report.path, set(self._relation_types)
    for r in records:
      n = len(r["entities"])
      for rel in r["relations"]:
        if not (0 <= rel["head"] < n and 0 <= rel["tail"] < n):
          raise readers.DataError(where, None, f"record {r['id']}: relation {rel} points outside its {n} entities",
                                  reason="bad_relation")
        if rel["type"] not in known:
          raise readers.DataError(where, None, f"record {r['id']}: relation {rel['type']!r} is not in "
                                  f"{os.path.join(os.path.dirname(where), RELATIONS_FILE)}: expected one of its "
                                  f"{len(known)} relations", reason="unknown_type")

  def _generate_examples(self, records: readers.Records):
    for i, r in enumerate(records):
      yield i, {"id": r["id"], "text": r["text"], "entities": [dict(e) for e in r["entities"]],
                "relations": [dict(x) for x in r["relations"]]}
