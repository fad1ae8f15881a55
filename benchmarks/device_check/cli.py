"""The parent: runs each stage in a child process of its own under its share of the budget, collects what the
children wrote into device_check.json and .md; and the children's entry (`--stage`, `--variant`,
`--kernels_child`). The stages themselves are the modules beside this one."""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import pathlib
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

from benchmarks.device_check import (attention, extras, kernels, precision, span_loss, tables, train_step, trainer,
                                     versions)
from benchmarks.device_check.base import RESULT, ROOT, Recorder, signal_name
from benchmarks.device_check.shapes import TRAINER_RUNS, shapes
from benchmarks.device_check.variants import TRAIN_VARIANTS, train_variants
from gp_jax import runtime

# The parent stays free of jax: the stage modules import it (and whatever imports it: flax, gp_jax's ops, models, aot
# and factory, benchmarks.inputs and benchmarks.train_step) only inside their functions, so in a stage's child, after
# the parent set that child's environment (child_env: JAX_PLATFORMS, XLA_FLAGS, XLA_PYTHON_CLIENT_PREALLOCATE) and
# runtime.configure() ran.

STAGES = ("versions", "trainer", "attention", "precision", "train_step", "span_loss", "extras")
SHARES = {"versions": 0.5, "trainer": 7.0, "attention": 1.0, "precision": 1.6, "train_step": 5.0, "span_loss": 0.8,
          "extras": 0.5}
# Stages that check numerics, not speed: their programs skip XLA's GPU autotuning (compiles took 20-45 s each with it
# on an H200, and cut both stages short on 2026-11-26).
NO_AUTOTUNE = ("attention", "precision")
STAGE_FNS = {"versions": versions.stage_versions, "trainer": trainer.stage_trainer,
             "attention": attention.stage_attention, "precision": precision.stage_precision,
             "train_step": train_step.stage_train_step, "span_loss": span_loss.stage_span_loss,
             "extras": extras.stage_extras}


def run_child(args) -> int:
  if args.variant:
    return train_step.run_variant_child(args)
  if args.kernels_child:
    return kernels.run_kernels_child(args)
  runtime.configure()
  start = time.time()
  out = pathlib.Path(args.out)
  rec = Recorder(out / f"_stage_{args.stage}.json")
  prev_path = out / RESULT
  margin = max(3.0, 0.03 * args.limit_s)  # to stop a subprocess and write its results before the parent's kill
  ctx = {"shapes": shapes(args.tiny), "tiny": args.tiny, "args": args,
         "deadline": start + args.limit_s - margin if args.limit_s else math.inf,
         "previous": json.loads(prev_path.read_text()).get("stages", {}) if prev_path.exists() else {}}
  if args.plant_hang:  # tests: a stage that never ends, which the parent stops at its limit
    rec.flush()
    threading.Event().wait()
  try:
    STAGE_FNS[args.stage](rec, ctx)
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    rec.data.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
    rec.flush()
    return 1
  if rec.data.get("status") == "running":
    rec.data["status"] = "ok"
  rec.flush()
  return 0


def stage_limits(remaining: float, todo: list[str]) -> float:
  """The next stage's limit: its share of what is left, against the shares of the stages still to run."""
  return remaining * SHARES[todo[0]] / sum(SHARES[s] for s in todo)


def child_env(args, stage: str) -> dict:
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = args.cache_dir
  if stage != "trainer":  # the trainer runs as a user's command does
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in stage train_step
  env["PYTHONUNBUFFERED"] = "1"
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  if args.tiny:
    env["JAX_PLATFORMS"] = "cpu"
  elif stage in NO_AUTOTUNE and "xla_gpu_autotune_level" not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
  return env


def run_stage(args, stage: str, limit: float, log) -> dict:
  out = pathlib.Path(args.out)
  part = out / f"_stage_{stage}.json"
  part.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "benchmarks.device_check", f"--out={args.out}", f"--stage={stage}",
         f"--cache_dir={args.cache_dir}", f"--limit_s={limit:.1f}", f"--data_dir={args.data_dir}",
         f"--anchor={args.anchor}", f"--trainer_runs={args.trainer_runs}", f"--scratch_dir={args.scratch_dir}",
         f"--train_variants={args.train_variants}"]
  cmd += (["--tiny"] if args.tiny else []) + (["--plant_abort"] if args.plant_abort else [])
  cmd += ["--plant_hang"] if args.plant_hang else []
  log.write(f"\n===== stage {stage} (limit {limit:.0f} s) {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} "
            "UTC =====\n")
  log.flush()
  t0 = time.time()
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=child_env(args, stage),
                          start_new_session=True)
  timed_out = False
  try:
    proc.wait(timeout=max(1.0, limit))
  except subprocess.TimeoutExpired:
    timed_out = True
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  data = json.loads(part.read_text()) if part.exists() else {}
  part.unlink(missing_ok=True)
  if timed_out:
    data["status"] = "timeout"
    data["why"] = f"stopped at its limit of {limit:.0f} s; what it had measured is kept"
  elif proc.returncode and data.get("status") in (None, "running", "ok"):
    data["status"] = "failed"
    how = f"killed by {signal_name(-proc.returncode)}" if proc.returncode < 0 else f"exit {proc.returncode}"
    data.setdefault("error", f"{how} (device_check.log)")
  data.setdefault("status", "failed")
  data["seconds"] = round(time.time() - t0, 1)
  data["limit_s"] = round(limit, 1)
  return data


def write_results(out: pathlib.Path, result: dict) -> None:
  (out / RESULT).write_text(json.dumps(result, indent=1, default=str))
  (out / "device_check.md").write_text(tables.markdown(result))


def unwritable(folder: str) -> str | None:
  """Why `folder` cannot hold the results (made if missing); None when a file can be written there."""
  if os.path.exists(folder) and not os.path.isdir(folder):
    return "a file, not a folder"
  try:
    pathlib.Path(folder).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=folder):
      pass
  except OSError as e:
    return e.strerror or type(e).__name__
  return None


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=sys.modules[__package__].__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="folder for device_check.json, device_check.md, device_check.log")
  p.add_argument("--budget_s", type=float, default=480, help="seconds for all stages together (default 480)")
  p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (the test suite's run)")
  p.add_argument("--stages", default=",".join(STAGES), help=f"comma list, in order, of {', '.join(STAGES)}")
  p.add_argument("--cache_dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gp_jax_device_check_cache"),
                 help="the persistent compilation cache all stages share")
  p.add_argument("--data_dir", default=os.environ.get("GP_JAX_DATA", ""),
                 help="trainer: the folder holding cluener2020/ (default $GP_JAX_DATA, else gp_jax's default)")
  p.add_argument("--anchor", default="", help="trainer: the PyTorch port's script (torch_cluener.py); none: skipped")
  p.add_argument("--trainer_runs", default="", help=f"trainer: comma list of {', '.join(TRAINER_RUNS)} (run in the "
                 "order given; default the first six in this order, --tiny the first five; warm and other_head read "
                 "the cache cold fills)")
  p.add_argument("--scratch_dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gp_jax_device_trainer"),
                 help="trainer: the fake BERT, the runs' compilation cache, workdirs and output (not under --out)")
  p.add_argument("--train_variants", default="", help="train_step: comma list of our and the PyTorch port's "
                 f"variants ({', '.join(TRAIN_VARIANTS)}; default those marked default in TRAIN_VARIANTS)")
  p.add_argument("--stage", default="", help=argparse.SUPPRESS)
  p.add_argument("--limit_s", type=float, default=0.0, help=argparse.SUPPRESS)
  p.add_argument("--variant", default="", help=argparse.SUPPRESS)  # a train_step variant's own process
  # one side of the trainer stage's fused-vs-reference check
  p.add_argument("--kernels_child", default="", choices=("", *kernels.KERNEL_RUNS), help=argparse.SUPPRESS)
  p.add_argument("--plant_hang", action="store_true", help=argparse.SUPPRESS)  # tests: each stage's child hangs
  p.add_argument("--plant_abort", action="store_true", help=argparse.SUPPRESS)  # tests: a variant, and both
  # sides of the fused-vs-reference check, abort
  args = p.parse_args(argv)
  if args.stage:
    pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
    runtime.quicken_imports()
    return run_child(args)
  if not (math.isfinite(args.budget_s) and args.budget_s > 0):
    p.error(f"--budget_s={args.budget_s:g}: expected seconds > 0 for all stages together")
  todo = [s.strip() for s in args.stages.split(",") if s.strip()]
  unknown = [s for s in todo if s not in STAGES]
  if unknown:
    p.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
  unknown = [r for r in args.trainer_runs.split(",") if r.strip() and r.strip() not in TRAINER_RUNS]
  if unknown:
    p.error(f"unknown trainer runs {unknown}; known: {', '.join(TRAINER_RUNS)}")
  try:
    train_variants(args.train_variants)
  except ValueError as e:
    p.error(str(e))
  for flag in ("out", "cache_dir"):  # made here, after every other check
    why = unwritable(getattr(args, flag))
    if why:
      p.error(f"--{flag}={getattr(args, flag)}: {why}: expected a folder this process can write")
  out = pathlib.Path(args.out)
  start = time.time()
  result = {"started_utc": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S}",
            "command": "python -m benchmarks.device_check " + " ".join(argv if argv is not None else sys.argv[1:]),
            "host": platform.node(), "budget_s": args.budget_s, "tiny": args.tiny, "stages": {}}
  with open(out / "device_check.log", "a") as log:
    while todo:
      stage = todo[0]
      limit = stage_limits(args.budget_s - (time.time() - start), todo)
      result["stages"][stage] = run_stage(args, stage, limit, log)
      status = result["stages"][stage]["status"]
      print(f"device_check: {stage}: {status} ({result['stages'][stage]['seconds']:.0f} s of "
            f"{limit:.0f})", flush=True)
      result["elapsed_s"] = round(time.time() - start, 1)
      write_results(out, result)
      todo.pop(0)
  print(tables.markdown(result))
  return 0 if all(s["status"] in ("ok", "skipped", "timeout") for s in result["stages"].values()) else 1
