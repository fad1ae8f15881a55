"""The persistent compilation cache (`gp_jax.runtime` re-exports these names): `configure_compilation_cache(
config.compilation_cache)`; "auto" is $GP_JAX_COMPILATION_CACHE, else $JAX_COMPILATION_CACHE_DIR, else
$XDG_CACHE_HOME/gp_jax/jax_cache; "off", "", "0", "false" or "none" turn it and XLA's caches off; anything else is
the folder. Entries are written by rename, so sweep workers can share it; an unreadable entry is one log line and a
compile, never a crash.

Measurements behind these choices: docs/benchmarks/compile_cache.md.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import warnings

from gp_jax import jax_private

# Deferred import below: jax, inside the functions (launch.accelerators imports gp_jax.runtime, and so this module,
# before launch.compile sets JAX_PLATFORMS, which jax reads when it is imported).

log = logging.getLogger(__name__)

CACHE_ENV = "GP_JAX_COMPILATION_CACHE"
CACHE_OFF = ("", "off", "0", "false", "none")
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Persist every program, the eager ops of parameter init too: each costs a fresh process ~25 ms to compile and ~1 ms
# to read back (docs/benchmarks/compile_cache.md: a warm msra_scratch:quick run 0.8 s sooner than at 0.1 s).
CACHE_MIN_COMPILE_SECONDS = 0.0
# XLA caches kept beside jax's entries: the per-fusion autotune results only, one file per fusion written by atomic
# rename. Not the kernel cache file: one file shared by every program, rewritten whole on each compile, and a compile
# fails outright on a damaged copy (docs/benchmarks/compile_cache.md). Names only xla_gpu_* options: no-op on CPU/TPU.
XLA_CACHES = "xla_gpu_per_fusion_autotune_cache_dir"
XLA_CACHES_ENV = "JAX_PERSISTENT_CACHE_ENABLE_XLA_CACHES"
_CACHE_WARNING = re.compile(r"Error (reading|writing) persistent compilation cache entry for '([^']*)': (.*)", re.S)
_cache_reads = threading.local()  # the last entry key each compiling thread read, to name it in a warning
_cache_guards = {"class": None, "showwarning": None}


def user_cache_dir(*parts: str) -> str:
  """$XDG_CACHE_HOME/gp_jax/PARTS (~/.cache by default)."""
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(base, "gp_jax", *parts)


def compilation_cache_dir(setting: str = "auto") -> str | None:
  """The persistent compilation cache folder `setting` names (see the module docstring), or None when off."""
  setting = str(setting).strip()
  if setting.lower() == "auto":
    setting = os.environ.get(CACHE_ENV, "auto").strip() or "off"
    if setting.lower() == "auto" and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
      return os.environ["JAX_COMPILATION_CACHE_DIR"]
    if setting.lower() == "auto":
      return user_cache_dir("jax_cache")
  return None if setting.lower() in CACHE_OFF else os.path.expanduser(setting)


def configure_compilation_cache(setting: str = "auto") -> str | None:
  """Points jax's persistent compilation cache at `compilation_cache_dir(setting)`, with the settings of the module
  docstring, or turns it and the XLA caches off; returns the folder. Programs compiled afterwards are cached."""
  import jax  # pylint: disable=g-import-not-at-top

  path = compilation_cache_dir(setting)
  if path is not None:
    try:
      os.makedirs(path, exist_ok=True)
    except OSError as e:
      log.warning("compilation cache off: cannot create %s (%s)", path, e)
      path = None
  atomic = _atomic_cache_class() if path is not None else None
  _reset_jax_cache_if_stale(path, atomic)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_enable_compilation_cache", path is not None)
  jax.config.update("jax_raise_persistent_cache_errors", False)  # a bad entry is a miss, never a crash
  if path is None:
    jax.config.update("jax_persistent_cache_enable_xla_caches", "none")
  else:
    if XLA_CACHES_ENV not in os.environ:
      jax.config.update("jax_persistent_cache_enable_xla_caches", XLA_CACHES)
    if MIN_COMPILE_TIME_ENV not in os.environ:
      jax.config.update("jax_persistent_cache_min_compile_time_secs", CACHE_MIN_COMPILE_SECONDS)
    _condense_cache_warnings()
  return path


def _atomic_cache_class():
  """Makes jax's file cache write each entry to a private temporary file and rename it into place: jax writes the entry
  file in place, so a process reading it meanwhile sees a prefix, and two processes writing it at once can leave a mix
  that every later run fails to read and never rewrites (jax skips existing files). A rename also replaces an entry
  that failed to read, so a damaged entry is compiled and written once, then read again. Returns the class, or None
  when this jax lacks the internals."""
  if _cache_guards["class"] is not None:
    return _cache_guards["class"] or None
  jax_cc, lru = jax_private.compilation_cache(), jax_private.lru_cache_base()
  if jax_cc is None or lru is None:
    log.warning("compilation cache: keeping jax's in-place entry writes (this jax lacks the internals)")
    _cache_guards["class"] = False
    return None
  base, suffix = lru

  class AtomicLRUCache(base):
    """jax's LRUCache, with entries replaced by rename (local folders, no size limit; otherwise jax's own writes)."""

    def get(self, key):
      _cache_reads.key = key
      return super().get(key)

    def put(self, key, value):
      folder = str(self.path)
      if getattr(self, "eviction_enabled", True) or ("://" in folder and not folder.startswith("file://")):
        return super().put(key, value)
      final = os.path.join(folder.removeprefix("file://"), f"{key}{suffix}")
      tmp = f"{final}.tmp.{os.getpid()}.{threading.get_ident()}"
      try:
        with open(tmp, "wb") as f:
          f.write(value)
        os.replace(tmp, final)
      finally:
        if os.path.exists(tmp):
          os.unlink(tmp)

  jax_cc.LRUCache = AtomicLRUCache
  _cache_guards["class"] = AtomicLRUCache
  return AtomicLRUCache


def _reset_jax_cache_if_stale(path: str | None, atomic) -> None:
  """jax opens its cache once per process and then ignores the folder setting: a sweep worker's next run with another
  folder, with the cache off, or a cache opened before `_atomic_cache_class`, starts from a closed cache."""
  import jax  # pylint: disable=g-import-not-at-top

  jax_cc = jax_private.compilation_cache()
  try:
    opened = jax_cc._cache  # pylint: disable=protected-access
    checked = jax_cc._cache_checked  # pylint: disable=protected-access
  except AttributeError:  # None too
    return
  changed = (jax.config.jax_compilation_cache_dir, jax.config.jax_enable_compilation_cache) != (path, path is not None)
  foreign = opened is not None and atomic is not None and not isinstance(opened, atomic)
  if (opened is not None or checked) and (changed or foreign):
    jax_cc.reset_cache()


def _condense_cache_warnings() -> None:
  """Shows each unreadable (or unwritable) cache entry as one log line naming the entry file, every time it happens.

  jax reports it with `warnings.warn` and goes on compiling; Python prints that as two lines (message and source line),
  an XLA error inside can span more, and `-W error` would turn it into a crash. Other warnings go to the
  `warnings.showwarning` that was in place."""
  warnings.filterwarnings("always", message=r"Error (reading|writing) persistent compilation cache entry")
  if warnings.showwarning is _show_cache_warning:
    return
  _cache_guards["showwarning"] = warnings.showwarning
  warnings.showwarning = _show_cache_warning


def _show_cache_warning(message, category, filename, lineno, file=None, line=None):
  m = _CACHE_WARNING.match(str(message))
  if m is None:
    return _cache_guards["showwarning"](message, category, filename, lineno, file, line)
  action, name, error = m.groups()
  error = " ".join(error.split())[:200]
  if action == "writing":
    log.warning("compilation cache: could not write the entry for %s (%s)", name, error)
    return None
  key = getattr(_cache_reads, "key", None)
  entry = f"{key}-cache" if key and (key == name or key.startswith(f"{name}-")) else name
  log.warning("compilation cache: skipped unreadable entry %s (%s); compiling it again", entry, error)
  return None
