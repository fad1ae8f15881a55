"""gs:// workdirs when storage fails, against the local GCS emulator (127.0.0.1): storage that goes away mid-run (every
request's connection dropped) ends the run in one line after GP_JAX_SAVE_TIMEOUT_S, naming the storage's error and the
last finished checkpoint, which restores (the run hung for good in Orbax's wait for the save in flight, deaf to
SIGTERM); SIGTERM and Ctrl-C during that wait stop at once; a missing bucket, a mistyped URL and an emulator host with
nothing listening are one line before anything runs; predict's and export's gs:// outputs are tried before a model
loads (they failed after the model ran, with a FileNotFoundError traceback)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import types

import portpicker
import pytest
from absl import flags
from absl.testing import flagsaver

from gp_jax import checkpoint as ckpt_lib
from gp_jax import export, predict, serving, storage
from tests import helpers_train as ht
from tests import zygote
from tests.helpers_gcs import set_faults

TIMEOUT = 120
# Saves every 2 steps: each waits for the one before, so a save is in flight whenever storage goes away.
RUN = {"num_train_steps": 100_000, "checkpoint_every_steps": 2, "eval_every_steps": 100_000,
       "data.max_eval_records": 8}


def _env(gcs_env, **extra) -> dict:
  return ht.subprocess_env(devices=1, **gcs_env, **{storage.PROBE_TIMEOUT_ENV: "1", **extra})


def _start_then_lose_storage(gcs_env, workdir: str, **env):
  """A run on `workdir`; once its checkpoint of step 4 is saved, every request to the emulator has its connection
  dropped. Returns (process, its stderr watcher, the index of the line after which storage was gone)."""
  proc = zygote.popen(ht.main_command(workdir, **RUN), cwd=ht.REPO, env=_env(gcs_env, **env),
                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
  watcher = ht.LogWatcher(types.SimpleNamespace(stdout=proc.stderr))
  try:
    gone, _ = watcher.wait_for_match("checkpoint at step 4:", timeout=TIMEOUT)
  except AssertionError:
    proc.kill()
    raise
  set_faults(gcs_env["STORAGE_EMULATOR_HOST"], 1.0, "drop")
  return proc, watcher, gone


def _exit_status(proc, timeout: float) -> int:
  try:
    return ht.exit_status(proc, timeout)
  finally:
    storage.forget_listings("gs://bucket")


@pytest.fixture
def storage_back(gcs_env):
  """Faults off after the test, whatever happened."""
  yield
  set_faults(gcs_env["STORAGE_EMULATOR_HOST"], 0)


def test_storage_gone_mid_run_is_one_line_after_the_save_timeout(gcs_env, storage_back):
  workdir = "gs://bucket/gone"
  proc, watcher, _ = _start_then_lose_storage(gcs_env, workdir, **{ckpt_lib.SAVE_TIMEOUT_ENV: "2"})
  t0 = time.monotonic()
  rc = _exit_status(proc, timeout=60)  # was: never (SIGKILL only)
  err = watcher.text()
  assert rc == 2 and time.monotonic() - t0 < 30, err[-4000:]
  last = err.rstrip().splitlines()[-1]
  port = gcs_env["STORAGE_EMULATOR_HOST"].rsplit(":", 1)[1]
  m = re.fullmatch(r"error: storage not answering: the checkpoint save of step (\d+) did not finish in 2 s "
                   rf"\(GP_JAX_SAVE_TIMEOUT_S\); cannot reach Google Cloud Storage at http://127\.0\.0\.1:{port} "
                   r"\(STORAGE_EMULATOR_HOST\): .+\. Last finished checkpoint: step (\d+) in gs://bucket/gone/ckpt; "
                   r"rerun the same command to resume from it once storage answers", last)
  assert m and int(m.group(2)) == int(m.group(1)) - 2 >= 2, last
  set_faults(gcs_env["STORAGE_EMULATOR_HOST"], 0)
  storage.forget_listings("gs://bucket")
  assert int(m.group(2)) in ckpt_lib.finalised_steps(f"{workdir}/ckpt")  # what the line names is there to resume


@pytest.mark.parametrize("sig,code,who", [(signal.SIGTERM, 0, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")],
                         ids=["SIGTERM", "SIGINT"])
def test_sigterm_and_ctrl_c_while_waiting_for_the_save_stop_at_once(gcs_env, storage_back, sig, code, who):
  workdir = f"gs://bucket/stopped_{who.lower().replace('-', '')}"
  proc, watcher, gone = _start_then_lose_storage(gcs_env, workdir, **{ckpt_lib.SAVE_TIMEOUT_ENV: "10",
                                                                        ckpt_lib.SIGNAL_GRACE_ENV: "1"})
  try:  # a wait after storage went (GP_JAX_SAVE_TIMEOUT_S / 10: 1 s in); a slow save before it also says so
    watcher.wait_for_match("is still running after", after=gone + 1, timeout=30)
  except AssertionError:
    proc.kill()
    raise
  proc.send_signal(sig)
  t0 = time.monotonic()
  rc = _exit_status(proc, timeout=20)  # was: SIGTERM ignored, Ctrl-C turned into a save that never came
  err = watcher.text()
  assert rc == code and time.monotonic() - t0 < 10, err[-4000:]
  lines = [line for line in err.splitlines() if line.startswith("interrupted:")]
  assert len(lines) == 1 and err.rstrip().splitlines()[-1] == lines[0], err[-4000:]
  assert re.match(rf"interrupted: {who} while waiting \d+ s for the checkpoint save of step \d+; stopped at once, "
                  rf"without it\. Last finished checkpoint: step \d+ in {workdir}/ckpt\. Rerun the same command to "
                  "resume from it", lines[0]), lines[0]


def _main(workdir: str, env: dict, cwd: str) -> subprocess.CompletedProcess:
  return zygote.run(ht.main_command(workdir), check=False, cwd=cwd, env=env, capture_output=True, text=True,
                    timeout=TIMEOUT)


def test_a_missing_bucket_a_mistyped_url_and_no_storage_are_one_line(gcs_env, tmp_path):
  cwd = str(tmp_path)
  run = _main("gs://nobucket/runs/x", _env(gcs_env), cwd)
  assert (run.returncode, run.stderr) == (2, "error: bucket gs://nobucket does not exist or is not accessible "
                                             "(--workdir=gs://nobucket/runs/x)\n"), run.stderr[-4000:]
  for typed in ("gs:/bucket/runs/t1", "gs//bucket/runs/t2"):
    run = _main(typed, _env(gcs_env), cwd)
    assert run.returncode == 2 and run.stderr == (
        f"error: --workdir={typed} looks like a mistyped Cloud Storage URL: did you mean gs://bucket/runs/"
        f"{typed[-2:]}? (a local folder: ./{typed})\n"), run.stderr[-4000:]
  assert not os.listdir(cwd)  # was: ./gs:/bucket/runs/t1 trained into (then an Orbax traceback), ./gs/bucket/...

  port = portpicker.pick_unused_port()
  dead = {**gcs_env, "STORAGE_EMULATOR_HOST": f"http://127.0.0.1:{port}", "TENSORSTORE_GCS_HTTP_URL":
          f"http://127.0.0.1:{port}"}
  t0 = time.monotonic()
  run = _main("gs://bucket/runs/x", _env(dead), cwd)
  assert run.returncode == 2 and time.monotonic() - t0 < 30, run.stderr[-4000:]  # was: rc 1 after 104 s
  assert run.stderr.startswith(f"error: cannot reach Google Cloud Storage at http://127.0.0.1:{port} "
                               f"(STORAGE_EMULATOR_HOST): Cannot connect to host 127.0.0.1:{port}"), run.stderr
  assert run.stderr.count("\n") == 1, run.stderr


def test_gs_outputs_are_tried_before_the_model_loads(gcs_env, monkeypatch, capsys, tmp_path):
  """predict --output and export --out in a bucket that does not exist (the folders here hold a manifest.json or a
  config.json alone, so reaching the model would fail differently); a bucket that exists keeps no probe object."""
  monkeypatch.setattr(predict.runtime, "configure", lambda: {})
  monkeypatch.setattr(predict.logging, "set_verbosity", lambda level: None)
  exported = tmp_path / "e"
  exported.mkdir()
  (exported / serving.MANIFEST).write_text(json.dumps({"format_version": serving.FORMAT_VERSION,
                                                       "task": "entities"}))
  with flagsaver.flagsaver(), pytest.raises(SystemExit) as e:
    predict.main(flags.FLAGS(["gp_jax.predict", f"--exported={exported}", "--output=gs://nobucket/p.jsonl"]))
  err = capsys.readouterr().err
  assert (e.value.code, err) == (2, "gp_jax.predict: bucket gs://nobucket does not exist or is not accessible "
                                    "(--output=gs://nobucket/p.jsonl)\n")

  workdir = tmp_path / "w"
  workdir.mkdir()
  (workdir / "config.json").write_text("{}")
  args = dict(workdir=str(workdir), out="gs://nobucket/serving", threshold=None, format="stablehlo", platforms=[],
              hit_buffer=4096, batch_size=0)
  with pytest.raises(SystemExit) as e:
    export.main(["gp_jax.export"], types.SimpleNamespace(**args))
  err = capsys.readouterr().err
  assert (e.value.code, err) == (2, "gp_jax.export: bucket gs://nobucket does not exist or is not accessible "
                                    "(--out=gs://nobucket/serving)\n")

  storage.check_bucket("gs://bucket/probed/serving", flag="out", write=True)
  storage.forget_listings("gs://bucket")
  assert not storage.path("gs://bucket/probed").exists()
