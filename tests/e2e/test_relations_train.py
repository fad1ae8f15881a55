"""End to end, task=relations: a relations jsonl trains and evaluates through the trainer on top of the synthetic
entity config (no code change): triple F1 selects checkpoints, every triple form and the entity F1 are reported."""

import json
import math
import os

import pytest

from gp_jax.data.sources import relation_records
from tests import helpers_train as ht

STEPS = 60


@pytest.fixture(scope="module")
def relations_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("relations")
  files = {split: ht.write_jsonl(root / f"{split}.jsonl", relation_records(n, seed=seed, prefix=split))
           for split, n, seed in (("train", 240, 0), ("dev", 48, 1), ("test", 48, 2))}
  run = {"task": "relations", "num_train_steps": STEPS, "eval_every_steps": 30, "checkpoint_every_steps": 30,
         "data.name": "jsonl", "data.train_file": files["train"], "data.dev_file": files["dev"],
         "data.test_file": files["test"], "data.max_len": 64, "optimizer.lr": 1e-2}
  workdir = str(root / "w")
  return workdir, ht.train_in_child([(workdir, run)])[0]  # one device: half the CPU of the test process's eight


def test_relations_train_and_evaluate(relations_run):
  workdir, summary = relations_run
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "finished" and results["steps"] == STEPS
  for split in ("dev", "test"):
    r = results[split]
    assert r["match"] == "boundaries"
    assert math.isfinite(r["f1"]) and 0.0 <= r["f1"] <= 1.0
    assert r["f1"] == r["triples"]["boundaries"]["f1"]  # the selection F1 is the triple F1
    assert set(r["triples"]) == {"boundaries", "strict", "string"}
    assert r["gold"] == sum(x["gold"] for x in r["per_type"].values())  # per relation
    assert set(r["per_type"]) <= {"lives_in", "works_at"}
    counts = r["per_record"]
    assert (sum(counts["tp"]), sum(counts["fp"]), sum(counts["fn"])) == (r["tp"], r["pred"] - r["tp"],
                                                                         r["gold"] - r["tp"])
    assert sum(v["gold"] for v in r["by_overlap"].values()) == r["gold"]
    assert math.isfinite(r["entities"]["f1"])
  assert results["best_dev_f1"] == results["dev"]["f1"]  # the best checkpoint is chosen by triple F1
  # A few dozen steps learn the synthetic relations well past chance (an untrained model finds no triple).
  assert results["test"]["f1"] > 0.3 and results["test"]["entities"]["f1"] > 0.5
  with open(os.path.join(workdir, "resolved.json")) as f:
    assert any("hits" in label and "/" in label for label in json.load(f)["programs"])  # three hit buffers


def test_predict_from_the_workdir_gives_the_evaluated_triples(relations_run, tmp_path):
  """gp_jax.predict on the test texts: {"id", "text", "entities", "relations": [{"head", "tail", "type", "score"}]}
  whose triples, scored as strings against the test file, give the string-form F1 training reported."""
  from gp_jax import predict

  workdir, _ = relations_run
  results = json.load(open(os.path.join(workdir, "results.json")))
  test_file = os.path.join(os.path.dirname(workdir), "test.jsonl")
  gold_records = [json.loads(line) for line in open(test_file)][:ht.TINY["data.max_eval_records"]]
  predictor = predict.Predictor(workdir)
  rows = list(predict.predict_records(predictor, [{"id": r["id"], "text": r["text"]} for r in gold_records]))
  out = tmp_path / "predictions.jsonl"
  with open(out, "w") as f:
    predict.write_jsonl(f, rows)
  written = [json.loads(line) for line in open(out)]
  assert [set(x) for x in written] == [{"id", "text", "entities", "relations"}] * len(gold_records)

  def strings(rec, rels):
    ents = rec["entities"]
    return {(rec["id"], rec["text"][ents[x["head"]]["start"]:ents[x["head"]]["end"]], x["type"],
             rec["text"][ents[x["tail"]]["start"]:ents[x["tail"]]["end"]]) for x in rels}

  pred, gold = set(), set()
  for rec, got in zip(gold_records, written):
    for x in got["relations"]:
      assert 0 <= x["head"] < len(got["entities"]) and 0 <= x["tail"] < len(got["entities"])
      assert isinstance(x["score"], float)
    pred |= strings(got, got["relations"])
    gold |= strings(rec, rec["relations"])
  tp = len(pred & gold)
  want = results["test"]["triples"]["string"]
  assert (tp, len(pred), len(gold)) == (want["tp"], want["pred"], want["gold"])


def test_export_then_predict_from_the_folder_gives_the_workdir_rows(relations_run, tmp_path):
  """gp_jax.export of the relations workdir: the program returns the three hit buffers (no dense scores), the
  manifest the task and relation types; gp_jax.predict --exported (flax, orbax, ml_collections unimportable) writes
  the rows predict writes from the workdir, every buffer grown from 2 on the way."""
  import numpy as np

  from gp_jax import tasks

  workdir, _ = relations_run
  test_file = os.path.join(os.path.dirname(workdir), "test.jsonl")
  records = [{"id": r["id"], "text": r["text"]} for r in map(json.loads, open(test_file))]
  records = records[:ht.TINY["data.max_eval_records"]]
  out = tmp_path / "exported"
  manifest = ht.export_pointer_workdir(workdir, out, task="relations")
  labels = tasks.get("relations")().load_labels(workdir)
  assert manifest["labels"] == list(labels) and len(labels) == 2

  want = ht.pointer_rows(workdir, records)
  assert sum(len(r["relations"]) for r in want) > len(records) // 2  # the trained model finds triples
  got = ht.exported_rows(out, records)
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert set(g) == {"id", "text", "entities", "relations"}
    for key in ("entities", "relations"):  # scores within 2e-4: another compile sums in another order
      assert [{**x, "score": None} for x in g[key]] == [{**x, "score": None} for x in w[key]], (key, g, w)
      np.testing.assert_allclose([x["score"] for x in g[key]], [x["score"] for x in w[key]], atol=2e-4)
    assert (g["id"], g["text"]) == (w["id"], w["text"])
  ht.assert_exported_buffers_grow(out, records)


def test_four_steps_per_call_equal_one_per_call_on_relations(tmp_path):
  """The relation targets stack over k steps like span_ids: same losses and state to the last bit (dropout on)."""
  ht.assert_k_steps_per_call_equal_one(tmp_path, task="relations", data="synthetic_relations")


def test_sigkill_then_restart_is_bit_exact_on_relations(tmp_path):
  """A relations run killed at step 8 and restarted ends in the state of one never killed (dropout on)."""
  ht.assert_sigkill_resume_bit_exact(tmp_path, task="relations", **{"data.name": "synthetic_relations"})
