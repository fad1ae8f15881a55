"""Resuming: after SIGKILL (bit-exact), after SIGTERM (clean exit + checkpoint), stopping on divergence (a NaN
loss, or an inf gradient with a finite loss), and a best/ checkpoint newer than ckpt/."""

import ast
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
from tests import zygote

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
  ht.killed_beside_reference(ref_dir, run_dir, kill_step=8, env=env, timeout=TIMEOUT, **RESUME)
  assert not os.path.exists(os.path.join(run_dir, "results.json"))
  step, _ = _state_leaves(run_dir)
  assert step == 8

  # Restart the same command without the kill flag until it finishes.
  for attempt in range(3):
    resumed = ht.run_main(run_dir, env=env, timeout=TIMEOUT, **RESUME)
    if resumed.returncode == 0:
      break
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert attempt == 0
  assert re.search(r"Resumed from \S+ at step 8\b", resumed.stdout), resumed.stdout[-4000:]

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
  proc = zygote.popen(cmd, cwd=ht.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
  assert results["preempted"] and results["status"] == "preempted" and results["steps"] == saved
  assert re.search(r"Done \(preempted\) in [\d.]+ minutes$", out, re.M), out[-4000:]  # no figures: no "{}"

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
  assert results["steps"] == saved + 2 and not results["preempted"] and results["status"] == "finished"
  done = re.search(r"Done \(finished\) in [\d.]+ minutes: (\{.*\})$", restarted.stdout, re.M)
  figures = ast.literal_eval(done[1]) if done else {}
  assert figures and all(f == round(results[k]["f1"], 4) for k, f in figures.items()), restarted.stdout[-4000:]


def _poison(at_step, *, loss_value, grad_value):
  """A step_transform that, at step `at_step` (1-based), replaces the loss and every gradient entry."""
  import jax.numpy as jnp

  def transform(loss, grads, step):
    hit = step + 1 == at_step
    loss = jnp.where(hit, loss_value, loss) if loss_value is not None else loss
    return loss, jax.tree.map(lambda g: jnp.where(hit, grad_value, g), grads)

  return transform


@pytest.mark.parametrize("loss_value,grad_value", [(float("nan"), float("nan")), (None, float("inf"))],
                         ids=["nan_loss", "inf_grad_finite_loss"])
def test_divergence_stops_and_keeps_last_good_checkpoint(tmp_path, loss_value, grad_value):
  config = ht.tiny_config(num_train_steps=12, checkpoint_every_steps=4)
  hooks = train.TrainHooks(step_transform=_poison(6, loss_value=loss_value, grad_value=grad_value))
  with pytest.raises(FloatingPointError, match=r"diverged at step 6\b.*Last good checkpoint: step 4"):
    train.train_and_evaluate(config, str(tmp_path), hooks=hooks)
  step, state = ht.restore_state(str(tmp_path))
  assert step == 4 and int(state["step"]) == 4
  assert all(np.isfinite(v).all() for v in ht.flat(state["params"]).values())
  with open(os.path.join(tmp_path, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "failed" and "diverged at step 6" in results["error"]


def test_a_diverged_run_ends_in_one_line_and_exit_1(tmp_path):
  """The command line's end of a divergence (a learning rate of 1e30): the reason as one line, not a traceback."""
  run = ht.run_main(str(tmp_path / "run"), env=ht.subprocess_env(1), num_train_steps=6,
                    **{"optimizer.lr": 1e30})  # stdout and stderr, merged
  assert run.returncode == 1 and "Traceback" not in run.stdout, run.stdout[-3000:]
  last = run.stdout.strip().splitlines()[-1]
  assert re.fullmatch(r"error: training diverged at step \d: loss \S+, gradient norm \S+; stopping\. No checkpoint "
                      r"was saved before it in .*/ckpt", last), last


def test_resume_when_best_holds_a_newer_step(tmp_path):
  """best/ at a later step than ckpt/ (saved just before a crash): the resumed run reaches that step with a
  higher dev F1 and must replace it, not raise StepAlreadyExistsError."""
  from gp_jax import checkpoint as ckpt_lib

  overrides = dict(num_train_steps=12, checkpoint_every_steps=4, eval_every_steps=12, **{"optimizer.lr": 1e-2})
  ht.train_in_child([(str(tmp_path), {**overrides, "num_train_steps": 8})])
  step, state = ht.restore_state(str(tmp_path))
  assert step == 8
  best = ckpt_lib.make_manager(os.path.join(tmp_path, "best"), keep=1, best=True)
  for s in list(best.all_steps()):
    best.delete(s)
  config_json = open(os.path.join(tmp_path, "config.json")).read()
  ckpt_lib.save_params(best, 12, params=jax.tree.map(np.zeros_like, state["params"]), config_json=config_json,
                       dev_f1=0.01)
  best.wait_until_finished()
  best.close()

  summary, = ht.train_in_child([(str(tmp_path), overrides)])
  assert summary["status"] == "finished" and summary["steps"] == 12
  assert summary["best_step"] == 12 and summary["best_dev_f1"] > 0.01
  step, params = ht.restore_state(str(tmp_path), sub="best")
  assert step == 12 and any(np.abs(v).sum() > 0 for v in ht.flat(params).values())
