"""End to end: the tiny synthetic task trains to a high dev F1; outputs; the efficient head; dense vs sparse ZLPR."""

import glob
import json
import math
import os
import struct

import jax
import numpy as np
import pytest

from gp_jax import sharding as shd
from tests import helpers_train as ht


def read_tb_scalars(path: str) -> dict[str, list[tuple[int, float]]]:
  """Scalars of a TensorBoard event file (TFRecord framing + Event protos), read without TensorFlow."""
  from tensorboardX.proto import event_pb2

  out = {}
  with open(path, "rb") as f:
    data = f.read()
  pos = 0
  while pos < len(data):
    (n,) = struct.unpack("<Q", data[pos:pos + 8])
    event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + n])  # after length + its CRC
    pos += 12 + n + 4  # record + its CRC
    for v in event.summary.value:
      out.setdefault(v.tag, []).append((event.step, v.simple_value))
  assert pos == len(data), "truncated event file"
  return out


def test_learns_synthetic_task(trained_workdir):
  workdir, summary = trained_workdir
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["steps"] == summary["steps"] == ht.TRAINED_STEPS
  assert not results["preempted"] and results["status"] == "finished"
  assert sum(b["gold"] for b in results["dev"]["by_length"].values()) == results["dev"]["gold"]
  assert sum(b["tp"] for b in results["dev"]["by_length"].values()) == results["dev"]["tp"]
  assert results["train_tokens_per_s"] > 0
  assert results["dev"]["f1"] >= 0.9, results["dev"]
  assert results["test"]["f1"] >= 0.9, results["test"]
  assert results["best_dev_f1"] == pytest.approx(results["dev"]["f1"])
  assert set(results["dev"]["per_type"]) == {"BOX", "NUM", "CAP"}
  assert results["split_stats"]["train"]["records"] == ht.TINY["data.synthetic_records"]

  lines = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  train_lines = [m for m in lines if m["split"] == "train"]
  every = ht.TRAINED_OVERRIDES["log_every_steps"]
  # Every log_every_steps, the last step included (TRAINED_STEPS is a multiple of it).
  assert ht.TRAINED_STEPS % every == 0
  assert [m["step"] for m in train_lines] == list(range(every, ht.TRAINED_STEPS + 1, every))
  assert all(math.isfinite(m["loss"]) and m["tokens_per_s"] > 0 for m in train_lines)
  assert train_lines[-1]["loss"] < 0.1 * train_lines[0]["loss"]
  dev_lines = [m for m in lines if m["split"] == "dev"]
  assert [m["step"] for m in dev_lines] == list(range(ht.TRAINED_OVERRIDES["eval_every_steps"], ht.TRAINED_STEPS + 1,
                                                     ht.TRAINED_OVERRIDES["eval_every_steps"]))
  assert max(m["f1"] for m in dev_lines) == pytest.approx(results["best_dev_f1"])
  assert [m["split"] for m in lines].count("final_test") == 1

  # TensorBoard: one event file, readable without TensorFlow, holding the same numbers as metrics.jsonl.
  events = glob.glob(os.path.join(workdir, "tb", "events.out.tfevents.*"))
  assert len(events) == 1
  scalars = read_tb_scalars(events[0])
  assert [s for s, _ in scalars["train/loss"]] == [m["step"] for m in train_lines]
  np.testing.assert_allclose([v for _, v in scalars["train/loss"]], [m["loss"] for m in train_lines], rtol=1e-6)
  np.testing.assert_allclose([v for _, v in scalars["dev/f1"]], [m["f1"] for m in dev_lines], rtol=1e-6)
  assert "final_dev/f1" in scalars and "train/lr" in scalars

  # Checkpoints: the best one by dev F1, and the last `keep_checkpoints` for resuming.
  assert os.listdir(os.path.join(workdir, "best")) == [str(results["best_step"])]
  assert sorted(int(s) for s in os.listdir(os.path.join(workdir, "ckpt")) if s.isdigit())[-1] == ht.TRAINED_STEPS
  log_text = open(os.path.join(workdir, "train.log")).read()
  assert f"step {ht.TRAINED_STEPS} dev" in log_text and "final test" in log_text


def test_efficient_head_trains(tmp_path):
  summary, = ht.train_in_child([(str(tmp_path), {"num_train_steps": 100, "model.head": "efficient",
                                                 "optimizer.lr": 1e-2})])
  assert summary["parameters"] > 0
  assert summary["dev"]["f1"] >= 0.9, summary["dev"]
  with open(os.path.join(tmp_path, "config.json")) as f:
    assert json.load(f)["model"]["head"] == "efficient"


def test_dense_zlpr_matches_sparse_first_step():
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  out = {}
  for kind in ("sparse_zlpr", "zlpr"):
    config = ht.tiny_config(**{"loss.kind": kind, "optimizer.warmup_steps": 0, "optimizer.eps": 1e-3})
    tokenizer, types, batches = ht.train_batches(config, 1)
    assert (batches[0]["span_ids"] >= 0).sum() > 10  # several gold spans
    out[kind] = ht.run_train_steps(config, tokenizer, types, batches, mesh)
  (init_s, first_s, _, loss_s), (init_d, first_d, _, loss_d) = out["sparse_zlpr"], out["zlpr"]
  assert math.isfinite(loss_s[0]) and loss_s[0] > 0
  np.testing.assert_allclose(loss_d, loss_s, rtol=1e-5)
  for k, v in ht.flat(init_s).items():
    np.testing.assert_array_equal(ht.flat(init_d)[k], v)
  for k, v in ht.flat(first_s["params"]).items():  # same gradients -> same update
    np.testing.assert_allclose(ht.flat(first_d["params"])[k], v, rtol=1e-5, atol=1e-7, err_msg=k)


@pytest.mark.parametrize("head,steps", [("crf", 150), ("softmax", 30)])
def test_tagger_baselines_train_end_to_end(tmp_path, head, steps):
  """Tagger heads on the nested synthetic task: one tag layer (outermost wins); the nested gold spans it cannot
  hold stay in the gold set, so recall is honestly capped."""
  summary, = ht.train_in_child([(str(tmp_path), {"num_train_steps": steps, "model.head": head, "optimizer.lr": 1e-2,
                                                 "log_every_steps": 50})])
  assert summary["status"] == "finished"
  dev = summary["dev"]
  assert dev["gold"] == summary["split_stats"]["dev"]["entities"]  # nothing dropped from gold
  assert summary["unrepresentable"]["dev"] > 0
  assert dev["recall"] <= 1 - summary["unrepresentable"]["dev"] / dev["gold"] / 2
  if head == "crf":
    assert dev["precision"] >= 0.9 and dev["f1"] >= 0.6, dev


def test_early_stop_on_dev_plateau_and_resume_stays_stopped(tmp_path):
  # lr 0: dev F1 never changes after the first evaluation, so patience 2 stops at epoch 3 of 6.
  overrides = {"num_epochs": 6.0, "early_stop_patience": 2, "eval_every_steps": 0, "optimizer.lr": 0.0,
               "optimizer.head_lr": 0.0}
  workdir = str(tmp_path / "w")
  # The second run resumes at the stop and trains no further.
  summary, again = ht.train_in_child([(workdir, overrides), (workdir, overrides)])
  per_epoch = summary["dev_history"][0]["step"]
  assert [h["epoch"] for h in summary["dev_history"]] == [1.0, 2.0, 3.0]
  assert summary["status"] == "finished" and summary["stopped_early"]
  assert summary["steps"] == 3 * per_epoch and summary["epochs"] == pytest.approx(3.0)
  assert [h["step"] for h in summary["dev_history"]] == [per_epoch, 2 * per_epoch, 3 * per_epoch]
  assert summary["best_step"] == per_epoch
  assert summary["head_kind"] == "span" and summary["length_buckets"][-1] == "9+"
  assert again["steps"] == 3 * per_epoch and again["stopped_early"]
  assert [h["step"] for h in again["dev_history"]] == [per_epoch, 2 * per_epoch, 3 * per_epoch]
