"""benchmarks.device_check --tiny: every stage runs on the CPU (cuDNN and torch parts skipped with their reason),
the results say what was measured, a stage cut off by its limit keeps its status, and a train_step variant whose
process aborts loses only its row; the trainer stage's log parsers; benchmarks/device_wheels.sh's import check."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import device_check
from benchmarks.device_check.trainer import STARTUP_MARKERS
from tests import helpers_train

TRAINER_LOG = """\
I1126 17:12:21.457494 140139521958208 train.py:84] Mesh {'data': 1, 'fsdp': 1} over 1 devices (gpu)
I1126 17:12:30.1 1401 aot.py:246] compiled ahead: eval L64 B32 hits 1024: 0.80 s (cache hit)
I1126 17:12:30.2 1401 aot.py:246] compiled ahead: train L64 B16: 3.21 s (cache miss)
I1128 19:05:30.900141 139946992070976 aot.py:317] compiled ahead: train L64 B16 x8: 133.82 s (cache miss)
2026-11-26 17:12:30,300 INFO gp_jax.aot: compiled ahead: train L128 B16: failed (XlaRuntimeError)
I1126 17:12:30.4 1401 aot.py:247] compiled ahead: 8 programs in 12.3 s wall, 20.1 s of compile summed, 2 threads
I1126 17:14:21.486810 140139521958208 train.py:175] first step after 163.6 s (compile 134.5 s)
I1126 17:15:04.382674 140139521958208 reporting.py:112] dev@672: 1/21 batches (5%), 35 s
I1126 17:15:04.514537 140139521958208 reporting.py:115] dev@672: 21/21 batches in 35.4 s
I1126 17:15:04.6 1401 steps.py:269] dev@672: 558 hits in one batch, growing the hit buffer to 1024
I1126 17:15:04.6 1401 steps.py:259] dev@672: eval L64 B32 hits 2048 not compiled ahead; compiling on first use
I1126 17:15:04.7 1401 train.py:143] dev@672 evaluation: 1.23 s
I1126 17:15:05.0 1401 train.py:234] checkpoint at step 672: 0.41 s
I1126 17:15:17.555580 140139521958208 reporting.py:115] dev@1344: 21/21 batches in 0.2 s
I1126 17:15:17.6 1401 train.py:143] dev@1344 evaluation: 0.21 s\r
I1126 17:15:18.0 1401 train.py:295] train pace L64: 612 steps, 8.12 ms/step, 51234 tokens/s
I1126 17:15:18.0 1401 train.py:295] train pace L128: 60 steps, 11.50 ms/step, 38,000 tokens/s
I1126 17:15:18.1 1401 train.py:302] 1344 steps in 168 calls
I1126 17:15:20.227025 140139521958208 train.py:349] Done (finished) in 3.9 minutes: {'dev': 0.0, 'test': nan}
"""

ANCHOR_LOG = """\
setup 12.3 s, 10748 train, 1343 dev, 10 types, compiled=False
first step after 19.5 s
epoch 1: train 34.5 s (672 steps), dev 1.2 s, span F1 0.0000, loss 1.2345
epoch 2: train 32.5 s (1344 steps), dev 0.5 s, span F1 0.0123, loss nan
done in 84.5 s
"""


def _run(out, *args, timeout=600):
  """The device check, --tiny, writing into `out`. Its stages compile into the test run's compilation cache
  (tests/conftest.py), so a program one test's stage compiled is loaded by the next that builds it; the trainer's
  runs keep their own cache in the scratch folder (their cold and warm runs are what they measure)."""
  cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or f"{out}/cache"
  return subprocess.run([sys.executable, "-m", "benchmarks.device_check", f"--out={out}", "--tiny",
                         f"--cache_dir={cache}", f"--scratch_dir={out}/scratch", *args], cwd=helpers_train.REPO,
                        env=helpers_train.subprocess_env(1), capture_output=True, text=True, timeout=timeout,
                        check=False)


def test_trainer_log_parser_reads_every_line():
  got = device_check.parse_trainer_log(TRAINER_LOG)
  assert got["backend"] == "gpu"
  assert got["programs"] == [{"step": "eval", "L": 64, "B": 32, "hits": 1024, "steps": 1, "s": 0.8, "cache": "hit"},
                             {"step": "train", "L": 64, "B": 16, "hits": None, "steps": 1, "s": 3.21, "cache": "miss"},
                             {"step": "train", "L": 64, "B": 16, "hits": None, "steps": 8, "s": 133.82,
                              "cache": "miss"},
                             {"step": "train", "L": 128, "B": 16, "hits": None, "steps": 1, "s": None,
                              "cache": "failed (XlaRuntimeError)"}]
  assert (got["cache_hits"], got["cache_misses"]) == (1, 2)
  assert (got["compile_programs"], got["compile_wall_s"], got["compile_summed_s"], got["compile_threads"]) == (
      8, 12.3, 20.1, 2)
  assert (got["first_step_s"], got["first_step_compile_s"]) == (163.6, 134.5)
  assert got["evals"] == [{"step": 672, "s": 1.23}, {"step": 1344, "s": 0.21}]  # not reporting.progress's lines
  assert (got["eval_first_s"], got["eval_second_s"]) == (1.23, 0.21)
  assert got["pace"] == {"64": {"steps": 612, "ms_per_step": 8.12, "tokens_per_s": 51234.0},
                         "128": {"steps": 60, "ms_per_step": 11.5, "tokens_per_s": 38000.0}}
  assert got["checkpoints"] == [{"step": 672, "s": 0.41}]
  assert (got["steps"], got["calls"]) == (1344, 168)
  assert (got["done_status"], got["done_minutes"], got["done"]) == ("finished", 3.9, None)  # nan: not a literal
  assert got["hit_growths"] == [{"at": "dev@672", "hits": 558, "size": 1024}]
  assert got["compiled_on_use"] == ["dev@672: eval L64 B32 hits 2048"]



def test_trainer_log_parser_reads_the_done_line_with_and_without_figures():
  line = "I1206 15:03:27.318968 1 train.py:444] Done (%s) in %s minutes%s"
  got = device_check.parse_trainer_log(line % ("finished", "0.1", ": {'dev': 0.7545, 'test': 0.7477}"))
  assert (got["done_status"], got["done_minutes"], got["done"]) == ("finished", 0.1, {"dev": 0.7545, "test": 0.7477})
  got = device_check.parse_trainer_log(line % ("preempted", "0.0", ""))
  assert (got["done_status"], got["done_minutes"], got["done"]) == ("preempted", 0.0, None)

def test_startup_phases_from_the_log_lines_times():
  """Seconds to the first step by phase, each ending at its marker line's time (one phase crossing midnight)."""
  log = "\n".join([
      "I1128 23:59:50.000000 1 train.py:92] Compilation cache: /tmp/c",
      "I1128 23:59:51.500000 1 sources.py:288] Data cluener2020: 10748 train / 1343 dev",
      "I1128 23:59:55.000000 1 tokenize.py:64] Tokenizer /tmp/b: lowercase on (its own setting)",
      "I1128 23:59:55.000000 1 windows.py:417] prepare_split train (max_len=256, stride=127): ...",
      "I1128 23:59:57.250000 1 windows.py:417] prepare_split dev (max_len=256, stride=127): ...",
      "I1128 23:59:59.000000 1 train.py:114] Model: bert encoder + standard head, 1 parameters, dtype bfloat16",
      "I1129 00:00:05.000000 1 aot.py:318] compiled ahead: 2 programs in 6.0 s wall, 1.9 s of compile summed, 2 "
      "threads",
      "I1129 00:00:05.500000 1 train.py:274] first step after 18.5 s (compile 3.3 s)"])
  got = device_check.parse_trainer_log(log)["startup"]
  assert got == {"imports": 3.0, "data": 1.5, "tokenizer": 3.5, "windows": 2.25, "model": 1.75, "compile": 6.0,
                 "first_step": 0.5}
  assert device_check.parse_trainer_log(log.replace("Model:", "Built:"))["startup"] == {}  # a marker missing


def test_trainer_log_parser_tolerates_missing_lines():
  got = device_check.parse_trainer_log("I1126 train.py:175] first step after 146.8 s (compile 121.6 s)\n"
                                       "I1126 reporting.py:115] dev@672: 21/21 batches in 35.4 s\n"
                                       "I1126 reporting.py:115] dev@1344: 21/21 batches in 0.2 s\n")
  assert got["first_step_s"] == 146.8 and got["programs"] == [] and got["compile_wall_s"] is None
  assert (got["eval_first_s"], got["eval_second_s"]) == (35.4, 0.2)  # the progress lines when nothing better
  assert got["pace"] == {} and got["steps"] is None and got["done_status"] is None
  empty = device_check.parse_trainer_log("Traceback (most recent call last):\n")
  assert empty["first_step_s"] is None and empty["eval_first_s"] is None and empty["evals"] == []


def test_anchor_log_parser():
  got = device_check.parse_anchor_log(ANCHOR_LOG)
  assert (got["setup_s"], got["first_step_s"], got["done_s"]) == (12.3, 19.5, 84.5)
  assert [(e["train_s"], e["steps"], e["eval_s"]) for e in got["epochs"]] == [(34.5, 672, 1.2), (32.5, 1344, 0.5)]
  assert (got["eval_first_s"], got["eval_second_s"], got["dev_f1"]) == (1.2, 0.5, 0.0123)
  assert device_check.parse_anchor_log("")["first_step_s"] is None


def _trainer_stage(tmp_path, runs: str) -> dict:
  """The trainer stage's record with only `runs` (comma list of its runs); its status checked."""
  proc = _run(tmp_path, "--budget_s=300", "--stages=trainer", f"--trainer_runs={runs}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  stage = json.loads((tmp_path / "device_check.json").read_text())["stages"]["trainer"]
  assert stage["status"] == "ok", stage.get("error")
  assert list(stage["runs"]) == runs.split(","), list(stage["runs"])  # in the order asked
  return stage


def _assert_trainer_run(r: dict, *, steps: int = 48) -> None:
  """A tiny trainer run that finished, read from its log: every program compiled before the first step."""
  assert r["status"] == "ok" and r["rc"] == 0 and r["backend"] == "cpu", r.get("log_tail")
  assert r["first_step_s"] > 0 and r["wall_s"] > 0 and r["dev_f1"] > 0.2  # the fake tokenizer has its vocabulary
  assert len(r["evals"]) == 2
  assert r["programs"] and r["compile_wall_s"] is not None and r["compile_programs"] == len(r["programs"])
  assert r["pace"] and len(r["checkpoints"]) == 2 and r["steps"] == steps
  # Every program is compiled before the first step: the first evaluation compiles nothing.
  assert not r["compiled_on_use"], r["compiled_on_use"]
  assert r["eval_first_s"] <= 1.5 * r["eval_second_s"] + 0.5, r["evals"]
  assert list(r["startup"]) == [name for name, _ in STARTUP_MARKERS], r["startup"]
  assert abs(sum(r["startup"].values()) - r["first_step_s"]) < 0.1 and min(r["startup"].values()) >= 0


def test_tiny_trainer_runs_by_default():
  """What `--stages=trainer --tiny` runs when no --trainer_runs is given (the tests below ask for them in parts)."""
  assert device_check.shapes(True)["trainer"]["runs"] == ("cold", "anchor", "warm", "fused_vs_reference",
                                                                "warm_k1")


@pytest.mark.e2e
def test_tiny_trainer_stage_cold_then_warm(tmp_path):
  runs = _trainer_stage(tmp_path, "cold,anchor,warm")["runs"]
  assert runs["anchor"]["status"] == "skipped" and "--anchor" in runs["anchor"]["why"]
  for name in ("cold", "warm"):
    _assert_trainer_run(runs[name])
  assert runs["cold"]["cache_misses"] == len(runs["cold"]["programs"])
  assert runs["warm"]["cache_hits"] == len(runs["warm"]["programs"])  # one cache: the warm run compiles nothing
  md = (tmp_path / "device_check.md").read_text()
  assert "## Trainer" in md and "| cold | ok |" in md and "skipped: no --anchor" in md


@pytest.mark.e2e
def test_tiny_trainer_stage_one_step_per_call(tmp_path):
  r = _trainer_stage(tmp_path, "warm_k1")["runs"]["warm_k1"]
  _assert_trainer_run(r)
  assert r["calls"] == r["steps"] == 48  # steps_per_execution=1: a call per step


@pytest.mark.e2e
def test_tiny_trainer_stage_fused_vs_reference(tmp_path):
  k = _trainer_stage(tmp_path, "fused_vs_reference")["runs"]["fused_vs_reference"]
  assert k["status"] == "ok", k
  fused, ref = k["sides"]["fused"], k["sides"]["reference"]
  assert (fused["choices"]["bert_kernels"], fused["choices"]["optimizer_update"]) == ("fused", "fused")  # forced
  assert (ref["choices"]["bert_kernels"], ref["choices"]["optimizer_update"]) == ("reference", "optax")
  assert fused["choices"]["dropout_bits"] == ref["choices"]["dropout_bits"] == "threefry"
  assert len(fused["loss"]) == len(ref["loss"]) == 30 and k["same_init"] and fused["loss"][-1] < fused["loss"][0]
  # f32 on the CPU with the same dropout masks: rounding apart (the hash bits' masks, which differ, are 1e-2 apart)
  assert k["pass"] and k["max_abs_loss_diff"] < 1e-4 and k["gap"] == device_check.BF16_F32_GAP
  params = k["params_after_one_step"]
  assert params["max_abs"] < 1e-6 and params["rel_to_update"] < 1e-3  # an update is lr = 1e-4 an element
  assert not list((tmp_path / "scratch").glob("kernels_*.npz")), "the parameter files were left"
  md = (tmp_path / "device_check.md").read_text()
  assert "## Fused vs reference step" in md and "| fused | ok | fused / fused | xla, threefry | float32 |" in md
  assert "**pass: largest loss difference" in md


@pytest.mark.e2e
def test_fused_vs_reference_side_that_aborts_loses_only_its_row(tmp_path):
  """Both sides planted to abort before building: the reference still runs after the fused side died, each is a row
  with its signal, the check says why there is no comparison, and the stage goes on."""
  proc = _run(tmp_path, "--budget_s=120", "--stages=trainer", "--trainer_runs=fused_vs_reference", "--plant_abort")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  stage = json.loads((tmp_path / "device_check.json").read_text())["stages"]["trainer"]
  assert stage["status"] == "ok", stage.get("error")
  k = stage["runs"]["fused_vs_reference"]
  assert list(k["sides"]) == ["fused", "reference"]
  for side in k["sides"].values():
    assert side["status"] == "aborted" and side["signal"] == "SIGABRT" and side["rc"] == -6
    assert any("os.abort()" in line for line in side["log_tail"])
  assert k["status"] == "failed" and k["verdict"] == "no comparison: fused aborted (SIGABRT), reference aborted " \
                                                   "(SIGABRT)" and "pass" not in k
  assert stage["lost"] == {"fused_vs_reference/fused": "SIGABRT", "fused_vs_reference/reference": "SIGABRT"}
  assert "fake_bert" not in stage  # the trainer's runs' checkpoint, not written for this check alone
  md = (tmp_path / "device_check.md").read_text()
  assert "| fused | **aborted (SIGABRT)** |" in md and "lost fused_vs_reference/fused (SIGABRT)" in md


def _npz(path, **arrays):
  np.savez(path, **{k: np.asarray(v, np.float32) for k, v in arrays.items()})
  return path


def test_compare_params_against_numpy(tmp_path):
  init = {"a": np.zeros(3), "b": np.ones((2, 2))}
  ref = {"a": np.array([1e-3, -1e-3, 1e-3]), "b": np.ones((2, 2)) - 1e-3}
  fused = {"a": ref["a"] + [0, 2e-4, 0], "b": ref["b"] + [[0, 0], [5e-4, 0]]}
  got = device_check.compare_params({"fused": _npz(tmp_path / "f.npz", **fused), "reference": _npz(
      tmp_path / "r.npz", **ref)}, _npz(tmp_path / "i.npz", **init))
  def flat(d):  # as stored (float32), every element once
    return np.concatenate([np.ravel(np.asarray(d[k], np.float32)).astype(np.float64) for k in "ab"])

  diff = flat(fused) - flat(ref)
  assert got["leaves"] == 2 and got["max_abs_leaf"] == "b"
  assert got["max_abs"] == pytest.approx(np.max(np.abs(diff)), rel=1e-6)
  assert got["rel_to_params"] == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(flat(ref)), rel=1e-6)
  assert got["rel_to_update"] == pytest.approx(np.linalg.norm(diff) / np.linalg.norm(flat(ref) - flat(init)),
                                               rel=1e-6)
  other = device_check.compare_params({"fused": _npz(tmp_path / "g.npz", a=ref["a"]), "reference": tmp_path / "r.npz"})
  assert "different parameters" in other["error"] and "'b'" in other["error"]


def test_kernels_verdict():
  ref = {"loss": [3.0, 2.0, 1.0, 0.5], "grad_norm": [1.0, 2.0, 2.0, 1.0], "init_fingerprint": "x"}
  close = dict(ref, loss=[3.0, 2.004, 1.002, 0.5], grad_norm=[1.0, 2.2, 2.0, 1.0])
  got = device_check.kernels_verdict(close, ref, steps=4, gap=0.011)
  assert got["pass"] and got["at_step"] == 2 and got["max_abs_loss_diff"] == pytest.approx(0.004)
  assert got["max_rel_grad_norm_diff"] == pytest.approx(0.1) and got["verdict"].startswith("pass: ")
  far = device_check.kernels_verdict(dict(close, loss=[3.0, 2.0, 1.02, 0.5]), ref, steps=4, gap=0.011)
  assert not far["pass"] and "over the gap 0.011" in far["verdict"] and far["at_step"] == 3
  assert "different parameters" in device_check.kernels_verdict(dict(close, init_fingerprint="y"), ref, steps=4)[
      "verdict"]
  short = device_check.kernels_verdict(dict(close, loss=close["loss"][:3]), ref, steps=4)
  assert not short["pass"] and "3 of 4 steps" in short["verdict"]
  assert "not finite" in device_check.kernels_verdict(dict(close, loss=[3.0, float("nan"), 1.0, 0.5]), ref,
                                                      steps=4)["verdict"]


def _check_versions(stage, md):
  assert stage["versions"]["backend"] == "cpu"
  assert all(p["jax"] > 0 for p in stage["peaks_gflops"].values())
  assert "## Versions" in md


def _check_attention(stage, md):
  for row in stage["compare"].values():
    assert row["xla_bf16"]["finite"] and row["xla_bf16"]["out_rel_err"] < 2e-2
    assert row["cudnn_bf16"]["status"] == "skipped" and "CUDA GPU" in row["cudnn_bf16"]["why"]
  assert stage["dropout"]["status"] == "skipped"
  assert "## Attention" in md


def _check_precision(stage, md):
  assert stage["variants"]["bf16 cudnn seed 0"]["status"] == "skipped"
  assert len(stage["variants"]["f32 xla seed 0"]["loss"]) == 3
  assert stage["summary"]["bf16 xla seed 0"]["max_abs_loss_diff"] < 0.1  # bf16 tracks f32 on one fixed batch
  assert "## Precision" in md


def _check_span_loss(stage, md):
  runs = stage["runs"]
  for L in (32, 64):  # dense and blockwise compute one loss
    assert runs[f"L{L} dense"]["loss"] == pytest.approx(runs[f"L{L} blockwise"]["loss"], rel=1e-4)
  assert "## Span loss" in md


def _check_extras(stage, md):
  assert {"threefry_ms", "hash_ms"} <= set(stage["dropout_bits"])


STAGE_CHECKS = {"versions": _check_versions, "attention": _check_attention, "precision": _check_precision,
                "span_loss": _check_span_loss, "extras": _check_extras}


def test_every_stage_has_a_tiny_test():
  assert device_check.STAGES == ("versions", "trainer", "attention", "precision", "train_step", "span_loss", "extras")
  assert set(STAGE_CHECKS) == set(device_check.STAGES) - {"trainer", "train_step"}  # those two: tests of their own


@pytest.mark.e2e
@pytest.mark.parametrize("name", list(STAGE_CHECKS))
def test_tiny_stage(tmp_path, name):
  """Each of the other stages alone (a process each, as in a full run), so that they run side by side."""
  proc = _run(tmp_path, "--budget_s=200", f"--stages={name}")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  stages = json.loads((tmp_path / "device_check.json").read_text())["stages"]
  assert list(stages) == [name]
  assert stages[name]["status"] == "ok", stages[name].get("error")
  STAGE_CHECKS[name](stages[name], (tmp_path / "device_check.md").read_text())


@pytest.mark.e2e
def test_an_aborting_variant_loses_only_its_row(tmp_path):
  """A variant whose process aborts (the planted stand-in for cuDNN's `Check failed` abort) is a row with its signal
  and last log lines; the stage goes on and times the others."""
  proc = _run(tmp_path, "--budget_s=240", "--stages=train_step", "--plant_abort")
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  stage = json.loads((tmp_path / "device_check.json").read_text())["stages"]["train_step"]
  assert stage["status"] == "ok", stage.get("error")
  variants = stage["variants"]
  assert list(variants) == ["planted_abort", *device_check.train_variants()]  # the abort first: the stage goes on
  planted = variants["planted_abort"]
  assert planted["status"] == "aborted" and planted["signal"] == "SIGABRT" and planted["rc"] == -6
  assert any("os.abort()" in line for line in planted["log_tail"]) and len(planted["log_tail"]) <= 20
  assert stage["lost"] == {"planted_abort": "SIGABRT"}
  for key in ("xla_threefry", "xla_hash"):  # each alone in its own process, then in the rounds of this one
    v = variants[key]
    assert v["status"] == "ok" and v["ms_per_step"] > 0 and v["compile_wall_s"] > 0, v
    assert v["choices"]["attention"] == "xla" and v["choices"]["dropout_bits"] == key.split("_")[1]
    assert stage["rounds"][key]["ms_median"] > 0
  assert set(stage["rounds"]) == {"xla_threefry", "xla_hash"}
  for key in ("cudnn_dropout", "no_dropout"):
    assert variants[key]["status"] == "skipped" and "CUDA GPU" in variants[key]["why"]
  assert variants["torch_compile_0.1"]["status"] == "skipped" and "GPU only" in variants["torch_compile_0.1"]["why"]
  assert stage["first_step"].startswith("first step after")
  md = (tmp_path / "device_check.md").read_text()
  assert "| planted abort (tests only) | **aborted (SIGABRT)** |" in md and "lost planted_abort (SIGABRT)" in md
  assert "died by SIGABRT" in md and "skipped: cuDNN needs a CUDA GPU" in md
  assert not list(tmp_path.glob("_variant_*")), "a variant's files were left"


def test_the_parent_imports_no_jax():
  """The package's modules import jax only inside a stage's functions: the parent sets each child's environment
  (JAX_PLATFORMS, XLA_FLAGS) before jax reads it."""
  assert helpers_train.jax_modules_imported_by("benchmarks.device_check.cli") == []


def test_variant_table():
  table = device_check.train_variants()
  assert "planted_abort" not in table and "planted_abort" in device_check.train_variants(plant=True)
  assert {"xla_threefry", "xla_hash", "cudnn_dropout", "no_dropout", "torch_compile_0.1"} <= set(table)
  assert table["cudnn_dropout"].env == {"GP_JAX_CUDNN_DROPOUT": "1"} and table["cudnn_dropout"].child_only() is None
  assert "XLA_FLAGS" in device_check.TRAIN_VARIANTS["cudnn_dropout_no_cmdbuf"].child_only()
  with pytest.raises(ValueError, match="unknown train_step variants"):
    device_check.train_variants("nope")


@pytest.mark.e2e
def test_a_stage_past_its_limit_reports_timeout(tmp_path):
  """A stage whose child never ends (planted: a fast machine may finish a tiny stage within the limit) is stopped
  at its limit and reported as a timeout."""
  proc = _run(tmp_path, "--budget_s=1", "--stages=precision", "--plant_hang", timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
  stage = json.loads((tmp_path / "device_check.json").read_text())["stages"]["precision"]
  assert stage["status"] == "timeout" and stage["limit_s"] <= 1.1
  assert "what it had measured is kept" in stage["why"]


def _wheels_check(**env):
  """The check with this interpreter (PYTHON): not whichever python3 is first on PATH."""
  return subprocess.run(["bash", "benchmarks/device_wheels.sh", "--check"], cwd=helpers_train.REPO,
                        env=helpers_train.subprocess_env(1, PYTHON=sys.executable, **env), capture_output=True,
                        text=True, timeout=300, check=False)


@pytest.mark.e2e
def test_wheels_cover_the_trainers_imports():
  """The trainer's imports and a CLUENER corpus built through TFDS, with only the GPU image and .whl/'s packages."""
  proc = _wheels_check()
  assert proc.returncode == 0 and "import check: ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.mark.e2e
def test_wheels_check_finds_a_missing_wheel():
  proc = _wheels_check(GP_JAX_WHEELS_DROP="ml-collections")
  assert proc.returncode != 0
  assert "ml_collections: distribution ml-collections is neither in the GPU image nor in .whl/" in proc.stderr


@pytest.mark.parametrize("args, says", [
    (["--out=/proc/nope"], "error: --out=/proc/nope: No such file or directory: expected a folder this process can "
                           "write"),
    (["--out={tmp}/a_file"], "error: --out={tmp}/a_file: a file, not a folder: expected a folder this process can "
                             "write"),
    (["--out={tmp}/out", "--budget_s=-5"], "error: --budget_s=-5: expected seconds > 0 for all stages together"),
    (["--out={tmp}/out", "--budget_s=0"], "error: --budget_s=0: expected seconds > 0 for all stages together"),
])
def test_an_unwritable_out_or_a_budget_not_above_zero_is_refused_in_one_line(tmp_path, capsys, args, says):
  """--out=/proc/nope was a FileNotFoundError traceback; --budget_s=-5 ran every stage into "stopped at its limit of
  -5 s" and exited 0."""
  (tmp_path / "a_file").write_text("")
  with pytest.raises(SystemExit) as e:
    device_check.main([a.format(tmp=tmp_path) for a in args] + ["--tiny", "--stages=versions"])
  assert e.value.code == 2
  assert capsys.readouterr().err.splitlines()[-1].endswith(says.format(tmp=tmp_path))
  assert not (tmp_path / "out").exists()


def test_the_prepared_device_calls_flags_still_reach_the_stages(tmp_path, monkeypatch):
  """docs/device/README.md's command line, with each stage's child stubbed out."""
  ran = []

  def stage(args, name, limit, log):
    ran.append((name, round(limit)))
    return {"status": "ok", "seconds": 0.0}

  monkeypatch.setattr(device_check.cli, "run_stage", stage)
  monkeypatch.setattr(device_check.cli.tables, "markdown", lambda result: "")
  assert device_check.main([f"--out={tmp_path}/out", "--stages=versions,trainer", "--budget_s=520",
                            "--trainer_runs=cold,anchor,warm,cold_cublas,cold_no_autotune,other_head",
                            f"--data_dir={tmp_path}/data", f"--anchor={tmp_path}/torch_cluener.py",
                            f"--cache_dir={tmp_path}/cache"]) == 0
  assert [name for name, _ in ran] == ["versions", "trainer"] and 0 < ran[0][1] < ran[1][1] <= 520
