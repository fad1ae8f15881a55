"""Trains and evaluates a GlobalPointer model: entities, or GPLinker relations or events (the config's `task`).

  python -m gp_jax.main --config=experiments/msra_scratch.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

--config: an experiment file (experiments/*.py), ARG passed to its get_config (`:quick`: a smoke run of a few
steps); every --config.KEY with its default and comment: `python -m gp_jax.configs [experiments/X.py[:ARG]]`.
DIR receives results.json (status, dev and test figures of the best dev checkpoint), train.log, metrics.jsonl, tb/
(TensorBoard), ckpt/ (resume) and best/ (the best parameters by dev F1: what gp_jax.predict and gp_jax.export read).
DIR may be local or gs://; a DIR holding a checkpoint is resumed. User errors (gp_jax.errors.UserError: a
config the experiment refuses, a missing config file, a config that differs from the one DIR was trained with, a
bad or missing data file) end with one line on stderr and exit status 2, as does a full disk or quota (the line
names the last finished checkpoint, which a rerun resumes from).
A gs:// DIR is probed before anything else: storage that does not answer within $GP_JAX_GCS_PROBE_TIMEOUT_S (default
10 s), a bucket that does not exist or refuses a write, and a mistyped URL (gs:/bucket/run) are one line, exit 2.
Storage that stops answering mid-run: a wait for the checkpoint save in flight lasts at most $GP_JAX_SAVE_TIMEOUT_S
(default 600 s), then the run ends with one line naming the storage's error and the last finished checkpoint (exit
2; results.json says "failed" if storage takes it); SIGTERM or Ctrl-C during that wait stops at once.
A second live run on the same DIR refuses to start (exit 2, naming the holder): a local DIR is held by an flock on
DIR/run.lock, which the OS releases when the run ends however it ends; under a sweep root the run also holds the
workers' lease of DIR, and on gs:// that lease alone (gp_jax/lease.py).
SIGTERM saves a checkpoint at the current step and exits 0; Ctrl-C (SIGINT) does the same and exits 130. Before the
first step (data, compile) or after the last (final evaluation) either stops at once, with the same exit status; a
second Ctrl-C stops at once. results.json says "preempted" in each case, and a rerun resumes from the last
checkpoint.
"""

import atexit
import logging
import os
import sys
import threading

from gp_jax import runtime

runtime.quicken_imports()

import jax  # noqa: E402
from absl import app, flags  # noqa: E402

from gp_jax import checkpoint, lease, storage, train  # noqa: E402
from gp_jax.configs.args import check_override_keys, define_config_file  # noqa: E402
from gp_jax.errors import StorageTimeout, UserError, help_exits_zero, storage_failure, storage_full  # noqa: E402

_CONFIG = define_config_file("config", "Experiment config file (get_config(arg)).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory (local or gs://) for checkpoints, logs and results; "
                               "resumes if it holds a checkpoint.")
flags.mark_flags_as_required(["config", "workdir"])


def _user_error(e: BaseException | None) -> UserError | None:
  """The innermost UserError in e's chain of causes, if any (absl and ml_collections re-raise what get_config
  raises with a traceback in the message; the innermost one holds the original line)."""
  found = None
  while e is not None:
    found = e if isinstance(e, UserError) else found
    e = e.__cause__ or e.__context__
  return found


def _exit_with(message) -> None:
  print(f"error: {message}", file=sys.stderr)
  sys.exit(2)


def _config_file_error(e: OSError, argv) -> str:
  """One line for a --config file that did not load (ml_collections keeps the failure until the config is used)."""
  values = [a.split("=", 1)[1] for a in argv if a.startswith(("--config=", "-config="))]
  values += [b for a, b in zip(argv, argv[1:]) if a in ("--config", "-config")]
  if not values:
    return f"cannot load --config: {' '.join(str(e.__cause__ or e).split())}"
  path = values[-1].split(":", 1)[0]
  if not os.path.isfile(path):
    return (f"no experiment file {os.path.abspath(path)}: --config takes a Python file with get_config(arg), e.g. "
            "experiments/synthetic.py:quick")
  cause = e.__cause__ or e
  return f"cannot load --config={path}: {' '.join(str(cause).split())}"


def parse_flags(argv):
  try:
    rest = flags.FLAGS(argv)
    hasattr(_CONFIG.value, "lock")  # a config file that failed to load raises OSError on first use
  except OSError as e:  # on that use: here, or by a --config.key=value override
    _exit_with(_config_file_error(e, argv))
  except (KeyError, AttributeError, flags.Error) as e:
    user = _user_error(e)
    _exit_with(user if user is not None else check_override_keys(argv) or e)
  return rest


def _interrupted(message: str) -> None:
  """Ctrl-C: one line, exit 130, threads (compiles, Orbax) not waited for."""
  sys.stdout.flush()
  print(f"interrupted: {message}", file=sys.stderr, flush=True)
  _exit_now(runtime.EXIT_INTERRUPTED)


def main(argv):
  del argv
  runtime.configure()  # process-level settings (malloc) before anything is allocated
  config = _CONFIG.value
  if config.multihost:  # before the lease: process 0 takes it and tells the others (train.setup_run skips this)
    jax.distributed.initialize(*([config.coordinator_address] if config.coordinator_address else []),
                               **({"num_processes": config.num_processes, "process_id": config.process_id}
                                  if config.coordinator_address else {}))
  else:  # one process; several stop through the coordination service (runtime.Preemption)
    runtime.stop_at_once_on_signals()
  try:
    checkpoint.save_timeout_s()  # a bad $GP_JAX_SAVE_TIMEOUT_S stops here, not at the first checkpoint
    checkpoint.signal_grace_s()
    storage.probe_timeout_s()
    storage.check_path(_WORKDIR.value, flag="workdir")
    storage.check_bucket(_WORKDIR.value, flag="workdir", write=True)
    with lease.hold_run(_WORKDIR.value):
      try:
        summary = train.train_and_evaluate(config, _WORKDIR.value)
      except Exception as e:  # pylint: disable=broad-except
        _exit_if_storage_failed(e)  # inside the lease: its release would wait on storage that stopped answering
        raise
  except lease.Held as e:  # raised by the lock or lease alone, before training starts
    _exit_with(f"{e}; not starting ({e.hint})" if e.hint else f"{e}; not starting")
  except (UserError, FileNotFoundError) as e:  # FileNotFoundError: a path the user gave (pretrained, data, workdir)
    _exit_with(e)
  except train.Diverged as e:  # a failed run, not a bug: results.json holds the same line
    print(f"error: {e}", file=sys.stderr)
    _exit_now(1, finished=True)
  except KeyboardInterrupt:  # Ctrl-C where no handler of ours took it (several processes)
    _interrupted("Ctrl-C; stopped at once. Rerun the same command to continue from the last checkpoint, if any")
  except Exception as e:  # pylint: disable=broad-except
    full = storage_full(e)
    if full is None:
      raise
    _last_line(f"error: storage full: {full}. {_last_checkpoint(_WORKDIR.value)}")
  code = 0
  if summary.get("signal") == "SIGINT":
    print(f"interrupted: Ctrl-C; saved the checkpoint of step {summary['steps']} in "
          f"{storage.path(_WORKDIR.value) / 'ckpt'}. Rerun the same command to resume", file=sys.stderr)
    code = runtime.EXIT_INTERRUPTED
  _exit_now(code, finished=True)


def _exit_now(code: int, *, finished: bool = False) -> None:
  """Ends the process without the interpreter's teardown (module and XLA client destructors: ~1.4 s after the last
  line), logs and streams flushed. `finished` (every write done): other threads joined and atexit handlers run
  first, as the interpreter would; else (Ctrl-C, a full disk) they are not waited for."""
  if finished:
    # The interpreter's first exit step: thread pools told to stop (an idle worker of a pool nobody shut down waits
    # for work until then; joined first, it would never end), then every non-daemon thread joined.
    threading._shutdown()  # pylint: disable=protected-access
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  logging.shutdown()
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)


def _exit_if_storage_failed(e: BaseException) -> None:
  """One line and exit 2 when storage stopped answering (`errors.storage_failure`); the lease is left to go stale."""
  failed = storage_failure(e)
  if failed is None:
    return
  if isinstance(failed, StorageTimeout):  # names the step, the storage's error and the last finished checkpoint
    _last_line(f"error: {failed}")
  else:
    _last_line(f"error: storage not answering: {' '.join(str(failed).split()) or type(failed).__name__}. Rerun the "
               f"same command to resume from the last finished checkpoint in {storage.path(_WORKDIR.value) / 'ckpt'}")


def _last_line(line: str) -> None:
  """A storage failure's one line, exit 2. The failed save's background threads (and gcsfs's retries) go on printing
  tracebacks (under load, after any line of ours too): from here stderr takes the one line only. No interpreter
  teardown either; every write that could still succeed is done."""
  logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # Orbax's failed writes, logged again at teardown
  stderr = _stderr_to_devnull()
  os.write(stderr, f"\n{line}\n".encode())  # the threads may have left a partial line: ours starts a new one
  _exit_now(2)


def _stderr_to_devnull() -> int:
  """Points fd 2 and sys.stderr (every thread's, Python's and C++'s) at /dev/null; returns a descriptor of what fd 2
  was, for the process's last words."""
  sys.stderr.flush()
  kept, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
  os.dup2(devnull, 2)
  os.close(devnull)
  sys.stderr = open(os.devnull, "w", encoding="utf-8")  # noqa: SIM115 (the process ends next)
  return kept


def _last_checkpoint(workdir) -> str:
  ckpt = storage.path(workdir) / "ckpt"
  steps = checkpoint.finalised_steps(ckpt)
  if not steps:
    return f"No finished checkpoint in {ckpt}."
  return f"Last finished checkpoint: step {max(steps)} in {ckpt}; free space and rerun to resume from it."


if __name__ == "__main__":
  app.run(main, flags_parser=help_exits_zero(parse_flags))
