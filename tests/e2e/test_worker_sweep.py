"""A fake pod: `launch.local --workers=2` on the synthetic sweep (two points, tiny model), one worker SIGKILLed
mid-point; the other takes over its stale lease and resumes the point from its checkpoint; the rerun has
nothing left to do."""

import json
import os
import re
import signal
import subprocess
import sys
import time

from tests import helpers_train as ht

STEPS = 20
OVERRIDES = {"num_train_steps": STEPS, "checkpoint_every_steps": 5, "data.max_eval_records": 8}


def _wait_file(path, pattern, timeout):
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if os.path.exists(path) and re.search(pattern, open(path).read()):
      return
    time.sleep(0.2)
  raise AssertionError(f"{pattern!r} not in {path}:\n{open(path).read()[-3000:] if os.path.exists(path) else ''}")


def test_two_workers_one_killed_then_rerun(tmp_path):
  root = str(tmp_path / "sweep")
  env = ht.subprocess_env(devices=2, GP_JAX_LEASE_HEARTBEAT_S=1, GP_JAX_LEASE_STALE_BEATS=3)
  cmd = [sys.executable, "-m", "launch.local", f"--config={ht.CONFIG_FILE}", f"--workdir={root}", "--workers=2",
         "--devices_per_worker=2", "--", *ht.flag_args(**OVERRIDES)]
  proc = subprocess.Popen(cmd, cwd=ht.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  log = ht.LogWatcher(proc)
  _, line = log.wait_for_match(r"worker 0 pid (\d+)", timeout=30)
  pid = int(re.search(r"pid (\d+)", line).group(1))
  w0_log = os.path.join(root, "_launch", "logs", "local-w0.log")
  _wait_file(w0_log, r"Saved checkpoint|step 5|Training", timeout=120)
  _wait_file(w0_log, r"step (1[0-9]|[5-9])\b", timeout=60)  # a few steps in, a checkpoint likely on disk
  os.kill(pid, signal.SIGKILL)
  assert proc.wait(timeout=240) == 0, log.text()[-4000:]
  out = log.text()
  assert re.search(r"worker exit codes: \[-9, 0\]", out), out[-3000:]
  w1 = open(os.path.join(root, "_launch", "logs", "local-w1.log")).read()
  assert "Took over the stale lease" in w1, w1[-3000:]
  for point in ("default/head=standard", "default/head=efficient"):
    results = json.load(open(os.path.join(root, point, "results.json")))
    assert results["status"] == "finished" and results["steps"] == STEPS, results
  assert not os.path.exists(os.path.join(root, "default", "_launch"))

  rerun = subprocess.run(cmd, cwd=ht.REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         timeout=120)
  assert rerun.returncode == 0, rerun.stdout[-3000:]
  assert "worker exit codes: [0, 0]" in rerun.stdout and "skipped 2" in rerun.stdout, rerun.stdout[-3000:]
