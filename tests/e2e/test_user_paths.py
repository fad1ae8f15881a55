"""What a researcher hits in the first week, end to end through `gp_jax.main` / `gp_jax.predict`:
a BERT workdir that predicts after the pretrained folder is gone, init_from, JSONL and two-level CoNLL files
through the config, a type seen only in dev, config checks that fail early with one line."""

import json
import os
import pathlib
import random
import string
import sys

import numpy as np
import pytest

from gp_jax import train
from gp_jax.errors import UserError
from gp_jax.models.bert import BertConfig
from tests import helpers_train as ht
from tests import zygote
from tests.models.test_bert import _hf_config_dict, _hf_weights, _write_checkpoint

TIMEOUT = 240


def _tiny_bert_dir(directory):
  """A random 2-layer BERT written as a Hugging Face folder: config.json, model.safetensors, tokenizer files."""
  from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
  from transformers import PreTrainedTokenizerFast

  chars = string.ascii_letters + string.digits + "[]_"
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]
  ids = {t: i for i, t in enumerate(vocab)}
  tok = Tokenizer(models.WordPiece(ids, unk_token="[UNK]"))
  tok.normalizer = normalizers.BertNormalizer(lowercase=False)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                 sep_token="[SEP]", mask_token="[MASK]")
  os.makedirs(directory, exist_ok=True)
  fast.save_pretrained(directory)
  cfg = BertConfig(vocab_size=len(vocab), hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
                   max_position_embeddings=128)
  hf = _hf_config_dict(cfg)
  # A trainable start: unit LayerNorm scales, the rest scaled down from test_bert's N(0, 0.3).
  weights = {k: np.ones_like(v) if k.endswith("LayerNorm.weight") else v / 3
             for k, v in _hf_weights(cfg, np.random.default_rng(0)).items()}
  _write_checkpoint(pathlib.Path(directory), hf, weights)
  return hf


def test_init_from_starts_from_the_other_runs_parameters(tmp_path):
  src, dst = str(tmp_path / "src"), str(tmp_path / "dst")
  # A zero learning rate and no weight decay: dst's one step leaves the initial parameters as they are.
  _, summary = ht.train_in_child([(src, {"num_train_steps": 40, "optimizer.lr": 1e-2}),
                                  (dst, {"num_train_steps": 1, "init_from": src, "optimizer.lr": 0.0,
                                         "optimizer.warmup_steps": 0, "optimizer.weight_decay": 0.0})])
  _, want = ht.restore_state(src, sub="best")
  _, got = ht.restore_state(dst, sub="best")
  for k, v in ht.flat(want).items():
    np.testing.assert_array_equal(ht.flat(got)[k], v, err_msg=k)
  src_summary = json.load(open(os.path.join(src, "results.json")))
  assert summary["dev"]["f1"] == pytest.approx(src_summary["dev"]["f1"])


def _conll_two_levels(path, n, *, seed, extra_type=None):
  """ORG (outer, column 1) spans 2-3 words and holds a LOC (inner, column 2); PER stands alone."""
  rng = random.Random(seed)
  words = ["the", "of", "and", "met", "said", "today", "in", "for"]
  cities = ["Berlin", "Paris", "Rome", "Oslo"]
  people = ["Anna", "Karl", "Lena", "Otto"]
  outer = inner = 0
  with open(path, "w") as f:
    for _ in range(n):
      rows = []
      for _ in range(rng.randint(2, 4)):
        kind = rng.random()
        if kind < 0.35:
          city = rng.choice(cities)
          rows += [("Bank", "B-ORG", "O"), ("of", "I-ORG", "O"), (city, "I-ORG", "B-LOC")]
          outer, inner = outer + 1, inner + 1
        elif kind < 0.6:
          rows.append((rng.choice(people), "B-PER", "O"))
          outer += 1
        elif extra_type and kind < 0.7:
          rows.append(("Euro", f"B-{extra_type}", "O"))
          outer += 1
        else:
          rows.append((rng.choice(words), "O", "O"))
      f.write("".join(f"{w} {a} {b}\n" for w, a, b in rows) + "\n")
  return outer, inner


def test_user_files_through_the_config(tmp_path):
  """Two-level CoNLL through gp_jax.main (outer and inner kept), a type seen only in dev, then the same data as JSONL."""
  train_file, dev_file = str(tmp_path / "train.conll"), str(tmp_path / "dev.conll")
  n_outer, n_inner = _conll_two_levels(train_file, 160, seed=0)
  _conll_two_levels(dev_file, 40, seed=1, extra_type="MISC")
  common = {"data.name": "conll", "data.train_file": train_file, "data.dev_file": dev_file, "num_train_steps": 60,
            "optimizer.lr": 1e-2, "data.max_len": 48}
  workdir = str(tmp_path / "conll")
  env = ht.subprocess_env(devices=1)  # one device here and in the child below: the same F1 to compare
  out = ht.run_main(workdir, env=env, timeout=TIMEOUT, **common, **{"data.conll_tag_cols": (1, 2)})
  assert out.returncode == 0, out.stdout[-4000:]
  results = json.load(open(os.path.join(workdir, "results.json")))
  assert results["split_stats"]["train"]["entities"] == n_outer + n_inner
  assert json.load(open(os.path.join(workdir, "types.json"))) == ["LOC", "MISC", "ORG", "PER"]
  assert "MISC" in out.stdout and "train" in out.stdout  # the warning names the type train lacks
  assert results["dev"]["per_type"]["MISC"]["tp"] == 0 and results["dev"]["per_type"]["MISC"]["gold"] > 0
  assert results["dev"]["per_type"]["LOC"]["tp"] > 0 and results["dev"]["per_type"]["ORG"]["tp"] > 0

  # The same records as JSONL.
  from gp_jax.data import read_conll

  jsonl = {}
  for name, path in (("train", train_file), ("dev", dev_file)):
    jsonl[name] = str(tmp_path / f"{name}.jsonl")
    with open(jsonl[name], "w") as f:
      for r in read_conll(path, tag_cols=(1, 2)):
        f.write(json.dumps({"id": r["id"], "text": r["text"], "entities": r["entities"]}) + "\n")
  last_only, same = ht.train_in_child([
      (str(tmp_path / "last"), {**common, "num_train_steps": 2}),
      (str(tmp_path / "jsonl"), {**common, "data.name": "jsonl", "data.train_file": jsonl["train"],
                                 "data.dev_file": jsonl["dev"]})], env=env, timeout=TIMEOUT)
  # The last column only (the default): the outer level is not read.
  assert last_only["split_stats"]["train"]["entities"] == n_inner
  assert same["split_stats"] == results["split_stats"]
  assert same["dev"]["f1"] == pytest.approx(results["dev"]["f1"], abs=1e-6)


def test_help_exits_zero_and_an_unknown_flag_is_one_line():
  env = ht.subprocess_env(devices=1)
  for module, flag in (("gp_jax.main", "--config"), ("gp_jax.predict", "--exported"), ("gp_jax.export", "--out")):
    out = zygote.run([sys.executable, "-m", module, "--help"], cwd=ht.REPO, env=env, capture_output=True,
                     text=True, timeout=TIMEOUT)
    assert out.returncode == 0 and flag in out.stdout, (module, out.returncode, out.stderr[-2000:])
    if module == "gp_jax.main":  # where the fields are listed and what a run writes
      assert "python -m gp_jax.configs" in out.stdout and "results.json" in out.stdout, out.stdout
  out = zygote.run([sys.executable, "-m", "gp_jax.main", "--config_file=x.py"], cwd=ht.REPO, env=env,
                   capture_output=True, text=True, timeout=TIMEOUT)
  assert out.returncode == 2 and out.stderr.strip() == ("error: Unknown command line flag 'config_file'. Did you mean: "
                                                        "config ?"), out.stderr


def test_a_missing_config_file_is_one_line(tmp_path):
  missing = str(tmp_path / "nope.py")
  for overrides in ([], ["--config.seed=3"]):  # an override reads the config that failed to load
    out = zygote.run([sys.executable, "-m", "gp_jax.main", f"--config={missing}:quick",
                      f"--workdir={tmp_path / 'w'}", *overrides], cwd=ht.REPO, env=ht.subprocess_env(devices=1),
                     capture_output=True, text=True, timeout=TIMEOUT)
    assert out.returncode == 2, out.stderr[-3000:]
    assert out.stderr.strip().splitlines() == [
        f"error: no experiment file {missing}: --config takes a Python file with get_config(arg), e.g. "
        "experiments/synthetic.py:quick"], out.stderr[-3000:]
  assert not os.path.exists(tmp_path / "w")


def test_config_checks_fail_early_with_one_line(tmp_path):
  out = ht.run_main(str(tmp_path / "a"), env=ht.subprocess_env(devices=1), timeout=TIMEOUT, **{"model.hed": "standard"})
  assert out.returncode == 2 and "unknown config key 'model.hed'" in out.stdout and "model.head" in out.stdout
  assert "Traceback" not in out.stdout
  out = ht.run_main(str(tmp_path / "p"), env=ht.subprocess_env(devices=1), timeout=TIMEOUT,
                    **{"model.encoder": "bert", "model.pretrained": str(tmp_path / "no_such_folder")})
  assert out.returncode == 2 and "Traceback" not in out.stdout, out.stdout[-3000:]
  assert f"'{tmp_path / 'no_such_folder'}' is not a directory (model.pretrained: " in out.stdout

  # Checked in setup, before any data is read (8 fake devices in this process too).
  with pytest.raises(ValueError, match=r"batch_size=12 must be divisible by the 8 data-parallel devices"):
    train.setup_run(ht.tiny_config(batch_size=12), str(tmp_path / "b"))

  # Reusing a workdir with another model fails with the changed keys, unless allowed: through gp_jax.main, one line
  # and exit 2, saying both ways on.
  workdir = str(tmp_path / "c")
  ht.train_in_child([(workdir, {"num_train_steps": 2})])  # one device: half the CPU of this process's eight
  with pytest.raises(UserError, match=r"1 changed keys: model.head_size: 16 -> 8\)"):
    train.train_and_evaluate(ht.tiny_config(num_train_steps=2, **{"model.head_size": 8}), workdir)
  out = zygote.run(ht.main_command(workdir, num_train_steps=2, **{"model.head_size": 8}), cwd=ht.REPO,
                   env=ht.subprocess_env(devices=1), capture_output=True, text=True, timeout=TIMEOUT)
  assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
  err = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(err) == 1 and "model.head_size: 16 -> 8" in err[0], out.stderr[-3000:]
  assert "--config.allow_config_change=True" in err[0] and "another --workdir" in err[0]
  # Where files live may differ between hosts; and the check can be switched off.
  _, summary = ht.train_in_child([(workdir, {"num_train_steps": 2, "data.tfds_dir": str(tmp_path / "elsewhere")}),
                                  (workdir, {"num_train_steps": 3, "allow_config_change": True, "optimizer.lr": 0.5})])
  assert summary["steps"] == 3


def test_bert_settings_come_from_the_config(tmp_path):
  """encoder=bert gets the fine-tuning optimizer in one place, and model.dropout reaches the encoder's
  hidden and attention dropout (the HF config's 0.1 is overridden), with or without pretrained weights."""
  from flax import nnx

  from gp_jax.configs import base
  from gp_jax.data.tokenize import HFTokenizer
  from gp_jax.factory import build_model

  c = base.get_config("encoder=bert")
  assert (c.optimizer.lr, c.optimizer.head_lr, c.optimizer.b2) == (5e-5, 1e-3, 0.999) and c.optimizer.warmup_steps > 0
  assert base.get_config().optimizer.lr == 2e-3  # scratch keeps its own
  pretrained = str(tmp_path / "tiny_bert")
  _tiny_bert_dir(pretrained)
  c.model.pretrained = pretrained
  c.model.dropout = 0.3
  tokenizer = HFTokenizer(pretrained)
  for load_weights in (True, False):
    model = build_model(c, tokenizer, 3, load_weights=load_weights)
    rates = {m.rate for _, m in nnx.iter_graph(model.encoder) if isinstance(m, nnx.Dropout)}
    assert rates == {0.3}, (load_weights, rates)


def test_keys_added_since_a_run_compare_as_their_defaults():
  """A workdir written before a config key existed resumes when the key holds its default, not otherwise."""
  from gp_jax import workdir as wd
  from gp_jax.configs import base

  defaults = json.loads(base.get_config().to_json_best_effort())
  new = json.loads(base.get_config().to_json_best_effort())
  old = json.loads(base.get_config().to_json_best_effort())
  del old["model"]["conv_impl"]
  assert wd.config_changes(old, new, defaults) == []
  assert wd.config_changes(old, new) == ["model.conv_impl: '<absent>' -> 'unfold'"]
  new["model"]["conv_impl"] = "xla"
  assert wd.config_changes(old, new, defaults) == ["model.conv_impl: 'unfold' -> 'xla'"]
  new["batch_size"] = 7  # outside the compared sections
  assert wd.config_changes(old, new, defaults) == ["model.conv_impl: 'unfold' -> 'xla'"]
  del old["progress_log_seconds"]  # how the log reads, never the model: absent or changed, no refusal
  new["progress_log_seconds"] = 5.0
  assert wd.config_changes(old, new, defaults) == ["model.conv_impl: 'unfold' -> 'xla'"]
