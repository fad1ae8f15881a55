"""gp_jax.predict and gp_jax.export on a user's mistakes: one line, exit 2, before any model loads (the workdirs and
folders here hold a config.json or manifest.json alone, so reaching the model would fail differently): entity-only
output formats for other tasks, a split the workdir has none of, folders and unwritable paths, thresholds past
float32. In-process: flags parsed under `flagsaver`, `runtime.configure` left alone."""

from __future__ import annotations

import json
import types

import pytest
from absl import flags
from absl.testing import flagsaver

from gp_jax import export, predict, serving
from gp_jax.configs.base import get_config
from gp_jax.errors import UserError


@pytest.fixture
def cli(monkeypatch, capsys):
  """call(*flags) -> (exit status, stderr) of `predict.main`."""
  monkeypatch.setattr(predict.runtime, "configure", lambda: {})
  monkeypatch.setattr(predict.logging, "set_verbosity", lambda level: None)

  def call(*args):
    with flagsaver.flagsaver():
      argv = flags.FLAGS(["gp_jax.predict", *args])
      with pytest.raises(SystemExit) as e:
        predict.main(argv)
    return e.value.code, capsys.readouterr().err

  return call


def run(*args):
  """`predict.run` with these flags (raises what it raises)."""
  with flagsaver.flagsaver():
    predict.run(flags.FLAGS(["gp_jax.predict", *args]))


def workdir(path, *, task=None, **data):
  """A folder with a config.json: the base config, `task` and data fields set."""
  c = get_config()
  if task:
    c.task = task
  for k, v in data.items():
    setattr(c.data, k, v)
  path.mkdir()
  (path / "config.json").write_text(json.dumps(c.to_dict()))
  return str(path)


def exported(path, task):
  path.mkdir()
  (path / serving.MANIFEST).write_text(json.dumps({"format_version": serving.FORMAT_VERSION, "task": task}))
  return str(path)


@pytest.mark.parametrize("task,fields", [("events", "events"), ("relations", "entities, relations")])
@pytest.mark.parametrize("fmt", ["cluener", "cmeee"])
def test_entity_only_formats_are_refused_for_other_tasks_before_the_model_loads(cli, tmp_path, task, fields, fmt):
  """events: a KeyError traceback and an empty file; relations: every relation silently left out."""
  out = tmp_path / "out.json"
  for where, folder in (("workdir", workdir(tmp_path / "w", task=task)), ("exported folder",
                                                                         exported(tmp_path / "e", task))):
    flag = "--workdir" if where == "workdir" else "--exported"
    code, err = cli(f"{flag}={folder}", f"--output_format={fmt}", f"--output={out}")
    assert code == 2 and err == (f"gp_jax.predict: --output_format={fmt} holds entities only; the {where}'s model is "
                                 f"task={task}, whose records hold {fields}: use --output_format=jsonl\n")
    assert not out.exists()
  with flagsaver.flagsaver(), pytest.raises(UserError, match="no such folder"):  # an entity workdir passes
    predict.run(flags.FLAGS(["gp_jax.predict", f"--workdir={workdir(tmp_path / 'n')}", "--output_format=cluener",
                             f"--output={tmp_path / 'missing' / 'x'}/"]))


def test_a_split_the_workdir_has_none_of_is_one_line(tmp_path):
  train = tmp_path / "train.jsonl"
  train.write_text("".join(json.dumps({"id": f"r{n}", "text": "ab", "entities": []}) + "\n" for n in range(3)))
  w = workdir(tmp_path / "w", name="jsonl", train_file=str(train), dev_file=str(train))
  with pytest.raises(UserError) as e:
    run(f"--workdir={w}", "--split=test")
  assert str(e.value) == ("--split=test: the workdir's config has no test split (data.test_file='', "
                          "data.name='jsonl'): give --input instead")
  assert predict._split_records(w, "train") == [{"id": f"r{n}", "text": "ab"} for n in range(3)]
  with pytest.raises(UserError, match="--split must be one of"):
    predict._split_records(w, "valid")


def test_bad_input_and_output_paths_are_one_line_before_the_model_loads(cli, tmp_path):
  e = exported(tmp_path / "e", "entities")
  cases = [([f"--input={tmp_path}"], f"--input={tmp_path} is a folder: give a file (lines), or '-' for standard "
                                      "input"),
           ([f"--output={tmp_path}/newdir/"], f"--output={tmp_path}/newdir/: no such folder (a path ending in / "
                                               "names a folder): create it, or give a file path"),
           (["--output=/proc/foo.jsonl"], "--output=/proc/foo.jsonl: cannot write in /proc ("),
           ([f"--output={e}/manifest.json/x.jsonl"], f"--output={e}/manifest.json/x.jsonl: {e}/manifest.json is "
                                                      "a file, not a folder")]
  for args, says in cases:
    code, err = cli(f"--exported={e}", *args)
    assert code == 2 and err.startswith(f"gp_jax.predict: {says}") and err.count("\n") == 1, (args, err)
  assert not (tmp_path / "newdir").exists()


@pytest.mark.parametrize("value", ["1e39", "-1e40", "inf"])
def test_thresholds_past_float32_are_refused(cli, tmp_path, value):
  """A float64 threshold above float32's largest overflowed in the program: nothing (or everything) was kept."""
  code, err = cli(f"--exported={exported(tmp_path / 'e', 'entities')}", f"--threshold={value}")
  assert code == 2 and err == (f"gp_jax.predict: --threshold={float(value)}: expected a finite number within "
                               "float32's range (|threshold| <= 3.403e+38; spans with score > threshold are kept)\n")
  assert serving.check_threshold(3.4e38) == 3.4e38


def test_a_folder_exported_with_a_threshold_past_float32_is_refused(monkeypatch):
  m = {"head": "efficient", "tagger": False, "threshold": 1e39, "batch_size": 4, "max_len": 8, "stride": 4,
       "max_span_width": None, "buckets": []}
  stub = types.SimpleNamespace(manifest=m, types=[], tokenizer=None, host=None, labels=(), options={})
  monkeypatch.setattr(serving, "load_exported", lambda directory: stub)
  with pytest.raises(serving.ExportError, match=r"^d: the manifest.json threshold 1e\+39 is not a finite float32"):
    serving.ExportedPredictor("d")
  assert serving.ExportedPredictor("d", threshold=0.5).threshold == 0.5


def test_export_refuses_an_unwritable_out_and_a_threshold_past_float32_before_restoring(monkeypatch, capsys,
                                                                                         tmp_path):
  monkeypatch.setattr(export.runtime, "configure", lambda: {})
  w = workdir(tmp_path / "w")
  base = dict(workdir=w, out=str(tmp_path / "out"), threshold=None, format="stablehlo", platforms=[],
              hit_buffer=4096, batch_size=0)
  for over, says in (({"out": "/proc/xx"}, "--out=/proc/xx: cannot write in /proc ("),
                     ({"threshold": 1e39}, "--threshold=1e+39: expected a finite number within float32's range")):
    with pytest.raises(SystemExit) as e:
      export.main(["gp_jax.export"], types.SimpleNamespace(**{**base, **over}))
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(f"gp_jax.export: {says}") and err.count("\n") == 1, err
  assert not (tmp_path / "out").exists()


def test_help_names_every_format_and_what_the_threshold_applies_to():
  usage = predict.__doc__.split("\n\n")[1]
  assert "--input_format=lines|jsonl|cblue" in usage and "--output_format=jsonl|cmeee|cluener" in usage
  assert "hold entities only" in flags.FLAGS["output_format"].help
  help_ = flags.FLAGS["threshold"].help
  assert "GPLinker pointers" in help_ and "export writes it as the folder's default" in help_
