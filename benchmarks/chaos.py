"""Chaos: one training run SIGKILLed at `--kills` random moments (checkpoint saves included) and restarted after
each, against an uninterrupted run of the same config: the final train state and best parameters must be
bit-identical.

  python -m benchmarks.chaos --kills 50 [--seed 0] [--workdir /tmp/gp_jax_chaos] [--steps_per_execution 4]

The run is `python -m gp_jax.main` on experiments/synthetic.py with a tiny model (`TINY`: many steps, a
checkpoint every 2 steps), so a restart costs a few seconds (one persistent compilation cache for all runs).
A kill moment is drawn uniformly over start-up plus `--window` seconds of training, so that each restart gets a
little further and `--kills` kills fit in one run (random moments are the point here: a timeout, not a signal from
the run, decides when the kill comes). A kill counts as "during a save" when it leaves
a new Orbax temporary checkpoint folder behind. A killed run's workdir lock goes with its process, so a restart
that is refused the workdir is a failure. Prints one line per kill with --verbose, and a summary line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np

from gp_jax import checkpoint as ckpt_lib
from gp_jax import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = {"data.synthetic_records": 240, "data.max_eval_records": 48, "data.max_len": 48, "data.buckets": "()",
        "model.embed_dim": 16, "model.bigram_dim": 16, "model.hidden_size": 32, "model.num_layers": 2,
        "model.head_size": 16, "batch_size": 16, "eval_batch_size": 64, "optimizer.warmup_steps": 5,
        "num_train_steps": 600, "checkpoint_every_steps": 2, "eval_every_steps": 150, "log_every_steps": 10,
        "progress_bar": False}


def k_steps(k: int) -> dict:
  """Overrides for `--steps_per_execution` k > 1: two buckets in same-bucket runs of k, a checkpoint every 2k steps,
  so most calls are k steps and kills land inside them."""
  return {"steps_per_execution": k, "data.buckets": "(24,)", "data.bucket_run": k, "checkpoint_every_steps": 2 * k}


def command(workdir: str, extra: dict | None = None) -> list[str]:
  return [sys.executable, "-m", "gp_jax.main", "--config=experiments/synthetic.py", f"--workdir={workdir}",
          *[f"--config.{k}={v}" for k, v in {**TINY, **(extra or {})}.items()]]


def environment(cache: str) -> dict:
  env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1",
             JAX_COMPILATION_CACHE_DIR=cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             PYTHONPATH=REPO)
  return env


def finished(workdir: str) -> bool:
  try:
    with open(os.path.join(workdir, "results.json")) as f:
      return json.load(f).get("status") == "finished"
  except (OSError, ValueError):
    return False


def time_to_first_log(workdir: str, env: dict, extra: dict | None = None) -> float:
  """Seconds from start to the first logged training step (start-up, data, compile) of a run that is then
  stopped."""
  t0 = time.monotonic()
  proc = subprocess.Popen(command(workdir, extra), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
  for line in proc.stderr:
    if "train loss" in line:
      break
  seconds = time.monotonic() - t0
  proc.kill()
  proc.wait()
  return seconds


def same(a, b) -> tuple[bool, float]:
  """(bit-identical, max abs difference) of two trees of numpy arrays."""
  la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
  if len(la) != len(lb):
    return False, float("inf")
  diff = max((float(np.max(np.abs(np.asarray(x, np.float64) - np.asarray(y, np.float64)))) if x.size else 0.0)
             for x, y in zip(la, lb))
  return all(np.array_equal(x, y) for x, y in zip(la, lb)), diff


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--kills", type=int, default=50, help="SIGKILLs before the run may finish")
  p.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
  p.add_argument("--workdir", default="", help="where the two runs go (default: a temporary folder, removed)")
  p.add_argument("--window", type=float, default=2.0,
                 help="kill moments are drawn over start-up plus this many seconds of training")
  p.add_argument("--verbose", action="store_true", help="a line per kill")
  p.add_argument("--steps_per_execution", type=int, default=1,
                 help="k train steps per call (k > 1: two buckets in runs of k, a checkpoint every 2k steps)")
  args = p.parse_args(argv)
  runtime.configure_start_up()  # it restores both runs' checkpoints: on the CPU, without libtpu's or Orbax's lines
  extra = k_steps(args.steps_per_execution) if args.steps_per_execution > 1 else {}
  root = args.workdir or tempfile.mkdtemp(prefix="gp_jax_chaos_")
  cache = os.path.join(root, "jit_cache")
  env = environment(cache)
  ref_dir, run_dir = os.path.join(root, "reference"), os.path.join(root, "chaos")
  rng = random.Random(args.seed)
  subprocess.run(command(ref_dir, extra), cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL,
                 stderr=subprocess.DEVNULL)  # the uninterrupted run; also fills the compilation cache
  startup = time_to_first_log(os.path.join(root, "timing"), env, extra)
  window = startup + args.window
  kills = during_save = starts = 0
  tmp_pattern = os.path.join(run_dir, "*", "*.orbax-checkpoint-tmp*")
  while kills < args.kills and not finished(run_dir):
    left_before = set(glob.glob(tmp_pattern))
    proc = subprocess.Popen(command(run_dir, extra), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    starts += 1
    moment = rng.uniform(0.0, window)
    try:
      rc = proc.wait(timeout=moment)
    except subprocess.TimeoutExpired:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      kills += 1
      saving = bool(set(glob.glob(tmp_pattern)) - left_before)  # a save this start began and did not finish
      during_save += saving
      if args.verbose:
        print(f"kill {kills}: at {moment:.2f} s{' (during a save)' if saving else ''}", flush=True)
      continue
    err = proc.stderr.read()
    if rc != 0:
      raise SystemExit(f"chaos: the run failed with exit status {rc}:\n{err[-3000:]}")
  while not finished(run_dir):
    proc = subprocess.run(command(run_dir, extra), cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    starts += 1
    if proc.returncode != 0:
      raise SystemExit(f"chaos: the run failed with exit status {proc.returncode}:\n{proc.stderr[-3000:]}")
  results = {}
  for sub in ("ckpt", "best"):
    (sa, a), (sb, b) = ckpt_lib.restore_numpy(ref_dir, sub=sub), ckpt_lib.restore_numpy(run_dir, sub=sub)
    results[sub] = (sa == sb, *same(a, b))
  ok = all(r[0] and r[1] for r in results.values())
  verdict = {sub: "bit-identical" if r[1] else f"DIFFERENT (max |diff| {r[2]:.3g})" for sub, r in results.items()}
  print(f"chaos (steps_per_execution {args.steps_per_execution}): {kills} SIGKILLs ({during_save} during a checkpoint save), {starts} starts; kill moments uniform over 0..{window:.1f} s after each start (start-up to the first logged step "
        f"{startup:.1f} s); final train state {verdict['ckpt']}, best parameters "
        f"{verdict['best']}; {'OK' if ok else 'FAILED'}", flush=True)
  if not args.workdir:
    shutil.rmtree(root, ignore_errors=True)
  sys.exit(0 if ok else 1)


if __name__ == "__main__":
  main()
