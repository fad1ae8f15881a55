"""launch/report cells, Holm and influence on sweep folders written here: Holm by hand, the seed t-test, the
influence check, length arms, folders of studies, skipped comparisons, flagged cells, legends (issue 41)."""

import json
import os
import statistics

import pytest

from launch import report
from tests.test_report import _run
from tests.test_report_significance import _with_counts


def _edit_config(root, name, **updates):
  """Sets dotted keys ("model.head", "tune_threshold") in a run's config.json."""
  path = os.path.join(root, name, "config.json")
  config = json.load(open(path))
  for key, value in updates.items():
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
      node = node.setdefault(part, {})
    node[leaf] = value
  json.dump(config, open(path, "w"))


def test_holm_by_hand():
  from launch.report import stats

  # Sorted: 0.005 x 4 = 0.02; 0.01 x 3 = 0.03; 0.03 x 2 = 0.06; 0.04 x 1 = 0.04 -> 0.06 (never below the one before).
  assert stats.holm([0.01, 0.04, 0.03, 0.005, None]) == pytest.approx([0.03, 0.06, 0.06, 0.02, None])
  assert stats.holm([0.5, 0.2, None]) == pytest.approx([0.5, 0.4, None])
  assert stats.holm([0.6, 0.7]) == pytest.approx([1.0, 1.0])  # capped at 1
  assert stats.holm([]) == [] and stats.holm([None]) == [None]
  # "Significant": both adjusted p values below 0.05 and not flagged by the influence check.
  row = {"t_p_holm": 0.01, "p_holm": 0.049, "influence": {"flagged": False}}
  assert stats.significant(row)
  assert not stats.significant({**row, "influence": {"flagged": True}})
  assert not stats.significant({**row, "t_p_holm": 0.05}) and not stats.significant({**row, "p_holm": None})
  assert not stats.significant({**row, "influence": None})  # no per-record counts: no check, not significant


def test_seed_t_test_and_interval_by_hand():
  from scipy import stats as scipy_stats

  from launch.report import stats

  # Differences 0.01, 0.02, 0.03: t = 0.02 / (0.01 / sqrt 3) = sqrt 12 with 2 degrees of freedom, where the
  # two-sided p is 1 - t / sqrt(2 + t^2) = 1 - sqrt(12 / 14).
  p, why = stats.seed_t_test([0.01, 0.02, 0.03])
  assert why is None and p == pytest.approx(1 - (12 / 14) ** 0.5, rel=1e-9)
  assert p == pytest.approx(scipy_stats.ttest_rel([0.81, 0.72, 0.93], [0.80, 0.70, 0.90]).pvalue, rel=1e-9)
  assert stats.seed_t_test([0.05]) == (None, "n = 1")
  assert stats.seed_t_test([0.05, 0.05]) == (None, "no spread over seeds")


def _records(n, a, b, special=None):
  """Per-record (tp, fp, fn) lists of two cells over n records: a(r) and b(r) give each record's counts; special
  {record: (counts A, counts B)} overrides some."""
  out = []
  for cell in (0, 1):
    rec = [(special or {}).get(r, (a(r), b(r)))[cell] for r in range(n)]
    out.append({k: [c[i] for c in rec] for i, k in enumerate(("tp", "fp", "fn"))})
  return out


def test_influence_one_record_carries_the_difference(tmp_path):
  from launch.report import stats

  root = str(tmp_path / "runs")
  for seed in (0, 1, 2):
    # Records agree in both cells but record 7, which A gets right and B misses entirely.
    on, off = _records(40, lambda r: (2, int(r == seed), 1), lambda r: (2, int(r == seed), 1),
                       {7: ((12, 0, 0), (0, 0, 12))})
    _with_counts(root, f"on{seed}", rope=True, seed=seed, **on)
    _with_counts(root, f"off{seed}", rope=False, seed=seed, **off)
    for name in (f"on{seed}", f"off{seed}"):  # the corpus's record ids, where results carry them
      res = json.load(open(os.path.join(root, name, "results.json")))
      res["test"]["per_record"]["id"] = [f"doc-{r}" for r in range(40)]
      json.dump(res, open(os.path.join(root, name, "results.json"), "w"))
  summary = report.summarize(report.collect(root))
  (row,) = stats.significance(summary, resamples=500)
  inf = row["influence"]
  assert row["mean"] > 0.05 and inf["full"] == pytest.approx(row["mean"])
  assert inf["flagged"] and inf["top"][0]["index"] == 7 and inf["top"][0]["id"] == "doc-7"
  assert inf["share"][1] == pytest.approx(1.0, abs=0.1) and abs(inf["mean"]) < 0.01
  assert not row["significant"]  # however small its p values, a flagged difference is not called significant
  text = report.markdown(report.collect(root), summary, resamples=500)
  line = next(ln for ln in text.split("## Influence")[1].splitlines() if "RoPE on vs off (standard)" in ln)
  assert "#7 (id doc-7)" in line and "**flagged**" in line
  sig = next(ln for ln in text.splitlines() if "RoPE on vs off (standard)" in ln)
  assert "flagged" in sig and sig.endswith("| no |")


def test_influence_spread_difference_is_not_flagged(tmp_path):
  from launch.report import stats

  root = str(tmp_path / "runs")
  for seed in (0, 1, 2):
    # A finds one more entity than B in every record: no record carries the difference.
    on, off = _records(40, lambda r: (2 + r % 3, int(r <= seed), 0), lambda r: (1 + r % 3, 0, 1))
    _with_counts(root, f"on{seed}", rope=True, seed=seed, **on)
    _with_counts(root, f"off{seed}", rope=False, seed=seed, **off)
  summary = report.summarize(report.collect(root))
  (row,) = stats.significance(summary, resamples=500, influence_k=3)
  inf = row["influence"]
  assert not inf["flagged"] and len(inf["top"]) == 3 and inf["top"][0]["id"] is None
  assert inf["share"][1] < 0.1 and inf["mean"] / inf["full"] > 0.9
  # Leave-one-out by hand for the top record: F1 per seed from the counts without it, in both cells.
  r = inf["top"][0]["index"]
  def f1_without(run, drop):
    counts = json.load(open(os.path.join(root, run, "results.json")))["test"]["per_record"]
    tp, fp, fn = (sum(v for i, v in enumerate(counts[k]) if i not in drop) for k in ("tp", "fp", "fn"))
    return 2 * tp / (2 * tp + fp + fn)
  loo = statistics.mean(f1_without(f"on{s}", {r}) - f1_without(f"off{s}", {r}) for s in (0, 1, 2))
  assert inf["top"][0]["effect"] == pytest.approx(loo - inf["full"], abs=1e-12)
  top = {t["index"] for t in inf["top"]}
  without = [f1_without(f"on{s}", top) - f1_without(f"off{s}", top) for s in (0, 1, 2)]
  assert (inf["mean"], inf["low"], inf["high"]) == pytest.approx(stats.mean_t_interval(without))
  assert row["significant"] == (row["t_p_holm"] < 0.05 and row["p_holm"] < 0.05)
  text = report.markdown(report.collect(root), summary, influence_k=3, resamples=500)
  assert "top 3 records" in text and "| holds |" in text


def test_length_arm_difference_is_a_row(tmp_path):
  from launch.report import stats

  root = str(tmp_path / "runs")
  f1 = {}
  for max_len in (579, 128):
    for seed in (0, 1):
      for rope in (True, False):
        name = f"max_len={max_len},rope={rope},seed={seed}"
        extra = 1 + seed if rope and max_len == 579 else 0  # RoPE helps more in the long arm
        on = (3 + extra, seed, 1) if rope else (2, 1, 1)
        counts = _records(6, lambda r: on if r < 3 else (1, 0, 0), lambda r: on)[0]
        f1[max_len, rope, seed] = _with_counts(root, name, rope=rope, seed=seed, **counts)
        _edit_config(root, name, **{"data.max_len": max_len})
  summary = report.summarize(report.collect(root))
  rows = {r["what"]: r for r in stats.significance(summary, resamples=200)}
  arm = rows["RoPE on vs off (standard): max_len 579 minus 128"]
  want = [(f1[579, True, s] - f1[579, False, s]) - (f1[128, True, s] - f1[128, False, s]) for s in (0, 1)]
  assert arm["max_len"] == "579 - 128" and arm["seeds"] == [0, 1]
  assert (arm["mean"], arm["low"], arm["high"]) == pytest.approx(stats.mean_t_interval(want))
  assert arm["bootstrap_mean"] == pytest.approx(arm["mean"]) and arm["influence"] is not None
  assert arm["p_holm"] is not None  # counted in the study's family
  text = report.markdown(report.collect(root), summary, resamples=200)
  assert "| 579 - 128 | RoPE on vs off (standard): max_len 579 minus 128 |" in text


def test_mixed_folder_of_studies_gives_cells_not_a_crash(tmp_path, capsys):
  """Two studies in one folder: the same seeds, the same head and RoPE, one study with tune_threshold=True. Its
  runs are cells of their own (named by the key), each study is a family for Holm, and the CLI finishes."""
  from launch.report import stats

  root = str(tmp_path / "study")
  for seed in (0, 1, 2):
    for study, tuned in (("rope", False), ("tuned", True)):
      for rope in (True, False):
        name = f"{study}/use_rope={rope},seed={seed}"
        counts = _records(5, lambda r: (2, seed + int(rope) * r % 2, int(not rope)), lambda r: (1, 0, 1))[0]
        _with_counts(root, name, rope=rope, seed=seed, **counts)
        if tuned:
          _edit_config(root, name, tune_threshold=True)
    # Older configs lack keys (today's defaults) or say dtype=auto (float32 on CPU): still the same cell.
    _edit_config(root, f"rope/use_rope=True,seed={seed}", **{"model.dtype": "auto" if seed else "float32"})
  _edit_config(root, "rope/use_rope=True,seed=2", **{"adversarial.kind": "none", "optimizer.ema_decay": 0.0,
                                                     "data.max_len": 128})
  rows = report.collect(root)
  assert {r["study"] for r in rows} == {f"{root}/rope", f"{root}/tuned"}
  summary = report.summarize(rows)
  assert sorted((g["rope"], g["variant"], g["n"]) for g in summary) == [
      ("False", "", 3), ("False", "tune_threshold=True", 3), ("True", "", 3), ("True", "tune_threshold=True", 3)]
  compared, skipped = stats.compare(summary, resamples=200)
  assert skipped == [] and len(compared) == 2
  assert {(r["study"].rsplit("/", 1)[1], r["what"]) for r in compared} == {
      ("rope", "RoPE on vs off (standard)"), ("tuned", "RoPE on vs off (standard) [tune_threshold=True]")}
  for r in compared:  # one comparison per family: Holm leaves its p values as they are
    assert r["p_holm"] == r["p"] and r["t_p_holm"] == r["t_p"]
  assert report.main([root]) == 0
  out = capsys.readouterr().out
  assert "| variant (non-default keys) |" in out and "| tune_threshold=True | 3 |" in out
  assert "| # | study | dataset |" in out and "| tuned | people_daily |" in out


def test_holm_within_a_study(tmp_path):
  from launch.report import stats

  root = str(tmp_path / "runs")
  for seed in (0, 1, 2):
    for head in ("standard", "efficient"):
      for rope in (True, False):
        counts = _records(8, lambda r: (3 + int(rope) * (head == "standard") + seed % 2, r % 2, 1),
                          lambda r: (1, 0, 1))[0]
        _with_counts(root, f"{head},{rope},{seed}", rope=rope, seed=seed, head=head, **counts)
  rows = stats.significance(report.summarize(report.collect(root)), resamples=200)
  assert len(rows) == 4  # RoPE on vs off x 2 heads, EGP vs GP x 2
  for key in ("t_p", "p"):
    assert [r[f"{key}_holm"] for r in rows] == pytest.approx(stats.holm([r[key] for r in rows]))
  assert all(r["significant"] == stats.significant(r) for r in rows)


def test_cells_that_differ_in_more_than_the_compared_setting_are_skipped(tmp_path):
  from launch.report import stats

  root = str(tmp_path / "runs")
  for seed in (0, 1):
    for rope in (True, False):
      _with_counts(root, f"{rope},{seed}", rope=rope, seed=seed, tp=[2, 1], fp=[0, 1], fn=[1, 0])
      _edit_config(root, f"{rope},{seed}", num_epochs=3.0 if rope else 5.0)
  summary = report.summarize(report.collect(root))
  rows, skipped = stats.compare(summary, resamples=10)
  assert rows == [] and [s["why"] for s in skipped] == [
      "the cells differ in more than the compared setting: num_epochs"]
  text = report.markdown(report.collect(root), summary)
  assert "- skipped people_daily, scratch: RoPE on vs off (standard): the cells differ in more" in text


def test_no_common_seed_is_one_line(tmp_path, capsys):
  root = str(tmp_path / "runs")
  _with_counts(root, "on", rope=True, seed=0, tp=[1], fp=[0], fn=[0])
  _with_counts(root, "off", rope=False, seed=1, tp=[1], fp=[0], fn=[0])
  assert report.main([root, "--influence_k", "2"]) == 0
  out = capsys.readouterr().out
  assert "- skipped people_daily, scratch: RoPE on vs off (standard): no seed in common (seeds 0 vs 1)" in out
  with pytest.raises(SystemExit):
    report.main([root, "--influence_k", "0"])


def test_missing_or_empty_folder_is_one_line_and_exit_2(tmp_path, capsys):
  empty = tmp_path / "empty"
  (empty / "sub").mkdir(parents=True)
  (empty / "sub" / "notes.txt").write_text("no run here")
  for root, says in ((tmp_path / "nope", "is not a folder"), (empty, "holds no run folder")):
    assert report.main([str(root)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"error: {root} ") and says in captured.err
  root = str(tmp_path / "runs")  # a folder with one run (not finished) is a report, not an error
  _run(root, "a", dataset="msra", rope=True, seed=0, status="failed", error="boom")
  assert report.main([root]) == 0
  assert "(no finished runs)" in capsys.readouterr().out


def _zero(root, name, *, rope, seed, head="standard"):
  """A finished run that found no entity: F1 0 on dev and test, per-record counts all misses."""
  res = _run(root, name, dataset="cluener2020", rope=rope, seed=seed, head=head)
  for split in ("dev", "test"):
    res[split].update(f1=0.0, precision=0.0, recall=0.0, per_record={"tp": [0] * 8, "fp": [0] * 8, "fn": [1] * 8})
  with open(os.path.join(root, name, "results.json"), "w") as f:
    json.dump(res, f)


def test_cells_at_f1_zero_or_with_failed_runs_are_flagged_never_holds(tmp_path):
  """rope_ablation.py:dataset=cluener2020,quick once scored F1 0 in every cell and the report said "holds"."""
  from launch.report import stats

  root = str(tmp_path / "runs")
  for seed in (0, 1):
    for head in ("standard", "efficient"):
      for rope in (True, False):
        _zero(root, f"{head},rope={rope},seed={seed}", rope=rope, seed=seed, head=head)
  _run(root, "standard,rope=True,seed=2", dataset="cluener2020", rope=True, seed=2, status="failed", error="nan")
  for seed in (0, 1):
    _run(root, f"crf,seed={seed}", dataset="cluener2020", rope=True, seed=seed, head="crf", status="failed")
  rows = report.collect(root)
  summary = report.summarize(rows)
  compared = stats.significance(summary)
  assert len(compared) == 4 and all(r["flags"] and not r["significant"] for r in compared)
  rope_std = next(r for r in compared if r["what"] == "RoPE on vs off (standard)")
  assert rope_std["flags"] == ["standard, RoPE: test F1 0 in 2 of 2 seeds (0, 1)",
                               "standard, RoPE: 1 run failed (seed 2)",
                               "standard, no RoPE: test F1 0 in 2 of 2 seeds (0, 1)"]
  assert rope_std["influence"]["top"] == []  # what once printed "holds (no record carries it)"
  text = report.markdown(rows, summary, resamples=200)
  assert "holds" not in text
  groups = text.split("## Significance")[0]
  cells = [ln for ln in groups.splitlines() if ln.startswith("| cluener2020 ")]
  assert len(cells) == 4 and all("**flagged**: dev F1 0 in 2 of 2 seeds (0, 1); test F1 0 in 2 of 2 seeds" in ln
                                 for ln in cells)
  assert sum("1 run failed (seed 2)" in ln for ln in cells) == 1
  assert "- cluener2020, scratch, crf: 2 runs failed (seeds 0, 1)" in groups  # a cell with no finished run
  sig = [ln for ln in text.split("## Significance")[1].split("## Influence")[0].splitlines() if ln.startswith("| 1 ")]
  assert "flagged: efficient, RoPE: test F1 0" in sig[0] and sig[0].endswith("| no |")
  influence = text.split("## Influence")[1].split("\n## ")[0]
  assert influence.count("**flagged**: ") == 4

  # A sound study has no check column and no flags.
  good = str(tmp_path / "good")
  for seed in (0, 1):
    _run(good, f"on{seed}", dataset="msra", rope=True, seed=seed)
    _run(good, f"off{seed}", dataset="msra", rope=False, seed=seed)
  rows = report.collect(good)
  text = report.markdown(rows, report.summarize(rows))
  assert "check" not in text.splitlines()[2] and "**flagged**" not in text and "flagged:" not in text


def test_legends_fit_inside_the_figure(tmp_path):
  """Four head x RoPE cells on one panel: the legend above it stays inside the figure and clear of the panel."""
  root = str(tmp_path / "runs")
  for seed in (0, 1):
    for head in ("standard", "efficient"):
      for rope in (True, False):
        _run(root, f"{head},rope={rope},seed={seed}", dataset="cluener2020", rope=rope, seed=seed, head=head)
    _run(root, f"crf,seed={seed}", dataset="cluener2020", rope=True, seed=seed, head="crf")
  rows = report.collect(root)
  summary = report.summarize(rows)
  for fig in (report.plot_by_length(rows, summary), report.plot_f1(summary)):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    [legend] = fig.legends
    box = legend.get_window_extent(renderer)
    assert page.x0 <= box.x0 and box.x1 <= page.x1 and page.y0 <= box.y0 and box.y1 <= page.y1, (box, page)
    assert len(legend.get_texts()) >= 3
    for ax in fig.axes:
      top = ax.get_tightbbox(renderer)  # the panel with its title
      assert top.y1 <= box.y0 and page.x0 <= top.x0 and top.x1 <= page.x1, (top, box)
    for text in fig.texts:  # a figure title sits between the legend and the panels
      t = text.get_window_extent(renderer)
      assert page.x0 <= t.x0 and t.x1 <= page.x1 and t.y1 <= box.y0, (t, box)
