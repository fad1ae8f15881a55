"""CMeEE (CBLUE): Chinese medical NER, 9 types, NESTED; versions 1 (`cmeee`) and 2 (`cmeee_v2`).

Files (manual dir): CMeEE_train.json, CMeEE_dev.json, CMeEE_test.json (V2: CMeEE-V2_*.json), each ONE JSON
array [{"text", "entities": [{"start_idx", "end_idx", "type", "entity"}]}] with INCLUSIVE end_idx, read by
gp_jax.data.cblue (streamed; every entity's text checked against text[start_idx:end_idx + 1]). Nested spans are
kept. A bad record fails the build naming file, line and record index (to skip bad records instead, read the
files as user files: data.name=cblue, data.strict=False). Counts (V1): train 15,000 / dev 5,000 / test 3,000.

The test split is UNLABELLED (official test set, texts only): it is exposed with empty entities and listed in
metadata["unlabelled_splits"]. Ids: cmeee-<split>-<record index> (cmeee_v2-...).

Citation: Ningyu Zhang et al. 2022. CBLUE: A Chinese Biomedical Language Understanding Evaluation Benchmark.
ACL 2022. Hongying Zan et al. 2020. Building a Pediatric Medical Corpus (CMeEE's source).
Licence: distributed by Alibaba Tianchi under the CBLUE terms of use (registration; research use).
"""

from __future__ import annotations

from gp_jax.data import cblue
from gp_jax.data.builders import base

TYPES = ("bod", "dep", "dis", "dru", "equ", "ite", "mic", "pro", "sym")
CITATION = """@inproceedings{zhang2022cblue,
  title={{CBLUE}: A {C}hinese Biomedical Language Understanding Evaluation Benchmark},
  author={Zhang, Ningyu and Chen, Mosha and Bi, Zhen and Liang, Xiaozhuan and Li, Lei and Shang, Xin and Yin, Kangping and Tan, Chuanqi and Xu, Jian and Huang, Fei and Si, Luo and Ni, Yuan and Xie, Guotong and Sui, Zhifang and Chang, Baobao and Zong, Hui and Yuan, Zheng and Li, Linfeng and Yan, Jun and Zan, Hongying and Zhang, Kunli and Tang, Buzhou and Chen, Qingcai},
  booktitle={Proceedings of ACL 2022},
  year={2022}
}"""


class GpCmeee(base.CorpusBuilder):
  __doc__ = __doc__
  name = "gp_cmeee"
  CORPUS = "cmeee"
  PREFIX = "CMeEE"
  TYPES = TYPES
  LANGUAGE = "zh"
  NESTED = True
  UNLABELLED_SPLITS = ("test",)
  HOMEPAGE = "https://tianchi.aliyun.com/dataset/95414"
  CITATION = CITATION
  LICENSE = "CBLUE terms of use (Alibaba Tianchi, registration); research use."
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put CMeEE_train.json, CMeEE_dev.json and CMeEE_test.json (CBLUE, from
  tianchi.aliyun.com/dataset/95414) in the manual dir."""

  def _read_splits(self, dl_manager):
    root = self._manual_dir(dl_manager)
    out = {}
    for split in ("train", "dev", "test"):
      path = base.find_file(root, f"{self.PREFIX}_{split}.json")
      out[split] = cblue.read_cblue(path, allow_unlabelled=split in self.UNLABELLED_SPLITS,
                                    id_prefix=f"{self.CORPUS}-{split}")
    return out


class GpCmeeeV2(GpCmeee):
  # CMeEE-V2 (CBLUE 2): the same format, types and splits as CMeEE, re-annotated; files CMeEE-V2_*.json.
  __doc__ = __doc__
  name = "gp_cmeee_v2"
  CORPUS = "cmeee_v2"
  PREFIX = "CMeEE-V2"
  MANUAL_DOWNLOAD_INSTRUCTIONS = """Put CMeEE-V2_train.json, CMeEE-V2_dev.json and CMeEE-V2_test.json (CBLUE)
  in the manual dir."""
