"""launch/report on results a report must survive: an F1 that is not a number (a diverged run, a hand-edited file)
and a config.json from before a key existed (its default then counts)."""

import itertools
import json
import math
import os

import numpy as np
import pytest
from scipy import stats as scipy_stats

from launch import report
from launch.report import paired
from tests.test_report import _run

NAN = float("nan")


def _set_f1(root, name, value, splits=("dev", "test")):
  """Writes `value` as the run's F1 (json writes NaN as NaN, as an older version did)."""
  path = os.path.join(root, name, "results.json")
  res = json.load(open(path))
  for split in splits:
    res[split]["f1"] = value
  json.dump(res, open(path, "w"))


def _rope_sweep(root, seeds=(0, 1, 2)):
  return {(rope, s): _run(root, f"use_rope={rope},seed={s}", dataset="msra", rope=rope, seed=s, k=s if rope else 3 * s)
          for rope in (True, False) for s in seeds}


def test_a_nan_f1_seed_is_left_out_of_its_cell_and_flagged(tmp_path, capsys):
  root = str(tmp_path / "runs")
  runs = _rope_sweep(root)
  _set_f1(root, "use_rope=True,seed=2", NAN)
  assert report.main([root]) == 0  # was AttributeError: 'float' object has no attribute 'numerator'
  text = capsys.readouterr().out
  rows = report.collect(root)
  summary = report.summarize(rows)
  cell = next(g for g in summary if g["rope"] == "True")
  assert cell["n"] == 2 and [m["seed"] for m in cell["members"]] == [0, 1]
  for split in ("dev", "test"):
    kept = [runs[(True, s)][split]["f1"] for s in (0, 1)]
    mean, std, count = cell["metrics"][f"{split} F1"]
    assert count == 2 and mean == pytest.approx(np.mean(kept)) and std == pytest.approx(np.std(kept, ddof=1))
  line = next(ln for ln in text.splitlines() if ln.startswith("| msra | scratch | standard | True | 2 |"))
  assert "**flagged**" in line and "not a number" in line and "seed 2" in line and "use_rope=True,seed=2" in line
  # Its comparison pairs the finite seeds and is flagged, never significant.
  (row,) = report.compare(summary, rows=rows, resamples=10)[0]
  assert row["seeds"] == [0, 1] and not row["significant"]
  assert any("not a number" in f for f in row["flags"])
  want = [runs[(True, s)]["test"]["f1"] - runs[(False, s)]["test"]["f1"] for s in (0, 1)]
  assert row["values"] == pytest.approx(want)


def test_a_cell_whose_every_seed_is_nan_is_named_not_averaged(tmp_path):
  root = str(tmp_path / "runs")
  _rope_sweep(root)
  for s in (0, 1, 2):
    _set_f1(root, f"use_rope=False,seed={s}", NAN, splits=("test",))
  rows = report.collect(root)
  summary = report.summarize(rows)
  assert [g["rope"] for g in summary] == ["True"]
  text = report.markdown(rows, summary, resamples=10)
  flagged = text.split("**Flagged**")[1].split("\n## ")[0]
  assert "standard, no RoPE: 3 runs with an F1 that is not a number (seeds 0, 1, 2)" in flagged
  assert "nan" not in text.lower().replace("not a number", "")


def _holm_by_hand(pvalues):
  """Holm over the finite p values only; the rest None."""
  finite = sorted((p, i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(p))
  out, running = [None] * len(pvalues), 0.0
  for rank, (p, i) in enumerate(finite):
    running = max(running, min(1.0, (len(finite) - rank) * p))
    out[i] = running
  return out


def test_holm_leaves_nan_out_wherever_it_sits():
  base = [0.01, 0.02, 0.04]
  for extra in (NAN, float("inf"), None):
    for order in itertools.permutations(base + [extra]):
      got, want = paired.holm(list(order)), _holm_by_hand(list(order))
      assert [g is None for g in got] == [w is None for w in want]
      assert [g for g in got if g is not None] == pytest.approx([w for w in want if w is not None])
  # The values of the three finite p do not depend on where the NaN is (was [1, 1, 1] vs [0.03, 0.04, 1]).
  assert paired.holm([NAN, 0.01, 0.02])[1:] == pytest.approx([0.02, 0.02])
  assert paired.holm([0.01, 0.02, NAN])[:2] == pytest.approx([0.02, 0.02])


def test_t_test_of_a_nan_difference_is_untested():
  p, why = paired.seed_t_test([NAN, 0.01, 0.02])
  assert p is None and "not a number" in why
  assert paired.seed_t_test([0.01, 0.03, 0.02])[0] == pytest.approx(
      scipy_stats.ttest_1samp([0.01, 0.03, 0.02], 0.0).pvalue)
  mean, low, high = paired.mean_t_interval([NAN, 0.01])
  assert math.isnan(mean) and low is None and high is None


def test_a_comparison_with_a_nan_input_is_untested_and_holm_ignores_it(tmp_path):
  """A summary made by hand (or by an older summarize) that still holds a NaN seed."""
  root = str(tmp_path / "runs")
  runs = _rope_sweep(root)
  for s in (0, 1, 2):
    _run(root, f"head=efficient,use_rope=True,seed={s}", dataset="msra", rope=True, seed=s, head="efficient",
         k=3 + 2 * s)
  summary = report.summarize(report.collect(root))
  efficient = next(g for g in summary if g["head"] == "efficient")
  efficient["members"][1]["results"]["test"]["f1"] = NAN
  rows = {r["what"]: r for r in report.compare(summary, resamples=10)[0]}
  bad = rows["EGP vs GP (RoPE)"]
  assert bad["t_p"] is None and "not a number" in bad["t_why"] and bad["p"] is None and bad["t_p_holm"] is None
  assert not bad["significant"]
  good = rows["RoPE on vs off (standard)"]
  diffs = [runs[(True, s)]["test"]["f1"] - runs[(False, s)]["test"]["f1"] for s in (0, 1, 2)]
  want = scipy_stats.ttest_1samp(diffs, 0.0).pvalue
  assert good["t_p"] == pytest.approx(want) and good["t_p_holm"] == pytest.approx(min(1.0, want))  # m = 1
  table = report.markdown(report.collect(root), summary, resamples=10)
  line = next(ln for ln in table.splitlines() if "EGP vs GP (RoPE)" in ln and ln.startswith("| "))
  assert "not a number" in line


def test_a_config_without_use_rope_joins_the_cell_of_its_default(tmp_path):
  """An older config.json without model.use_rope: today's default (True) counts, so the seed is in the RoPE cell
  (it was a cell of its own, "RoPE ?", and left out of the comparison)."""
  root = str(tmp_path / "runs")
  runs = _rope_sweep(root)
  path = os.path.join(root, "use_rope=True,seed=1", "config.json")
  config = json.load(open(path))
  del config["model"]["use_rope"]
  json.dump(config, open(path, "w"))
  rows = report.collect(root)
  assert {r["rope"] for r in rows} == {True, False}
  summary = report.summarize(rows)
  assert sorted((g["rope"], g["n"]) for g in summary) == [("False", 3), ("True", 3)]
  cell = next(g for g in summary if g["rope"] == "True")
  assert cell["metrics"]["test F1"][0] == pytest.approx(np.mean([runs[(True, s)]["test"]["f1"] for s in range(3)]))
  (row,) = report.compare(summary, resamples=10)[0]
  assert row["seeds"] == [0, 1, 2]
  assert "unknown" not in report.markdown(rows, summary, resamples=10)
