"""How a run continues the one its workdir holds: every resume decision, in the order a run meets them.

  setup  `check_workdir`: the workdir's config.json is an earlier run. `model.dtype=auto` takes that run's dtype
         (a float32 run stays float32 on any platform); a changed model, data, tokenizer, optimizer, loss or
         adversarial key refuses to resume unless `allow_config_change`.
  data   `saved_tokenizer`: the workdir's tokenizer wins over a new one, so text is read exactly as before.
  state  `open_checkpoints`: the latest step in ckpt/ decides the rest. Resuming, the encoder is rebuilt from
         encoder.json without its pretrained weights (the checkpoint has them); `initial_state` restores the
         train state and the iterator's position. Otherwise `init_from`'s parameters, else a fresh init.
  loop   a run whose dev F1 had already stopped improving for `early_stop_patience` epochs stays stopped
         (`train.train_loop`).
"""

from __future__ import annotations

import dataclasses
import json
import logging

from gp_jax import checkpoint as ckpt_lib
from gp_jax import factory, storage
from gp_jax import state as state_lib
from gp_jax import workdir as wd
from gp_jax.configs import base as base_config
from gp_jax.errors import UserError

log = logging.getLogger("gp_jax.train")


def adopt_workdir_dtype(config, saved: dict | None) -> None:
  """`model.dtype=auto` takes the workdir's own dtype when it names one (a run from before "auto" existed saved
  "float32"). Changes `config` in place."""
  old = ((saved or {}).get("model") or {}).get("dtype")
  if config.model.dtype == "auto" and old in factory.DTYPES:
    config.model.dtype = old


def check_workdir(config, root) -> None:
  """Setup: adopts the earlier run's dtype, then refuses a config that would make the resumed run another model
  (UserError naming the changed keys and the two ways on)."""
  saved_path = root / "config.json"
  saved = storage.read_json(saved_path) if saved_path.exists() else None
  adopt_workdir_dtype(config, saved)
  if saved is None or config.get("allow_config_change", False):
    return
  defaults = json.loads(base_config.get_config().to_json_best_effort())
  changes = wd.resume_changes(root, saved, json.loads(config.to_json_best_effort(sort_keys=True)), defaults)
  if changes:
    raise UserError(f"{root} holds a run of another config ({len(changes)} changed keys: {'; '.join(changes)}); "
                    "to resume it with this config anyway add --config.allow_config_change=True, or give another "
                    "--workdir")


def saved_tokenizer(root):
  """Data: the tokenizer the workdir holds, None for a new workdir."""
  return wd.load_tokenizer(root) if wd.has_tokenizer(root) else None


@dataclasses.dataclass(frozen=True)
class Checkpoints:
  """The resume (ckpt/) and best (best/) managers and the step to resume from (None: a new start)."""

  mngr: object
  best_mngr: object
  step: int | None

  @property
  def resuming(self) -> bool:
    return self.step is not None


def open_checkpoints(root, *, keep: int) -> Checkpoints:
  mngr = ckpt_lib.make_manager(root / "ckpt", keep=keep)
  best_mngr = ckpt_lib.make_manager(root / "best", keep=1, best=True)
  return Checkpoints(mngr, best_mngr, mngr.latest_step())


def encoder_config(ckpts: Checkpoints, root) -> dict | None:
  """Resuming: the encoder as the workdir recorded it (encoder.json), so `model.pretrained` is not reopened."""
  return wd.load_encoder_config(root) if ckpts.resuming else None


def initial_state(ckpts: Checkpoints, setup, tx, params, train_it, *, seed: int, init_from: str):
  """(start step, train state): the latest resume checkpoint (moving `train_it` to where it was), else `init_from`'s
  parameters (the EMA, if on, starts from them too), else `params` fresh."""
  if ckpts.resuming:
    step, state, data_state = ckpt_lib.restore(ckpts.mngr, state_lib.abstract_state(setup, tx), ckpts.step)
    train_it.set_state(data_state)
    log.info("Resumed from %s at step %d", ckpts.mngr.directory, step)
    return int(step), state
  if init_from:
    src = ckpt_lib.make_manager(ckpt_lib.find_checkpoint_dir(init_from), keep=1)
    src_step, params = ckpt_lib.restore_params(src, state_lib.abstract_params(setup))
    log.info("Initialised parameters from %s (step %d)", src.directory, src_step)
  return 0, state_lib.init_train_state(setup, params, tx, seed=seed)
