"""Resuming: after SIGKILL (bit-exact), after SIGTERM (clean exit + checkpoint), and stopping on a NaN loss."""

import json
import os
import re
import signal
import subprocess

import jax
import numpy as np
import pytest

from gp_jax import train
from tests import helpers_train as ht

# 24 rows per batch -> 11 steps per epoch: the kill at step 8 is mid-epoch and step 12 is in the second epoch.
# Dropout is on, so the per-step RNG must be restored too. Few eval records: evaluation is not the point here.
RESUME = {"num_train_steps": 12, "checkpoint_every_steps": 4, "batch_size": 24, "model.dropout": 0.1,
          "model.embed_dropout": 0.1, "data.max_eval_records": 8}
TIMEOUT = 180


def _state_leaves(workdir):
  step, state = ht.restore_state(workdir)
  return step, ht.flat(state)


def test_sigkill_then_restart_is_bit_exact(tmp_path):
  env = ht.subprocess_env(devices=1)
  ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
  # The uninterrupted reference runs beside the run that kills itself.
  ref = subprocess.Popen(ht.main_command(ref_dir, **RESUME), cwd=ht.REPO, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
  try:
    killed = ht.run_main(run_dir, env=env, timeout=TIMEOUT, **RESUME, **{"debug.sigkill_after_checkpoint_step": 8})
    ref_out = ref.communicate(timeout=TIMEOUT)[0]
  finally:
    if ref.poll() is None:
      ref.kill()
      ref.wait()
  assert ref.returncode == 0, ref_out[-4000:]
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-4000:]
  assert not os.path.exists(os.path.join(run_dir, "results.json"))
  step, _ = _state_leaves(run_dir)
  assert step == 8

  # Restart the same command without the kill flag (config.json changes; resuming must not care) until it finishes.
  for attempt in range(3):
    resumed = ht.run_main(run_dir, env=env, timeout=TIMEOUT, **RESUME)
    if resumed.returncode == 0:
      break
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert attempt == 0
  assert re.search(r"Resumed from \S+ at step 8\b", resumed.stdout), resumed.stdout[-4000:]
  with open(os.path.join(run_dir, "config.json")) as f:
    assert json.load(f)["debug"]["sigkill_after_checkpoint_step"] == 0

  step_r, got = _state_leaves(run_dir)
  step_ref, want = _state_leaves(ref_dir)
  assert step_r == step_ref == 12 and int(got["['step']"]) == 12
  assert got.keys() == want.keys()
  differ = [k for k in want if not np.array_equal(got[k], want[k])]
  assert not differ, f"{len(differ)} of {len(want)} state arrays differ after resuming, e.g. {differ[:3]}"
  with open(os.path.join(run_dir, "results.json")) as f, open(os.path.join(ref_dir, "results.json")) as g:
    assert json.load(f)["dev"] == json.load(g)["dev"]


def test_sigterm_saves_and_exits_cleanly(tmp_path):
  env = ht.subprocess_env(devices=1)
  workdir = str(tmp_path / "run")
  cmd = ht.main_command(workdir, num_train_steps=100_000, checkpoint_every_steps=10_000, log_every_steps=1,
                        **{"data.max_eval_records": 8})
  proc = subprocess.Popen(cmd, cwd=ht.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  watcher = ht.LogWatcher(proc)
  try:
    line = watcher.wait_for("step 3 train loss", timeout=TIMEOUT)
    assert line is not None, watcher.text()[-4000:]
    proc.send_signal(signal.SIGTERM)
    rc = proc.wait(timeout=TIMEOUT)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()
  out = watcher.text()
  assert rc == 0, out[-4000:]
  m = re.search(r"SIGTERM: saved checkpoint at step (\d+)", out)
  assert m, out[-4000:]
  saved = int(m.group(1))
  assert 3 < saved < 100_000
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["preempted"] and results["steps"] == saved

  # The checkpoint restores through the library, at the step the run stopped at.
  step, state = ht.restore_state(workdir)
  assert step == saved and int(state["step"]) == saved
  from gp_jax import checkpoint as ckpt_lib

  mngr = ckpt_lib.make_manager(os.path.join(workdir, "ckpt"), keep=2)
  abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
  got_step, _, data_state = ckpt_lib.restore(mngr, abstract)
  mngr.close()
  assert got_step == saved > 0 and data_state["index"] > 0

  # A restart resumes there and finishes (a shorter run: the first one would train for 100k steps).
  restarted = ht.run_main(workdir, env=env, timeout=TIMEOUT, num_train_steps=saved + 2, checkpoint_every_steps=10_000,
                          **{"data.max_eval_records": 8})
  assert restarted.returncode == 0, restarted.stdout[-4000:]
  assert re.search(rf"Resumed from \S+ at step {saved}\b", restarted.stdout), restarted.stdout[-4000:]
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["steps"] == saved + 2 and not results["preempted"]


def test_nan_loss_stops_and_keeps_last_good_checkpoint(tmp_path):
  config = ht.tiny_config(num_train_steps=12, checkpoint_every_steps=4, **{"debug.nan_at_step": 6})
  with pytest.raises(FloatingPointError, match=r"loss is nan at step 6\b.*Last good checkpoint: step 4"):
    train.train_and_evaluate(config, str(tmp_path))
  step, state = ht.restore_state(str(tmp_path))
  assert step == 4 and int(state["step"]) == 4
  assert all(np.isfinite(v).all() for v in ht.flat(state["params"]).values())
  assert not os.path.exists(os.path.join(tmp_path, "results.json"))
