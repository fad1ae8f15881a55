"""launch/report names the split a figure is on as the runs' config says (data.dev_split, data.test_split): a
corpus's official dev reported as the test figure is "official dev", a dev held out of the training split "holdout";
a report of two sweeps shows each row's, cell's and panel's own."""

import json
import os

import pytest

from gp_jax.data import sources
from launch import report
from launch.report import headline, splits
from tests.test_report import _history, _run


def _set_splits(root, name, **data):
  path = os.path.join(root, name, "config.json")
  config = json.load(open(path))
  config["data"].update(data)
  json.dump(config, open(path, "w"))


def _two_sweeps(root, cluener_test=True):
  """cluener (test_split=dev, dev_split=holdout, as experiments/rope_ablation.py) and msra (the corpus's splits),
  RoPE on and off, 2 seeds, each with a dev history and by-length counts."""
  for dataset in ("cluener2020", "msra"):
    for rope in (True, False):
      for seed in (0, 1):
        name = f"{dataset}/use_rope={rope},seed={seed}"
        _run(root, name, dataset=dataset, rope=rope, seed=seed, k=seed * (1 + rope), test=cluener_test or
             dataset == "msra", dev_history=_history([1, 2], [0.3, 0.4 + 0.1 * seed]), epochs=2.0)
        if dataset == "cluener2020":
          _set_splits(root, name, test_split="dev", dev_split="holdout", dev_fraction=0.1)


def test_split_label_reads_the_config():
  assert splits.split_label({}, "test") == "test" and splits.split_label({}, "dev") == "dev"
  config = {"data.name": "cluener2020", "data.test_split": "dev", "data.dev_split": "holdout"}
  assert splits.split_label(config, "test") == "official dev" and splits.split_label(config, "dev") == "holdout"
  assert splits.split_label({"data.test_split": "validation"}, "test") == "official dev"
  assert splits.split_label({"data.dev_split": "validation"}, "dev") == "dev"
  # User files: test is the test file; without a dev file the dev set is held out of train.
  assert splits.split_label({"data.name": "jsonl", "data.dev_file": ""}, "dev") == "holdout"
  assert splits.split_label({"data.name": "conll", "data.dev_file": "d.conll"}, "dev") == "dev"
  assert splits.split_label({"data.name": "jsonl", "data.test_split": "dev"}, "test") == "test"
  # The names copied from the data stack are its own.
  assert splits.HOLDOUT == sources.HOLDOUT and set(splits.USER_FORMATS) == set(sources.USER_FORMATS)


def test_two_sweeps_each_row_names_its_split(tmp_path):
  root = str(tmp_path / "runs")
  _two_sweeps(root)
  rows = report.collect(root)
  summary = report.summarize(rows)
  text = report.markdown(rows, summary, resamples=10)
  groups = text.split("## Significance")[0]
  header = next(ln for ln in groups.splitlines() if ln.startswith("| dataset |"))
  cols = [c.strip() for c in header.strip("|").split("|")]
  assert "test F1" not in cols and "dev F1" not in cols
  assert "dev / holdout F1" in cols and "test / official dev F1" in cols and "splits (dev / test)" in cols
  for line in groups.splitlines():
    if line.startswith("| cluener2020 |"):
      assert dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))["splits (dev / test)"] == \
          "holdout / official dev"
    elif line.startswith("| msra |"):
      assert dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))["splits (dev / test)"] == "dev / test"
  assert "official dev = the corpus's dev split" in groups
  sig = text.split("## Significance")[1].split("\n## ")[0]
  header = next(ln for ln in sig.splitlines() if ln.startswith("| # |"))
  cols = [c.strip() for c in header.strip("|").split("|")]
  splits_by_dataset = {}
  for line in sig.splitlines():
    if line.startswith("| ") and not line.startswith("| # |"):
      cells = dict(zip(cols, (c.strip() for c in line.strip("|").split("|"))))
      splits_by_dataset.setdefault(cells["dataset"], set()).add(cells["split"])
  assert splits_by_dataset == {"cluener2020": {"official dev"}, "msra": {"test"}}
  lengths = text.split("## Dev F1 (%) by gold entity length")[1].split("\n## ")[0]
  assert any(ln.startswith("| cluener2020 |") and "| holdout |" in ln for ln in lengths.splitlines())
  assert any(ln.startswith("| msra |") and "| dev |" in ln for ln in lengths.splitlines())


def test_one_sweep_names_its_columns(tmp_path):
  root = str(tmp_path / "runs")
  _two_sweeps(root)
  rows = [r for r in report.collect(root) if r["dataset"] == "cluener2020"]
  table = report.groups_table(report.summarize(rows))
  cols = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
  assert cols[cols.index("n") + 1:cols.index("n") + 7] == ["holdout F1", "holdout P", "holdout R", "official dev F1",
                                                           "official dev P", "official dev R"]
  # The corpus's own splits keep their names and no splits column.
  rows = [r for r in report.collect(root) if r["dataset"] == "msra"]
  assert "| n | dev F1 | dev P | dev R | test F1 |" in report.groups_table(report.summarize(rows))


def test_figures_name_each_panels_split(tmp_path):
  pytest.importorskip("matplotlib")
  import matplotlib.pyplot as plt

  root = str(tmp_path / "runs")
  _two_sweeps(root)
  rows = report.collect(root)
  summary = report.summarize(rows)
  for fig, want in ((report.plot_f1(summary), {"cluener2020": "official dev F1", "msra": "test F1"}),
                    (report.plot_by_length(rows, summary), {"cluener2020": "holdout F1", "msra": "dev F1"}),
                    (report.plot_epochs(summary), {"cluener2020": "holdout F1", "msra": "dev F1"})):
    try:
      titles = {ax.get_title().split(":")[0]: ax for ax in fig.axes if ax.get_visible()}
      assert set(titles) == set(want)
      for dataset, ax in titles.items():
        assert ax.get_title().split(": ")[1].startswith(want[dataset]), ax.get_title()
        assert ax.get_ylabel().startswith(want[dataset])
    finally:
      plt.close(fig)


def test_headline_and_dev_only_comparisons_use_the_shared_names(tmp_path):
  """Without a test F1 the comparison is on dev: "holdout" when that dev was held out of train (headline said
  "dev"); with one, "official dev" as before."""
  root = str(tmp_path / "runs")
  _two_sweeps(root, cluener_test=False)
  compared, _ = report.compare(report.summarize(report.collect(root)), resamples=10)
  by_dataset = {h["dataset"].split(",")[0]: h["split"] for h in headline.headline_rows(compared)}
  assert by_dataset == {"CLUENER 2020": "holdout", "MSRA": "test"}
  root2 = str(tmp_path / "runs2")
  _two_sweeps(root2)
  compared, _ = report.compare(report.summarize(report.collect(root2)), resamples=10)
  assert {h["dataset"].split(",")[0]: h["split"] for h in headline.headline_rows(compared)} == {
      "CLUENER 2020": "official dev", "MSRA": "test"}
