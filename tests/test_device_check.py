"""benchmarks.device_check --tiny: every stage runs on the CPU (cuDNN and torch parts skipped with their reason),
the results say what was measured, and a stage cut off by its limit keeps its status."""

import json
import subprocess
import sys

import pytest

from tests import helpers_train

pytestmark = pytest.mark.e2e


def _run(out, *args, timeout=600):
  return subprocess.run([sys.executable, "-m", "benchmarks.device_check", f"--out={out}", "--tiny",
                         f"--cache_dir={out}/cache", *args], cwd=helpers_train.REPO, env=helpers_train.subprocess_env(1),
                        capture_output=True, text=True, timeout=timeout, check=False)


def test_tiny_run_covers_every_stage(tmp_path):
  proc = _run(tmp_path, "--budget_s=400")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((tmp_path / "device_check.json").read_text())
  stages = result["stages"]
  assert list(stages) == ["versions", "attention", "precision", "train_step", "span_loss", "extras"]
  assert {s["status"] for s in stages.values()} == {"ok"}, {k: s.get("error") for k, s in stages.items()}
  assert stages["versions"]["versions"]["backend"] == "cpu"
  assert all(p["jax"] > 0 for p in stages["versions"]["peaks_gflops"].values())
  for row in stages["attention"]["compare"].values():
    assert row["xla_bf16"]["finite"] and row["xla_bf16"]["out_rel_err"] < 2e-2
    assert row["cudnn_bf16"]["status"] == "skipped" and "CUDA GPU" in row["cudnn_bf16"]["why"]
  assert stages["attention"]["dropout"]["status"] == "skipped"
  precision = stages["precision"]
  assert precision["variants"]["bf16 cudnn seed 0"]["status"] == "skipped"
  assert len(precision["variants"]["f32 xla seed 0"]["loss"]) == 3
  assert precision["summary"]["bf16 xla seed 0"]["max_abs_loss_diff"] < 0.1  # bf16 tracks f32 on one fixed batch
  train = stages["train_step"]
  ours = [v for n, v in train["variants"].items() if n.startswith("ours")]
  assert len(ours) == 2 and all(v["ms_per_step"] > 0 and v["compile_s"] > 0 for v in ours)
  assert train["variants"]["torch"]["status"] == "skipped"
  assert train["first_step"].startswith("first step after")
  runs = stages["span_loss"]["runs"]
  for L in (32, 64):  # dense and blockwise compute one loss
    assert runs[f"L{L} dense"]["loss"] == pytest.approx(runs[f"L{L} blockwise"]["loss"], rel=1e-4)
  assert {"threefry_ms", "hash_ms"} <= set(stages["extras"]["dropout_bits"])
  md = (tmp_path / "device_check.md").read_text()
  assert "## Train step" in md and "skipped: cuDNN needs a CUDA GPU" in md


def test_a_stage_past_its_limit_reports_timeout(tmp_path):
  proc = _run(tmp_path, "--budget_s=3", "--stages=precision", timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  stage = json.loads((tmp_path / "device_check.json").read_text())["stages"]["precision"]
  assert stage["status"] == "timeout" and stage["limit_s"] <= 3.1
  assert "what it had measured is kept" in stage["why"]
