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
"""

from __future__ import annotations

import functools
import json
import logging
import os

import jax
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from gp_jax import storage
from gp_jax.errors import UserError

log = logging.getLogger(__name__)

RETRIES_ENV = "GP_JAX_GCS_RETRIES"
_retries_set: str | None = None


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
  return ocp.CheckpointManager(directory, options=options)


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
