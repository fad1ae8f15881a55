"""launch/report on relation studies (GPLinker, task=relations): cells by pointer RoPE, their comparisons and
figures, mixed with entity runs."""

import json
import os

import pytest

from launch import report
from tests.test_report import BUCKETS, _history, _run, _visible_axes, sweep_dir  # noqa: F401 (sweep_dir: a fixture)


def _f1_of(tp, fp, fn):
  return 2 * sum(tp) / (2 * sum(tp) + sum(fp) + sum(fn))


def _relation_run(root, name, *, rope, pointer, seed, tp, fp, fn, history=None):
  """A finished relation run as experiments/webnlg_minilm.py writes it: task and model.pointer_rope in config.json
  only, triple P/R/F1 with per-record counts, no by_length."""
  d = os.path.join(root, name)
  os.makedirs(d)
  config = {"seed": seed, "task": "relations", "data": {"name": "webnlg_star"},
            "model": {"encoder": "scratch", "head": "efficient", "use_rope": rope, "pointer_rope": pointer}}
  json.dump(config, open(os.path.join(d, "config.json"), "w"))
  test = {"f1": _f1_of(tp, fp, fn), "precision": sum(tp) / (sum(tp) + sum(fp)), "recall": sum(tp) / (sum(tp) + sum(fn)),
          "match": "string", "per_record": {"tp": tp, "fp": fp, "fn": fn}}
  res = {"status": "finished", "steps": 100, "parameters": 1000, "train_tokens_per_s": 5000.0, "head_kind": "span",
         "length_buckets": list(BUCKETS), "dev": {**test, "f1": test["f1"] - 0.01}, "test": test,
         **({"dev_history": history} if history else {})}
  json.dump(res, open(os.path.join(d, "results.json"), "w"))
  return test["f1"]


@pytest.fixture
def relations_dir(tmp_path):
  """experiments/webnlg_minilm.py:get_sweep: pointer_rope x use_rope x seeds 0-2, efficient head; F1 by cell."""
  root = str(tmp_path / "webnlg")
  f1 = {}
  for pointer in (False, True):
    for rope in (True, False):
      for seed in (0, 1, 2):
        tp = [2 + int(pointer), 1 + int(rope), 3, seed]
        fp = [seed % 2, 1, int(not pointer), 0]
        fn = [0, int(not rope) + seed // 2, int(pointer and seed == 1), 1]
        f1[pointer, rope, seed] = _relation_run(
            root, f"default/pointer_rope={pointer},use_rope={rope},seed={seed}", rope=rope, pointer=pointer,
            seed=seed, tp=tp, fp=fp, fn=fn,
            history=_history((1, 2), [0.2 + 0.1 * rope + 0.05 * pointer, 0.5 + 0.1 * rope + 0.05 * pointer]))
  return root, f1


def test_relations_cells_and_comparisons(relations_dir):
  from launch.report import stats

  root, f1 = relations_dir
  rows = report.collect(root)
  assert len(rows) == 12 and {r["task"] for r in rows} == {"relations"}
  assert sorted({r["pointer_rope"] for r in rows}) == ["False", "True"]
  summary = report.summarize(rows)
  names = {stats.cell_name(g): g for g in summary}
  assert sorted(names) == ["efficient, RoPE, no pointer RoPE", "efficient, RoPE, pointer RoPE",
                           "efficient, no RoPE, no pointer RoPE", "efficient, no RoPE, pointer RoPE"]
  assert all(g["n"] == 3 and "variant" not in g for g in summary)  # told apart by pointer RoPE, not a variant
  compared, skipped = stats.compare(summary, resamples=300)
  assert skipped == []
  by_what = {r["what"]: r for r in compared}
  # (A's use_rope, A's pointer_rope), (B's ...) of each comparison.
  want = {"RoPE on vs off (efficient, pointer RoPE)": ((True, True), (False, True)),
          "RoPE on vs off (efficient, no pointer RoPE)": ((True, False), (False, False)),
          "pointer RoPE on vs off (efficient, RoPE)": ((True, True), (True, False)),
          "pointer RoPE on vs off (efficient, no RoPE)": ((False, True), (False, False))}
  assert sorted(by_what) == sorted(want)  # no GP vs CRF, EGP vs GP: no such cells
  for what, ((rope_a, pointer_a), (rope_b, pointer_b)) in want.items():
    r = by_what[what]
    assert (r["a"]["rope"], r["a"]["pointer_rope"]) == (str(rope_a), str(pointer_a))
    assert (r["b"]["rope"], r["b"]["pointer_rope"]) == (str(rope_b), str(pointer_b))
    diffs = [f1[pointer_a, rope_a, s] - f1[pointer_b, rope_b, s] for s in (0, 1, 2)]
    assert r["split"] == "test" and r["seeds"] == [0, 1, 2]
    assert r["values"] == pytest.approx(diffs) and r["mean"] == pytest.approx(sum(diffs) / 3)
    assert r["bootstrap_mean"] == pytest.approx(r["mean"]) and r["influence"] is not None
  # Holm over the study's family of 4, by hand: the i-th smallest p times 4 - i (i from 0), capped at 1, running max.
  for key in ("t_p", "p"):
    ps = sorted((r[key], r["what"]) for r in compared)
    running, holm = 0.0, {}
    for i, (p, what) in enumerate(ps):
      running = max(running, min(1.0, (4 - i) * p))
      holm[what] = running
    assert {r["what"]: r[f"{key}_holm"] for r in compared} == pytest.approx(holm)

  text = report.markdown(rows, summary, resamples=300)
  groups = text.split("## Significance")[0]
  assert "| dataset | encoder | head | RoPE | pointer RoPE | n | dev F1 |" in groups
  assert "| webnlg_star | scratch | efficient | True | False | 3 |" in groups
  assert "(subject, relation, object) triples (string form" in groups
  for what in want:
    assert f"| {what} | test | 0, 1, 2 |" in text


def test_relation_and_entity_cells_in_one_report(relations_dir, sweep_dir):
  """Entity cells beside relation cells: pointer RoPE "n/a", names and comparisons as in an entity-only report."""
  from launch.report import stats

  rel_root, _ = relations_dir
  ent_root, _ = sweep_dir
  rows = report.collect([rel_root, ent_root])
  summary = report.summarize(rows)
  entity = [g for g in summary if g["dataset"] == "msra"]
  assert [(g["rope"], g["pointer_rope"], stats.cell_name(g)) for g in entity] == [
      ("False", "n/a", "standard, no RoPE"), ("True", "n/a", "standard, RoPE")]
  compared = {(r["a"]["dataset"], r["what"]) for r in stats.significance(summary, resamples=50)}
  assert compared == {("msra", "RoPE on vs off (standard)"), ("cluener2020", "RoPE on vs off (standard)"),
                      *(("webnlg_star", f"RoPE on vs off (efficient, {p})")
                        for p in ("pointer RoPE", "no pointer RoPE")),
                      *(("webnlg_star", f"pointer RoPE on vs off (efficient, {r})") for r in ("RoPE", "no RoPE"))}
  assert "| msra | scratch | standard | True | n/a | 3 |" in report.groups_table(summary)


def test_entity_report_has_no_pointer_rope(sweep_dir):
  root, _ = sweep_dir
  rows = report.collect(root)
  assert {(r["task"], r["pointer_rope"]) for r in rows} == {("entities", "n/a")}  # configs without a task
  summary = report.summarize(rows)
  assert all("pointer_rope" not in g for g in summary)
  text = report.markdown(rows, summary, resamples=50)
  assert "pointer" not in text and "triple" not in text


def test_relations_figures(relations_dir, tmp_path):
  import matplotlib.pyplot as plt

  root, f1 = relations_dir
  rows = report.collect(root)
  summary = report.summarize(rows)
  fig = report.plot_f1(summary)
  try:
    (ax,) = _visible_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == ["efficient\npointer RoPE", "efficient\nno pointer RoPE"]
    assert "test triple F1" in ax.get_title() and len(ax.patches) == 4
    heights = sorted(round(b.get_height(), 9) for b in ax.patches)
    want = sorted(round(100 * sum(f1[p, r, s] for s in (0, 1, 2)) / 3, 9) for p in (False, True) for r in (True, False))
    assert heights == pytest.approx(want)
  finally:
    plt.close(fig)
  fig = report.plot_epochs(summary)
  try:
    (ax,) = _visible_axes(fig)
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["efficient, RoPE, pointer RoPE (n=3)", "efficient, RoPE, no pointer RoPE (n=3)",
                      "efficient, no RoPE, pointer RoPE (n=3)", "efficient, no RoPE, no pointer RoPE (n=3)"]
    assert len({line.get_color() for line in ax.get_lines()}) == 4
  finally:
    plt.close(fig)
  assert report.plot_by_length(rows, summary) is None  # no run has by_length: no figure, no error
  # Beside an entity run with by_length, only the entity cell is drawn.
  mixed = str(tmp_path / "mixed")
  _run(mixed, "msra/seed=0", dataset="msra", rope=True, seed=0)
  rows = report.collect([root, mixed])
  summary = report.summarize(rows)
  fig = report.plot_by_length(rows, summary)
  try:
    (ax,) = _visible_axes(fig)
    assert ax.get_title().startswith("msra:") and [line.get_label() for line in ax.get_lines()] == [
        "standard, RoPE"]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["standard, RoPE"]
  finally:
    plt.close(fig)
  out = str(tmp_path / "fig" / "webnlg")
  assert report.main([root, "--out", out]) == 0
  md = open(out + ".md").read()
  assert "(webnlg_f1.png)" in md and "(webnlg_epochs.png)" in md and not os.path.exists(out + "_by_length.png")
  assert "No dev F1 by entity length figure" in md
