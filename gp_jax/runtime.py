"""Process-level settings, applied once at process start (`gp_jax.main`, benchmarks): malloc, the CPU threefry
lowering, the persistent compilation cache, the compile clock, and SIGTERM and SIGINT (Ctrl-C) handling.

- malloc: XLA:CPU mallocs and frees every step's buffers; glibc's mmap threshold, trimming and per-thread arenas
  make each step re-map and re-fault them, so `configure()` turns all three off (GP_JAX_MALLOC=0 leaves malloc
  alone). The price is heap fragmentation around multi-GiB buffers: long documents should use `loss.block_size`.
- threefry on CPU: JAX's CPU lowering is a rolled loop XLA:CPU runs as separate kernels; `configure()` registers the
  unrolled lowering other backends use (the same bits, one fused kernel; GP_JAX_THREEFRY=rolled keeps JAX's).
- compilation cache: `configure_compilation_cache(config.compilation_cache)`; "auto" is $GP_JAX_COMPILATION_CACHE,
  else $JAX_COMPILATION_CACHE_DIR, else $XDG_CACHE_HOME/gp_jax/jax_cache; "off", "", "0", "false" or "none" turn it
  and XLA's caches off; anything else is the folder. Entries are written by rename, so sweep workers can share it.
- `compile_seconds()` / `process_seconds()` give the `first step after N s (compile M s)` line.
- dropout bits: `model.dropout_bits` (factory.resolve_dropout_bits); `dropout_bits()` is the fallback for a model
  built without the config.
- signals (one process): in the training loop SIGTERM and Ctrl-C save a checkpoint at the step and stop
  (`Preemption`); elsewhere, and at a second Ctrl-C, Ctrl-C stops at once (`stop_at_once_on_sigint`, `stop_now`):
  results.json says "preempted" either way, and `gp_jax.main` exits 130 with one line.

Measurements behind these choices: docs/design.md ("Process settings") and docs/benchmarks/compile_cache.md.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import importlib.util
import logging
import os
import platform
import re
import signal
import sys
import threading
import time
import warnings

from gp_jax import jax_private

# Deferred imports below: jax (and orbax, which imports it) only inside functions. launch.accelerators imports this
# module before launch.compile sets JAX_PLATFORMS, which jax reads when it is imported.

log = logging.getLogger(__name__)

# mallopt parameters (glibc malloc.h).
M_TRIM_THRESHOLD = -1
M_TOP_PAD = -2
M_MMAP_THRESHOLD = -3
M_MMAP_MAX = -4
M_ARENA_MAX = -8

_configured: dict | None = None


def _glibc():
  if platform.system() != "Linux":
    return None
  try:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    libc.gnu_get_libc_version  # pylint: disable=pointless-statement
  except (OSError, AttributeError):
    return None  # musl or no libc we know
  return libc


def malloc_settings() -> dict[str, int]:
  """The mallopt values `configure` applies: no mmap, no trimming, one arena."""
  return {"M_MMAP_MAX": 0, "M_TRIM_THRESHOLD": 2 ** 31 - 1, "M_TOP_PAD": 64 << 20, "M_ARENA_MAX": 1}


def configure_malloc() -> dict[str, int]:
  """Applies `malloc_settings()` through mallopt; returns what was set ({} if not glibc or disabled)."""
  if os.environ.get("GP_JAX_MALLOC", "1").lower() in ("0", "false", "off", "no"):
    return {}
  libc = _glibc()
  if libc is None:
    return {}
  libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
  libc.mallopt.restype = ctypes.c_int
  done = {}
  for name, value in malloc_settings().items():
    if libc.mallopt(globals()[name], value) == 1:
      done[name] = value
    else:
      log.warning("mallopt(%s, %d) failed", name, value)
  return done


def set_threefry_lowering(kind: str) -> bool:
  """Registers JAX's "unrolled" threefry2x32 lowering (other backends') or its "rolled" one (CPU default) for
  CPU; applies to programs compiled afterwards. False when this JAX lacks the internals."""
  if kind not in ("unrolled", "rolled"):
    raise ValueError(f"threefry lowering must be 'unrolled' or 'rolled', got {kind!r}")
  rules = jax_private.threefry_cpu_lowerings()
  if rules is None:
    log.warning("threefry: keeping JAX's CPU lowering (this jax lacks the internals)")
    return False
  from jax.interpreters import mlir  # pylint: disable=g-import-not-at-top

  primitive, unrolled, rolled = rules
  mlir.register_lowering(primitive, unrolled if kind == "unrolled" else rolled, platform="cpu")
  return True


def configure_threefry() -> str:
  """The unrolled lowering unless GP_JAX_THREEFRY=rolled; returns the lowering in use."""
  if os.environ.get("GP_JAX_THREEFRY", "unrolled").lower() == "rolled":
    return "rolled"
  return "unrolled" if set_threefry_lowering("unrolled") else "rolled"


DROPOUT_BITS = ("auto", "hash", "threefry")
DROPOUT_BITS_ENV = "GP_JAX_DROPOUT_BITS"


def resolve_dropout_bits(name: str, platform: str) -> str:
  """"hash" or "threefry" for a program compiled for `platform`: $GP_JAX_DROPOUT_BITS when set overrides `name`
  (`model.dropout_bits`); "auto" is threefry on tpu, hash elsewhere (XLA fuses the integer hash into the ops around
  it instead of running threefry kernels; docs/design.md, "Process settings"). ValueError naming the source of a bad
  value."""
  env = os.environ.get(DROPOUT_BITS_ENV, "").strip().lower()
  source, choice = (DROPOUT_BITS_ENV, env) if env and env != "auto" else ("model.dropout_bits", str(name).strip().lower())
  if choice not in DROPOUT_BITS:
    raise ValueError(f"{source} must be one of {', '.join(DROPOUT_BITS)}; got {choice!r}")
  if choice != "auto":
    return choice
  return "threefry" if platform == "tpu" else "hash"


def dropout_bits() -> str:
  """`resolve_dropout_bits` for a model built without the config, on this machine's backend (at trace time)."""
  import jax  # pylint: disable=g-import-not-at-top

  return resolve_dropout_bits("auto", jax.default_backend())


@contextlib.contextmanager
def environ(values: dict):
  """`values` in os.environ inside the block; each variable back to what it was (or unset) after it."""
  before = {k: os.environ.get(k) for k in values}
  os.environ.update(values)
  try:
    yield
  finally:
    for k, old in before.items():
      if old is None:
        os.environ.pop(k, None)
      else:
        os.environ[k] = old


def configure_platforms() -> str | None:
  """libtpu installed beside jax on a machine with no TPU (the `aot` extra, for `launch.compile`): JAX would still
  start its TPU backend in every process, printing libtpu's start-up warnings and holding /tmp/libtpu_lockfile for
  the process's life. Such a process computes on the CPU, so JAX is told so (and its subprocesses, through
  JAX_PLATFORMS). Nothing changes when JAX_PLATFORMS is set, libtpu is absent, a TPU or NVIDIA GPU is present, or
  this jax cannot tell. Returns the platforms set, or None."""
  if os.environ.get("JAX_PLATFORMS") is not None or importlib.util.find_spec("libtpu") is None:
    return None
  if jax_private.accelerators_present() is not False:  # present, or this jax cannot tell
    return None
  import jax  # pylint: disable=g-import-not-at-top

  jax.config.update("jax_platforms", "cpu")
  os.environ["JAX_PLATFORMS"] = "cpu"
  return "cpu"


def configure() -> dict:
  """Process-level settings; idempotent. Call before JAX allocates or compiles anything."""
  global _configured
  if _configured is None:
    _configured = {"platforms": configure_platforms(), "malloc": configure_malloc(), "threefry": configure_threefry(),
                   "compile_clock": start_compile_clock()}
  return _configured


# ----------------------------------------------------------------------------- start-up time

_IMPORTED_AT = time.time()
COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",)
_compile = {"seconds": 0.0, "count": 0, "listening": False}
_compile_lock = threading.Lock()


def process_seconds() -> float:
  """Seconds since this process started (/proc/self/stat), else since this module was imported."""
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  except (OSError, ValueError, IndexError):
    return time.time() - _IMPORTED_AT


def _on_duration(event: str, duration: float, **_) -> None:
  if event in COMPILE_EVENTS:
    with _compile_lock:
      _compile["seconds"] += duration
      _compile["count"] += 1


def start_compile_clock() -> bool:
  """Listens to jax's compile-duration events (once per process); False when this jax has no such hook."""
  if _compile["listening"]:
    return True
  try:
    import jax.monitoring  # pylint: disable=g-import-not-at-top

    jax.monitoring.register_event_duration_secs_listener(_on_duration)
  except (ImportError, AttributeError):
    return False
  _compile["listening"] = True
  return True


def compile_seconds() -> float:
  """Seconds of backend compilation in this process since `start_compile_clock` (persistent-cache hits cost 0)."""
  with _compile_lock:
    return _compile["seconds"]


_runs = {"count": 0, "start": 0.0, "compile_at_start": 0.0}


def mark_run_start() -> None:
  """A training run starts in this process (a sweep worker trains several, one after another)."""
  _runs.update(count=_runs["count"] + 1, start=time.time(), compile_at_start=compile_seconds())


def first_step_line() -> str:
  """`first step after N s (compile M s)`: N from process start; for a later run in the same process, from that
  run's start, with the compile seconds since then."""
  if _runs["count"] <= 1:
    return f"first step after {process_seconds():.1f} s (compile {compile_seconds():.1f} s)"
  return (f"first step after {time.time() - _runs['start']:.1f} s (compile "
          f"{compile_seconds() - _runs['compile_at_start']:.1f} s; run {_runs['count']} of this process, timed "
          f"from its start)")


CACHE_ENV = "GP_JAX_COMPILATION_CACHE"
CACHE_OFF = ("", "off", "0", "false", "none")
MIN_COMPILE_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Persist programs that took at least this long to compile: every train/eval step a run compiles ahead, on hosts that
# compile far faster than the project's CPU machine too, but not the eager ops (docs/benchmarks/compile_cache.md).
CACHE_MIN_COMPILE_SECONDS = 0.1
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


EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a process that Ctrl-C stopped
_stop_callbacks: list = []


def _exit_at_once(signum, frame) -> None:
  os._exit(EXIT_INTERRUPTED)


def stop_now(name: str, message: str) -> None:
  """Ends the process at once: each `on_stop` callback (newest first) with the signal's name, then `message` as one
  line on stderr, then exit 130. Threads (compiles, a save in flight) are not waited for; a Ctrl-C meanwhile ends
  the process without the rest."""
  try:
    signal.signal(signal.SIGINT, _exit_at_once)
  except ValueError:  # not the main thread
    pass
  for callback in reversed(_stop_callbacks):
    try:
      callback(name)
    except Exception as e:  # pylint: disable=broad-except
      message += f" ({type(e).__name__} while recording it: {e})"
  for stream in (sys.stdout, sys.stderr, *(getattr(h, "stream", None) for h in logging.getLogger().handlers)):
    try:
      stream.flush()
    except Exception:  # pylint: disable=broad-except  # a write this handler interrupted, or no stream
      pass
  os.write(2, f"\ninterrupted: {message}\n".encode())
  os._exit(EXIT_INTERRUPTED)


def _sigint_at_once(signum, frame) -> None:
  stop_now("SIGINT", "Ctrl-C outside the training steps; stopped at once. Rerun the same command to continue from "
                     "the last checkpoint, if any")


def stop_at_once_on_sigint() -> None:
  """`gp_jax.main` with one process: Ctrl-C stops at once (`stop_now`) wherever `Preemption` does not turn it into a
  checkpoint: before the first step (data, compile) and after the loop (final evaluation)."""
  signal.signal(signal.SIGINT, _sigint_at_once)


@contextlib.contextmanager
def on_stop(callback):
  """`callback(signal_name)` runs if `stop_now` ends the process inside the block (train.py records the stop in
  results.json)."""
  _stop_callbacks.append(callback)
  try:
    yield
  finally:
    _stop_callbacks.remove(callback)


class Preemption:
  """Whether to save and stop now, asked after every step (negligible cost), agreed by every process.

  With `jax.distributed` on, the coordination service's preemption notifier catches SIGTERM (on any process, or
  the platform's maintenance notice) and `orbax.checkpoint.multihost.reached_preemption(step)` turns it into one
  sync point: every process answers True at the same step. No Python SIGTERM handler is installed then: it would
  replace the service's handler and the notice would never reach the other processes.
  With one process, SIGTERM and SIGINT (Ctrl-C) set a flag that the next step reads (`signal_name` says which); a
  second Ctrl-C stops at once (`stop_now`).
  """

  def __init__(self):
    self.requested = False
    self.signal_name: str | None = None
    self._old: dict = {}
    self._distributed = False

  def should_stop(self, step: int) -> bool:
    if not self._distributed:
      return self.requested
    from orbax.checkpoint import multihost  # pylint: disable=g-import-not-at-top

    return bool(multihost.reached_preemption(step))

  def __enter__(self):
    import jax  # pylint: disable=g-import-not-at-top

    self._distributed = jax.process_count() > 1
    if self._distributed:
      return self

    def handler(signum, frame):
      if self.requested and signum == signal.SIGINT:
        stop_now("SIGINT", "a second Ctrl-C; stopped at once, without the checkpoint of this step. Rerun the same "
                           "command to resume from the last checkpoint")
      self.requested = True
      self.signal_name = self.signal_name or signal.Signals(signum).name

    for sig in (signal.SIGTERM, signal.SIGINT):
      try:
        self._old[sig] = signal.signal(sig, handler)
      except ValueError:  # not the main thread
        pass
    return self

  def __exit__(self, *exc):
    for sig, old in self._old.items():
      signal.signal(sig, signal.SIG_DFL if old is None else old)  # None: a handler not set from Python
    self._old = {}
