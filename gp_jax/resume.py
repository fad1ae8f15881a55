"""How a run continues the one its workdir holds: every resume decision, in the order a run meets them.

  setup  `check_workdir`: the workdir's config.json is an earlier run. `model.dtype=auto` takes that run's dtype
         (a float32 run stays float32 on any platform); a changed model, data, tokenizer, optimizer, loss or
         adversarial key refuses to resume unless `allow_config_change`.
  data   `saved_tokenizer`: the workdir's tokenizer wins over a new one, so text is read exactly as before; a new
         workdir with `init_from` takes that run's tokenizer (its embeddings were trained on that vocabulary).
  state  `open_checkpoints`: the latest step in ckpt/ decides the rest. Resuming, the encoder is rebuilt from
         encoder.json without its pretrained weights (the checkpoint has them); `initial_state` restores the
         train state and the iterator's position. Otherwise `init_from`'s parameters (a run of another model is
         refused, naming what differs: `init_from_params`), else a fresh init.
  loop   a run whose dev F1 had already stopped improving for `early_stop_patience` epochs stays stopped
         (`train.train_loop`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os

import jax
import orbax.checkpoint as ocp

from gp_jax import checkpoint as ckpt_lib
from gp_jax import factory, storage
from gp_jax import state as state_lib
from gp_jax import workdir as wd
from gp_jax.configs import base as base_config
from gp_jax.errors import UserError
from gp_jax.models.taggers import TAGGERS

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


def saved_tokenizer(root, init_from: str = "", encoder: str = ""):
  """Data: the tokenizer the workdir holds; in a new workdir, `init_from`'s run's when it has this `encoder` (a
  scratch vocabulary built from this run's data would give its embedding rows other characters, silently when the
  sizes happen to agree; a run of another encoder is refused when its parameters are read); None: build one from
  the training data."""
  if wd.has_tokenizer(root):
    return wd.load_tokenizer(root)
  if not init_from:
    return None
  if not storage.path(init_from).exists():
    raise UserError(f"init_from={init_from}: no such folder: expected the workdir of an earlier run, or its best/ "
                    "or ckpt/ folder")
  src = run_root(init_from)
  if src is not None and encoder and wd.flatten(storage.read_json(src / "config.json")).get("model.encoder") != encoder:
    return None
  if src is None or not wd.has_tokenizer(src):
    log.warning("init_from=%s holds no tokenizer/: this run builds its own from its training data, which must be "
                "the vocabulary init_from's embeddings were trained on", init_from)
    return None
  log.info("Tokenizer: init_from's (%s), the vocabulary its embeddings were trained on", src / "tokenizer")
  return wd.load_tokenizer(src)


def run_root(init_from):
  """The run folder `init_from` names (a workdir, or its best/ or ckpt/ folder): the one holding config.json; None
  for a checkpoint folder outside a workdir."""
  root = storage.path(init_from)
  for d in (root, root.parent) if root.name in ("best", "ckpt") else (root,):
    if (d / "config.json").exists():
      return d
  return None


# The config keys that fix a model's parameter shapes: init_from's run and this one must agree on them (the scratch
# encoder's own only for it).
SCRATCH_KEYS = ("model.embed_dim", "model.bigram_dim", "model.hidden_size", "model.num_layers", "model.block",
                "model.kernel_size", "model.num_attn_layers")
SHAPE_KEYS = ("task", "model.encoder", "model.pretrained", "model.head", "model.tag_scheme", "model.head_size",
              *SCRATCH_KEYS)
ENCODER_KEYS = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")


def model_differences(setup, config, init_from) -> list[str]:
  """What differs between `init_from`'s run and this model, as "what theirs -> ours": the SHAPE_KEYS of the two
  configs, the number of types, the tokenizer's vocabulary, a bert encoder's sizes. [] when init_from holds no
  config.json."""
  src = run_root(init_from)
  if src is None:
    return []
  old, new = wd.flatten(storage.read_json(src / "config.json")), wd.flatten(json.loads(config.to_json_best_effort()))
  defaults = wd.flatten(json.loads(base_config.get_config().to_json_best_effort()))
  scratch = setup.spec.encoder == "scratch"
  tagger = any(c.get("model.head") in TAGGERS for c in (old, new))
  out = []
  for key in SHAPE_KEYS:
    if ((key in SCRATCH_KEYS and not scratch) or (key == "model.pretrained" and scratch)
        or (key == "model.tag_scheme" and not tagger)):
      continue
    a, b = old.get(key, defaults.get(key)), new.get(key, defaults.get(key))
    if a != b:
      out.append(f"{key} {a!r} -> {b!r}")
  theirs = wd.load_types(src) if (src / "types.json").exists() else None
  if theirs is not None and len(theirs) != len(setup.types):
    out.append(f"types {len(theirs)} -> {len(setup.types)}")
  if wd.has_tokenizer(src):
    tokenizer = wd.load_tokenizer(src)
    for name in ("vocab_size", "bigram_vocab_size"):
      a, b = getattr(tokenizer, name, None), getattr(setup.tokenizer, name, None)
      if a != b:
        out.append(f"tokenizer {name} {a} -> {b}")
  encoder = wd.load_encoder_config(src) or {}
  for name in ENCODER_KEYS if encoder and setup.encoder_config else ():
    if encoder.get(name) != setup.encoder_config.get(name):
      out.append(f"encoder {name} {encoder.get(name)} -> {setup.encoder_config.get(name)}")
  return out


def _shapes(tree) -> dict[str, tuple]:
  return {".".join(str(getattr(k, "key", k)) for k in path): tuple(leaf.shape)
          for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]}


def stored_shapes(directory, step: int) -> dict[str, tuple] | None:
  """{parameter path: shape} of the checkpoint `directory`/`step` (best/: its params; ckpt/: its state's), read from
  its metadata, no array read; None when the metadata cannot be read (the restore then says what it finds)."""
  d = storage.path(directory) / str(step)
  item = "params" if (d / "params").exists() else "state"
  try:
    tree = ocp.StandardCheckpointer().metadata(os.fspath(d / item)).item_metadata.tree
  except Exception:  # pylint: disable=broad-except  (a layout this reader does not know: leave it to the restore)
    return None
  return _shapes(tree if item == "params" else tree.get("params", {}))


def shape_differences(theirs: dict, ours: dict, *, limit: int = 3) -> list[str]:
  """The first `limit` parameters that differ, as "path theirs -> ours" (a shape, or absent), then how many more."""
  paths = sorted(p for p in set(theirs) | set(ours) if theirs.get(p) != ours.get(p))
  out = [f"{p} {theirs.get(p, 'absent')} -> {ours.get(p, 'absent')}" for p in paths[:limit]]
  return out + ([f"{len(paths) - limit} more"] if len(paths) > limit else [])


def init_from_params(setup, init_from: str, config):
  """`init_from`'s parameters for `setup`'s model (its best/ checkpoint, else its latest); a UserError when there is
  none, or when that run's model is another one: checked on the checkpoint's metadata before any array is read (a
  restore that fails part way leaves Orbax's readers printing to stderr), naming the config keys that differ, else
  the parameters."""
  try:
    directory = ckpt_lib.find_checkpoint_dir(init_from)
  except FileNotFoundError as e:
    raise UserError(f"init_from: {e}: expected the workdir of an earlier run, or its best/ or ckpt/ folder") from None
  src = ckpt_lib.make_manager(directory, keep=1)

  def misfit(fallback: str) -> UserError:
    what = "; ".join(model_differences(setup, config, init_from)) or fallback
    return UserError(f"init_from={init_from}: that run's parameters do not fit this model ({what}); give init_from "
                     "a run of the same model, or train without it")

  try:
    step = src.best_step()
    step = src.latest_step() if step is None else step
    theirs, ours = stored_shapes(directory, step) if step is not None else None, _shapes(setup.abstract_params)
    if theirs is not None and theirs != ours:
      raise misfit("parameters " + "; ".join(shape_differences(theirs, ours)))
    try:
      src_step, params = ckpt_lib.restore_params(src, state_lib.abstract_params(setup), step)
    except ValueError as e:
      said = " ".join(str(e).split()).split(": - ")[0].split(". Truncating")[0]  # drop Orbax's trees and hints
      raise misfit(f"restoring them said: {said[:300]}") from None
  finally:
    src.close()
  log.info("Initialised parameters from %s (step %d)", src.directory, src_step)
  root = run_root(init_from)
  theirs = wd.load_types(root) if root is not None and (root / "types.json").exists() else None
  if theirs is not None and list(theirs) != list(setup.types):
    log.warning("init_from's types %s are not this run's %s: the head's row of each type starts from the row at its "
                "position there", theirs, list(setup.types))
  return params


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


def initial_state(ckpts: Checkpoints, setup, tx, params, train_it, *, seed: int, init_from: str, config):
  """(start step, train state): the latest resume checkpoint (moving `train_it` to where it was), else `init_from`'s
  parameters (the EMA, if on, starts from them too; `init_from_params`), else `params` fresh."""
  if ckpts.resuming:
    step, state, data_state = ckpt_lib.restore(ckpts.mngr, state_lib.abstract_state(setup, tx), ckpts.step)
    train_it.set_state(data_state)
    log.info("Resumed from %s at step %d", ckpts.mngr.directory, step)
    return int(step), state
  if init_from:
    params = init_from_params(setup, init_from, config)
  return 0, state_lib.init_train_state(setup, params, tx, seed=seed)
