"""gs:// workdirs against a local GCS emulator (127.0.0.1 only), with storage faults: a run SIGKILLed while its
checkpoint of step 8 is being saved, then resumed, both with 503 / 429 / dropped connections on a share of the
bucket's requests, ends bit-exact with an uninterrupted fault-free local run; then predict from the bucket.

The faults are survived by tensorstore's and gcsfs's own retries, with short backoffs here: tensorstore's through
GP_JAX_GCS_RETRIES (gp_jax.checkpoint), gcsfs's hard-coded sleeps scaled by tests/fault_main.py."""

import json
import os
import subprocess
import sys

import numpy as np

from gp_jax import storage
from launch import worker
from tests import helpers_train as ht
from tests import zygote
from tests.helpers_gcs import fault_counts, set_faults

RESUME = {"num_train_steps": 12, "checkpoint_every_steps": 4, "eval_every_steps": 6, "batch_size": 24,
          "model.dropout": 0.1, "model.embed_dropout": 0.1, "data.max_eval_records": 8}
TIMEOUT = 180
FAULTS = {"share": 0.08, "kinds": "503,429,drop"}  # requests that fail before they run: always safe to retry
FAST_RETRIES = json.dumps({"max_retries": 32, "initial_delay": "10ms", "max_delay": "100ms"})
FAST_GCSFS = {"gcsfs_backoff_scale": 0.01}


def _faulted(url: str, seed: int) -> None:
  set_faults(url, FAULTS["share"], FAULTS["kinds"], seed=seed)


def _counts(url: str, total: dict) -> None:
  """Adds the injector's counts to `total`, then turns faults off (this process's own reads are not faulted) and
  drops this process's gcsfs listings (cached for its lifetime; the run that just ended changed the bucket)."""
  got = fault_counts(url)
  for k, v in got["counts"].items():
    total[k] = total.get(k, 0) + v
  total["requests"] = total.get("requests", 0) + got["requests"]
  set_faults(url, 0)
  storage.forget_listings("gs://bucket")


def test_gs_workdir_faults_kill_during_save_resume_predict(gcs_env, tmp_path):
  from etils import epath

  url = gcs_env["STORAGE_EMULATOR_HOST"]
  env = ht.subprocess_env(devices=1, GP_JAX_GCS_RETRIES=FAST_RETRIES, **gcs_env)
  ref_dir, run_dir = str(tmp_path / "reference"), "gs://bucket/run"
  cwd = str(tmp_path / "cwd")  # where a wrongly resolved gs:// path would land as a local "gs:" folder
  os.makedirs(cwd)
  env["PYTHONPATH"] = ht.REPO + os.pathsep + env["PYTHONPATH"]
  env["TMPDIR"] = str(tmp_path / "tmp")  # local mirrors and downloads of the gs:// runs land here
  os.makedirs(env["TMPDIR"])
  injected = {}
  _faulted(url, seed=0)  # the reference is local: only the gs:// run meets them
  ht.killed_beside_reference(ref_dir, run_dir, faults={"sigkill_before_commit_step": 8, **FAST_GCSFS}, env=env,
                             cwd=cwd, timeout=TIMEOUT, **RESUME)
  _counts(url, injected)
  bucket = epath.Path(run_dir)
  assert not (bucket / "results.json").exists()
  # Killed mid-save: step 8's files are in the bucket, its commit marker is not (Orbax writes gs:// checkpoints in
  # place and finalises them with commit_success.txt).
  assert (bucket / "ckpt" / "8" / "state").exists() and not (bucket / "ckpt" / "8" / "commit_success.txt").exists()
  assert (bucket / "ckpt" / "4" / "commit_success.txt").exists()
  assert worker.resume_step(run_dir) == 4  # what a sweep worker broadcasts: the unfinalised step 8 is skipped

  _faulted(url, seed=1)
  resumed = zygote.run(ht.main_command(run_dir, faults=FAST_GCSFS, **RESUME), check=False, cwd=cwd, env=env,
                       timeout=TIMEOUT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  _counts(url, injected)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert "Resumed from gs://bucket/run/ckpt at step 4" in resumed.stdout, resumed.stdout[-4000:]
  print(f"faults injected ({FAULTS}): {injected}")
  assert all(injected[k] > 0 for k in FAULTS["kinds"].split(",")), injected

  step_r, got = ht.restore_state(run_dir)
  step_ref, want = ht.restore_state(ref_dir)
  assert step_r == step_ref == 12
  got, want = ht.flat(got), ht.flat(want)
  assert got.keys() == want.keys()
  assert not [k for k in want if not np.array_equal(got[k], want[k])]
  (best_r, got), (best_ref, want) = ht.restore_state(run_dir, sub="best"), ht.restore_state(ref_dir, sub="best")
  assert best_r == best_ref and ht.flat(got).keys() == ht.flat(want).keys()
  assert all(np.array_equal(v, ht.flat(want)[k]) for k, v in ht.flat(got).items())
  results = json.loads((bucket / "results.json").read_text())
  reference = json.loads(epath.Path(ref_dir, "results.json").read_text())
  assert results["status"] == "finished"
  for k in ("steps", "best_step", "best_dev_f1", "dev", "test"):
    assert results[k] == reference[k], k

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

  pred = zygote.run([sys.executable, "-m", "gp_jax.predict", f"--workdir={run_dir}", "--batch_size=4"],
                    input="abc_[12_Xyz]_qq_777\n", check=False, cwd=cwd, env=env, capture_output=True, text=True,
                    timeout=TIMEOUT)
  assert pred.returncode == 0, pred.stderr[-4000:]
  row = json.loads(pred.stdout)
  assert row["text"] == "abc_[12_Xyz]_qq_777"
  for e in row["entities"]:
    assert row["text"][e["start"]:e["end"]] == e["text"]
  assert not os.path.exists(os.path.join(cwd, "gs:")) and not os.path.exists(os.path.join(ht.REPO, "gs:"))
  left = [n for n in os.listdir(env["TMPDIR"]) if n.startswith("gp_jax_")]
  assert len(left) == 1 and left[0].startswith("gp_jax_mirror_"), left  # only the SIGKILLed run's mirror
