"""launch/report significance on sweep folders written here: t quantiles, the paired bootstrap, the report's
significance table, max_len arms and training tricks (issue 31)."""

import json
import os

import pytest

from launch import report
from tests.test_report import _run


def test_t_quantile_matches_the_table():
  from launch.report import stats

  # Two-sided 95% (and one 99%) critical values of Student's t, as printed in textbook tables.
  table = {(0.975, 1): 12.706, (0.975, 2): 4.303, (0.975, 3): 3.182, (0.975, 4): 2.776, (0.975, 5): 2.571,
           (0.975, 10): 2.228, (0.975, 30): 2.042, (0.975, 120): 1.980, (0.995, 4): 4.604}
  for (q, df), want in table.items():
    assert abs(stats.t_quantile(q, df) - want) < 5e-4, (q, df)
    assert abs(stats.t_quantile(1 - q, df) + want) < 5e-4
    assert abs(stats.t_cdf(stats.t_quantile(q, df), df) - q) < 1e-10
  mean, low, high = stats.mean_t_interval([0.01, 0.02, 0.03])  # mean 0.02, sd 0.01, n = 3
  assert mean == pytest.approx(0.02)
  assert (low, high) == pytest.approx((0.02 - 4.3027 * 0.01 / 3 ** 0.5, 0.02 + 4.3027 * 0.01 / 3 ** 0.5), abs=1e-6)
  assert stats.mean_t_interval([0.05]) == (0.05, None, None)


def test_paired_bootstrap_two_records_by_hand():
  """Records (tp, fp, fn): A = (1,0,0), (0,1,0); B = (0,1,1), (1,0,0). Full data: F1(A) = 2/3, F1(B) = 1/2.
  Resamples of 2 indices: (0,0) -> A 1, B 0: +1; (1,1) -> A 0, B 1: -1; (0,1), (1,0) -> A 2/3, B 1/2: +1/6.
  Only (1,1) is on the other side of 0, so p = 2 x its share, 0.5 in expectation."""
  import numpy as np

  from launch.report import stats

  a = [[[1, 0], [0, 1], [0, 0]]]  # [seed, (tp, fp, fn), record]
  b = [[[0, 1], [1, 0], [1, 0]]]
  observed, p, resampled = stats.paired_bootstrap(a, b)
  assert observed == pytest.approx(2 / 3 - 1 / 2)
  assert set(np.round(resampled, 12)) == {1.0, -1.0, round(1 / 6, 12)}
  idx = np.random.default_rng(0).integers(0, 2, size=(10_000, 2))
  both_one = float(np.mean((idx == 1).all(axis=1)))
  assert p == pytest.approx(2 * both_one, abs=1e-12)
  assert abs(p - 0.5) < 4 * 2 * (0.25 * 0.75 / 10_000) ** 0.5
  swapped = stats.paired_bootstrap(b, a)  # B - A: the same resamples, mirrored; (1,1) is now the far side
  assert swapped[0] == pytest.approx(-observed) and swapped[1] == pytest.approx(p, abs=1e-12)


def test_paired_bootstrap_equals_a_plain_loop(monkeypatch):
  """Three seeds, 7 records: the vectorised bootstrap (drawn in chunks of 300 resamples here) gives the statistics
  of a plain loop over the same 10,000 draws, F1 from Python sums."""
  import numpy as np

  from launch.report import paired, stats

  monkeypatch.setattr(paired, "_BOOTSTRAP_CELLS", 7 * 300)
  rng = np.random.default_rng(123)
  a, b = rng.integers(0, 4, size=(3, 3, 7)), rng.integers(0, 4, size=(3, 3, 7))
  b[:, 0] = np.maximum(b[:, 0] - 1, 0)  # B finds fewer entities: a positive difference
  observed, p, resampled = stats.paired_bootstrap(a, b)

  def f1(counts, idx):
    tp, fp, fn = (sum(int(counts[k][i]) for i in idx) for k in range(3))
    return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0

  draws = np.random.default_rng(0).integers(0, 7, size=(10_000, 7))
  want = np.array([np.mean([f1(a[s], row) - f1(b[s], row) for s in range(3)]) for row in draws])
  np.testing.assert_allclose(resampled, want, rtol=0, atol=1e-12)
  assert observed == pytest.approx(np.mean([f1(a[s], range(7)) - f1(b[s], range(7)) for s in range(3)]))
  assert observed > 0 and p == pytest.approx(min(1.0, 2 * np.mean(want <= 0)))


def _with_counts(root, name, *, rope, seed, head="standard", tp, fp, fn, counts=True):
  """A finished run whose test split has per-record counts (dev without)."""
  res = _run(root, name, dataset="people_daily", rope=rope, seed=seed, head=head)
  f1 = 2 * sum(tp) / (2 * sum(tp) + sum(fp) + sum(fn))
  res["test"]["f1"] = f1
  if counts:
    res["test"]["per_record"] = {"tp": tp, "fp": fp, "fn": fn}
  with open(os.path.join(root, name, "results.json"), "w") as f:
    json.dump(res, f)
  return f1


def test_significance_in_the_report(tmp_path):
  from launch.report import stats, tables

  root = str(tmp_path / "runs")
  f1 = {}
  for seed in (0, 1, 2):
    f1[True, seed] = _with_counts(root, f"on{seed}", rope=True, seed=seed, tp=[2, 1, 3, 2], fp=[0, seed, 0, 1],
                                  fn=[0, 1, 0, 0])
    f1[False, seed] = _with_counts(root, f"off{seed}", rope=False, seed=seed, tp=[1, 0, 2, 1], fp=[1, 2, seed, 1],
                                   fn=[1, 2, 1, 1])
    _with_counts(root, f"crf{seed}", rope=True, seed=seed, head="crf", tp=[1], fp=[0], fn=[0], counts=False)
  summary = report.summarize(report.collect(root))
  rows = {r["what"]: r for r in stats.significance(summary)}
  assert sorted(rows) == ["GP vs CRF (GP with RoPE)", "RoPE on vs off (standard)"]
  rope = rows["RoPE on vs off (standard)"]
  diffs = [f1[True, s] - f1[False, s] for s in (0, 1, 2)]
  assert rope["split"] == "test" and rope["seeds"] == [0, 1, 2]
  assert (rope["mean"], rope["low"], rope["high"]) == pytest.approx(stats.mean_t_interval(diffs))
  assert rope["bootstrap_mean"] == pytest.approx(rope["mean"]) and 0 <= rope["p"] <= 1
  assert rows["GP vs CRF (GP with RoPE)"]["p"] is None
  text = report.markdown(report.collect(root), summary)
  line = next(ln for ln in text.splitlines() if "RoPE on vs off (standard)" in ln)
  assert tables.fmt_p(rope["p"]) in line and f"{100 * rope['mean']:+.2f}" in line
  assert "no per-record counts (3 of 6 runs)" in next(ln for ln in text.splitlines() if "GP vs CRF" in ln)
  assert tables.fmt_p(0.0123) == "p = 0.012" and tables.fmt_p(0.0004) == "p < 0.001" and tables.fmt_p(0.0) == \
      "p < 0.001"


def test_groups_split_by_max_len_when_a_dataset_has_several(tmp_path):
  root = str(tmp_path / "runs")
  for name, max_len in (("short", 128), ("long", 579)):
    _run(root, f"pd/{name}", dataset="people_daily", rope=True, seed=0)
    config = json.load(open(os.path.join(root, "pd", name, "config.json")))
    config["data"]["max_len"] = max_len
    json.dump(config, open(os.path.join(root, "pd", name, "config.json"), "w"))
  summary = report.summarize(report.collect(root))
  assert [(g["dataset"], g["max_len"], g["n"]) for g in summary] == [("people_daily", "128", 1),
                                                                    ("people_daily", "579", 1)]
  assert report.groups_table(summary).startswith("| dataset | encoder | max_len | head | RoPE | n |")
  # One max_len per dataset (datasets may differ): no split, no column.
  plain = report.summarize(report.collect(str(tmp_path / "runs" / "pd" / "short")))
  assert "max_len" not in plain[0]


def test_by_length_bucket_without_gold_is_empty_not_zero(tmp_path):
  """A bucket with predictions but no gold entity has no F1: no point, no line through it, "0 gold" on the axis."""
  import math

  pytest.importorskip("matplotlib")
  root = str(tmp_path / "runs")
  res = _run(root, "a", dataset="msra", rope=True, seed=0)
  res["dev"]["by_length"]["1"] = {"tp": 0, "pred": 5, "gold": 0}
  json.dump(res, open(os.path.join(root, "a", "results.json"), "w"))
  rows = report.collect(root)
  summary = report.summarize(rows)
  f1 = report.pooled_by_length(summary[0]["members"])
  assert f1["1"] is None and f1["2"] is not None
  fig = report.plot_by_length(rows, summary)
  ys = fig.axes[0].lines[0].get_ydata()
  assert math.isnan(ys[0]) and not math.isnan(ys[1])
  labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
  gold_2 = res["dev"]["by_length"]["2"]["gold"]
  assert labels[:2] == ["1\n0 gold", f"2\n{gold_2} gold"]


def test_trick_runs_are_their_own_cells_and_compared_with_plain(tmp_path):
  from launch.report import runs as runs_lib
  from launch.report import stats

  root = str(tmp_path / "runs")
  cells = {"plain": {}, "fgm+ema": {"adversarial": {"kind": "fgm", "epsilon": 1.0}, "optimizer": {"ema_decay": 0.999}},
           "pgd": {"adversarial": {"kind": "pgd", "epsilon": 1.0}}}
  for seed in (0, 1):
    for name, extra in cells.items():
      _with_counts(root, f"{name}{seed}", rope=True, seed=seed, tp=[2, seed, 1], fp=[0, 1, len(name) % 2], fn=[1, 0, 0])
      path = os.path.join(root, f"{name}{seed}", "config.json")
      config = json.load(open(path))
      json.dump({**config, **extra}, open(path, "w"))
  assert runs_lib.trick_of({"adversarial.kind": "fgm", "adversarial.epsilon": 0.0}) == "plain"  # epsilon 0: the plain step
  summary = report.summarize(report.collect(root))
  assert sorted((g["trick"], g["n"]) for g in summary) == [("fgm+ema", 2), ("pgd", 2), ("plain", 2)]
  rows = {r["what"]: r for r in stats.significance(summary, resamples=200)}
  assert sorted(rows) == ["fgm+ema vs plain (standard, RoPE)", "pgd vs plain (standard, RoPE)"]
  assert report.groups_table(summary).startswith("| dataset | encoder | head | RoPE | tricks | n |")
  # Two runs of one seed in one cell (the same resolved config run twice): the comparisons of that cell are
  # skipped, each with a line saying why, never a traceback.
  _with_counts(root, "plain0_again", rope=True, seed=0, tp=[1, 1, 1], fp=[0, 0, 0], fn=[0, 0, 0])
  summary = report.summarize(report.collect(root))
  rows, skipped = stats.compare(summary, resamples=10)
  assert rows == [] and len(skipped) == 2 and all("share seed 0" in s["why"] for s in skipped)
  text = report.markdown(report.collect(root), summary, resamples=10)
  lines = [ln for ln in text.splitlines() if ln.startswith("- skipped ")]
  assert len(lines) == 2 and all("two runs of one cell share seed 0 (plain0, plain0_again)" in ln for ln in lines)
