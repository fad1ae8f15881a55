"""launch/report/ on a sweep folder written here: grouping, mean +- sample std, unfinished runs apart, plots.
Significance, influence, relation and event studies: tests/test_report_{significance,influence,relations,events}.py
(they import this module's run writers and fixtures)."""

import json
import os
import statistics
import sys

import pytest

from launch import report

BUCKETS = ("1", "2", "3-4", "5-8", "9+")


def _split(f1, p, r, seed, k):
  by_length = {b: {"tp": seed + i + k, "pred": 2 * (seed + i + k) + 1, "gold": 2 * (seed + i + k) + 2}
               for i, b in enumerate(BUCKETS)}
  return {"f1": f1, "precision": p, "recall": r, "tp": 1, "pred": 2, "gold": 2, "per_type": {}, "by_length": by_length}


def _run(root, name, *, dataset, rope, seed, status="finished", test=True, k=0, head="standard", **extra):
  d = os.path.join(root, name)
  os.makedirs(d)
  config = {"seed": seed, "data": {"name": dataset}, "model": {"encoder": "scratch", "head": head,
                                                               "use_rope": rope}}
  with open(os.path.join(d, "config.json"), "w") as f:
    json.dump(config, f)
  if status is None:
    return None
  base = 0.5 + 0.1 * seed + 0.01 * k + (0.2 if rope else 0.0)
  res = {"status": status, "steps": 100, "parameters": 1000 + k, "train_tokens_per_s": 5000.0 + 37 * seed + k,
         "wall_minutes": 1.0, **extra}
  if status == "finished":
    res["dev"] = _split(base, base + 0.01, base - 0.01, seed, k)
    if test:
      res["test"] = _split(base - 0.05, base - 0.04, base - 0.06, seed, k)
  with open(os.path.join(d, "results.json"), "w") as f:
    json.dump(res, f)
  return res


@pytest.fixture
def sweep_dir(tmp_path):
  root = str(tmp_path / "runs")
  runs = {}
  for seed in (0, 1, 2):
    runs[("msra", True, seed)] = _run(root, f"msra/use_rope=True,seed={seed}", dataset="msra", rope=True, seed=seed,
                                      k=seed)
  for seed in (0, 1):
    runs[("msra", False, seed)] = _run(root, f"msra/use_rope=False,seed={seed}", dataset="msra", rope=False,
                                       seed=seed, k=3 * seed)
  runs[("cluener2020", True, 0)] = _run(root, "cluener/use_rope=True,seed=0", dataset="cluener2020", rope=True,
                                        seed=0, test=False)
  for seed in (0, 1):
    runs[("cluener2020", False, seed)] = _run(root, f"cluener/use_rope=False,seed={seed}", dataset="cluener2020",
                                              rope=False, seed=seed, test=False, k=seed)
  # Not finished: must be listed apart and never averaged.
  _run(root, "msra/use_rope=True,seed=3", dataset="msra", rope=True, seed=3, status="preempted")
  _run(root, "msra/use_rope=False,seed=2", dataset="msra", rope=False, seed=2, status="failed",
       error="FloatingPointError: loss is nan")
  _run(root, "cluener/use_rope=True,seed=1", dataset="cluener2020", rope=True, seed=1, status=None)
  return root, runs


def _expected(runs, dataset, rope, split, field):
  vals = [r[split][field] for (d, ro, _), r in runs.items() if d == dataset and ro == rope]
  return statistics.mean(vals), (statistics.stdev(vals) if len(vals) > 1 else None), len(vals)


def test_groups_means_stds_and_counts(sweep_dir):
  root, runs = sweep_dir
  rows = report.collect(root)
  assert len(rows) == 11
  summary = report.summarize(rows)
  by_key = {(g["dataset"], g["rope"]): g for g in summary}
  assert sorted(by_key) == [("cluener2020", "False"), ("cluener2020", "True"), ("msra", "False"), ("msra", "True")]
  assert {k: g["n"] for k, g in by_key.items()} == {("cluener2020", "False"): 2, ("cluener2020", "True"): 1,
                                                    ("msra", "False"): 2, ("msra", "True"): 3}
  for (dataset, rope), g in by_key.items():
    assert all(r.split("/")[0] in ("msra", "cluener") for r in g["runs"])
    assert "msra/use_rope=True,seed=3" not in g["runs"] and "msra/use_rope=False,seed=2" not in g["runs"]
    for split in ("dev", "test"):
      for field, col in (("f1", "F1"), ("precision", "P"), ("recall", "R")):
        if dataset == "cluener2020" and split == "test":
          assert g["metrics"][f"test {col}"] == (None, None, 0)
          continue
        assert g["metrics"][f"{split} {col}"] == _expected(runs, dataset, rope == "True", split, field)
    members = [r for (d, ro, _), r in runs.items() if d == dataset and str(ro) == rope]
    for col, key in (("tokens/s", "train_tokens_per_s"), ("params", "parameters")):
      vals = [float(m[key]) for m in members]
      assert g["metrics"][col] == (statistics.mean(vals), statistics.stdev(vals) if len(vals) > 1 else None,
                                   len(vals))

  table = report.groups_table(summary)
  mean, std, _ = _expected(runs, "msra", True, "dev", "f1")
  msra_rope = next(ln for ln in table.splitlines() if ln.startswith("| msra | scratch | standard | True | 3 |"))
  assert f"| {100 * mean:.2f} ± {100 * std:.2f} |" in msra_rope
  mean, _, _ = _expected(runs, "cluener2020", True, "dev", "f1")
  one = next(ln for ln in table.splitlines() if ln.startswith("| cluener2020 | scratch | standard | True | 1 |"))
  cells = [c.strip() for c in one.strip("|").split("|")]
  assert cells[5] == f"{100 * mean:.2f} ± -"  # n = 1: no std
  assert cells[8:11] == ["-", "-", "-"]  # CLUENER: no test split
  assert cells[11] == "5000 ± -" and cells[12] == "1000 ± -"


def test_unfinished_listed_apart(sweep_dir):
  root, _ = sweep_dir
  rows = report.collect(root)
  text = report.markdown(rows, report.summarize(rows))
  finished, apart = text.split("## Not finished")
  assert "| msra/use_rope=True,seed=3 | preempted | 100 |  |" in apart
  assert "| msra/use_rope=False,seed=2 | failed | 100 | FloatingPointError: loss is nan |" in apart
  assert "| cluener/use_rope=True,seed=1 | started (no results.json) | - |  |" in apart
  assert "seed=3" not in finished and "FloatingPoint" not in finished
  assert len([ln for ln in apart.splitlines() if ln.startswith("| msra/") or ln.startswith("| cluener/")]) == 3


def test_pooled_by_length(sweep_dir):
  root, runs = sweep_dir
  rows = report.collect(root)
  members = [r for r in rows if r["dataset"] == "msra" and r["rope"] is True and r["status"] == "finished"]
  assert len(members) == 3
  got = report.pooled_by_length(members)
  for b in BUCKETS:
    cells = [runs[("msra", True, s)]["dev"]["by_length"][b] for s in (0, 1, 2)]
    tp, pred, gold = (sum(c[k] for c in cells) for k in ("tp", "pred", "gold"))
    assert got[b] == 2 * tp / (pred + gold)


def test_cli_writes_markdown_and_plots(sweep_dir, tmp_path, capsys):
  root, _ = sweep_dir
  out = str(tmp_path / "figures" / "rope")
  assert report.main([root, "--out", out]) == 0
  printed = capsys.readouterr().out
  md = open(out + ".md").read()
  assert printed.strip() in md and "(rope_f1.png)" in md and "(rope_by_length.png)" in md
  assert "rope_epochs.png" not in md and not os.path.exists(out + "_epochs.png")  # no run has a dev history
  assert "No per-epoch history recorded (8 of 8 finished runs" in md
  for suffix in ("_f1.png", "_by_length.png"):
    data = open(out + suffix, "rb").read()
    assert len(data) > 1000 and data[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_says_how_to_install(sweep_dir, tmp_path, capsys, monkeypatch):
  root, _ = sweep_dir
  monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
  out = str(tmp_path / "r")
  assert report.main([root, "--out", out]) == 1
  assert "pip install -e '.[plots]'" in capsys.readouterr().err
  assert os.path.exists(out + ".md") and not os.path.exists(out + "_f1.png")
  assert report.main([root]) == 0  # no --out: no plots, no matplotlib needed


def test_taggers_have_no_rope_column(tmp_path):
  root = str(tmp_path / "runs")
  for seed in (0, 1):
    _run(root, f"msra/head=crf,seed={seed}", dataset="msra", rope=True, seed=seed, head="crf")
  _run(root, "msra/use_rope=True,head=standard,seed=0", dataset="msra", rope=True, seed=0)
  summary = report.summarize(report.collect(root))
  by_head = {g["head"]: g for g in summary}
  assert by_head["crf"]["rope"] == "n/a" and by_head["crf"]["n"] == 2
  assert by_head["standard"]["rope"] == "True"
  assert "| msra | scratch | crf | n/a | 2 |" in report.groups_table(summary)


def _png_size(path):
  data = open(path, "rb").read()
  assert data[:8] == b"\x89PNG\r\n\x1a\n"
  return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def _visible_axes(fig):
  return [ax for ax in fig.axes if ax.get_visible()]


def test_head_kind_and_buckets_read_from_results(tmp_path):
  root = str(tmp_path / "runs")
  # results.json says which heads are taggers and which buckets it wrote, whatever gp_jax holds today.
  _run(root, "a/head=newtagger,seed=0", dataset="msra", rope=True, seed=0, head="newtagger", head_kind="tagger",
       length_buckets=list(BUCKETS))
  _run(root, "a/head=crf,seed=0", dataset="msra", rope=True, seed=0, head="crf", head_kind="span",
       length_buckets=["3-4", "1"])
  rows = report.collect(root)
  by_head = {r["head"]: r for r in rows}
  assert by_head["newtagger"]["rope"] == "n/a" and by_head["newtagger"]["head_kind"] == "tagger"
  assert by_head["crf"]["rope"] is True and by_head["crf"]["head_kind"] == "span"
  assert by_head["crf"]["length_buckets"] == ("3-4", "1")
  assert report.pooled_by_length([by_head["crf"]]).keys() == {"3-4", "1"}
  summary = report.summarize(rows)
  header = report.length_table(rows, summary).splitlines()[0]
  assert header.endswith("| len 3-4 | len 1 | len 2 | len 5-8 | len 9+ |")  # first seen order, then the union


def test_head_kind_and_buckets_fallback_for_old_results(tmp_path, monkeypatch):
  from gp_jax.models import taggers
  from gp_jax.tasks import entities as evaluate  # the entity task's by-length buckets

  root = str(tmp_path / "runs")
  _run(root, "a/head=crf,seed=0", dataset="msra", rope=True, seed=0, head="crf")
  _run(root, "a/head=mytagger,seed=0", dataset="msra", rope=True, seed=0, head="mytagger")
  _run(root, "a/head=standard,seed=0", dataset="msra", rope=False, seed=0)
  rows = {r["head"]: r for r in report.collect(root)}
  assert rows["crf"]["head_kind"] == "tagger" and rows["crf"]["rope"] == "n/a"
  assert rows["mytagger"]["head_kind"] == "span" and rows["mytagger"]["rope"] is True
  assert rows["standard"]["rope"] is False
  assert rows["crf"]["length_buckets"] == tuple(label for label, *_ in evaluate.LENGTH_BUCKETS)
  # The fallback follows gp_jax, not a copy in the report.
  monkeypatch.setitem(taggers.TAGGERS, "mytagger", object)
  monkeypatch.setattr(evaluate, "LENGTH_BUCKETS", (("short", 1, 2), ("long", 3, None)))
  rows = {r["head"]: r for r in report.collect(root)}
  assert rows["mytagger"]["head_kind"] == "tagger" and rows["mytagger"]["rope"] == "n/a"
  assert rows["standard"]["length_buckets"] == ("short", "long")


def _history(epochs, f1s, spe=10):
  return [{"step": int(e * spe), "epoch": e, "f1": f} for e, f in zip(epochs, f1s)]


@pytest.fixture
def history_dir(tmp_path):
  """Two datasets; msra has 2 cells x 2 seeds with dev_history, one stopped early; plus old-style points."""
  root = str(tmp_path / "runs")
  curves = {}
  for rope in (True, False):
    for seed in (0, 1):
      f1s = [0.3 + 0.1 * seed + 0.05 * rope, 0.5 + 0.1 * seed, 0.6 + 0.1 * seed + 0.05 * rope]
      stop = rope and seed == 1
      if stop:
        f1s = f1s[:2]
      if not rope and seed == 0:
        f1s[1] = 0.62  # best checkpoint at epoch 2 of 3
      curves[(rope, seed)] = f1s
      history = _history(range(1, len(f1s) + 1), f1s)
      _run(root, f"msra/use_rope={rope},seed={seed}", dataset="msra", rope=rope, seed=seed, head="standard",
           head_kind="span", length_buckets=list(BUCKETS), dev_history=history,
           epochs=float(len(f1s)), stopped_early=stop, best_step=max(history, key=lambda h: h["f1"])["step"])
  # An old results.json: history from metrics.jsonl, steps per epoch from split_stats and batch_size.
  res = _run(root, "conll/head=crf,seed=0", dataset="conll2003", rope=True, seed=0, head="crf",
             split_stats={"train": {"windows": 95}})
  with open(os.path.join(root, "conll/head=crf,seed=0/config.json")) as f:
    config = json.load(f)
  config.update(batch_size=10, num_epochs=10.0, num_train_steps=0)
  with open(os.path.join(root, "conll/head=crf,seed=0/config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(root, "conll/head=crf,seed=0/metrics.jsonl"), "w") as f:
    for step, f1 in ((50, 0.4), (100, 0.5), (100, 0.55)):  # step 100 logged again by a resumed attempt
      f.write(json.dumps({"step": step, "split": "dev", "f1": f1, "precision": 0.5}) + "\n")
      f.write(json.dumps({"step": step, "split": "train", "loss": 1.0}) + "\n")
    f.write('{"step": 101, "spl')  # a line being written
  # No history at all.
  _run(root, "conll/head=softmax,seed=0", dataset="conll2003", rope=True, seed=0, head="softmax")
  return root, curves, res


def test_epochs_and_history_per_run(history_dir):
  root, curves, res = history_dir
  rows = {r["run"]: r for r in report.collect(root)}
  r = rows["msra/use_rope=True,seed=1"]
  assert r["epochs"] == 2.0 and r["stopped_early"] is True and r["history_source"] == "results.json"
  assert [h["f1"] for h in r["history"]] == curves[(True, 1)]
  assert r["best_at_end"] is True and rows["msra/use_rope=False,seed=0"]["best_at_end"] is False
  assert rows["conll/head=crf,seed=0"]["best_at_end"] is None  # no best_step recorded
  old = rows["conll/head=crf,seed=0"]
  assert old["history_source"] == "metrics.jsonl"
  assert old["history"] == [{"step": 50, "epoch": 5.0, "f1": 0.4}, {"step": 100, "epoch": 10.0, "f1": 0.55}]
  assert old["epochs"] == res["steps"] / 10 and old["stopped_early"] is False  # 100 of ceil(10 * 95 / 10) steps
  none = rows["conll/head=softmax,seed=0"]
  assert none["history"] == [] and none["history_source"] is None and none["epochs"] is None

  summary = report.summarize(list(rows.values()))
  text = report.markdown(list(rows.values()), summary)
  training = text.split("## Training length")[1]
  assert "| msra | scratch | standard | True | 2 | 2.50 (2.00-3.00) | 1/2 | 2/2 | 2/2 (results.json) |" in training
  assert "| msra | scratch | standard | False | 2 | 3.00 | 0/2 | 1/2 | 2/2 (results.json) |" in training
  assert "| conll2003 | scratch | crf | n/a | 1 | 10.00 | 0/1 | ? | 1/1 (metrics.jsonl) |" in training
  assert "| conll2003 | scratch | softmax | n/a | 1 | - | ? | ? | 0/1 |" in training
  listed = training.split("No per-epoch history recorded")[1]
  assert "- conll/head=softmax,seed=0" in listed and "msra/" not in listed and "head=crf" not in listed


def test_epoch_figure_from_dev_history(history_dir):
  root, curves, _ = history_dir
  summary = report.summarize(report.collect(root))
  fig = report.plot_epochs(summary)
  try:
    axes = _visible_axes(fig)
    assert [ax.get_title().split(":")[0] for ax in axes] == ["conll2003", "msra"]  # softmax: no history, no line
    conll, msra = axes
    assert len(conll.get_lines()) == 1 and conll.get_xlabel() == "epoch"
    assert list(conll.get_lines()[0].get_xdata()) == [5.0, 10.0]
    # Per cell a line over both seeds; the RoPE cell (seed 1 stopped at epoch 2) adds a faint one over the seed
    # still training, under it (tests/test_report_plot_styles.py checks it in detail).
    assert msra.get_xlabel() == "epoch" and len(msra.get_lines()) == 3
    for line in [ln for ln in msra.get_lines() if not ln.get_label().startswith("_")]:
      rope = "no RoPE" not in line.get_label()
      assert line.get_label().endswith("(n=2; faint from epoch 3: 1 seed)" if rope else "(n=2)")
      seeds = [curves[(rope, s)] for s in (0, 1)]
      want = [statistics.mean(c[i] for c in seeds) * 100 if all(i < len(c) for c in seeds) else float("nan")
              for i in range(3)]
      assert list(line.get_xdata()) == [1.0, 2.0, 3.0]
      assert line.get_ydata() == pytest.approx(want, nan_ok=True)
    assert len(msra.collections) == 2  # min..max band per cell with 2 seeds
  finally:
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_epoch_figure_by_step_when_steps_per_epoch_unknown(tmp_path):
  root = str(tmp_path / "runs")
  _run(root, "a/seed=0", dataset="msra", rope=True, seed=0)
  with open(os.path.join(root, "a/seed=0/metrics.jsonl"), "w") as f:
    f.write(json.dumps({"step": 7, "split": "dev", "f1": 0.5}) + "\n")
  summary = report.summarize(report.collect(root))
  assert summary[0]["members"][0]["history"] == [{"step": 7, "epoch": None, "f1": 0.5}]
  fig = report.plot_epochs(summary)
  (ax,) = _visible_axes(fig)
  assert "step" in ax.get_xlabel() and list(ax.get_lines()[0].get_xdata()) == [7.0]
  import matplotlib.pyplot as plt

  plt.close(fig)
  assert report.plot_epochs(report.summarize(report.collect(str(tmp_path / "none")))) is None


def test_f1_figure_one_panel_per_dataset(sweep_dir, tmp_path):
  root, runs = sweep_dir
  _run(root, "germeval/head=crf,seed=0", dataset="germeval2014", rope=True, seed=0, head="crf")
  summary = report.summarize(report.collect(root))
  fig = report.plot_f1(summary)
  try:
    axes = _visible_axes(fig)
    assert [ax.get_title().split(":")[0] for ax in axes] == ["cluener2020", "germeval2014", "msra"]
    cluener, germeval, msra = axes
    assert "dev F1" in cluener.get_title() and "test F1" in msra.get_title()  # CLUENER has no test labels
    assert [t.get_text() for t in msra.get_xticklabels()] == ["standard"]
    bars = {b.get_facecolor()[:3]: b.get_height() for b in msra.patches}
    assert len(msra.patches) == 2 and len(germeval.patches) == 1
    for rope in (True, False):
      mean = statistics.mean(100 * r["test"]["f1"] for (d, ro, _), r in runs.items() if d == "msra" and ro == rope)
      assert mean in [pytest.approx(h) for h in bars.values()]
    assert sum(t.get_text().startswith("n=") for t in msra.texts) == 2
    assert "n=3" in [t.get_text() for t in msra.texts]
  finally:
    import matplotlib.pyplot as plt

    plt.close(fig)
  out = str(tmp_path / "fig" / "s")
  assert report.main([root, "--out", out]) == 0
  w, h = _png_size(out + "_f1.png")
  assert 1000 <= w <= 1700 and 400 <= h <= 1400  # page width, 2 rows of panels
  assert _png_size(out + "_by_length.png")[0] <= 1700


def test_cli_links_epoch_figure(history_dir, tmp_path):
  root, _, _ = history_dir
  out = str(tmp_path / "figures" / "h")
  assert report.main([root, "--out", out]) == 0
  md = open(out + ".md").read()
  assert "(h_epochs.png)" in md and "(h_f1.png)" in md and "(h_by_length.png)" in md
  w, _ = _png_size(out + "_epochs.png")
  assert 1000 <= w <= 1700


def test_out_prefix_naming_a_folder_writes_report_files_there(sweep_dir, tmp_path, capsys):
  """--out /tmp/rep/ once wrote rep/.md, rep/_f1.png and named /tmp/rep_f1.png, a file that did not exist."""
  root, _ = sweep_dir
  for out, folder in ((str(tmp_path / "rep") + "/", tmp_path / "rep"), (str(tmp_path), tmp_path)):
    before = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    assert report.main([root, "--out", out]) == 0
    assert set(os.listdir(folder)) - before == {"report.md", "report_by_length.png", "report_f1.png"}
    wrote = capsys.readouterr().err.strip().splitlines()[-1]
    assert wrote.startswith("wrote ")
    named = wrote[len("wrote "):].split(", ")
    assert sorted(named) == sorted(str(folder / n) for n in ("report.md", "report_by_length.png", "report_f1.png"))
    assert "(report_f1.png)" in open(folder / "report.md").read()
  with pytest.raises(SystemExit):
    report.main(["--help"])
  assert "FOLDER/report" in " ".join(capsys.readouterr().out.split())
