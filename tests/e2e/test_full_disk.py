"""A full disk mid-run (RLIMIT_FSIZE lowered once the checkpoint of step 4 is on disk, so every later write past
32 KiB fails with EFBIG): the run ends with one line naming the error and the last good checkpoint (exit 2), the
last one on stderr whatever other threads print meanwhile, and that checkpoint restores."""

import json
import os

import numpy as np

from gp_jax import checkpoint as ckpt_lib
from tests import helpers_train as ht
from tests import zygote

OVERRIDES = {"num_train_steps": 8, "checkpoint_every_steps": 4, "batch_size": 24, "data.max_eval_records": 8}


def test_full_disk_is_one_line_and_keeps_the_last_checkpoint(tmp_path):
  workdir = str(tmp_path / "run")
  # The planted noise stands in for the failed save's threads, which print tracebacks to stderr until the end.
  cmd = ht.main_command(workdir, faults={"fsize_limit_after_checkpoint_step": 4, "stderr_noise": True}, **OVERRIDES)
  run = zygote.run(cmd, check=False, cwd=ht.REPO, env=ht.subprocess_env(devices=1), capture_output=True,
                   text=True, timeout=180)
  last = run.stderr.strip().splitlines()[-1]
  assert run.returncode == 2, run.stderr[-4000:]
  assert last.startswith("error: storage full: File too large writing "), run.stderr[-4000:]
  assert last.endswith(f"Last finished checkpoint: step 4 in {workdir}/ckpt; free space and rerun to resume "
                       "from it."), last
  assert "train.log: write failed" in run.stderr  # once, not a traceback per log record
  assert "--- Logging error ---" not in run.stderr

  assert ckpt_lib.finalised_steps(os.path.join(workdir, "ckpt")) == [4]
  assert any(n.startswith("8.orbax-checkpoint-tmp") for n in os.listdir(os.path.join(workdir, "ckpt")))
  step, state = ht.restore_state(workdir)
  assert step == 4 and int(state["step"]) == 4
  assert all(np.isfinite(v).all() for k, v in ht.flat(state).items() if v.dtype.kind == "f")
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "failed" and "File too large" in results["error"]
