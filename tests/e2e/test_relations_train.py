"""End to end, task=relations: a relations jsonl trains and evaluates through the trainer on top of the synthetic
entity config (no code change): triple F1 selects checkpoints, every triple form and the entity F1 are reported."""

import json
import math
import os

import pytest

from gp_jax import train
from gp_jax.data.sources import relation_records
from tests import helpers_train as ht

STEPS = 60


def write_jsonl(path, recs):
  with open(path, "w", encoding="utf-8") as f:
    for r in recs:
      f.write(json.dumps(r) + "\n")
  return str(path)


@pytest.fixture(scope="module")
def relations_run(tmp_path_factory):
  root = tmp_path_factory.mktemp("relations")
  files = {split: write_jsonl(root / f"{split}.jsonl", relation_records(n, seed=seed, prefix=split))
           for split, n, seed in (("train", 240, 0), ("dev", 48, 1), ("test", 48, 2))}
  config = ht.tiny_config(task="relations", num_train_steps=STEPS, eval_every_steps=30, checkpoint_every_steps=30,
                          **{"data.name": "jsonl", "data.train_file": files["train"], "data.dev_file": files["dev"],
                             "data.test_file": files["test"], "data.max_len": 64, "optimizer.lr": 1e-2})
  workdir = str(root / "w")
  return workdir, train.train_and_evaluate(config, workdir)


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
  import io

  import jax
  import numpy as np

  from gp_jax import export, predict, serving, tasks
  from tests.e2e.test_export import _predict_cmd, _run

  workdir, _ = relations_run
  test_file = os.path.join(os.path.dirname(workdir), "test.jsonl")
  records = [{"id": r["id"], "text": r["text"]} for r in map(json.loads, open(test_file))]
  records = records[:ht.TINY["data.max_eval_records"]]
  out = tmp_path / "exported"
  manifest = export.export_workdir(workdir, str(out), hit_buffer=2)
  labels = tasks.get("relations")().load_labels(workdir)
  assert manifest["task"] == "relations" and manifest["labels"] == list(labels) and len(labels) == 2
  assert manifest["hit_buffers"] == [2, 2, 2] and manifest["outputs"] == list(tasks.host("relations").OUTPUTS)
  exported = jax.export.deserialize(bytearray((out / "model.jax_export").read_bytes()))
  # (count, coords [S, 4], scores [S]) per pointer, S a buffer input's size: nothing shaped by B or L.
  assert [len(a.shape) for a in exported.out_avals] == [0, 2, 1] * 3
  assert not any(str(d) in ("B", "L") for a in exported.out_avals for d in a.shape), exported.out_avals

  want = io.StringIO()
  predict.write_jsonl(want, predict.predict_records(predict.Predictor(workdir), records))
  want = [json.loads(line) for line in want.getvalue().splitlines()]
  assert sum(len(r["relations"]) for r in want) > len(records) // 2  # the trained model finds triples
  proc = _run(_predict_cmd(f"--exported={out}", "--input_format=jsonl", blocked=True),
              stdin="".join(json.dumps(r) + "\n" for r in records))
  assert proc.returncode == 0, proc.stderr[-4000:]
  got = [json.loads(line) for line in proc.stdout.splitlines()]
  assert len(got) == len(want)
  for g, w in zip(got, want):
    assert set(g) == {"id", "text", "entities", "relations"}
    for key in ("entities", "relations"):  # scores within 2e-4: another compile sums in another order
      assert [{**x, "score": None} for x in g[key]] == [{**x, "score": None} for x in w[key]], (key, g, w)
      np.testing.assert_allclose([x["score"] for x in g[key]], [x["score"] for x in w[key]], atol=2e-4)
    assert (g["id"], g["text"]) == (w["id"], w["text"])
  # The buffers of 2 overflowed and grew (the rows above are whole only if they did).
  p = serving.ExportedPredictor(str(out))
  p.predict([r["text"] for r in records])
  assert all(size > 2 for size in p.model.hit_buffers), p.model.hit_buffers


def test_four_steps_per_call_equal_one_per_call_on_relations(tmp_path):
  """The relation targets stack over k steps like span_ids: same losses and state to the last bit (dropout on)."""
  import numpy as np

  run = {"num_train_steps": 16, "checkpoint_every_steps": 8, "eval_every_steps": 8, "batch_size": 16,
         "model.dropout": 0.1, "model.embed_dropout": 0.1, "data.name": "synthetic_relations",
         "data.max_eval_records": 24, "data.buckets": (), "data.max_len": 64}
  out = {}
  for k in (1, 4):
    workdir = str(tmp_path / f"k{k}")
    summary = train.train_and_evaluate(ht.tiny_config(task="relations", steps_per_execution=k, **run), workdir)
    losses = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      for line in f:
        m = json.loads(line)
        if m.get("split") == "train":
          losses[m["step"]] = m["loss"]
    step, state = ht.restore_state(workdir)
    out[k] = (summary["train_calls"], losses, step, ht.flat(state))
  (calls1, l1, s1, st1), (calls4, l4, s4, st4) = out[1], out[4]
  assert calls1 == 16 and calls4 < 16
  assert sorted(l1) == list(range(1, 17)) and l1 == l4
  assert s1 == s4 and st1.keys() == st4.keys()
  assert all(np.array_equal(st1[k], st4[k]) for k in st1)


def test_sigkill_then_restart_is_bit_exact_on_relations(tmp_path):
  """A relations run killed at step 8 and restarted ends in the state of one never killed (dropout on)."""
  import numpy as np

  run = {"task": "relations", "data.name": "synthetic_relations", "num_train_steps": 12, "checkpoint_every_steps": 4,
         "batch_size": 24, "model.dropout": 0.1, "model.embed_dropout": 0.1, "data.max_eval_records": 8,
         "data.max_len": 64}
  env = ht.subprocess_env(devices=1)
  ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
  ht.killed_beside_reference(ref_dir, run_dir, kill_step=8, env=env, timeout=180, **run)
  assert ht.restore_state(run_dir)[0] == 8
  resumed = ht.run_main(run_dir, env=env, timeout=180, **run)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  (step_r, got), (step_ref, want) = [(s, ht.flat(st)) for s, st in (ht.restore_state(run_dir),
                                                                     ht.restore_state(ref_dir))]
  assert step_r == step_ref == 12 and got.keys() == want.keys()
  assert all(np.array_equal(got[k], want[k]) for k in want)
  with open(os.path.join(run_dir, "results.json")) as f, open(os.path.join(ref_dir, "results.json")) as g:
    assert json.load(f)["dev"] == json.load(g)["dev"]
