"""Paths a user gives, before anything uses them (gp_jax.storage): a mistyped gs:// URL is refused in one line by
every CLI (it was a local folder `./gs:/bucket/...`); storage that does not answer (STORAGE_EMULATOR_HOST with nothing
listening) is one line within GP_JAX_GCS_PROBE_TIMEOUT_S (was gcsfs's ~35 s of retries, then tracebacks); writes
after storage stopped answering are bounded (`limit_writes`); the exceptions that mean storage stopped answering are
found in a chain. In-process: predict and export with their flags parsed under `flagsaver`, nothing listening on
the port (no emulator: tests/e2e/test_gcs_failures.py has those)."""

from __future__ import annotations

import os
import threading
import time
import types

import portpicker
import pytest
from absl import flags
from absl.testing import flagsaver

from gp_jax import checkpoint, errors, export, predict, storage
from gp_jax.errors import UserError


@pytest.mark.parametrize("typed,meant", [
    ("gs:/bucket/runs/t1", "gs://bucket/runs/t1"),
    ("gs//bucket/runs/t2", "gs://bucket/runs/t2"),
    ("gs:bucket/x", "gs://bucket/x"),
    ("gs:///bucket/x", "gs://bucket/x"),
    ("gcs:/bucket/x", "gcs://bucket/x"),
])
def test_a_mistyped_gs_url_is_refused_with_what_was_meant(typed, meant):
  with pytest.raises(UserError) as e:
    storage.check_path(typed, flag="workdir")
  assert str(e.value) == (f"--workdir={typed} looks like a mistyped Cloud Storage URL: did you mean {meant}? (a local "
                          f"folder: ./{typed})")


@pytest.mark.parametrize("fine", ["gs://bucket/runs/x", "gcs://bucket", "runs/gs/x", "gs/x", "./gs:/x", "/tmp/gs:",
                                  "gsx:/b", "s3://b/x"])
def test_urls_and_local_paths_pass(fine):
  storage.check_path(fine, flag="out")
  if not fine.startswith(("gs://", "gcs://")):
    storage.check_bucket(fine, flag="out", write=True)  # nothing to probe: local paths, other schemes


def test_gs_with_no_bucket_says_what_a_url_is():
  with pytest.raises(UserError, match=r"^--out=gs:/ looks like a mistyped Cloud Storage URL: a Cloud Storage URL is "
                                      r"gs://BUCKET/PATH"):
    storage.check_path("gs:/", flag="out")


@pytest.fixture
def dead_storage(monkeypatch):
  """STORAGE_EMULATOR_HOST at a port nothing listens on; probes given 0.5 s."""
  port = portpicker.pick_unused_port()
  monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{port}")
  monkeypatch.setenv(storage.PROBE_TIMEOUT_ENV, "0.5")
  return f"cannot reach Google Cloud Storage at http://127.0.0.1:{port} (STORAGE_EMULATOR_HOST): Cannot connect to host"


def test_storage_that_does_not_answer_is_one_line_within_the_probe_time(dead_storage):
  t0 = time.monotonic()
  with pytest.raises(UserError) as e:
    storage.check_bucket("gs://bucket/runs/x", flag="workdir", write=True)
  assert str(e.value).startswith(dead_storage), str(e.value)
  assert "\n" not in str(e.value) and time.monotonic() - t0 < 5


def _predict(*args):
  with flagsaver.flagsaver():
    argv = flags.FLAGS(["gp_jax.predict", *args])
    with pytest.raises(SystemExit) as e:
      predict.main(argv)
  return e.value.code


def _export(**over):
  base = dict(workdir="w", out="o", threshold=None, format="stablehlo", platforms=[], hit_buffer=4096, batch_size=0)
  with pytest.raises(SystemExit) as e:
    export.main(["gp_jax.export"], types.SimpleNamespace(**{**base, **over}))
  return e.value.code


@pytest.fixture
def quiet_runtime(monkeypatch):
  monkeypatch.setattr(predict.runtime, "configure", lambda: {})
  monkeypatch.setattr(predict.logging, "set_verbosity", lambda level: None)


def test_predict_and_export_with_storage_that_does_not_answer(quiet_runtime, dead_storage, capsys, tmp_path):
  """Each was rc 1 after ~35 s of gcsfs's retries and a ClientConnectorError traceback."""
  for args in (["--workdir=gs://bucket/w"], ["--exported=gs://bucket/e"],
               ["--exported=gs://bucket/e", f"--output={tmp_path / 'p.jsonl'}"]):
    t0 = time.monotonic()
    assert _predict(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gp_jax.predict: {dead_storage}") and err.count("\n") == 1, err
    assert time.monotonic() - t0 < 5
  assert _export(workdir="gs://bucket/w", out=str(tmp_path / "o")) == 2
  err = capsys.readouterr().err
  assert err.startswith(f"gp_jax.export: {dead_storage}") and err.count("\n") == 1, err
  assert not os.listdir(tmp_path)


def test_predict_and_export_refuse_mistyped_urls(quiet_runtime, capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  for args, flag in ((["--workdir=gs:/bucket/w"], "workdir"), (["--exported=gs//bucket/e"], "exported"),
                     (["--exported=gs://bucket/e", "--input=gs:/bucket/in.txt"], "input"),
                     (["--exported=gs://bucket/e", "--output=gs:/bucket/p.jsonl"], "output")):
    assert _predict(*args) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"gp_jax.predict: --{flag}=") and "did you mean gs://bucket/" in err, err
    assert err.count("\n") == 1
  for over in ({"workdir": "gs:/bucket/w"}, {"workdir": str(tmp_path), "out": "gs//bucket/serving"}):
    assert _export(**over) == 2
    err = capsys.readouterr().err
    assert "looks like a mistyped Cloud Storage URL: did you mean gs://bucket/" in err and err.count("\n") == 1, err
  assert not os.listdir(tmp_path)


def test_writes_after_storage_stopped_answering_are_bounded(tmp_path):
  """A FIFO nobody reads blocks its writer as storage that never answers does."""
  fifo = tmp_path / "results.json"
  os.mkfifo(fifo)
  storage.limit_writes(0.3)
  try:
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"^writing .*results.json: no answer from storage within 0.3 s$"):
      storage.write_json(fifo, {"status": "failed"})
    assert time.monotonic() - t0 < 2
    storage.write_text(tmp_path / "ok.txt", "fine")  # a write that ends is done as before
    assert (tmp_path / "ok.txt").read_text() == "fine"
  finally:
    storage.limit_writes(None)
    threading.Thread(target=lambda: open(fifo).read(), daemon=True).start()  # releases the blocked writer


def test_storage_failures_are_found_in_a_chain():
  import aiohttp
  from fsspec.exceptions import FSTimeoutError

  timeout = errors.StorageTimeout("storage not answering: ...")
  try:
    try:
      raise timeout
    except errors.StorageTimeout as inner:
      raise TimeoutError("writing results.json") from inner
  except TimeoutError as outer:
    assert errors.storage_failure(outer) is timeout
  gone = aiohttp.ServerDisconnectedError()
  assert errors.storage_failure(RuntimeError("x")) is None
  wrapped = ValueError("save failed")
  wrapped.__cause__ = gone
  assert errors.storage_failure(wrapped) is gone
  assert isinstance(errors.storage_failure(FSTimeoutError()), FSTimeoutError)
  assert errors.storage_full(timeout) is None


@pytest.mark.parametrize("env,read", [(checkpoint.SAVE_TIMEOUT_ENV, checkpoint.save_timeout_s),
                                      (checkpoint.SIGNAL_GRACE_ENV, checkpoint.signal_grace_s),
                                      (storage.PROBE_TIMEOUT_ENV, storage.probe_timeout_s)])
def test_timeouts_from_the_environment(monkeypatch, env, read):
  monkeypatch.delenv(env, raising=False)
  assert read() in (checkpoint.DEFAULT_SAVE_TIMEOUT_S, checkpoint.DEFAULT_SIGNAL_GRACE_S,
                    storage.DEFAULT_PROBE_TIMEOUT_S)
  monkeypatch.setenv(env, "2.5")
  assert read() == 2.5
  for bad in ("0", "-1", "soon"):
    monkeypatch.setenv(env, bad)
    with pytest.raises(UserError, match=f"^{env}='{bad}': expected a number of seconds > 0$"):
      read()
