"""Client side of the test GCS emulator (tests/gcs_emulator.py): start one, point clients at it, set its faults."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import portpicker

from gp_jax import runtime

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _wait_listening(port: int, proc: subprocess.Popen, log, timeout: float = 30.0) -> None:
  end = time.monotonic() + timeout
  while time.monotonic() < end:
    if proc.poll() is not None:
      log.seek(0)
      raise RuntimeError(f"GCS emulator exited with {proc.returncode}: {log.read()[-2000:]}")
    try:
      with socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return
    except OSError:
      time.sleep(0.1)  # polling a port that is not open yet
  raise TimeoutError(f"GCS emulator not listening on 127.0.0.1:{port} after {timeout} s")


@contextlib.contextmanager
def emulator(*args: str):
  """A GCS emulator subprocess on 127.0.0.1; yields (url, env for clients). This process's os.environ points at
  it meanwhile (gcsfs, tensorstore and etils read it). Its output goes to a temporary file: the server is
  single-threaded, and a pipe nobody reads fills with its tracebacks of dropped connections and stalls it."""
  port = portpicker.pick_unused_port()
  with tempfile.TemporaryFile("w+") as log:
    proc = subprocess.Popen([sys.executable, "-m", "tests.gcs_emulator", str(port), "bucket", *args], cwd=REPO,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    try:
      _wait_listening(port, proc, log)
      url = f"http://127.0.0.1:{port}"
      env = {"STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url, "GOOGLE_AUTH_TOKEN_FOR_TESTING": "test",
             "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false"}
      with runtime.environ(env):
        yield url, env
    finally:
      proc.kill()
      proc.wait()


def scale_gcsfs_backoff(scale: float):
  """gcsfs's retry loop (gcsfs/retry.py `retry_request`: 6 tries) sleeps `min(random() + 2**(n-1), 32)` s
  between tries, hard-coded, with no setting. Tests scale those sleeps: the loop and what it retries stay
  gcsfs's own. Returns a function that puts gcsfs's sleeps back."""
  import asyncio
  import types

  from gcsfs import retry

  kept, sleep = retry.asyncio, asyncio.sleep
  retry.asyncio = types.SimpleNamespace(sleep=lambda s: sleep(s * scale))
  return lambda: setattr(retry, "asyncio", kept)


def set_faults(url: str, share: float, kinds: str = "503,429,drop,lost_answer", seed: int = 0, next_: int = 0) -> dict:
  """Faults on a share of requests (and on the next `next_` requests whatever the share)."""
  req = urllib.request.Request(f"{url}/_faults?share={share}&kinds={kinds}&seed={seed}&next={next_}", method="POST")
  return json.loads(urllib.request.urlopen(req).read())


def fault_counts(url: str) -> dict:
  return json.loads(urllib.request.urlopen(f"{url}/_faults").read())
