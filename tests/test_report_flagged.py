"""launch/report on sweeps with something wrong in them: one seed run twice in a cell, failed runs without a
config.json. The report must say so, never count a seed twice or invent a cell."""

import json
import os
import statistics

from launch import report
from tests.test_report import _run


def test_a_seed_run_twice_is_counted_once_and_flagged(tmp_path):
  """An extra --config.model.head=efficient overrode the swept head: "head=standard,seed=0" ran the efficient head,
  the same resolved config and seed as "head=efficient,seed=0"."""
  root = str(tmp_path / "runs")
  kept = _run(root, "head=efficient,seed=0", dataset="synthetic", rope=True, seed=0, head="efficient")
  _run(root, "head=standard,seed=0", dataset="synthetic", rope=True, seed=0, head="efficient", k=7)
  other = _run(root, "head=efficient,seed=1", dataset="synthetic", rope=True, seed=1, head="efficient")
  rows = report.collect(root)
  summary = report.summarize(rows)
  (cell,) = summary
  assert cell["n"] == 2  # seeds 0 and 1, not 3 runs
  assert cell["runs"] == ["head=efficient,seed=0", "head=efficient,seed=1"]  # first in folder order kept
  want = statistics.mean([kept["dev"]["f1"], other["dev"]["f1"]])
  assert cell["metrics"]["dev F1"] == (want, statistics.stdev([kept["dev"]["f1"], other["dev"]["f1"]]), 2)
  text = report.markdown(rows, summary)
  line = next(ln for ln in text.splitlines() if ln.startswith("| synthetic |"))
  assert line.startswith("| synthetic | scratch | efficient | True | 2 |") and "**flagged**" in line
  assert "seed 0" in line and "head=standard,seed=0" in line
  flagged = text.split("## Finished runs")[1].split("## ")[0].split("**Flagged**")[1]
  assert "seed 0" in flagged and "head=efficient,seed=0" in flagged and "head=standard,seed=0" in flagged


def test_two_runs_of_one_seed_only(tmp_path):
  """The user's report: two folders, one seed, shown as n=2 with std 0.00."""
  root = str(tmp_path / "runs")
  res = _run(root, "a/head=efficient,seed=0", dataset="synthetic", rope=True, seed=0, head="efficient")
  _run(root, "b/head=standard,seed=0", dataset="synthetic", rope=True, seed=0, head="efficient")
  rows = report.collect(root)
  text = report.groups_table(report.summarize(rows))
  line = next(ln for ln in text.splitlines() if ln.startswith("| synthetic |"))
  assert line.startswith(f"| synthetic | scratch | efficient | True | 1 | {100 * res['dev']['f1']:.2f} ± - |")
  assert "a/head=efficient,seed=0" in line and "b/head=standard,seed=0" in line


def _failed_without_config(root, name):
  os.makedirs(os.path.join(root, name))
  with open(os.path.join(root, name, "results.json"), "w") as f:
    json.dump({"status": "failed", "error": "boom"}, f)


def test_failed_runs_without_config_are_named_not_made_a_cell(tmp_path):
  root = str(tmp_path / "runs")
  for seed in (0, 1):
    _run(root, f"use_rope=True,seed={seed}", dataset="msra", rope=True, seed=seed)
  _failed_without_config(root, "head=nosuchhead,seed=0")
  _failed_without_config(root, "lr=-1.0,seed=0")
  rows = report.collect(root)
  summary = report.summarize(rows)
  assert [g["failed"] for g in summary] == [[]]  # not taken for failed runs of the finished cell
  text = report.markdown(rows, summary)
  head = text.split("## Not finished")[0]
  assert "no RoPE" not in head and "None" not in head
  lines = [ln for ln in head.split("**Flagged**")[1].split("\n## ")[0].splitlines() if ln.startswith("- ")]
  assert len(lines) == 2  # one per run folder, not one invented cell
  for name, line in zip(("head=nosuchhead,seed=0", "lr=-1.0,seed=0"), lines):
    assert name in line and "config unknown" in line and "?, ?" not in line
  assert "check" not in text.splitlines()[2]  # the finished cell is sound


def test_failed_run_with_unknown_rope_is_not_called_no_rope(tmp_path):
  root = str(tmp_path / "runs")
  os.makedirs(os.path.join(root, "old_config"))
  with open(os.path.join(root, "old_config", "config.json"), "w") as f:
    json.dump({"seed": 4, "data": {"name": "msra"}, "model": {"encoder": "scratch", "head": "standard"}}, f)
  with open(os.path.join(root, "old_config", "results.json"), "w") as f:
    json.dump({"status": "failed"}, f)
  rows = report.collect(root)
  text = report.markdown(rows, report.summarize(rows))
  (line,) = [ln for ln in text.split("**Flagged**")[1].split("\n## ")[0].splitlines() if ln.startswith("- ")]
  assert "no RoPE" not in line and "seed 4" in line and "old_config" in line


def test_one_point_in_two_studies_counts_once_and_each_study_compares(tmp_path):
  """The same config and seeds in two study folders: a cell of 2 seeds (not 4), each study's comparison made on its
  own runs."""
  root = str(tmp_path / "runs")
  for study in ("a", "b"):
    for seed in (0, 1):
      for rope in (True, False):
        _run(root, f"{study}/use_rope={rope},seed={seed}", dataset="msra", rope=rope, seed=seed)
  rows = report.collect(root)
  summary = report.summarize(rows)
  assert sorted((g["rope"], g["n"]) for g in summary) == [("False", 2), ("True", 2)]
  compared, skipped = report.compare(summary, resamples=10)
  assert skipped == [] and sorted(r["study"].split("/")[-1] for r in compared) == ["a", "b"]
  assert all(r["seeds"] == [0, 1] for r in compared)
  flagged = report.markdown(rows, summary, resamples=10).split("**Flagged**")[1].split("\n## ")[0]
  assert "a/use_rope=True,seed=0; b/use_rope=True,seed=0" in flagged
