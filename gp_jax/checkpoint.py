"""A thin Orbax wrapper.

Layout under a workdir:
  ckpt/<step>/   last `keep` checkpoints, for resuming: state (params, optimizer, step, rng),
                 data (iterator state, JSON), config (JSON)
  best/<step>/   the single best checkpoint by dev F1 (same items), for evaluation and predict

Resume order (`train.py`): a checkpoint in workdir/ckpt, then `config.init_from` (params only),
then a fresh init.
"""

from __future__ import annotations

import json
import logging
import os

import jax
import orbax.checkpoint as ocp

log = logging.getLogger(__name__)


def make_manager(directory: str, *, keep: int, best: bool = False) -> ocp.CheckpointManager:
  """Async saves on one process. With several, saves block and each manager gets its own barrier
  prefix: two managers' async barriers otherwise collide ("Barrier _async_write_complete.N is
  already ongoing")."""
  multi = jax.process_count() > 1
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep,
      best_fn=(lambda m: m["dev_f1"]) if best else None,
      best_mode="max",
      keep_checkpoints_without_metrics=not best,
      create=True,
      enable_async_checkpointing=not multi,
      multiprocessing_options=ocp.options.MultiprocessingOptions(
          barrier_sync_key_prefix=("best" if best else "ckpt") + "_" + os.path.basename(os.path.normpath(directory))),
  )
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(mngr: ocp.CheckpointManager, step: int, *, state, data_state: dict, config_json: str, metrics=None,
         force: bool = True) -> bool:
  return mngr.save(
      step,
      args=ocp.args.Composite(
          state=ocp.args.StandardSave(state),
          data=ocp.args.JsonSave(data_state),
          config=ocp.args.JsonSave(json.loads(config_json)),
      ),
      metrics=metrics,
      force=force,
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


def find_checkpoint_dir(path: str) -> str:
  """`path` may be a workdir (uses best/, else ckpt/) or a manager directory itself."""
  for sub in ("best", "ckpt"):
    d = os.path.join(path, sub)
    if os.path.isdir(d) and any(n.isdigit() for n in os.listdir(d)):
      return d
  if os.path.isdir(path) and any(n.isdigit() for n in os.listdir(path)):
    return path
  raise FileNotFoundError(f"no Orbax checkpoint under {path!r} (looked in best/, ckpt/ and the folder itself)")
