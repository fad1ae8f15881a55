"""Two local processes (4 CPU devices each, gloo collectives) train like one process with 8 devices."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import portpicker

from gp_jax import train
from tests import helpers_train as ht

STEPS = 3
# Dropout on, no warmup (a zero first learning rate would hide differences), a checkpoint mid-run, small evals.
OVERRIDES = {"num_train_steps": STEPS, "optimizer.warmup_steps": 0, "model.dropout": 0.1,
             "model.embed_dropout": 0.1, "checkpoint_every_steps": 2, "data.max_eval_records": 8,
             # Adam's eps = 1e-8 makes updates sign(g) * lr, blind to gradient scale and noisy for g ~ 0 (see
             # tests/test_sharding.py); 1e-3 keeps them linear in small gradients.
             "optimizer.eps": 1e-3}


def test_two_processes_match_one_process(tmp_path):
  multi_dir, single_dir = str(tmp_path / "multi"), str(tmp_path / "single")
  coordinator = f"127.0.0.1:{portpicker.pick_unused_port()}"
  kvs = [f"{k}={v!r}" for k, v in OVERRIDES.items()]
  env = ht.subprocess_env(devices=4, jit_cache=False, JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
  worker = [sys.executable, "-m", "tests.helpers_train", "worker", multi_dir, coordinator, "2"]
  procs = [subprocess.Popen([*worker, str(i), *kvs], cwd=ht.REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True) for i in range(2)]
  logs = [ht.LogWatcher(p) for p in procs]  # drains both pipes
  try:
    # The reference runs here while the workers start up: one process, the same 8 devices in one mesh.
    assert jax.device_count() == 8
    single = train.train_and_evaluate(ht.tiny_config(**OVERRIDES), single_dir)
  except BaseException:
    ht.wait_all(procs, timeout=0)  # kills them
    raise
  codes = ht.wait_all(procs, timeout=240)
  for i, (rc, log) in enumerate(zip(codes, logs)):
    out = log.text()
    assert rc == 0, f"worker {i} exited with {rc}:\n{out[-6000:]}"
    assert f"WORKER {i} DONE steps={STEPS} devices=8/4" in out, out[-3000:]

  # Process 0 alone writes the workdir's files; both wrote their shards of the checkpoints.
  with open(os.path.join(multi_dir, "results.json")) as f:
    multi = json.load(f)
  assert multi["steps"] == STEPS == single["steps"]
  lines = [json.loads(line) for line in open(os.path.join(multi_dir, "metrics.jsonl"))]
  train_steps = [m["step"] for m in lines if m["split"] == "train"]
  assert train_steps and train_steps == sorted(set(train_steps))  # written once, by process 0 only
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
