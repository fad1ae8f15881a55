"""gs:// workdirs against a local GCS emulator (127.0.0.1 only): train, SIGKILL after a checkpoint, resume from
the bucket bit-exact with an uninterrupted local run, then predict from the bucket."""

import json
import os
import subprocess
import sys

import numpy as np

from tests import helpers_train as ht

RESUME = {"num_train_steps": 12, "checkpoint_every_steps": 4, "eval_every_steps": 6, "batch_size": 24,
          "model.dropout": 0.1, "model.embed_dropout": 0.1, "data.max_eval_records": 8}
TIMEOUT = 180


def test_gs_workdir_train_kill_resume_predict(gcs_env, tmp_path):
  from etils import epath

  env = ht.subprocess_env(devices=1, **gcs_env)
  ref_dir, run_dir = str(tmp_path / "reference"), "gs://bucket/run"
  cwd = str(tmp_path / "cwd")  # where a wrongly resolved gs:// path would land as a local "gs:" folder
  os.makedirs(cwd)
  env["PYTHONPATH"] = ht.REPO + os.pathsep + env["PYTHONPATH"]
  env["TMPDIR"] = str(tmp_path / "tmp")  # local mirrors and downloads of the gs:// runs land here
  os.makedirs(env["TMPDIR"])
  ht.killed_beside_reference(ref_dir, run_dir, kill_step=8, env=env, cwd=cwd, timeout=TIMEOUT, **RESUME)
  bucket = epath.Path(run_dir)
  assert not (bucket / "results.json").exists()

  resumed = subprocess.run(ht.main_command(run_dir, **RESUME), cwd=cwd, env=env, timeout=TIMEOUT,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert "Resumed from gs://bucket/run/ckpt at step 8" in resumed.stdout, resumed.stdout[-4000:]

  step_r, got = ht.restore_state(run_dir)
  step_ref, want = ht.restore_state(ref_dir)
  assert step_r == step_ref == 12
  got, want = ht.flat(got), ht.flat(want)
  assert got.keys() == want.keys()
  assert not [k for k in want if not np.array_equal(got[k], want[k])]
  results = json.loads((bucket / "results.json").read_text())
  assert results["status"] == "finished"
  assert results["dev"] == json.loads(open(os.path.join(ref_dir, "results.json")).read())["dev"]

  names = {p.name for p in bucket.iterdir()}
  assert {"ckpt", "best", "config.json", "types.json", "tokenizer", "metrics.jsonl", "results.json", "tb",
          "train.log"} <= names, names
  assert any(p.name.isdigit() for p in (bucket / "ckpt").iterdir())
  assert any(p.name.isdigit() for p in (bucket / "best").iterdir())
  assert list((bucket / "tb").iterdir())
  steps = [json.loads(line)["step"] for line in (bucket / "metrics.jsonl").read_text().splitlines()
           if json.loads(line)["split"] == "train"]
  assert steps[-1] == 12
  log_text = (bucket / "train.log").read_text()
  assert "Resumed from" in log_text and "Done (finished)" in log_text  # the last line reaches the bucket too

  pred = subprocess.run([sys.executable, "-m", "gp_jax.predict", f"--workdir={run_dir}", "--batch_size=4"],
                        input="abc_[12_Xyz]_qq_777\n", cwd=cwd, env=env, stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
  assert pred.returncode == 0, pred.stderr[-4000:]
  row = json.loads(pred.stdout)
  assert row["text"] == "abc_[12_Xyz]_qq_777"
  for e in row["entities"]:
    assert row["text"][e["start"]:e["end"]] == e["text"]
  assert not os.path.exists(os.path.join(cwd, "gs:")) and not os.path.exists(os.path.join(ht.REPO, "gs:"))
  left = [n for n in os.listdir(env["TMPDIR"]) if n.startswith("gp_jax_")]
  assert len(left) == 1 and left[0].startswith("gp_jax_mirror_"), left  # only the SIGKILLed run's mirror
