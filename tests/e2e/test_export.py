"""Export (gp_jax.export) and prediction from the exported folder (gp_jax.serving, gp_jax.predict --exported): the artifact
equals the in-process model exactly, predicts without flax/orbax/ml_collections, never drops hits; predict's
formats, threshold, streaming, user errors and gs:// paths; imports go export -> predict -> serving only."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from gp_jax import export, predict, serving, tasks
from gp_jax.data import batching, merge, windows
from gp_jax.tasks.entities import export as entity_export
from tests import helpers_train as ht
from tests import zygote
from tests.e2e.test_predict import CASES

TEXTS = [t for t, _ in CASES]
ENTITIES = tasks.host("entities")
# Makes flax, orbax and ml_collections unimportable, then runs gp_jax.predict.
BLOCKED = ("flax", "orbax", "ml_collections")
PRELUDE = f"""
import sys
class _Block:
  def find_spec(self, name, path=None, target=None):
    if name.split(".")[0] in {BLOCKED!r}:
      raise ImportError("blocked in this test: " + name)
    return None
sys.meta_path.insert(0, _Block())
from absl import app
from gp_jax import predict
sys.argv[0] = "gp_jax.predict"
app.run(predict.main)
"""


def _predict_cmd(*flags, blocked: bool = False):
  head = ["-c", PRELUDE] if blocked else ["-m", "gp_jax.predict"]
  return [sys.executable, *head, *flags]


def _run(cmd, *, stdin: str | bytes = "", env=None):
  """The finished process; stdin given as bytes is passed as it is (stdout and stderr are decoded either way)."""
  raw = isinstance(stdin, bytes)
  proc = zygote.run(cmd, input=stdin, cwd=ht.REPO, env=env or ht.subprocess_env(devices=1), text=not raw,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=180)
  if raw:
    proc.stdout, proc.stderr = proc.stdout.decode(), proc.stderr.decode()
  return proc


def _batch(predictor, texts, *, pipeline: bool = False):
  """The one eval batch of `texts` as the predictor cuts it: model inputs (or the pipeline batch)."""
  records = [{"id": str(n), "text": t, "entities": []} for n, t in enumerate(texts)]
  prepared = windows.prepare_split(records, predictor.tokenizer, types=predictor.types, name="t",
                                   **predictor.window_options)
  batches = list(batching.eval_batches(prepared, batch_size=16, buckets=predictor.buckets))
  assert len(batches) == 1
  return batches[0] if pipeline else serving.model_inputs(batches[0])


def _entities(rows):
  """The entity lists of predicted records ({"entities": [...]})."""
  return [r["entities"] for r in rows]


def _assert_same_predictions(got, want):
  """Equal entity lists (or records' "entities"); scores (rounded to 4 places) within 2e-4: a sharded batch or
  another runtime sums in another order, which can flip the last rounded digit."""
  assert len(got) == len(want)
  got, want = ([x["entities"] if "entities" in x else x for x in rows] for rows in (got, want))
  for g, w in zip(got, want):
    assert [{**e, "score": None} for e in g] == [{**e, "score": None} for e in w]
    np.testing.assert_allclose([e["score"] for e in g], [e["score"] for e in w], atol=2e-4)


@pytest.fixture(scope="module")
def trained(trained_workdir, tmp_path_factory):
  workdir, _ = trained_workdir
  out = str(tmp_path_factory.mktemp("exported"))
  export.export_workdir(workdir, out)
  return workdir, out, predict.Predictor(workdir)


def test_artifact_equals_in_process_model(trained):
  workdir, out, p = trained
  m = serving.load_exported(out)
  assert m.manifest["head"] == "standard" and m.manifest["step"] == p.step and m.manifest["max_len"] == 48
  assert m.manifest["task"] == "entities" and m.manifest["labels"] == [] and m.task == "entities"
  assert m.manifest["task_options"] == {} and m.manifest["hit_buffers"] == [export.DEFAULT_HIT_BUFFER]
  assert "hit_buffer" not in m.manifest and m.manifest["outputs"] == list(ENTITIES.OUTPUTS)
  assert [x["name"] for x in m.manifest["inputs"]] == [*p.tokenizer.feature_names, "attention_mask", "span_mask",
                                                      "positions", "threshold"]
  assert m.types == p.types and os.path.exists(os.path.join(out, "tokenizer", "gp_jax_tokenizer.json"))
  batch = _batch(p, TEXTS)
  names = export.input_names(p.tokenizer.feature_names)
  params = export._one_device(jax.device_get(p.params))
  rest = export._one_device(p.setup.rest)
  size = m.manifest["hit_buffers"][0]
  fn = jax.jit(entity_export.export_forward(p.setup.graphdef, params, rest, names=names, sizes=(size,)))
  want = fn(*[batch[n] for n in names], np.float32(0.0))
  got = m.outputs(batch)
  for name, w in zip(ENTITIES.OUTPUTS, want):
    np.testing.assert_array_equal(np.asarray(got[name]), np.asarray(w), err_msg=name)
  count = int(got["count"])
  assert 0 < count < size
  got_count, got_coords, got_scores = m(batch)
  assert got_count == count
  np.testing.assert_array_equal(got_coords, np.asarray(want[1])[:count])
  np.testing.assert_array_equal(got_scores, np.asarray(want[2])[:count])
  # The workdir predictor's hits (batch sharded over the fake devices) are the same hits.
  pipeline_batch = _batch(p, TEXTS, pipeline=True)
  hits, want_hits = p.window_hits(pipeline_batch), merge.batch_hits(pipeline_batch["window_index"], got_coords,
                                                                    got_scores)
  for key in ("window", "start", "end", "type"):
    np.testing.assert_array_equal(hits[key], want_hits[key], err_msg=key)
  np.testing.assert_allclose(hits["score"], want_hits["score"], rtol=1e-5)  # sharded: another summation order


def test_export_resolves_the_portable_policy_on_any_host(trained, tmp_path, monkeypatch):
  """On a TPU host `model.dtype=auto` trains in bfloat16, but an export stays float32 with the XLA attention."""
  from gp_jax import factory

  workdir, _, _ = trained
  monkeypatch.setattr(factory, "target_platform", lambda platform=None: platform or "tpu")
  p = predict.Predictor(workdir)
  assert p.config.model.dtype == "auto" and p.setup.spec.precision.dtype == "bfloat16"
  assert factory.precision(predict.Predictor(workdir).config).dtype == "bfloat16"
  built = []
  real_build = factory.build_model
  monkeypatch.setattr(factory, "build_model", lambda *a, **kw: built.append(kw.get("platform")) or real_build(*a, **kw))
  manifest = export.export_workdir(workdir, str(tmp_path / "out"), platforms=["cpu"])
  assert manifest["compute_dtype"] == "float32" and set(built) == {export.PORTABLE_POLICY}


def test_export_cli_threshold_wins_compiles_no_eval_step_and_fused_attention_exports_as_xla(trained, tmp_path):
  workdir, _, _ = trained
  out = tmp_path / "cli"
  # No persistent cache (a cache hit is no compile) and every XLA compile logged by jax.
  env = ht.subprocess_env(devices=1, jit_cache=False, JAX_LOG_COMPILES=1)
  proc = _run([sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={out}", "--threshold=0.7"],
              env=env)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert json.loads((out / "manifest.json").read_text())["threshold"] == 0.7
  compiled = re.findall(r"Finished XLA compilation of (\S+)", proc.stderr)
  assert "Finished tracing" in proc.stderr  # the log is on
  assert not [name for name in compiled if "eval_step" in name], compiled  # the artifact holds no eval step
  # A run trained with splash attention (a TPU kernel) still exports: the folder gets the XLA attention.
  splash = tmp_path / "splash"
  shutil.copytree(workdir, splash)
  config = json.loads((splash / "config.json").read_text())
  config["model"]["attention"] = "splash"
  (splash / "config.json").write_text(json.dumps(config))
  manifest = export.export_workdir(str(splash), str(tmp_path / "splash_out"), platforms=["cpu"])
  assert manifest["compute_dtype"] == "float32" and manifest["step"] > 0


def test_exported_predicts_without_flax_orbax_ml_collections(trained):
  workdir, out, p = trained
  rows = [{"id": n, "text": t} for n, t in enumerate(TEXTS)]
  proc = _run(_predict_cmd(f"--exported={out}", "--input_format=jsonl", "--batch_size=4", blocked=True),
              stdin="".join(json.dumps(r) + "\n" for r in rows))
  assert proc.returncode == 0, proc.stderr[-4000:]
  got = [json.loads(line) for line in proc.stdout.splitlines()]
  assert [r["id"] for r in got] == list(range(len(TEXTS)))  # ints stay ints
  _assert_same_predictions([r["entities"] for r in got], p.predict(TEXTS))
  assert any(r["entities"] for r in got)


def test_a_manifest_written_before_labels_and_hit_buffers_still_loads(trained, tmp_path):
  """An entity folder of the older format (relation_types null, one "hit_buffer", "hit_buffers" null, no labels or
  task_options) predicts as the folder written now."""
  _, out, _ = trained
  old = tmp_path / "old"
  shutil.copytree(out, old)
  manifest = json.loads((old / "manifest.json").read_text())
  size = manifest.pop("hit_buffers")[0]
  del manifest["labels"], manifest["task_options"]
  manifest.update(relation_types=None, hit_buffer=size, hit_buffers=None)
  (old / "manifest.json").write_text(json.dumps(manifest))
  m = serving.load_exported(str(old))
  assert m.hit_buffers == (size,) and m.labels == () and m.options == {}
  assert serving.ExportedPredictor(str(old)).predict(TEXTS) == serving.ExportedPredictor(out).predict(TEXTS)


def test_overflowing_hit_buffer_loses_nothing(trained, tmp_path):
  workdir, out, p = trained
  small = str(tmp_path / "small")
  export.export_workdir(workdir, small, hit_buffer=2)
  m = serving.load_exported(small)
  batch = _batch(p, TEXTS)
  assert int(m.outputs(batch)["count"]) > 2  # really overflows
  _assert_same_predictions(serving.ExportedPredictor(small).predict(TEXTS), p.predict(TEXTS))


@pytest.fixture(scope="module")
def untrained(tmp_path_factory):
  """head -> (setup, params, folder exported with hit_buffer=1): an untrained model, many hits, so every
  batch overflows the buffer (taggers' buffer is raised to max_len; a batch holds more)."""
  from gp_jax import sharding as shd
  from gp_jax import state as state_lib
  from gp_jax.data.char_tokenizer import CharTokenizer

  cache = {}

  def get(head):
    if head not in cache:
      config = ht.tiny_config(**{"model.head": head})
      tokenizer = CharTokenizer.build(TEXTS, min_freq=1, bigram_min_freq=1)
      mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
      setup, params = state_lib.init_model(config, tokenizer, ["BOX", "CAP", "NUM"], mesh)
      out = str(tmp_path_factory.mktemp(head))
      export.export_model(setup, params, out, hit_buffer=1)
      cache[head] = setup, params, out
    return cache[head]

  return get


@pytest.mark.parametrize("head", ["standard", "efficient", "softmax", "crf"])
def test_every_head_exports_and_overflow_loses_nothing(head, untrained):
  setup, params, out = untrained(head)
  m = serving.load_exported(out)
  assert m.is_tagger == (head in ("softmax", "crf"))
  assert m.manifest["hit_buffers"] == [48 if m.is_tagger else 1]
  batch = _batch(serving.ExportedPredictor(out), TEXTS)
  assert int(m.outputs(batch)["count"]) > m.manifest["hit_buffers"][0]
  names = export.input_names(setup.tokenizer.feature_names)
  fn = jax.jit(entity_export.export_forward(setup.graphdef, params, setup.rest, names=names, sizes=(1 << 14,)))
  count, coords, hit_scores, _ = fn(*[batch[n] for n in names], np.float32(0.0))
  count = int(count)
  assert 0 < count < 1 << 14
  got_count, got_coords, got_scores = m(batch)
  assert got_count == count
  np.testing.assert_array_equal(got_coords, np.asarray(coords)[:count])
  np.testing.assert_allclose(got_scores, np.asarray(hit_scores)[:count], rtol=1e-5, atol=1e-5)  # another compile
  # A one-column batch (L = 1 < the exported minimum 2) is padded, not refused.
  m({n: np.asarray(batch[n])[:, :1] for n in names})


def test_relations_artifact_decodes_as_the_model_and_grows_its_buffers(tmp_path):
  """An untrained task=relations model (entities fire nearly everywhere) exported with buffers of 1: the folder's
  three pointers' hits equal the in-process model's `decode_hits` in buffers large enough for all, after each buffer
  grew; an ONNX export is refused in one line."""
  from flax import nnx

  from gp_jax import sharding as shd
  from gp_jax import state as state_lib
  from gp_jax.data.char_tokenizer import CharTokenizer

  config = ht.tiny_config(task="relations", **{"model.head": "efficient"})
  tokenizer = CharTokenizer.build(TEXTS, min_freq=1, bigram_min_freq=1)
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  labels = ("left_of", "part_of")
  setup, params = state_lib.init_model(config, tokenizer, ["BOX", "CAP", "NUM"], mesh, labels=labels)
  out = str(tmp_path / "relations")
  manifest = export.export_model(setup, params, out, hit_buffer=1)
  host = tasks.host("relations")
  assert manifest["task"] == "relations" and manifest["labels"] == list(labels)
  assert manifest["task_options"] == {"match": "boundaries", "pointer_rope": False, "roles": []}
  assert manifest["hit_buffers"] == [1, 1, 1] and "hit_buffer" not in manifest
  assert manifest["outputs"] == list(host.OUTPUTS) and [x["name"] for x in manifest["inputs"]][-4:] == [
      *host.BUFFERS, "threshold"]
  m = serving.load_exported(out)
  assert m.labels == labels and m.names == export.input_names(tokenizer.feature_names)
  predictor = serving.ExportedPredictor(out)
  batch = _batch(predictor, TEXTS)
  counts = [int(m.outputs(batch)[f"{k}_count"]) for k in host.POINTERS]
  assert min(counts) > 1, counts  # every buffer overflows
  got = m(batch)
  assert all(size >= count for size, count in zip(m.hit_buffers, counts)), (m.hit_buffers, counts)
  names = export.input_names(tokenizer.feature_names)

  def decode(*arrays):
    model = nnx.merge(setup.graphdef, nnx.State(params), setup.rest)
    model.eval()
    return model.decode_hits(dict(zip(names, arrays)), size=(1 << 14,) * 3, threshold=0.0)

  want = jax.jit(decode)(*[batch[n] for n in names])
  for k, (count, coords, scores), (w_count, w_coords, w_scores) in zip(host.POINTERS, got, want):
    w_count = int(w_count)
    assert count == w_count < 1 << 14, k
    np.testing.assert_array_equal(coords, np.asarray(w_coords)[:count], err_msg=k)
    np.testing.assert_allclose(scores, np.asarray(w_scores)[:count], rtol=1e-5, atol=1e-5, err_msg=k)
  rows = predictor.predict(TEXTS[:3])
  assert [set(r) for r in rows] == [{"entities", "relations"}] * 3 and any(r["entities"] for r in rows)
  # A folder written before "labels" (its relation types apart, no task options) reads the same labels.
  old = tmp_path / "old"
  shutil.copytree(out, old)
  manifest = json.loads((old / "manifest.json").read_text())
  del manifest["labels"], manifest["task_options"]
  (old / "manifest.json").write_text(json.dumps(dict(manifest, relation_types=list(labels), hit_buffer=None)))
  assert serving.load_exported(str(old)).labels == labels
  assert serving.ExportedPredictor(str(old)).predict(TEXTS[:3]) == rows
  with pytest.raises(serving.ExportError, match="task=relations.*--format=stablehlo"):
    export.export_model(setup, params, str(tmp_path / "onnx"), fmt="onnx")


def test_onnx_scores_within_1e4(trained, tmp_path):
  pytest.importorskip("jax2onnx", reason="jax2onnx pins orbax-checkpoint<0.11.37, below ours: ONNX export runs "
                      "in a separate environment (docs/serving.md)")
  pytest.importorskip("onnxruntime")
  workdir, out, p = trained
  onnx_dir = str(tmp_path / "onnx")
  export.export_workdir(workdir, onnx_dir, fmt="onnx")
  m, ref = serving.load_exported(onnx_dir), serving.load_exported(out)
  batch = _batch(p, TEXTS)
  want = np.asarray(ref.outputs(batch)["scores"])
  got = np.asarray(m.outputs(batch)["scores"])
  valid = want > np.finfo(np.float32).min / 2
  np.testing.assert_allclose(got[valid], want[valid], atol=1e-4)
  _assert_same_predictions(serving.ExportedPredictor(onnx_dir).predict(TEXTS), p.predict(TEXTS))


def test_threshold_and_streaming(trained):
  workdir, out, p = trained
  default = serving.ExportedPredictor(out)
  low, high = default.predict(TEXTS), serving.ExportedPredictor(out, threshold=2.0).predict(TEXTS)
  for a, b in zip(low, high):
    assert b == {"entities": [e for e in a["entities"] if e["score"] > 2.0]}
  assert sum(map(len, _entities(high))) < sum(map(len, _entities(low)))
  p.threshold = 2.0  # the workdir predictor: threshold is an argument of its jitted step
  try:
    _assert_same_predictions(p.predict(TEXTS), high)
  finally:
    p.threshold = None

  pulled = []

  def records():
    for n, t in enumerate(TEXTS * 3):
      pulled.append(n)
      yield {"id": n, "text": t}

  stream = predict.predict_stream(default, records(), chunk_size=4)
  first = next(stream)
  assert first[0]["id"] == 0 and len(pulled) == 4  # one chunk read, not the whole input
  rest = list(stream)
  assert len(pulled) == len(TEXTS) * 3 == 1 + len(rest)
  assert [ents for _, ents in [first, *rest]] == low * 3


def test_split_reads_the_workdir_corpus(trained):
  from gp_jax import workdir as wd
  from gp_jax.data.sources import load_records

  workdir, _, _ = trained
  config = wd.load_config(workdir)
  test = load_records(config.data, seed=config.seed)[2]
  got = predict._split_records(workdir, "test")
  assert got == [{"id": r["id"], "text": r["text"]} for r in test] and got


def test_user_errors_one_line_exit_2(trained, untrained, tmp_path):
  workdir, out, _ = trained
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"id": 1, "text": "ok"}\n{"id": 2}\n')
  tagger = untrained("crf")[2]
  cases = [
      (["--exported=" + out, f"--input={bad}", "--input_format=jsonl"], f"{bad}:2: expected a JSON object"),
      (["--exported=" + str(tmp_path / "missing")], "no such folder"),
      (["--workdir=" + str(tmp_path / "missing")], "no such folder"),
      (["--exported=" + tagger, "--threshold=0.5"], "is a tagger"),
      (["--exported=" + out, "--input_format=csv"], "--input_format must be one of"),
      (["--exported=" + out, "--threshold=nan"], "--threshold=nan: expected a finite number"),
  ]
  a_file = tmp_path / "a_file"
  a_file.write_text("")
  export_cmd = [sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={a_file}"]
  for cmd, message in [(_predict_cmd(*flags), message) for flags, message in cases] + [
      (export_cmd, f"--out={a_file} is a file: give a folder")]:
    proc = _run(cmd, stdin="x\n")
    assert proc.returncode == 2, (cmd, proc.stderr[-2000:])
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], (cmd, proc.stderr[-2000:])


def test_flags_out_of_range_stop_at_parsing(trained, tmp_path):
  """Before any model is read: a negative batch, a hit buffer of 0 and an unknown platform (exported for 'nosuch'
  before, a folder no machine loads)."""
  workdir, out, _ = trained
  export = [sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={tmp_path / 'x'}"]
  for cmd, says in [(_predict_cmd(f"--exported={out}", "--batch_size=-1"), "--batch_size=-1: -1 is not a non-negative"),
                    (_predict_cmd(f"--exported={out}", "--chunk_size=0"), "--chunk_size=0: 0 is not a positive"),
                    ([*export, "--hit_buffer=0"], "--hit_buffer=0: 0 is not a positive integer"),
                    ([*export, "--platforms=cpu,nosuch"], "--platforms takes a comma list of cpu, cuda, rocm, tpu")]:
    proc = _run(cmd, stdin="x\n")
    assert proc.returncode == 1 and says in proc.stderr and "Traceback" not in proc.stderr, (cmd, proc.stderr[-2000:])
  assert not (tmp_path / "x").exists()


def test_input_not_utf8_is_one_line_naming_file_line_and_column(trained, tmp_path):
  """Input files and standard input are decoded as strict UTF-8: a bad byte is a user error at its own line, not a
  traceback (files) nor a silently replaced character (standard input)."""
  _, out, _ = trained
  jsonl_line = b'{"id": 2, "text": "caf\xe9"}'
  cases = [  # (input bytes, format, line, byte, column): ASCII before the bad byte, so column = its byte offset + 1
      (b"ok\ncaf\xe9 au lait\n", "lines", 2, 0xe9, 4),
      (b'{"id": 1, "text": "ok"}\n' + jsonl_line + b"\n", "jsonl", 2, 0xe9, jsonl_line.index(b"\xe9") + 1),
      (b"ok\nfine\n\xff\n", "lines", 3, 0xff, 1),
  ]
  for n, (data, fmt, line, byte, column) in enumerate(cases):
    path = tmp_path / f"in{n}.{fmt}"
    path.write_bytes(data)
    for source, flags, stdin in [(str(path), [f"--input={path}"], b""), ("<stdin>", [], data)]:
      proc = _run(_predict_cmd(f"--exported={out}", f"--input_format={fmt}", *flags), stdin=stdin)
      want = f"gp_jax.predict: {source}:{line}: not valid UTF-8: byte 0x{byte:02x} at column {column} "
      assert proc.returncode == 2 and proc.stderr.startswith(want), (source, data, proc.stderr[-2000:])
      assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
  # A CBLUE array with a bad byte: one line too (the file and what is wrong).
  path = tmp_path / "in.json"
  path.write_bytes(b'[{"text": "ok"},\n {"text": "caf\xe9"}]\n')
  for flags, stdin in [([f"--input={path}"], b""), ([], path.read_bytes())]:
    proc = _run(_predict_cmd(f"--exported={out}", "--input_format=cblue", *flags), stdin=stdin)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "not valid UTF-8" in lines[0], proc.stderr[-2000:]


def test_export_help_lists_its_flags_and_those_it_shares_with_predict():
  proc = _run([sys.executable, "-m", "gp_jax.export", "--help"])
  assert proc.returncode == 0, proc.stderr[-2000:]
  for name in ("out", "format", "platforms", "hit_buffer", "workdir", "batch_size", "threshold"):
    assert f"--{name}:" in proc.stdout + proc.stderr, name
  assert "--input_format" not in proc.stdout + proc.stderr  # predict's own flags stay under --helpfull


def test_gs_paths_in_and_out(trained, gcs_env, tmp_path):
  from etils import epath

  workdir, out, p = trained
  from gp_jax import storage

  storage.upload_dir(out, "gs://bucket/exported")
  epath.Path("gs://bucket/in.txt").write_text("".join(t + "\n" for t in TEXTS[:4]))
  env = ht.subprocess_env(devices=1, **gcs_env)
  proc = _run(_predict_cmd("--exported=gs://bucket/exported", "--input=gs://bucket/in.txt",
                           "--output=gs://bucket/out/pred.jsonl"), env=env)
  assert proc.returncode == 0, proc.stderr[-4000:]
  rows = [json.loads(line) for line in epath.Path("gs://bucket/out/pred.jsonl").read_text().splitlines()]
  assert [r["text"] for r in rows] == TEXTS[:4] and "id" not in rows[0]
  _assert_same_predictions([r["entities"] for r in rows], p.predict(TEXTS[:4]))




def _gp_jax_imports(module) -> set[str]:
  """Every gp_jax module `module`'s file imports, at the top or inside a function."""
  names = set()
  for node in ast.walk(ast.parse(open(module.__file__, encoding="utf-8").read())):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
  return {n for n in names if n.startswith("gp_jax")}


def test_imports_go_one_way_and_old_names_resolve():
  """export -> predict -> serving, never back (no cycle); the re-exported names resolve."""
  assert {"gp_jax.predict", "gp_jax.serving"} <= _gp_jax_imports(export)
  assert "gp_jax.serving" in _gp_jax_imports(predict) and "gp_jax.export" not in _gp_jax_imports(predict)
  assert not {"gp_jax.export", "gp_jax.predict"} & _gp_jax_imports(serving)
  # The folder's reader reaches a task through the registry, by the manifest's name (tests/test_import_graph.py
  # checks that nothing it imports pulls in flax, orbax or ml_collections).
  assert {n for n in _gp_jax_imports(serving) if n.startswith(("gp_jax.tasks", "gp_jax.models"))} == {"gp_jax.tasks"}
  for name in ("ExportError", "ExportedModel", "load_exported"):
    assert getattr(export, name) is getattr(serving, name), name
  assert predict.ExportedPredictor is serving.ExportedPredictor and predict.model_inputs is serving.model_inputs
  assert issubclass(predict.Predictor, serving.WindowPredictor) and predict.UserError is serving.UserError
