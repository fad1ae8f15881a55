"""launch/report/ on a sweep folder written here: grouping, mean +- sample std, unfinished runs apart, plots."""

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
    assert msra.get_xlabel() == "epoch" and len(msra.get_lines()) == 2
    for line in msra.get_lines():
      rope = "no RoPE" not in line.get_label()
      assert line.get_label().endswith("(n=2)")
      seeds = [curves[(rope, s)] for s in (0, 1)]
      want = [statistics.mean(c[i] for c in seeds if i < len(c)) * 100 for i in range(3)]
      assert list(line.get_xdata()) == [1.0, 2.0, 3.0]
      assert line.get_ydata() == pytest.approx(want)
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


# ----------------------------------------------------------------------------- significance (issue 31)


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
  assert runs_lib.trick_of({"adversarial": {"kind": "fgm", "epsilon": 0.0}}) == "plain"  # epsilon 0: the plain step
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


# ----------------------------------------------------------------------------- cells, Holm, influence (issue 41)


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


# ----------------------------------------------------------------------------- relations (GPLinker, task=relations)


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
