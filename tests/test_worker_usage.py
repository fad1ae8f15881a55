"""launch.worker as a user meets it: a config that does not load is one line and exit 2, before anything is written
under the sweep root (it was a traceback after the point's lease was taken). In-process, with a stand-in runner."""

import json
import os

import pytest

from launch import worker
from tests import helpers_train as ht

RAN = []


def standin(config, workdir: str) -> dict:
  """The runner: records the point and finishes it, training nothing."""
  RAN.append(workdir)
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump({"status": "finished"}, f)
  return {"status": "finished"}


def _worker(tmp_path, config: str, *extra) -> int:
  return worker.main([f"--config={config}", f"--workdir={tmp_path / 'root'}",
                      "--runner=tests.test_worker_usage:standin", *(["--", *extra] if extra else [])])


@pytest.mark.parametrize("arg, extra, says", [
    (":quik", (), "error: unknown config arg 'quik'; known: dataset, dtype, encoder, epochs, head, pretrained, quick, "
                  "rope, seed (point quik/head=standard)"),
    (":quick", ("--config.nope=3",),
     "error: unknown config key 'nope' in '--config.nope=3' (point quick/head=standard)"),
    (":quick", ("--config.batch_size=abc",), "error: IllegalFlagValueError: flag --config.batch_size=abc: invalid "
                                             "literal for int() with base 10: 'abc' (point quick/head=standard)"),
])
def test_a_config_that_does_not_load_is_one_line_and_writes_nothing(tmp_path, capsys, arg, extra, says):
  RAN.clear()
  assert _worker(tmp_path, ht.CONFIG_FILE + arg, *extra) == 2
  assert capsys.readouterr().err == says + "\n"
  assert not os.path.exists(tmp_path / "root") and RAN == []


def test_every_points_config_is_checked_before_the_first_runs(tmp_path, capsys):
  """The second point sets a key the config lacks: the first is not run (nor leased) either."""
  RAN.clear()
  exp = tmp_path / "exp.py"
  exp.write_text("import ml_collections\n"
                 "def get_config(arg=None):\n  return ml_collections.ConfigDict({'x': 0})\n"
                 "def get_sweep(arg=None):\n  return [{'config.x': 1}, {'config.y': 2}]\n")
  assert _worker(tmp_path, str(exp)) == 2
  assert capsys.readouterr().err == "error: unknown config key 'y' in '--config.y=2' (point default/y=2)\n"
  assert not os.path.exists(tmp_path / "root") and RAN == []


def test_a_config_that_loads_runs_its_points(tmp_path, capsys):
  RAN.clear()
  assert _worker(tmp_path, ht.CONFIG_FILE + ":quick", "--config.num_train_steps=1") == worker.EXIT_DONE
  assert RAN == [str(tmp_path / "root" / "quick" / f"head={head}") for head in ("standard", "efficient")]
  assert capsys.readouterr().err == ""


def test_a_bad_only_is_one_line_and_one_matching_nothing_leaves_nothing(tmp_path, capsys):
  """--only went to a bare re.search: a bad regex was a traceback (local and slurm say one line)."""
  RAN.clear()
  argv = [f"--config={ht.CONFIG_FILE}:quick", f"--workdir={tmp_path / 'root'}",
          "--runner=tests.test_worker_usage:standin"]
  assert worker.main([*argv, "--only=seed=("]) == 2
  assert capsys.readouterr().err == ("error: --only 'seed=(' is not a regular expression: missing ), unterminated "
                                     "subpattern at position 5\n")
  assert not os.path.exists(tmp_path / "root") and RAN == []
  assert worker.main([*argv, "--only=seed=7"]) == worker.EXIT_DONE
  captured = capsys.readouterr()
  assert captured.err == "" and "0 points" in captured.out and "nothing left (every point finished)" in captured.out
  assert RAN == []


def test_each_config_loads_once_up_front_and_once_for_its_run(tmp_path, capsys, monkeypatch):
  """The choice loaded the chosen point's config again to compare it with the workdir's config.json; the one loaded
  up front serves (a mismatch is still found), the run gets a fresh one."""
  RAN.clear()
  loaded, load = [], worker.load_config
  monkeypatch.setattr(worker, "load_config", lambda run: loaded.append(run.name) or load(run))
  root = tmp_path / "root"
  names = ["quick/head=standard", "quick/head=efficient"]
  saved = json.loads(load(worker.sweep.expand(f"{ht.CONFIG_FILE}:quick", str(root))[1]).to_json_best_effort())
  saved["model"]["hidden_size"] += 32
  os.makedirs(root / names[1])
  (root / names[1] / "config.json").write_text(json.dumps(saved))
  assert _worker(tmp_path, ht.CONFIG_FILE + ":quick") == worker.EXIT_INCOMPLETE
  assert loaded == [*names, names[0]] and RAN == [str(root / names[0])]
  assert f"{names[1]}: the workdir holds a run of another config (model.hidden_size" in capsys.readouterr().out
