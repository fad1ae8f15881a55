"""What every stage shares: the result file a stage writes as it goes, the child processes it runs (their output in
the stage's log, how each ended), and whether this machine has what a part needs (a GPU, cuDNN, torch)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import signal
import subprocess
import time

import numpy as np

# Deferred imports below: jax (and gp_jax.ops, which imports it) only in a stage's child, after the parent set that
# child's environment; torch and transformers: optional, slow to import.

RESULT = "device_check.json"
ROOT = pathlib.Path(__file__).resolve().parents[2]
VARIANT_TAIL_LINES = 20


class Recorder:
  """A stage's result dict, written to its file (atomically) at every `set`, so a killed stage leaves its data."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.data = {"status": "running"}
    self.flush()

  def set(self, key: str, value) -> None:
    self.data[key] = value
    self.flush()

  def update(self, key: str, sub: str, value) -> None:
    self.data.setdefault(key, {})[sub] = value
    self.flush()

  def flush(self) -> None:
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(self.data, indent=1, default=str))
    os.replace(tmp, self.path)


def skipped(why: str) -> dict:
  return {"status": "skipped", "why": why}


def rel_err(a, b) -> float:
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def on_gpu() -> bool:
  import jax  # pylint: disable=g-import-not-at-top

  return jax.default_backend() == "gpu"


def cudnn_reason() -> str | None:
  """Why cuDNN attention cannot run here, or None."""
  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  if not on_gpu():
    import jax  # pylint: disable=g-import-not-at-top

    return f"cuDNN needs a CUDA GPU (backend {jax.default_backend()})"
  if not attention_lib.cudnn_detected():
    return "cuDNN is not detected by this jaxlib"
  return None


def torch_reason() -> str | None:
  """Why the PyTorch port cannot run on the GPU here, or None."""
  if not on_gpu():
    return "the PyTorch comparison runs on a GPU only"
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"torch/transformers not importable ({e})"
  if not torch.cuda.is_available():
    return "torch sees no CUDA device"
  return None


def log_lines(text: str) -> list[str]:
  return re.split(r"[\r\n]+", text)


def run_logged(name: str, cmd: list[str], *, env: dict, timeout: float, log_path: pathlib.Path) -> tuple:
  """(exit code or None on timeout, seconds, output): `cmd` from the repo root, its output in `log_path` and also in
  the stage's log."""
  t0 = time.time()
  with open(log_path, "w") as f:
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
      rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      rc = None
  seconds = time.time() - t0
  text = log_path.read_text(errors="replace")
  print(f"----- {name}: {' '.join(cmd)} (exit {rc}, {seconds:.1f} s) -----\n{text}\n----- end {name} -----", flush=True)
  return rc, seconds, text


def signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


def child_outcome(row: dict, rc: int | None, text: str, timeout: float) -> dict:
  """`row`, what a child recorded, with how its process ended: timeout, aborted (the signal it died by) or failed
  (nonzero exit, or no "ok" recorded); any but ok with the last lines of its output."""
  if rc is None:
    row.update(status="timeout", why=f"stopped at its limit of {timeout:.0f} s")
  elif rc < 0:
    row.update(status="aborted", signal=signal_name(-rc), why=f"its process died by {signal_name(-rc)}")
  elif rc > 0 or row.get("status") != "ok":
    row["status"] = "failed"
    row.setdefault("error", f"exit {rc}")
  if row["status"] != "ok":
    row["log_tail"] = [line[:400] for line in log_lines(text.rstrip())[-VARIANT_TAIL_LINES:]]
  return row
