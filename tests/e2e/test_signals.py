"""Ctrl-C and crashes through `python -m gp_jax.main` (tests/fault_main.py where a run must wait somewhere): SIGINT
in the loop saves that step's checkpoint, results.json says "preempted" and the process exits 130 with one line;
before the first step (SIGTERM too), and at a second Ctrl-C, it stops at once; a SIGKILLed run's workdir is taken over at once by
the next run, and nothing is written beside the workdir."""

import json
import os
import re
import signal
import subprocess
import sys

import pytest

from gp_jax import checkpoint as ckpt_lib
from gp_jax import storage
from tests import helpers_train as ht
from tests import zygote

TIMEOUT = 180
# Long enough that the signal always lands mid-run; the only checkpoint is the one the signal asks for.
LONG = {"num_train_steps": 100_000, "checkpoint_every_steps": 10_000, "log_every_steps": 1,
        "data.max_eval_records": 8}


def _start(workdir: str, *, faults: dict | None = None):
  proc = zygote.popen(ht.main_command(workdir, faults=faults, **LONG), cwd=ht.REPO,
                      env=ht.subprocess_env(devices=1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  return proc, ht.LogWatcher(proc)


def _wait(proc, watcher, text: str) -> None:
  if watcher.wait_for(text, timeout=TIMEOUT) is None:
    proc.kill()
    raise AssertionError(f"no {text!r} in:\n{watcher.text()[-4000:]}")


def _exit_status(proc, timeout: float = TIMEOUT) -> int:
  return ht.exit_status(proc, timeout)


def _interrupted_line(out: str) -> str:
  """The one `interrupted:` line, which is the last line printed; no traceback."""
  lines = [line for line in out.splitlines() if line.startswith("interrupted:")]
  assert len(lines) == 1 and "Traceback" not in out, out[-4000:]
  assert out.rstrip().splitlines()[-1] == lines[0], out[-4000:]
  return lines[0]


def _results(workdir: str) -> dict:
  with open(os.path.join(workdir, "results.json")) as f:
    return json.load(f)


def test_sigint_in_the_loop_saves_that_step_and_exits_130(tmp_path):
  workdir = str(tmp_path / "run")
  proc, watcher = _start(workdir)
  _wait(proc, watcher, "step 3 train loss")
  proc.send_signal(signal.SIGINT)
  rc = _exit_status(proc)
  out = watcher.text()
  assert rc == 130, out[-4000:]
  m = re.search(r"SIGINT: saved checkpoint at step (\d+)", out)
  assert m, out[-4000:]
  saved = int(m.group(1))
  assert 3 < saved < LONG["num_train_steps"]
  assert f"step {saved} in" in _interrupted_line(out)
  results = _results(workdir)
  assert (results["status"], results["signal"], results["steps"]) == ("preempted", "SIGINT", saved)
  assert "error" not in results
  step, state = ht.restore_state(workdir)
  assert step == saved and int(state["step"]) == saved


@pytest.mark.parametrize("sig, code", [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_signal_before_the_first_step_stops_at_once(tmp_path, sig, code):
  """The run waits on a compile that never ends (on a thread pool, as aot.compile_all does): only a stop at once
  ends it. SIGTERM (a launcher's stop) was the default action there: no results.json, the point read as failed."""
  workdir = str(tmp_path / "run")
  proc, watcher = _start(workdir, faults={"block_in": "compile"})
  _wait(proc, watcher, "BLOCKED in compile")
  proc.send_signal(sig)
  rc = _exit_status(proc, timeout=60)
  out = watcher.text()
  assert rc == code, out[-4000:]
  assert "stopped at once" in _interrupted_line(out)
  assert "first step after" not in out
  results = _results(workdir)
  assert (results["status"], results["signal"], results["stopped_at_once"]) == ("preempted", sig.name, True)
  assert "error" not in results
  assert not ckpt_lib.finalised_steps(storage.path(workdir) / "ckpt")


def test_a_second_sigint_stops_at_once(tmp_path):
  """The first Ctrl-C asks for a checkpoint, whose save never ends here; the second stops the run at once."""
  workdir = str(tmp_path / "run")
  proc, watcher = _start(workdir, faults={"block_in": "checkpoint"})
  _wait(proc, watcher, "step 3 train loss")
  proc.send_signal(signal.SIGINT)
  _wait(proc, watcher, "BLOCKED in checkpoint")
  proc.send_signal(signal.SIGINT)
  rc = _exit_status(proc, timeout=60)
  out = watcher.text()
  assert rc == 130, out[-4000:]
  assert re.search(r"SIGINT at step \d+: saving its checkpoint, then stopping \(Ctrl-C again stops at once", out)
  assert "a second Ctrl-C" in _interrupted_line(out)
  results = _results(workdir)
  assert (results["status"], results["signal"], results["stopped_at_once"]) == ("preempted", "SIGINT", True)


def test_a_killed_runs_workdir_is_taken_over_at_once(tmp_path):
  """A run SIGKILLed after its step-4 checkpoint; the same command right away resumes there (the lease timings are an
  hour, so only the lock the OS released can let it in), and nothing was written beside the workdir."""
  parent = tmp_path / "runs"
  workdir = str(parent / "x")
  env = ht.subprocess_env(devices=1, GP_JAX_LEASE_HEARTBEAT_S=3600)
  short = {"num_train_steps": 6, "checkpoint_every_steps": 2, "data.max_eval_records": 8}
  killed = ht.run_main(workdir, env=env, timeout=TIMEOUT, faults={"sigkill_after_checkpoint_step": 4}, **short)
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-4000:]
  assert os.path.exists(os.path.join(workdir, "run.lock"))  # the file stays; its lock went with the process
  resumed = ht.run_main(workdir, env=env, timeout=TIMEOUT, **short)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert re.search(r"Resumed from \S+ at step 4\b", resumed.stdout), resumed.stdout[-4000:]
  assert _results(workdir)["status"] == "finished"
  assert os.listdir(parent) == ["x"]


def test_a_finished_run_exits_though_a_thread_pool_was_never_shut_down():
  """gp_jax.main ends without the interpreter's teardown, but as the interpreter does it first tells thread pools to
  stop, then joins the threads: an idle worker of a pool nobody shut down (Orbax leaves some to the garbage
  collector) would otherwise wait for work for ever."""
  script = ("import concurrent.futures\nfrom gp_jax import main\n"
            "pool = concurrent.futures.ThreadPoolExecutor(1)\npool.submit(print, 'worked').result()\n"
            "main._exit_now(0, finished=True)\n")
  out = subprocess.run([sys.executable, "-c", script], cwd=ht.REPO, env=ht.subprocess_env(devices=1),
                       capture_output=True, text=True, timeout=60)
  assert out.returncode == 0 and out.stdout == "worked\n", out.stderr[-2000:]
