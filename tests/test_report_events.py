"""launch.report on an events study (experiments/phee_minilm.py's get_sweep: use_rope on / off x seeds 0, 1, 2).

The fake study's results.json files are written by the task's own scorer (`gp_jax.tasks.events.host.score` and
`final_fields`, as training writes them) on PHEE-like sentences with predictions perturbed per run; config.json is
phee_minilm's config with the sweep's overrides. The report's events figures are checked against computations from
the formulas: Student's t with 2 degrees of freedom in closed form (F(t) = 1/2 + t / (2 sqrt(2 + t^2))), Holm by
hand, and the paired bootstrap as a plain loop over resamples.
"""

from __future__ import annotations

import inspect
import json
import math
import os
import statistics

import numpy as np
import pytest

from experiments import phee_minilm
from gp_jax import tasks
from gp_jax.tasks.events import host
from launch import report
from launch.report import events as report_events
from launch.report import runs as report_runs
from tests.helpers_train import EVENT_RESULT_FIELDS

ETYPE = "Adverse_event"
TYPES = tuple(f"{ETYPE}:{r}" for r in ("trigger", "Effect", "Subject", "Subject.Age", "Treatment", "Treatment.Drug"))
RESAMPLES = 2000


def _sentence(i: int) -> tuple[str, list[dict]]:
  """A PHEE-like sentence and its one gold event (nested Subject / Subject.Age, Treatment / Treatment.Drug)."""
  drug, effect, age = f"drug{i}", f"rash{i % 3}", f"{20 + i} year old"
  text = f"{drug} therapy caused {effect} in a {age} man"
  at = lambda s: {"start": text.index(s), "end": text.index(s) + len(s)}  # noqa: E731
  args = [dict(at(f"{drug} therapy"), role="Treatment"), dict(at(drug), role="Treatment.Drug"),
          dict(at(effect), role="Effect"), dict(at(f"a {age} man"), role="Subject"),
          dict(at(age), role="Subject.Age")]
  return text, [{"type": ETYPE, "trigger": at("caused"), "arguments": args}]


def _predictions(gold: list[list[dict]], rng, *, miss: float, wrong: float) -> list[dict]:
  """Gold events with each argument dropped with probability `miss`, shifted by one character (a false positive
  and a miss) with probability `wrong`, and the trigger dropped now and then."""
  out = []
  for events in gold:
    pred = []
    for e in events:
      args = []
      for a in e["arguments"]:
        u = rng.random()
        if u < miss:
          continue
        args.append(dict(a, start=a["start"] + 1, score=0.5) if u < miss + wrong else dict(a, score=0.9))
      trigger = None if rng.random() < miss / 2 else dict(e["trigger"], score=0.9)
      pred.append({"type": e["type"], "trigger": trigger, "arguments": args, "score": 0.8})
    out.append({"events": pred})
  return out


def _split_result(records: int, offset: int, rng, *, miss: float, wrong: float) -> dict:
  texts, gold = zip(*(_sentence(offset + i) for i in range(records)))

  class Prepared:  # the fields host.score reads of a prepared split
    types = TYPES
    table = type("T", (), {"gold": tuple(tuple(g) for g in gold)})

  Prepared.texts = texts
  result = host.score(Prepared, _predictions(list(gold), rng, miss=miss, wrong=wrong))
  return host.final_fields(result)


def _config(rope: bool, seed: int) -> dict:
  config = phee_minilm.get_config()
  overrides = {"config.model.use_rope": rope, "config.seed": seed}
  assert overrides in phee_minilm.get_sweep(), "the study's sweep changed: update this test's runs"
  config.model.use_rope, config.seed = rope, seed
  return json.loads(json.dumps(config.to_dict()))  # as config.json holds it (tuples as lists)


@pytest.fixture(scope="module")
def events_study(tmp_path_factory):
  """phee_minilm's sweep, RoPE on scoring better than off on average; returns (root, {(rope, seed): results})."""
  root = str(tmp_path_factory.mktemp("phee_study"))
  written = {}
  for overrides in phee_minilm.get_sweep():
    rope, seed = overrides["config.model.use_rope"], overrides["config.seed"]
    rng = np.random.default_rng(100 * seed + int(rope))
    miss, wrong = (0.15, 0.1) if rope else (0.3, 0.15)
    results = {"status": "finished", "head_kind": "span", "steps": 40, "epochs": 2.0, "stopped_early": False,
               "best_step": 40, "dev_history": [{"step": 20, "epoch": 1.0, "f1": 0.3}, {"step": 40, "epoch": 2.0,
                                                                                         "f1": 0.5}],
               "dev": _split_result(14, 0, rng, miss=miss, wrong=wrong),
               "test": _split_result(16, 100, rng, miss=miss, wrong=wrong)}
    folder = os.path.join(root, f"use_rope={rope},seed={seed}")
    os.makedirs(folder)
    for name, value in (("config.json", _config(rope, seed)), ("results.json", results)):
      with open(os.path.join(folder, name), "w") as f:
        json.dump(value, f)
    written[rope, seed] = results
  return root, written


# ----------------------------------------------------------------------------- references from the formulas


def _t2_p(values) -> float:
  """Two-sided p of the one-sample t-test of 3 values against 0: Student's t with 2 degrees of freedom,
  P(|T| > t) = 1 - t / sqrt(2 + t^2)."""
  assert len(values) == 3
  mean = sum(values) / 3
  sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 2)
  t = abs(mean) / (sd / math.sqrt(3))
  return 1 - t / math.sqrt(2 + t * t)


def _t2_interval(values) -> tuple[float, float]:
  """95% t-interval of the mean of 3 values: quantile of t(2) at 0.975 = (2q - 1) / sqrt(2 q (1 - q))."""
  q = 0.975
  quantile = (2 * q - 1) / math.sqrt(2 * q * (1 - q))
  mean = sum(values) / 3
  half = quantile * math.sqrt(sum((v - mean) ** 2 for v in values) / 2) / math.sqrt(3)
  return mean - half, mean + half


def _holm(ps: list[float]) -> list[float]:
  order = sorted(range(len(ps)), key=lambda i: ps[i])
  out, running = [0.0] * len(ps), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(ps) - rank) * ps[i]))
    out[i] = running
  return out


def _f1(tp, fp, fn) -> float:
  return 2 * tp / (2 * tp + fp + fn) if 2 * tp + fp + fn else 0.0


def _bootstrap_p(on: list[dict], off: list[dict], resamples: int) -> float:
  """Paired bootstrap over records as a plain loop: indices from default_rng(0).integers(0, R, (resamples, R))."""
  counts = [[[r["per_record"][k] for k in ("tp", "fp", "fn")] for r in cell] for cell in (on, off)]
  records = len(counts[0][0][0])
  observed = statistics.mean(_f1(*map(sum, a)) - _f1(*map(sum, b)) for a, b in zip(*counts))
  idx = np.random.default_rng(0).integers(0, records, size=(resamples, records))
  other = 0
  for row in idx:
    diff = statistics.mean(_f1(*(sum(c[j] for j in row) for c in a)) - _f1(*(sum(c[j] for j in row) for c in b))
                           for a, b in zip(*counts))
    other += diff <= 0 if observed > 0 else diff >= 0
  return min(1.0, 2 * other / resamples)


# ----------------------------------------------------------------------------- tests


def test_report_task_names_are_the_registrys_and_pointer_tasks_take_pointer_rope():
  assert {report_runs.ENTITIES, report_runs.RELATIONS, report_runs.EVENTS} <= set(tasks.NAMES)
  takes = {name for name in tasks.NAMES if "pointer_rope" in inspect.signature(tasks.get(name)).parameters}
  assert takes == set(report_runs.POINTER_TASKS)


def test_fake_results_have_the_fields_training_writes(events_study):
  _, written = events_study
  r = written[True, 0]["test"]
  assert {"f1", "per_record", "event_level", "ti", "tc", "ai", "ac", "phee"} <= set(r)
  assert set(r["phee"]["headline"]) == set(report_events.FIGURES)
  counts = r["per_record"]
  assert sum(counts["tp"]) == r["tp"] and sum(counts["tp"]) + sum(counts["fp"]) == r["pred"]
  assert set(r) == EVENT_RESULT_FIELDS | {"phee"}  # what a trained run writes (tests/e2e/test_events_train.py)
  assert set(r["phee"]) == {"classification", "identification", "headline", "skipped"}
  assert all(set(v) == {"em_f1", "token_f1"} for v in r["phee"]["headline"].values())


def test_events_cells_pair_rope_on_off_by_seed(events_study):
  root, written = events_study
  rows = report.collect(root)
  assert len(rows) == 6 and {r["task"] for r in rows} == {"events"} and {r["pointer_rope"] for r in rows} == {"False"}
  summary = report.summarize(rows)
  assert [report.stats.cell_name(g) for g in summary] == ["efficient, no RoPE, no pointer RoPE",
                                                          "efficient, RoPE, no pointer RoPE"]
  assert all(g["n"] == 3 and "variant" not in g for g in summary)
  compared, skipped = report.compare(summary, resamples=RESAMPLES)
  assert not skipped and [r["what"] for r in compared] == ["RoPE on vs off (efficient, no pointer RoPE)"]
  row = compared[0]
  assert row["split"] == "test" and row["seeds"] == [0, 1, 2]
  diffs = [written[True, s]["test"]["f1"] - written[False, s]["test"]["f1"] for s in (0, 1, 2)]
  assert row["values"] == pytest.approx(diffs, abs=1e-12)
  assert row["mean"] == pytest.approx(sum(diffs) / 3, abs=1e-12)
  assert (row["low"], row["high"]) == pytest.approx(_t2_interval(diffs), abs=1e-9)
  assert row["t_p"] == pytest.approx(_t2_p(diffs), abs=1e-9)
  want = _bootstrap_p([written[True, s]["test"] for s in (0, 1, 2)], [written[False, s]["test"] for s in (0, 1, 2)],
                      RESAMPLES)
  assert row["p"] == pytest.approx(want, abs=1e-12)
  assert row["influence"] is not None


def test_phee_figures_paired_by_seed(events_study):
  root, written = events_study
  summary = report.summarize(report.collect(root))
  compared, _ = report.compare(summary, resamples=RESAMPLES)
  (entry,) = report_events.paired_figures(compared)
  assert entry["index"] == 1 and entry["why"] is None
  ps = []
  for figure in report_events.FIGURES:
    diffs = [written[True, s]["test"]["phee"]["headline"][figure]["em_f1"]
             - written[False, s]["test"]["phee"]["headline"][figure]["em_f1"] for s in (0, 1, 2)]
    got = entry["figures"][figure]
    assert got["values"] == pytest.approx(diffs, abs=1e-12)
    assert (got["low"], got["high"]) == pytest.approx(_t2_interval(diffs), abs=1e-9)
    assert got["t_p"] == pytest.approx(_t2_p(diffs), abs=1e-9)
    ps.append(_t2_p(diffs))
  holm = _holm(ps)
  for figure, want in zip(report_events.FIGURES, holm):
    assert entry["figures"][figure]["t_p_holm"] == pytest.approx(want, abs=1e-9)


def _cell(values) -> str:
  values = [100 * v for v in values]
  return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f}"


def test_markdown_shows_phee_headline_beside_argument_f1(events_study, tmp_path, capsys):
  root, written = events_study
  out = str(tmp_path / "fig" / "phee")
  assert report.main([root, "--out", out]) == 0
  printed = capsys.readouterr().out
  with open(f"{out}.md") as f:
    text = f.read()
  assert printed in text and os.path.exists(f"{out}_f1.png") and os.path.exists(f"{out}_epochs.png")
  assert "F1, P and R are Su's argument level" in text
  assert "## Events: the PHEE paper's figures beside the argument F1" in text
  for rope, name in ((True, "efficient, RoPE, no pointer RoPE"), (False, "efficient, no RoPE, no pointer RoPE")):
    for split in ("dev", "test"):
      runs = [written[rope, s][split] for s in (0, 1, 2)]
      em = [_cell([r["phee"]["headline"][f]["em_f1"] for r in runs]) for f in report_events.FIGURES]
      tok = [_cell([r["phee"]["headline"][f]["token_f1"] for r in runs]) for f in report_events.FIGURES]
      line = " | ".join(["phee", "bert", name, split, "3", _cell([r["f1"] for r in runs]),
                         _cell([r["event_level"]["f1"] for r in runs]), *em, *tok])
      assert f"| {line} |" in text
  diffs = {f: [written[True, s]["test"]["phee"]["headline"][f]["em_f1"]
               - written[False, s]["test"]["phee"]["headline"][f]["em_f1"] for s in (0, 1, 2)]
           for f in report_events.FIGURES}
  (line,) = [x for x in text.splitlines() if x.startswith("| 1 | phee | RoPE on vs off")]
  ps = [_t2_p(diffs[f]) for f in report_events.FIGURES]
  p_text = lambda p: "< 0.001" if p < 0.001 else f"{p:.3f}"  # noqa: E731
  cells = []
  for f, p, adjusted in zip(report_events.FIGURES, ps, _holm(ps)):
    low, high = _t2_interval(diffs[f])
    cells.append(f"{100 * statistics.mean(diffs[f]):+.2f} [{100 * low:+.2f}, {100 * high:+.2f}]; p = {p_text(p)} "
                 f"(Holm {p_text(adjusted)})")
  assert line.endswith(" | ".join(cells) + " |")


def test_study_without_phee_figures_says_so(events_study, tmp_path):
  """A non-PHEE events corpus (no "phee" in results.json): the PHEE columns are "-", the comparison says why."""
  root, _ = events_study
  copy = tmp_path / "study"
  for rel, path in report.find_runs(root):
    (copy / rel).mkdir(parents=True)
    (copy / rel / "config.json").write_text((path / "config.json").read_text())
    res = json.loads((path / "results.json").read_text())
    for split in ("dev", "test"):
      del res[split]["phee"]
    (copy / rel / "results.json").write_text(json.dumps(res))
  summary = report.summarize(report.collect(str(copy)))
  compared, _ = report.compare(summary, resamples=200)
  (entry,) = report_events.paired_figures(compared)
  assert entry["why"] == "no PHEE figures on test (18 of 18 values)"
  table = report_events.figures_table(summary).splitlines()
  assert table[0].endswith("| argument F1 (Su; selects) | event-level F1 |") and len(table) == 6
  text = "\n".join(report_events.section(summary, compared))
  assert "## Events: the event-level F1 beside the argument F1" in text and "EM F1(A)" not in text
  # One run with them: the columns come back, "-" (n=...) where runs lack them.
  res = json.loads((path / "results.json").read_text())
  (copy / rel / "results.json").write_text(json.dumps(res))
  summary = report.summarize(report.collect(str(copy)))
  table = report_events.figures_table(summary)
  assert table.count("(n=1)") == 6 * 2 and "| - | - | - | - | - | - |" in table
