"""Test-only entry point: `gp_jax.main` plus injected faults (never part of the user's config).

  python -m tests.fault_main --config=... --workdir=... [--reference_workdir=DIR] [--sigkill_after_checkpoint_step=N]
      [--sigkill_before_commit_step=N] [--gcsfs_backoff_scale=S] [--fsize_limit_after_checkpoint_step=N]
      [--block_in=compile|checkpoint] [--stderr_noise] [--config.k=v ...]

Runs `gp_jax.main.main` (so its error handling, its one-line errors and its workdir lock and lease are the ones
tested) with `train.TrainHooks`. A run that SIGKILLs itself holds the workdir as any run does: the restart that
follows tests that a dead holder's workdir is taken over at once. With --reference_workdir, the same config first
trains there uninterrupted, in this process and before any fault is armed: the run a SIGKILL test compares against,
without a process of its own (its programs are then compiled once for both runs).
"""

import concurrent.futures
import logging
import os
import resource
import signal
import sys
import threading
import time

from absl import app, flags

from gp_jax import main as gp_main
from gp_jax import train
from tests import helpers_gcs

_KILL = flags.DEFINE_integer("sigkill_after_checkpoint_step", 0, "SIGKILL this process once the resume "
                             "checkpoint of this step is on disk (0 = never).")
_KILL_COMMIT = flags.DEFINE_integer("sigkill_before_commit_step", 0, "SIGKILL this process while the resume "
                                    "checkpoint of this step is being saved: its files are written, Orbax has not "
                                    "finalised it (commit_success.txt on gs://, the rename of the tmp folder locally).")
_REFERENCE = flags.DEFINE_string("reference_workdir", "", "First train the same config here, uninterrupted, with no "
                                 "fault armed; then the run in --workdir.")
_BACKOFF = flags.DEFINE_float("gcsfs_backoff_scale", 1.0, "Multiply gcsfs's retry sleeps by this.")
_FSIZE_STEP = flags.DEFINE_integer("fsize_limit_after_checkpoint_step", 0, "Once the resume checkpoint of this "
                                   "step is on disk, no file may grow past --fsize_limit_bytes (RLIMIT_FSIZE; "
                                   "writes fail with EFBIG, as on a full disk).")
_FSIZE_BYTES = flags.DEFINE_integer("fsize_limit_bytes", 32 << 10, "See --fsize_limit_after_checkpoint_step.")
_NOISE = flags.DEFINE_bool("stderr_noise", False, "With --fsize_limit_after_checkpoint_step: from the limit on, "
                            "stderr is written to by a thread every millisecond and at logging's shutdown "
                            "(`stderr_noise`).")
_BLOCK = flags.DEFINE_enum("block_in", "", ["", "compile", "checkpoint"], "Never finish this: 'compile' (the run's "
                           "programs, waited for on a thread pool as aot.compile_all does) or 'checkpoint' (every "
                           "resume checkpoint save). Prints 'BLOCKED in <what>' first, for tests that signal it there.")


def kill_before_commit(step: int) -> None:
  """SIGKILL when Orbax is about to finalise ckpt/<step>."""
  from orbax.checkpoint._src.path import atomicity

  for cls in (atomicity.CommitFileTemporaryPath, atomicity.AtomicRenameTemporaryPath):
    def finalize(self, *args, _finalize=cls.finalize, **kwargs):
      final = self.get_final()
      if final.name == str(step) and final.parent.name == "ckpt":
        os.kill(os.getpid(), signal.SIGKILL)
      return _finalize(self, *args, **kwargs)

    cls.finalize = finalize


def block_in(what: str) -> None:
  """Replaces the compile of the run's programs, or the resume checkpoint's save, by a wait that never ends."""
  from gp_jax import aot
  from gp_jax import checkpoint as ckpt_lib

  def never(*args, **kwargs):
    print(f"BLOCKED in {what}", flush=True)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # leaving the block waits for the job, as compile_all's
      pool.submit(threading.Event().wait).result()

  if what == "compile":
    aot.compile_for_run = never
  else:
    ckpt_lib.save = never


class _CloseWriter(logging.Handler):
  """Writes to stderr when logging shuts down (gp_jax.main's exit): what a thread printing just then would show."""

  def emit(self, record):
    pass

  def close(self):
    _noise_line()
    super().close()


def _noise_line() -> None:
  print("RuntimeError: Event loop is closed (planted)", file=sys.stderr, flush=True)
  os.write(2, b"RuntimeError: Event loop is closed (planted, fd 2)\n")


def stderr_noise() -> None:
  """Stderr written to, as a failed save's threads print 'Event loop is closed' tracebacks until the process ends,
  both ways they do (Python's sys.stderr, the C++ side's fd 2): by a daemon thread, and at logging's shutdown."""
  def noise():
    while True:
      _noise_line()
      time.sleep(0.001)

  threading.Thread(target=noise, daemon=True, name="stderr-noise").start()
  logging.getLogger().addHandler(_CloseWriter())


def main(argv):
  def after_checkpoint(step):
    if _KILL.value and step == _KILL.value:
      os.kill(os.getpid(), signal.SIGKILL)
    if _FSIZE_STEP.value and step == _FSIZE_STEP.value:
      signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of the signal's default: dying
      resource.setrlimit(resource.RLIMIT_FSIZE, (_FSIZE_BYTES.value, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
      if _NOISE.value:
        stderr_noise()

  def arm():
    if _KILL_COMMIT.value:
      kill_before_commit(_KILL_COMMIT.value)
    if _BLOCK.value:
      block_in(_BLOCK.value)

  if _BACKOFF.value != 1.0:
    helpers_gcs.scale_gcsfs_backoff(_BACKOFF.value)
  run = train.train_and_evaluate
  hooks = train.TrainHooks(after_checkpoint=after_checkpoint)

  def faulted(config, workdir):
    if _REFERENCE.value:
      reference = run(config, _REFERENCE.value)
      print(f"reference run in {_REFERENCE.value}: {reference['status']} at step {reference['steps']}", flush=True)
    arm()
    return run(config, workdir, hooks=hooks)

  train.train_and_evaluate = faulted
  gp_main.main(argv)


if __name__ == "__main__":
  app.run(main, flags_parser=gp_main.parse_flags)
