"""A thin Orbax wrapper.

Layout under a workdir (local or gs://):
  ckpt/<step>/   last `keep` checkpoints, for resuming: state (params, optimizer, step, rng),
                 data (iterator state, JSON), config (JSON)
  best/<step>/   one checkpoint of parameters only (params, config): the best by dev F1, or the
                 final parameters when there is no dev split. Evaluation, predict and init_from read it.

Resume order (`resume.py`): a checkpoint in workdir/ckpt, then `config.init_from` (params only),
then a fresh init.

gs:// requests that fail transiently (429, 5xx, dropped connections) are retried by tensorstore (arrays) and
gcsfs (small files) themselves; `GP_JAX_GCS_RETRIES` tunes tensorstore's retries (docs/tpu.md).

Storage that stops answering mid-run leaves an async save unfinished for as long as those retries last (tensorstore's
defaults: up to 32 tries a request, 32 s apart). A `Manager` (what `make_manager` returns) waits for a save in flight
at most $GP_JAX_SAVE_TIMEOUT_S (default 600 s), then raises `errors.StorageTimeout`. SIGTERM or Ctrl-C while it
waits: a save that finishes within $GP_JAX_SAVE_SIGNAL_GRACE_S (default 10 s) hands the signal to the run's own
handler (a checkpoint at the step, then stop); otherwise, or at a second signal, the process stops at once
(`runtime.stop_now`), naming the last finished checkpoint.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import signal
import threading
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from gp_jax import runtime, storage
from gp_jax.errors import StorageTimeout, UserError

log = logging.getLogger(__name__)

RETRIES_ENV = "GP_JAX_GCS_RETRIES"
_retries_set: str | None = None
SAVE_TIMEOUT_ENV = "GP_JAX_SAVE_TIMEOUT_S"
DEFAULT_SAVE_TIMEOUT_S = 600.0
SIGNAL_GRACE_ENV = "GP_JAX_SAVE_SIGNAL_GRACE_S"  # a signal during a wait for a save: how long the save may still
DEFAULT_SIGNAL_GRACE_S = 10.0  # finish (then a checkpoint at the step) before the process stops at once


def configure_gcs_retries() -> dict | None:
  """tensorstore's retries of gs:// requests for every Orbax read and write, from $GP_JAX_GCS_RETRIES: its
  `gcs_request_retries` resource as JSON, e.g. {"max_retries": 32, "initial_delay": "1s", "max_delay": "32s"}
  (tensorstore's defaults, kept when unset). Orbax takes no tensorstore context from its callers, so the
  resource goes into the default contexts it copies for each read and write. Returns what was set."""
  global _retries_set
  spec = os.environ.get(RETRIES_ENV, "")
  if not spec or spec == _retries_set:
    return json.loads(spec) if spec else None
  try:
    retries = json.loads(spec)
    ts.Context({"gcs_request_retries": retries})  # validates
  except ValueError as e:
    raise UserError(f"{RETRIES_ENV}={spec!r}: {e}") from e
  try:  # Orbax's private module: the only place its default tensorstore contexts live
    from orbax.checkpoint._src.serialization import tensorstore_utils  # pylint: disable=g-import-not-at-top
  except ImportError:
    tensorstore_utils = None
  defaults = [getattr(tensorstore_utils, n, None) for n in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT")]
  if not all(isinstance(d, dict) for d in defaults):
    log.warning("%s ignored: this Orbax builds its tensorstore contexts differently", RETRIES_ENV)
    return None
  for d in defaults:
    d["gcs_request_retries"] = retries
  _retries_set = spec
  return retries


@functools.cache  # once a process
def save_whole_arrays() -> None:
  """Orbax saves each array of several replicas replica-parallel: every replica writes a slice, cut by an eager slice
  op per array and save (a lowering each, ~7 ms here). On one process's CPU devices the replicas share this memory
  and one writer, so the slices are work for nothing: each array is written whole (Orbax's own default on GPUs)."""
  absl_log = logging.getLogger("absl")  # Orbax warns of the override it was asked for
  level = absl_log.level
  absl_log.setLevel(logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False),
                                            override=True)
  finally:
    absl_log.setLevel(level)


def make_manager(directory, *, keep: int, best: bool = False) -> ocp.CheckpointManager:
  """Async saves on one process. With several, saves block and each manager gets its own barrier
  prefix: two managers' async barriers otherwise collide ("Barrier _async_write_complete.N is
  already ongoing"); and process 0 alone lists the steps and broadcasts them, so every process restores
  the same step even if their reads of the storage disagree."""
  configure_gcs_retries()
  directory = storage.path(directory)
  multi = jax.process_count() > 1
  if not multi and jax.default_backend() == "cpu":
    save_whole_arrays()
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      best_fn=(lambda m: m["dev_f1"]) if best else None,
      best_mode="max",
      keep_checkpoints_without_metrics=not best,
      create=True,
      enable_async_checkpointing=not multi,
      **({"single_host_load_and_broadcast": True,
          "step_name_format": ocp.step.standard_name_format(single_host_load_and_broadcast=True)} if multi else {}),
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          barrier_sync_key_prefix=("best" if best else "ckpt") + "_" + directory.name),
  )
  return Manager(directory, options=options)


def save_timeout_s() -> float:
  """$GP_JAX_SAVE_TIMEOUT_S: how long a wait for a save in flight may last (seconds, > 0)."""
  return storage.env_seconds(SAVE_TIMEOUT_ENV, DEFAULT_SAVE_TIMEOUT_S)


def signal_grace_s() -> float:
  """$GP_JAX_SAVE_SIGNAL_GRACE_S: how long a save in flight may still finish after a signal (seconds, > 0)."""
  return storage.env_seconds(SIGNAL_GRACE_ENV, DEFAULT_SIGNAL_GRACE_S)


class Manager(ocp.CheckpointManager):
  """An Orbax CheckpointManager whose waits for an async save in flight (its own `save` waits for the previous one
  first; callers wait before reading or at the end) are bounded and leave the main thread to signals: Orbax's own
  wait runs on a helper thread, joined in short slices. Past `save_timeout_s()` it raises StorageTimeout; a SIGTERM
  or Ctrl-C meanwhile waits $GP_JAX_SAVE_SIGNAL_GRACE_S more for the save, then stops the process at once (a save
  that storage never finishes cannot be waited out); a save that finishes in time passes the signal on to the run's
  handler.
  `last_finished`: the latest step known finalised (None: none yet)."""

  def __init__(self, directory, *, options: ocp.CheckpointManagerOptions):
    super().__init__(directory, options=options)
    self.is_async = bool(options.enable_async_checkpointing)
    self.in_flight: int | None = None
    self.last_finished: int | None = self.latest_step()

  def save(self, step: int, *args, **kwargs) -> bool:
    saved = super().save(step, *args, **kwargs)  # calls self.wait_until_finished() first
    if saved and self.is_async:
      self.in_flight = step
    elif saved:
      self.last_finished = step
    return saved

  def wait_until_finished(self):
    if not self.is_async:  # several processes: saves are synchronous, nothing runs in the background
      return super().wait_until_finished()
    waiter, failed = storage.in_background(lambda: ocp.CheckpointManager.wait_until_finished(self),
                                           "gp_jax-save-wait")
    waiter.join(0.05)
    if waiter.is_alive():  # a save in flight
      self._wait_interruptibly(waiter)
    step, self.in_flight = self.in_flight, None
    if failed:
      raise failed[0]
    if step is not None:
      self.last_finished = step
    return None

  def last_finished_line(self) -> str:
    if self.last_finished is None:
      return f"No finished checkpoint in {self.directory}"
    return f"Last finished checkpoint: step {self.last_finished} in {self.directory}"

  def _wait_interruptibly(self, waiter: threading.Thread) -> None:
    timeout = save_timeout_s()
    grace = signal_grace_s()
    notice = min(30.0, timeout / 10)
    stop: list[str] = []
    restore = _catch_signals(stop)
    start, noticed, signalled_at = time.monotonic(), False, None
    try:
      while True:
        waiter.join(0.2)
        if not waiter.is_alive():
          break
        waited = time.monotonic() - start
        if stop and signalled_at is None:
          signalled_at = waited
        # A save that finishes within the grace period lets the run's own handler take the signal (a checkpoint at
        # the step, then stop); a second signal, or a save that does not finish, stops at once.
        if stop and (len(stop) > 1 or waited - signalled_at >= grace):
          self._stop_at_once(stop[0], waited)
        if not noticed and waited >= notice:
          noticed = True
          log.warning("The checkpoint save of step %s is still running after %.1f s; waiting for it up to %g s "
                      "(%s; SIGTERM or Ctrl-C stops at once)", self.in_flight, waited, timeout, SAVE_TIMEOUT_ENV)
        if waited >= timeout:
          raise StorageTimeout(self._timeout_message(timeout))
    finally:
      restore()
    if stop:  # the save finished: the signal goes to the handler the run had
      signal.raise_signal(signal.Signals[stop[0]])

  def _timeout_message(self, timeout: float) -> str:
    storage.limit_writes(storage.probe_timeout_s())  # the run's last writes (results.json, logs): tried, not waited on
    try:
      why = storage.unreachable(self.directory)
    except Exception as e:  # pylint: disable=broad-except  # an answer, but not a good one
      why = f"{type(e).__name__}: {' '.join(str(e).split())}"
    return (f"storage not answering: the checkpoint save of step {self.in_flight} did not finish in {timeout:g} s "
            f"({SAVE_TIMEOUT_ENV}){'; ' + why if why else ''}. {self.last_finished_line()}; rerun the same command to "
            "resume from it once storage answers")

  def _stop_at_once(self, name: str, waited: float) -> None:
    storage.limit_writes(storage.probe_timeout_s())  # results.json says "preempted" if storage takes it in time
    who = "Ctrl-C" if name == "SIGINT" else name
    runtime.stop_now(name, f"{who} while waiting {waited:.0f} s for the checkpoint save of step {self.in_flight}; "
                           f"stopped at once, without it. {self.last_finished_line()}. Rerun the same command to "
                           "resume from it", code=0 if name == "SIGTERM" else runtime.EXIT_INTERRUPTED)


def _catch_signals(stop: list):
  """SIGTERM and SIGINT append their names to `stop` until the returned function puts the handlers back (main thread
  only; elsewhere nothing changes)."""
  if threading.current_thread() is not threading.main_thread():
    return lambda: None

  def handler(signum, frame):
    stop.append(signal.Signals(signum).name)

  old = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

  def restore():
    for sig, h in old.items():
      signal.signal(sig, signal.SIG_DFL if h is None else h)  # None: a handler not set from Python

  return restore


def save(mngr: ocp.CheckpointManager, step: int, *, state, data_state: dict, config_json: str) -> bool:
  """A resume checkpoint: the whole train state, the data iterator position and the config."""
  return mngr.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_state),
          config=ocp.args.JsonSave(json.loads(config_json)),
      ),
      force=True,
  )


def save_params(mngr: ocp.CheckpointManager, step: int, *, params, config_json: str, dev_f1: float) -> bool:
  """A parameters-only checkpoint (best/); replaces an existing checkpoint of the same step."""
  if step in mngr.all_steps():
    mngr.wait_until_finished()
    mngr.delete(step)
  return mngr.save(
      step,
      args=ocp.args.Composite(params=ocp.args.StandardSave(params), config=ocp.args.JsonSave(json.loads(config_json))),
      metrics={"dev_f1": float(dev_f1)},
      force=True,
  )


def restore(mngr: ocp.CheckpointManager, abstract_state, step: int | None = None):
  """Returns (step, state, data_state) of `step` (default: latest), or None when there is none."""
  step = mngr.latest_step() if step is None else step
  if step is None:
    return None
  out = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
  )
  return step, out["state"], out["data"]


def restore_params(mngr: ocp.CheckpointManager, abstract_params, step: int | None = None):
  """(step, params) from a best/ checkpoint, or the params alone of a resume checkpoint (no optimizer
  moments are read). `step` defaults to the best step (best/) or the latest."""
  if step is None:
    step = mngr.best_step() if mngr.best_step() is not None else mngr.latest_step()
  if step is None:
    raise FileNotFoundError(f"no checkpoint in {mngr.directory}")
  if (storage.path(mngr.directory) / str(step) / "params").exists():
    out = mngr.restore(step, args=ocp.args.Composite(params=ocp.args.StandardRestore(abstract_params)))
    return step, out["params"]
  target = {"params": abstract_params}
  restore_args = ocp.checkpoint_utils.construct_restore_args(target)
  out = mngr.restore(step, args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(item=target, restore_args=restore_args, partial_restore=True)))
  return step, out["state"]["params"]


def finalised_steps(directory) -> list[int]:
  """Steps of the finalised checkpoints in a manager directory ([] when absent), read as Orbax reads them."""
  return ocp.path.step.checkpoint_steps(storage.path(directory))


def _has_steps(d) -> bool:
  return d.is_dir() and any(p.name.isdigit() for p in d.iterdir())


def find_checkpoint_dir(workdir):
  """`workdir` may be a workdir (uses best/, else ckpt/) or a manager directory itself."""
  root = storage.path(workdir)
  for d in (root / "best", root / "ckpt", root):
    if _has_steps(d):
      return d
  raise FileNotFoundError(f"no Orbax checkpoint under {os.fspath(workdir)!r} (looked in best/, ckpt/ and the "
                          "folder itself)")


def restore_numpy(workdir, *, sub: str = "ckpt", step: int | None = None):
  """(step, tree of numpy arrays) of workdir/<sub> (latest step by default), read onto one device whatever mesh
  or number of processes wrote it: the train state from ckpt/, the parameters from best/. None when there is
  no checkpoint. For comparing runs (tests, benchmarks.chaos), not for resuming."""
  mngr = make_manager(storage.path(workdir) / sub, keep=100)
  try:
    step = mngr.latest_step() if step is None else step
    if step is None:
      return None
    item = "params" if sub == "best" else "state"
    meta = ocp.StandardCheckpointer().metadata(os.path.join(mngr.directory, str(step), item)).item_metadata
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one), meta.tree)
    out = mngr.restore(step, args=ocp.args.Composite(**{item: ocp.args.StandardRestore(abstract)}))
    return step, jax.tree.map(np.asarray, out[item])
  finally:
    mngr.close()
