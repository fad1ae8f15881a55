"""experiments/su2022.py trains: one step per head (standard, efficient, crf) on a CBLUE-format fixture with a tiny
Chinese BERT written as a local Hugging Face folder (passed as pretrained=, like a hub id resolves to one)."""

import json
import os
import subprocess
import sys

from gp_jax import train
from launch import sweep
from tests import helpers_train as ht
from tests import zygote

CHARS = "小儿肺炎支原体感染发热三天咳嗽无明显诱因出现腹痛头"
TEXTS = ["小儿肺炎支原体感染", "发热三天咳嗽", "无明显诱因出现腹痛", "头痛发热", "小儿咳嗽三天"]
SPANS = {"肺炎支原体感染": "dis", "肺炎": "dis", "支原体": "mic", "发热": "sym", "咳嗽": "sym", "腹痛": "sym",
         "小儿": "bod", "头": "bod"}


def _tiny_chinese_bert(directory):
  """A random BERT folder as transformers saves one (1 layer, hidden 32, a lowercasing char WordPiece vocab), written
  by the device check's writer (safetensors and tokenizers: no torch import)."""
  import pathlib

  from benchmarks.device_check.trainer import write_fake_bert

  hf = {"vocab_size": None, "hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2,
        "intermediate_size": 64, "max_position_embeddings": 64}
  write_fake_bert(pathlib.Path(directory), [CHARS], hf=hf, lowercase=True, word_pieces=False)


def _cblue_file(path, n):
  records = []
  for i in range(n):
    text = TEXTS[i % len(TEXTS)]
    ents = [{"start_idx": s, "end_idx": s + len(m) - 1, "type": t, "entity": m}
            for m, t in SPANS.items() for s in [text.find(m)] if s >= 0]
    records.append({"text": text, "entities": ents})
  with open(path, "w", encoding="utf-8") as f:
    json.dump(records, f, ensure_ascii=False)
  return sum(len(r["entities"]) for r in records)


def train_heads(tmp):
  """One training step per head from experiments/su2022.py on tmp's CBLUE files; returns the summaries."""
  module = sweep.load_module(os.path.join(ht.REPO, "experiments", "su2022.py"))
  out = {}
  for head in ("standard", "efficient", "crf"):
    c = module.get_config(f"dataset=cmeee,head={head},pretrained={os.path.join(tmp, 'tiny_bert')}")
    c.data.name = "cblue"
    c.data.train_file, c.data.dev_file = os.path.join(tmp, "train.json"), os.path.join(tmp, "dev.json")
    c.data.max_len, c.data.buckets, c.data.truncate = 16, (), True
    c.num_train_steps, c.progress_bar, c.log_every_steps, c.eval_batch_size = 1, False, 1, 16
    out[head] = train.train_and_evaluate(c, os.path.join(tmp, head))
  return out


def test_one_step_per_head_on_cblue_files(tmp_path):
  """In one child process with one CPU device (8 fake devices triple the compile time of a BERT step)."""
  _tiny_chinese_bert(str(tmp_path / "tiny_bert"))
  n_train = _cblue_file(tmp_path / "train.json", 32)
  _cblue_file(tmp_path / "dev.json", 8)
  run = zygote.run([sys.executable, "-m", "tests.e2e.test_su2022_train", str(tmp_path)], cwd=ht.REPO,
                   env=ht.subprocess_env(devices=1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                   timeout=300)
  assert run.returncode == 0, run.stdout[-4000:]
  summaries = json.loads(run.stdout.strip().splitlines()[-1])
  for head, summary in summaries.items():
    assert summary["status"] == "finished" and summary["steps"] == 1, (head, summary)
    assert summary["split_stats"]["train"]["entities"] == n_train and summary["dev"]["gold"] > 0
    config = json.load(open(tmp_path / head / "config.json"))
    assert config["model"]["head"] == head and config["data"]["truncate"] is True
    assert config["optimizer"]["lr"] == 2e-5 and config["optimizer"]["crf_lr_multiplier"] == 1000.0
  assert sorted(summaries) == ["crf", "efficient", "standard"]


if __name__ == "__main__":
  print(json.dumps(train_heads(sys.argv[1]), default=str))
