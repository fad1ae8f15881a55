"""Two local processes (4 CPU devices each, gloo collectives) run a sweep through `launch.worker --multihost` and
train its point like one process with 8 devices: they resume it from the one-process run's checkpoint of step 2
and end at step 3 where that run ends. Through injected failing reads (tests/fault_worker.py) process 1 sees the
sweep's first point unstarted and no checkpoint anywhere; process 0 sees the first point finished and the second
one's checkpoint. Both still run the second point from step 2: process 0 chooses and broadcasts the point, the
resume step and the config check (launch.worker), and lists the checkpoints for both (gp_jax.checkpoint)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import portpicker

from gp_jax import train
from tests import helpers_train as ht
from tests import zygote

STEPS = 3
# Dropout on, no warmup (a zero first learning rate would hide differences), a checkpoint mid-run, small evals.
OVERRIDES = {"num_train_steps": STEPS, "optimizer.warmup_steps": 0, "model.dropout": 0.1,
             "model.embed_dropout": 0.1, "checkpoint_every_steps": 2, "data.max_eval_records": 8,
             # Adam's eps = 1e-8 makes updates sign(g) * lr, blind to gradient scale and noisy for g ~ 0 (see
             # tests/test_sharding.py); 1e-3 keeps them linear in small gradients.
             "optimizer.eps": 1e-3}
DONE, TRAINED = "default/head=standard", "default/head=efficient"  # experiments/synthetic.py's sweep, in order


def test_two_processes_match_one_process(tmp_path):
  root, single_dir = str(tmp_path / "sweep"), str(tmp_path / "single")
  os.makedirs(os.path.join(root, DONE))
  with open(os.path.join(root, DONE, "results.json"), "w") as f:
    json.dump({"status": "finished"}, f)
  coordinator = f"127.0.0.1:{portpicker.pick_unused_port()}"
  env = ht.subprocess_env(devices=4, jit_cache=False, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
  worker = [sys.executable, "-m", "tests.fault_worker", "1", f"--config={ht.CONFIG_FILE}", f"--workdir={root}",
            "--name=w", "--multihost", f"--coordinator_address={coordinator}", "--num_processes=2"]
  procs = [subprocess.Popen([*worker, f"--process_id={i}", "--", *ht.flag_args(**OVERRIDES)], cwd=ht.REPO, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
           for i in range(2)]
  logs = [ht.LogWatcher(p) for p in procs]  # drains both pipes
  try:
    # The reference runs here while the workers import: one process, the same 8 devices in one mesh.
    assert jax.device_count() == 8
    single = train.train_and_evaluate(ht.tiny_config(**OVERRIDES, **{"model.head": "efficient"}), single_dir)
    shutil.copytree(os.path.join(single_dir, "ckpt", "2"), os.path.join(root, TRAINED, "ckpt", "2"))
    for p in procs:  # go
      p.stdin.write("go\n")
      p.stdin.close()
  except BaseException:
    ht.wait_all(procs, timeout=0)  # kills them
    raise
  codes = ht.wait_all(procs, timeout=240)
  outs = [log.text() for log in logs]
  for i, (rc, out) in enumerate(zip(codes, outs)):
    assert rc == 0, f"worker {i} exited with {rc}:\n{out[-6000:]}"
    assert f"w: {TRAINED}: resuming from step 2" in out and f"{DONE}: " not in out, out[-3000:]
    assert "nothing left (every point finished)" in out, out[-3000:]
  assert "process 1: reads of the sweep's state fail (injected)" in outs[1]
  assert "Distributed: process 0 of 2, 4 local / 8 global devices" in outs[0], outs[0][-3000:]
  assert f"Resumed from {root}/{TRAINED}/ckpt at step 2" in outs[0], outs[0][-3000:]
  assert os.listdir(os.path.join(root, DONE)) == ["results.json"]  # nobody ran the point that looked unstarted

  # Process 0 alone writes the workdir's files; both wrote their shards of the checkpoints.
  multi_dir = os.path.join(root, TRAINED)
  with open(os.path.join(multi_dir, "results.json")) as f:
    multi = json.load(f)
  assert multi["steps"] == STEPS == single["steps"]
  with open(os.path.join(multi_dir, "metrics.jsonl")) as f:
    lines = [json.loads(line) for line in f]
  train_steps = [m["step"] for m in lines if m["split"] == "train"]
  assert train_steps == [STEPS]  # step 3 alone, written once, by process 0 only
  assert [m["split"] for m in lines].count("final_dev") == 1

  step_m, state_m = ht.restore_state(multi_dir)
  step_s, state_s = ht.restore_state(single_dir)
  assert step_m == step_s == STEPS
  assert int(state_m["step"]) == STEPS
  pm, ps = ht.flat(state_m["params"]), ht.flat(state_s["params"])
  assert pm.keys() == ps.keys()
  for k in ps:
    np.testing.assert_allclose(pm[k], ps[k], rtol=1e-5, atol=1e-7, err_msg=k)
  np.testing.assert_array_equal(state_m["rng"], state_s["rng"])
  # Both evaluated the same model on the same dev set (process 0 gathered every process's hits).
  assert multi["dev"]["gold"] == single["dev"]["gold"] > 0
  assert abs(multi["dev"]["f1"] - single["dev"]["f1"]) < 1e-6
  assert multi["dev"]["pred"] == single["dev"]["pred"]


def test_sigterm_on_one_process_stops_the_group_at_one_step(tmp_path):
  """SIGTERM to process 1 alone: the coordination service's notifier (no Python handler shadows it) makes both
  processes reach Orbax's preemption sync point at the same step, save that step's checkpoint and end
  "preempted"."""
  workdir = str(tmp_path / "run")
  coordinator = f"127.0.0.1:{portpicker.pick_unused_port()}"
  env = ht.subprocess_env(devices=4, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
  group = {"multihost": True, "coordinator_address": coordinator, "num_processes": 2}
  run = {"num_train_steps": 400, "checkpoint_every_steps": 1000, "eval_every_steps": 1000, "log_every_steps": 1}
  procs = [zygote.popen(ht.main_command(workdir, **run, **group, process_id=i), cwd=ht.REPO, env=env,
                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [ht.LogWatcher(p) for p in procs]
  try:
    logs[0].wait_for_match(r"step 3 train loss", timeout=180)
    procs[1].send_signal(signal.SIGTERM)
  except BaseException:
    ht.wait_all(procs, timeout=0)
    raise
  codes = ht.wait_all(procs, timeout=180)
  outs = [log.text() for log in logs]
  assert codes == [0, 0], "\n".join(o[-3000:] for o in outs)
  assert "SIGTERM caught" in outs[1] and "SIGTERM caught" not in outs[0]
  steps = []
  for out in outs:
    saved = re.findall(r"SIGTERM: saved checkpoint at step (\d+)", out)
    synced = set(re.findall(r"Reached preemption sync point, step=(\d+)", out))
    assert len(saved) == 1 and synced == set(saved), out[-3000:]
    steps.append(int(saved[0]))
  assert steps[0] == steps[1] < 400
  with open(os.path.join(workdir, "results.json")) as f:
    results = json.load(f)
  assert results["status"] == "preempted" and results["steps"] == steps[0]
  assert ht.restore_state(workdir)[0] == steps[0]
