"""Pretrained encoders named as a user names them, end to end: hub ids from an offline HF cache (HF_HOME +
HF_HUB_OFFLINE) through `gp_jax.main`, predict after the cache is gone; a gs:// encoder folder (GCS emulator)."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from gp_jax.models import locate, pretrained
from tests import helpers_train as ht
from tests import zygote
from tests.models.test_pretrained import _assert_same_model, hub_cache, tiny_encoder

TIMEOUT = 240
# The tiny BERT run of test_user_paths.py (same shapes and schedule: the session's JIT cache serves both).
BERT = {"model.encoder": "bert", "model.dropout": 0.0, "num_train_steps": 120, "optimizer.lr": 3e-3,
        "optimizer.head_lr": 1e-2, "optimizer.warmup_steps": 5, "data.synthetic_records": 400}
ROBERTA = {"model.encoder": "bert", "model.dropout": 0.0, "num_train_steps": 4, "data.synthetic_records": 48,
           "data.max_eval_records": 16, "optimizer.warmup_steps": 1}


def _train_offline(tmp_path, kind: str, name: str, overrides: dict) -> str:
  """`gp_jax.main` with model.pretrained=`name` from the HF cache in tmp_path/hf, HF_HUB_OFFLINE=1, in tmp_path/kind;
  checks that it exited 0 and kept the encoder's own lowercase setting; returns its output."""
  env = ht.subprocess_env(devices=1, HF_HOME=tmp_path / "hf", HF_HUB_OFFLINE=1)
  proc = zygote.run(ht.main_command(str(tmp_path / kind), **overrides, **{"model.pretrained": name}), cwd=ht.REPO,
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=TIMEOUT)
  assert proc.returncode == 0, proc.stdout[-4000:]
  assert "lowercase off (its own setting)" in proc.stdout
  return proc.stdout


def test_hub_id_at_a_commit_trains_offline(tmp_path):
  """org/name@<commit>: a 1-layer RoBERTa with flax_model.msgpack weights from an HF cache with HF_HUB_OFFLINE=1;
  the workdir records the resolved encoder. Its own test: it trains beside the BERT one."""
  commit, _ = hub_cache(tmp_path / "hf", "org/tiny-roberta", model_type="roberta", weights_format="flax", num_layers=1)
  _train_offline(tmp_path, "roberta", f"org/tiny-roberta@{commit}", ROBERTA)
  assert json.loads((tmp_path / "roberta" / "pretrained.json").read_text()) == {
      "repo_id": "org/tiny-roberta", "revision": commit, "commit": commit}
  assert json.loads((tmp_path / "roberta" / "encoder.json").read_text())["model_type"] == "roberta"
  assert json.loads((tmp_path / "roberta" / "results.json").read_text())["status"] == "finished"


def test_hub_ids_train_offline_and_predict_without_the_cache(tmp_path):
  """org/name (BERT, safetensors) from an HF cache with HF_HUB_OFFLINE=1; the workdir records the resolved encoder
  and is self-contained: predict runs with the cache deleted."""
  hf_home = tmp_path / "hf"
  bert_commit, bert_snapshot = hub_cache(hf_home, "org/tiny-bert")
  env = ht.subprocess_env(devices=1, HF_HOME=hf_home, HF_HUB_OFFLINE=1)
  _train_offline(tmp_path, "bert", "org/tiny-bert", BERT)
  assert json.loads((tmp_path / "bert" / "pretrained.json").read_text()) == {
      "repo_id": "org/tiny-bert", "revision": "main", "commit": bert_commit}
  results = json.loads((tmp_path / "bert" / "results.json").read_text())
  assert results["status"] == "finished" and results["dev"]["f1"] > 0.5, results.get("dev")
  assert json.loads((tmp_path / "bert" / "encoder.json").read_text()) == json.loads(
      (bert_snapshot / "config.json").read_text())
  resolved = json.loads((tmp_path / "bert" / "resolved.json").read_text())  # what `auto` resolved to on this CPU
  assert (resolved["platform"], resolved["dtype"], resolved["dropout_bits"]) == ("cpu", "float32", "hash")
  assert resolved["programs"] and {(c["attention"], c["loss"], c["bert_kernels"], c["optimizer_update"])
                                   for c in resolved["programs"].values()} == {("xla", "xla", "reference", "optax")}
  best = tmp_path / "bert" / "best" / str(results["best_step"])  # parameters only: predict never reads Adam's moments
  assert (best / "params").is_dir() and not (best / "state").exists()

  shutil.rmtree(hf_home)
  text = "abc_[12_Xyz]_qq_777_Hello"
  pred = zygote.run([sys.executable, "-m", "gp_jax.predict", f"--workdir={tmp_path / 'bert'}", "--batch_size=4"],
                    input=text + "\n", cwd=ht.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, timeout=TIMEOUT)
  assert pred.returncode == 0, pred.stderr[-4000:]
  ents = json.loads(pred.stdout)["entities"]
  assert ents and all(text[e["start"]:e["end"]] == e["text"] for e in ents), pred.stdout
  assert {(e["start"], e["end"], e["type"]) for e in ents} & {(16, 19, "NUM"), (4, 12, "BOX"), (5, 7, "NUM")}
  # A BERT workdir exports (the position-table check meets a symbolic length) and predicts the same spans.
  from gp_jax import export, predict, serving

  export.export_workdir(str(tmp_path / "bert"), str(tmp_path / "exported"))
  texts = [text, "Hello_world_4521", "[Ab_cd_99]"]
  got = serving.ExportedPredictor(str(tmp_path / "exported")).predict(texts)
  want = predict.Predictor(str(tmp_path / "bert")).predict(texts)
  spans = lambda records: [[(e["start"], e["end"], e["type"]) for e in r["entities"]] for r in records]  # noqa: E731
  assert spans(got) == spans(want)
  assert any(spans(got))


def test_gs_encoder_folder_is_copied_once(gcs_env, tmp_path, monkeypatch):
  from etils import epath

  from gp_jax import storage

  monkeypatch.setenv("GP_JAX_CACHE", str(tmp_path / "cache"))
  monkeypatch.setattr(locate, "_RESOLVED", {})
  tiny_encoder(tmp_path / "enc", seed=2)
  (tmp_path / "enc" / "pytorch_model.bin").write_bytes(b"not read, not copied")
  storage.upload_dir(tmp_path / "enc", "gs://bucket/encoders/tiny")
  folder = pretrained.resolve("gs://bucket/encoders/tiny/")
  assert folder.is_relative_to(tmp_path / "cache" / "pretrained")
  assert not (folder / "pytorch_model.bin").exists() and (folder / "model.safetensors").exists()
  assert pretrained.source("gs://bucket/encoders/tiny") == {"url": "gs://bucket/encoders/tiny"}
  _assert_same_model(pretrained.load_pretrained(tmp_path / "enc"), pretrained.load_pretrained(folder))
  # Copied once: a later process reuses the copy without reading the bucket.
  epath.Path("gs://bucket/encoders/tiny").rmtree()
  monkeypatch.setattr(locate, "_RESOLVED", {})
  assert pretrained.resolve("gs://bucket/encoders/tiny") == folder
  monkeypatch.setattr(locate, "_RESOLVED", {})
  with pytest.raises(FileNotFoundError, match="gs://bucket/encoders/other is not a folder"):
    pretrained.resolve("gs://bucket/encoders/other")
  assert os.listdir(tmp_path / "cache" / "pretrained") == [folder.name]
