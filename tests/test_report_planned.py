"""launch/report lists every planned comparison: one whose arm has no finished run (all failed, or no run folder at
all) is a line naming the missing cell and why, untested, and the text under the table says over how many
comparisons each Holm family adjusted and which planned ones were untested."""

import os

import pytest
from scipy import stats as scipy_stats

from launch import report
from tests.test_report import _run
from tests.test_report_influence import _edit_config


def _rope_heads(root, *, lost="failed", max_len=None, seeds=(0, 1, 2)):
  """GP and EGP x RoPE on/off, all finished but EGP without RoPE, whose runs end as `lost` says (a status; None: no
  run folder at all). Returns {(head, rope, seed): results}."""
  runs = {}
  prefix = f"max_len={max_len}," if max_len else ""
  for head in ("standard", "efficient"):
    for rope in (True, False):
      for s in seeds:
        name = f"{prefix}head={head},use_rope={rope},seed={s}"
        missing = head == "efficient" and not rope
        if missing and lost is None:
          continue
        runs[(head, rope, s)] = _run(root, name, dataset="msra", rope=rope, seed=s, head=head,
                                     k=s * (1 + rope + 3 * (head == "efficient")),
                                     status=lost if missing else "finished")
        if max_len:
          _edit_config(root, name, **{"data.max_len": max_len})
  return runs


def _holm(pvalues):
  order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
  out, running = [None] * len(pvalues), 0.0
  for rank, i in enumerate(order):
    running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
    out[i] = running
  return out


def test_an_arm_whose_runs_all_failed_is_named_untested(tmp_path):
  root = str(tmp_path / "runs")
  runs = _rope_heads(root)
  rows = report.collect(root)
  summary = report.summarize(rows)
  compared, skipped = report.compare(summary, rows=rows, resamples=10)
  assert [r["what"] for r in compared] == ["RoPE on vs off (standard)", "EGP vs GP (RoPE)"]
  untested = {s["what"]: s["why"] for s in skipped}
  assert set(untested) == {"RoPE on vs off (efficient)", "EGP vs GP (no RoPE)"}
  for why in untested.values():
    assert why == "no finished run of efficient, no RoPE: 3 failed (seeds 0, 1, 2)"
  # Holm over the two tested comparisons only (m = 2), from the F1s themselves.
  diffs = {"RoPE on vs off (standard)": [runs[("standard", True, s)]["test"]["f1"] -
                                         runs[("standard", False, s)]["test"]["f1"] for s in range(3)],
           "EGP vs GP (RoPE)": [runs[("efficient", True, s)]["test"]["f1"] -
                                runs[("standard", True, s)]["test"]["f1"] for s in range(3)]}
  p = [scipy_stats.ttest_rel(d, [0.0] * 3).pvalue for d in diffs.values()]
  assert [r["t_p_holm"] for r in compared] == pytest.approx(_holm(p))
  text = report.markdown(rows, summary, resamples=10)
  sig = text.split("## Significance")[1].split("\n## ")[0]
  assert "- skipped msra, scratch: RoPE on vs off (efficient): no finished run of efficient, no RoPE: 3 failed" in sig
  assert "- skipped msra, scratch: EGP vs GP (no RoPE): no finished run of efficient, no RoPE: 3 failed" in sig
  (holm_line,) = [ln for ln in sig.splitlines() if "Holm over" in ln]
  assert ("Holm over 2 comparisons with a t-test p and 0 with a bootstrap p; 2 planned untested: msra: RoPE on vs "
          "off (efficient); msra: EGP vs GP (no RoPE)") in holm_line


def test_an_arm_without_any_run_folder_is_named_missing(tmp_path):
  root = str(tmp_path / "runs")
  _rope_heads(root, lost=None)
  rows = report.collect(root)
  compared, skipped = report.compare(report.summarize(rows), rows=rows, resamples=10)
  assert len(compared) == 2
  assert {s["what"]: s["why"] for s in skipped} == {
      w: "no finished run of efficient, no RoPE: no run of it in this study"
      for w in ("RoPE on vs off (efficient)", "EGP vs GP (no RoPE)")}
  assert all(s["a"].get("missing") or s["b"].get("missing") for s in skipped)


def test_a_preempted_arm_and_a_failed_crf_are_named(tmp_path):
  root = str(tmp_path / "runs")
  _rope_heads(root, lost="preempted")
  for s in (0, 1):
    _run(root, f"head=crf,seed={s}", dataset="msra", rope=True, seed=s, head="crf", status="failed")
  rows = report.collect(root)
  _, skipped = report.compare(report.summarize(rows), rows=rows, resamples=10)
  why = {s["what"]: s["why"] for s in skipped}
  assert why["GP vs CRF (GP with RoPE)"] == "no finished run of crf: 2 failed (seeds 0, 1)"
  assert why["RoPE on vs off (efficient)"] == "no finished run of efficient, no RoPE: 3 preempted (seeds 0, 1, 2)"


def test_a_length_arm_with_an_untested_side_is_named(tmp_path):
  root = str(tmp_path / "runs")
  _rope_heads(root, max_len=128, lost="finished")  # every cell finished at 128
  _rope_heads(root, max_len=579)  # EGP without RoPE failed at 579
  rows = report.collect(root)
  compared, skipped = report.compare(report.summarize(rows), rows=rows, resamples=10)
  arms = [r["what"] for r in compared if r.get("arms")]
  assert arms == [f"{w}: max_len 579 minus 128" for w in ("RoPE on vs off (standard)", "EGP vs GP (RoPE)")]
  why = {s["what"]: s["why"] for s in skipped}
  assert why["RoPE on vs off (efficient): max_len 579 minus 128"] == "untested at max_len 579 (see there)"
  assert why["EGP vs GP (no RoPE): max_len 579 minus 128"] == "untested at max_len 579 (see there)"
  assert why["RoPE on vs off (efficient)"].startswith("no finished run of efficient, no RoPE: 3 failed")


def test_a_study_that_planned_no_such_arm_lists_nothing(tmp_path):
  """No CRF, and a tricks-only study with RoPE on only: nothing planned is missing, so nothing is listed."""
  root = str(tmp_path / "runs")
  _rope_heads(os.path.join(root, "heads"), lost="finished")
  for s in (0, 1):
    for kind in ("none", "fgm"):
      name = f"tricks/kind={kind},seed={s}"
      _run(root, name, dataset="msra", rope=True, seed=s, k=s * (1 + (kind == "fgm")))
      _edit_config(root, name, **{"adversarial.kind": kind, "adversarial.epsilon": 1.0})
  rows = report.collect(root)
  compared, skipped = report.compare(report.summarize(rows), rows=rows, resamples=10)
  assert skipped == []
  assert sorted(r["what"] for r in compared) == sorted(
      ["RoPE on vs off (efficient)", "RoPE on vs off (standard)", "EGP vs GP (RoPE)", "EGP vs GP (no RoPE)",
       "fgm vs plain (standard, RoPE)"])
