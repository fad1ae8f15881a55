"""Trains and evaluates GlobalPointer NER.

  python -m gp_jax.main --config=experiments/msra_scratch.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

DIR may be local or gs://; a DIR holding a checkpoint is resumed. User errors (gp_jax.errors.UserError: a
config the experiment refuses, a bad or missing data file) end with one line on stderr and exit status 2, as
does a full disk or quota (the line names the last finished checkpoint, which a rerun resumes from).
A second live run on the same DIR refuses to start (exit 2, naming the holder): the run holds a lease in
DIR/../_launch/leases/ (gp_jax/lease.py).
"""

import logging
import os
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

from gp_jax import checkpoint, lease, runtime, storage, train
from gp_jax.configs.args import check_override_keys
from gp_jax.errors import UserError, help_exits_zero, storage_full

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).", lock_config=True)
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


def parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError, flags.Error) as e:
    user = _user_error(e)
    _exit_with(user if user is not None else check_override_keys(argv) or e)


def main(argv):
  del argv
  runtime.configure()  # process-level settings (malloc) before anything is allocated
  config = _CONFIG.value
  if config.multihost:  # before the lease: process 0 takes it and tells the others (train.setup_run skips this)
    jax.distributed.initialize(*([config.coordinator_address] if config.coordinator_address else []),
                               **({"num_processes": config.num_processes, "process_id": config.process_id}
                                  if config.coordinator_address else {}))
  try:
    with lease.hold_run(_WORKDIR.value):
      train.train_and_evaluate(config, _WORKDIR.value)
  except lease.Held as e:  # raised by the lease alone, before training starts
    _exit_with(f"{e}; not starting (a stopped holder's lease is taken over after "
               f"{lease.stale_beats():g} missed heartbeats of {lease.heartbeat_s():g} s)")
  except UserError as e:
    _exit_with(e)
  except Exception as e:  # pylint: disable=broad-except
    full = storage_full(e)
    if full is None:
      raise
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # Orbax's failed writes, logged again at teardown
    sys.stderr.flush()  # the failed save's threads may have printed a partial line: ours starts a new one
    print(f"\nerror: storage full: {full}. {_last_checkpoint(_WORKDIR.value)}", file=sys.stderr, flush=True)
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter teardown: the failed save's background threads would print "Event loop is closed"
    # tracebacks after the one line (seen under load). Every write that could still succeed is done.
    os._exit(2)


def _last_checkpoint(workdir) -> str:
  ckpt = storage.path(workdir) / "ckpt"
  steps = checkpoint.finalised_steps(ckpt)
  if not steps:
    return f"No finished checkpoint in {ckpt}."
  return f"Last finished checkpoint: step {max(steps)} in {ckpt}; free space and rerun to resume from it."


if __name__ == "__main__":
  app.run(main, flags_parser=help_exits_zero(parse_flags))
