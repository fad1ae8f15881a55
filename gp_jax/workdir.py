"""What a workdir holds besides checkpoints, so that predict and resume need nothing else:

  config.json     the training config
  types.json      entity types, in head order
  tokenizer/      the tokenizer (scratch vocabulary, or the pretrained tokenizer's files)
  encoder.json    bert: the HF config.json of the encoder (predict never reopens `model.pretrained`)
  pretrained.json bert: which encoder the run started from, as resolved (hub: {repo_id, revision, commit});
                  a resumed run compares this, not the string typed (`org/name` and `org/name@<its commit>`
                  resume each other, another commit does not). Written with the first run files, never rewritten.
  results.json    written by training: status (finished | preempted | failed), figures
  run.lock        gp_jax.main's flock on a local workdir while it runs (gp_jax/lease.py); the file stays after
  threshold.json  `tune_threshold`: the dev-tuned decision threshold of best/ (gp_jax/threshold.py)
"""

from __future__ import annotations

import json
import os
import tempfile

import ml_collections

from gp_jax import storage
from gp_jax.data import tokenize
from gp_jax.models import locate

PRETRAINED = "pretrained.json"


def save_run_files(workdir, *, config_json: str, types, tokenizer, encoder_config: dict | None) -> None:
  root = storage.path(workdir)
  first = not (root / "config.json").exists()
  if first and encoder_config is not None:
    storage.write_json(root / PRETRAINED, locate.source(json.loads(config_json)["model"]["pretrained"]), indent=1)
  storage.write_text(root / "config.json", config_json)
  storage.write_json(root / "types.json", list(types))
  if encoder_config is not None:
    storage.write_json(root / "encoder.json", encoder_config, indent=1)
  with tempfile.TemporaryDirectory(prefix="gp_jax_tok_") as tmp:
    tokenizer.save(tmp)
    storage.upload_dir(tmp, root / "tokenizer")


def has_tokenizer(workdir) -> bool:
  return (storage.path(workdir) / "tokenizer").is_dir()


def load_tokenizer(workdir):
  src = storage.path(workdir) / "tokenizer"
  if not storage.is_url(os.fspath(src)):
    return tokenize.load_tokenizer(src)
  with tempfile.TemporaryDirectory(prefix="gp_jax_tok_") as tmp:  # loaded into memory; the copy is not kept
    return tokenize.load_tokenizer(storage.download_dir(src, tmp))


def load_config(workdir) -> ml_collections.ConfigDict:
  return ml_collections.ConfigDict(storage.read_json(storage.path(workdir) / "config.json"))


def load_types(workdir) -> list[str]:
  return storage.read_json(storage.path(workdir) / "types.json")


def load_encoder_config(workdir) -> dict | None:
  p = storage.path(workdir) / "encoder.json"
  return json.loads(p.read_text()) if p.exists() else None


def load_pretrained_source(workdir) -> dict | None:
  p = storage.path(workdir) / PRETRAINED
  return json.loads(p.read_text()) if p.exists() else None


# Config sections whose change makes a resumed run another model; where files live may differ between hosts.
COMPARED_SECTIONS = ("model", "data", "tokenizer", "optimizer", "loss", "adversarial")
LOCATION_KEYS = ("data.manual_dir", "data.tfds_dir")


def flatten(d, prefix=""):
  """{"model": {"head": "crf"}} -> {"model.head": "crf"} (tuples become lists, as in config.json)."""
  out = {}
  for k, v in d.items():
    key = f"{prefix}{k}"
    if isinstance(v, dict):
      out.update(flatten(v, key + "."))
    else:
      out[key] = list(v) if isinstance(v, tuple) else v
  return out


# Keys renamed since a workdir may have been written: old name -> new name.
RENAMED_KEYS = {"optimizer.update": "optimizer.update_impl"}


def config_changes(old: dict, new: dict, defaults: dict | None = None, *, ignore=()) -> list[str]:
  """Keys of model/data/tokenizer/optimizer/loss (but not `ignore`) whose values differ, as 'key: old -> new'.

  A key missing from `old` (added to the code after that run was written) counts as its value in
  `defaults`, the base config, whose defaults keep earlier behaviour."""
  compared = lambda d: {RENAMED_KEYS.get(k, k): v for k, v in flatten(d).items()  # noqa: E731
                        if k.split(".")[0] in COMPARED_SECTIONS and k not in LOCATION_KEYS and k not in ignore}
  a, b = compared(old), compared(new)
  a = {**{k: v for k, v in compared(defaults or {}).items() if k in b}, **a}
  return [f"{k}: {a.get(k, '<absent>')!r} -> {b.get(k, '<absent>')!r}" for k in sorted(set(a) | set(b))
          if a.get(k) != b.get(k)]


def resume_changes(workdir, old: dict, new: dict, defaults: dict | None = None) -> list[str]:
  """`config_changes` of resuming `workdir` (config `old`) with config `new`. When the workdir records its
  encoder (pretrained.json), `model.pretrained` is compared by what it resolves to, not as typed."""
  recorded = load_pretrained_source(workdir)
  if recorded is None or new.get("model", {}).get("encoder") != "bert":
    return config_changes(old, new, defaults)
  changes = config_changes(old, new, defaults, ignore=("model.pretrained",))
  current = locate.source(new["model"]["pretrained"])
  if not locate.same_source(recorded, current):
    changes.append(f"model.pretrained: {locate.describe(recorded)!r} -> {locate.describe(current)!r}")
  return sorted(changes)
