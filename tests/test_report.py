"""launch/report.py on a sweep folder written here: grouping, mean +- sample std, unfinished runs apart, plots."""

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
  assert printed.strip() in md and "rope_f1.png" in md and "rope_by_length.png" in md
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
