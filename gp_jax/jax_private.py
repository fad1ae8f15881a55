"""The one place gp_jax reaches into jax's private modules (`jax._src`), for what jax has no public API for.

Each accessor imports lazily and returns None when this jax lacks the internal (its layout changes between
releases), so a caller degrades to jax's own behaviour instead of failing.
"""

from __future__ import annotations

import importlib
import logging
from types import ModuleType

log = logging.getLogger(__name__)


def _module(name: str) -> ModuleType | None:
  try:
    return importlib.import_module(name)
  except ImportError as e:
    log.debug("jax internal %s unavailable: %s", name, e)
    return None


def threefry_cpu_lowerings():
  """(threefry2x32 primitive, unrolled lowering rule, JAX's rolled CPU rule): JAX lowers threefry as a rolled loop on
  CPU and exposes neither rule publicly."""
  tf = _module("jax._src.random.threefry2x32") or _module("jax._src.prng")
  if tf is None:
    return None
  try:
    return tf.threefry2x32_p, tf._threefry2x32_lowering_rule, tf._threefry2x32_cpu_lowering_rule  # pylint: disable=protected-access
  except AttributeError:
    return None


def accelerators_present() -> bool | None:
  """Whether a TPU chip or an NVIDIA GPU is visible, without starting a backend (jax's own probe); None if unknown."""
  hw = _module("jax._src.hardware_utils")
  try:
    return bool(hw.num_available_tpu_chips_and_device_id()[0] or hw.has_visible_nvidia_gpu()) if hw else None
  except (AttributeError, OSError):
    return None


def compilation_cache() -> ModuleType | None:
  """jax's persistent compilation cache module (its cache object and reset): no public API opens or resets it."""
  return _module("jax._src.compilation_cache")


def lru_cache_base():
  """(jax's file cache class, its entry suffix), to write entries by rename; None if this jax has neither."""
  lru = _module("jax._src.lru_cache")
  try:
    return (lru.LRUCache, lru._CACHE_SUFFIX) if lru else None  # pylint: disable=protected-access
  except AttributeError:
    return None


def cudnn_fused_attention() -> ModuleType | None:
  """jax's cuDNN attention module: its `dot_product_attention` takes a dropout rate and seed, which
  `jax.nn.dot_product_attention` does not."""
  return _module("jax._src.cudnn.fused_attention_stablehlo")


def cuda_versions():
  """jaxlib's CUDA/cuDNN version probe (`cudnn_get_version`), or None."""
  lib = _module("jax._src.lib")
  return getattr(lib, "cuda_versions", None) if lib else None
