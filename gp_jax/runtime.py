"""Process-level settings, applied once at process start (`configure()`: `gp_jax.main`, predict, export, the
launcher's workers, benchmarks): platforms, quiet start-up logs, malloc, the CPU threefry lowering, the compile
clock; the persistent compilation cache (gp_jax/compile_cache.py, its names re-exported here), and SIGTERM and
SIGINT (Ctrl-C) handling.

- platforms: libtpu installed (the `aot` extra) on a machine without a TPU: JAX computes on the CPU, so libtpu never
  starts (its `E0000 ... TPU_WORKER_HOSTNAMES` errors, /tmp/libtpu_lockfile); `launch.compile` loads libtpu itself.
- start-up logs: what JAX and Orbax log at INFO that no user can act on (`Unable to initialize backend 'tpu'` where
  there is no TPU or no libtpu; Orbax's INFO records, its restore record a Python dict among them) is dropped unless
  absl's --verbosity (-v) is on the command line; their warnings and errors always show.
- malloc: XLA:CPU mallocs and frees every step's buffers; glibc's mmap threshold, trimming and per-thread arenas
  make each step re-map and re-fault them, so `configure()` turns all three off (GP_JAX_MALLOC=0 leaves malloc
  alone). The price is heap fragmentation around multi-GiB buffers: long documents should use `loss.block_size`.
- threefry on CPU: JAX's CPU lowering is a rolled loop XLA:CPU runs as separate kernels; `configure()` registers the
  unrolled lowering other backends use for draws above THREEFRY_ROLLED_MAX words (the same bits, one fused kernel;
  small draws keep the loop so that XLA does not copy them into every fusion; GP_JAX_THREEFRY=rolled keeps JAX's).
- garbage collector: tracing and lowering allocate millions of short-lived objects; at Python's default thresholds
  (700, 10, 10) the cyclic collector runs every few hundred of them and each full pass walks every object the imports
  left alive (jax, flax, orbax). `configure()` freezes what is alive then out of every pass and makes young passes
  rarer (GC_THRESHOLDS; GP_JAX_GC=0 leaves the collector alone). Cycles are still collected, a little later.
- compilation cache: `configure_compilation_cache(config.compilation_cache)` (gp_jax/compile_cache.py).
- `compile_seconds()` / `process_seconds()` give the `first step after N s (compile M s)` line.
- dropout bits: `model.dropout_bits` (factory.resolve_dropout_bits); `dropout_bits()` is the fallback for a model
  built without the config.
- signals (one process): in the training loop SIGTERM and Ctrl-C save a checkpoint at the step and stop
  (`Preemption`); elsewhere (data, compile, the final evaluation), and at a second Ctrl-C, they stop at once
  (`stop_at_once_on_signals`, `stop_now`): results.json says "preempted" either way, and `gp_jax.main` exits with
  one line, 130 after Ctrl-C, 0 after SIGTERM (as a run that saved at SIGTERM does: a launcher reads results.json).

Measurements behind these choices: docs/design.md ("Process settings") and docs/benchmarks/compile_cache.md.
"""
from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
import importlib.util
import logging
import math
import os
import platform
import signal
import sys
import threading
import time

import gp_jax
from gp_jax import jax_private
from gp_jax.compile_cache import (CACHE_ENV, CACHE_MIN_COMPILE_SECONDS, CACHE_OFF, MIN_COMPILE_TIME_ENV,  # noqa: F401
                                  XLA_CACHES, XLA_CACHES_ENV, compilation_cache_dir, configure_compilation_cache,
                                  user_cache_dir)

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


# Draws this small (key derivations: fold_in, split, a hash mask's two key words) keep JAX's rolled loop under the
# "unrolled" lowering: XLA:CPU fuses an unrolled hash into every op that reads its result (a tiny BERT train step
# held 88 copies in 22 fusions: 22,864 lines of optimized HLO, 14,487 with the loops; benchmarks/compile_step.py).
THREEFRY_ROLLED_MAX = 64


def set_threefry_lowering(kind: str) -> bool:
  """Registers JAX's "unrolled" threefry2x32 lowering (other backends') for draws of more than THREEFRY_ROLLED_MAX
  words, or its "rolled" one (CPU default) for all, for CPU; applies to programs compiled afterwards. The bits are
  the same either way. False when this JAX lacks the internals."""
  if kind not in ("unrolled", "rolled"):
    raise ValueError(f"threefry lowering must be 'unrolled' or 'rolled', got {kind!r}")
  rules = jax_private.threefry_cpu_lowerings()
  if rules is None:
    log.warning("threefry: keeping JAX's CPU lowering (this jax lacks the internals)")
    return False
  from jax.interpreters import mlir  # pylint: disable=g-import-not-at-top

  primitive, unrolled, rolled = rules

  def by_size(ctx, *args, **params):
    words = max(math.prod(aval.shape) for aval in ctx.avals_in)
    return (rolled if words <= THREEFRY_ROLLED_MAX else unrolled)(ctx, *args, **params)

  mlir.register_lowering(primitive, by_size if kind == "unrolled" else rolled, platform="cpu")
  return True


def configure_threefry() -> str:
  """The unrolled lowering (above THREEFRY_ROLLED_MAX words) unless GP_JAX_THREEFRY=rolled; returns the lowering in
  use."""
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



def libtpu_compile_only_env(accelerator_type: str) -> dict[str, str]:
  """What libtpu reads when it starts, for compiling TPU programs where there is no TPU (`launch.compile`,
  `benchmarks.head_scaling tpu_tiles`): another process's libtpu may hold /tmp/libtpu_lockfile, and with no metadata
  server to ask, the host's place in a slice is given (else libtpu prints `E0000 ... TPU_WORKER_HOSTNAMES` errors)."""
  return {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": accelerator_type,
          "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}

# Loggers whose INFO records say nothing a user can act on: "Unable to initialize backend" from jax's backend search,
# and Orbax's records, which it logs through absl's logger (its restore and save records are Python dicts).
BACKEND_LOGGER, ABSL_LOGGER = "jax._src.xla_bridge", "absl"


def verbosity_asked() -> bool:
  """Whether absl's --verbosity (or -v) is on this process's command line (absl's flags parsed with it)."""
  absl_flags = sys.modules.get("absl.flags")
  if absl_flags is None:
    return False
  try:
    return bool(absl_flags.FLAGS.is_parsed() and absl_flags.FLAGS["verbosity"].present)
  except (KeyError, AttributeError):
    return False


def start_up_noise(record: logging.LogRecord) -> bool:
  """True for an INFO (or lower) record nobody can act on: a backend JAX could not start where its hardware is
  absent (`Unable to initialize backend 'tpu'`: no libtpu, or no TPU or GPU here), or any of Orbax's."""
  if record.levelno >= logging.WARNING:
    return False
  if record.name == BACKEND_LOGGER:
    message = str(record.msg)
    if not message.startswith("Unable to initialize backend"):
      return False
    tpu_without_libtpu = (message.startswith("Unable to initialize backend 'tpu'")
                          and importlib.util.find_spec("libtpu") is None)
    return tpu_without_libtpu or jax_private.accelerators_present() is False
  return record.name == ABSL_LOGGER and "/orbax/" in record.pathname.replace(os.sep, "/")


def _keep(record: logging.LogRecord) -> bool:
  return not start_up_noise(record)


def quiet_start_up() -> bool:
  """Drops `start_up_noise` records from here on unless --verbosity asked for them; True when it does."""
  if verbosity_asked():
    return False
  for name in (BACKEND_LOGGER, ABSL_LOGGER):
    logger = logging.getLogger(name)
    if _keep not in logger.filters:
      logger.addFilter(_keep)
  return True


def configure_start_up() -> dict:
  """The platforms and quiet start-up logs alone: for a process that must keep JAX's other defaults (a benchmark's
  --no-runtime baseline, a harness the tests call in their own process)."""
  return {"platforms": configure_platforms(), "quiet": quiet_start_up()}


GC_THRESHOLDS = (50_000, 20, 100)


def _gc_left_alone() -> bool:
  return os.environ.get("GP_JAX_GC", "1").lower() in ("0", "false", "off", "no")


def configure_gc() -> tuple[int, ...] | None:
  """Freezes the objects alive now (modules, classes) out of the collector's passes and sets GC_THRESHOLDS; returns
  them (None with GP_JAX_GC=0)."""
  if _gc_left_alone():
    return None
  gc.freeze()
  gc.set_threshold(*GC_THRESHOLDS)
  return GC_THRESHOLDS


def quicken_imports() -> tuple[int, ...] | None:
  """GC_THRESHOLDS before a command's first import of jax: its imports (jax, flax, orbax) leave ~1M objects alive,
  which the default thresholds walk again and again (~0.15 CPU-s a process); `configure_gc` freezes them once they
  are in. None with GP_JAX_GC=0."""
  if _gc_left_alone():
    return None
  gc.set_threshold(*GC_THRESHOLDS)
  return GC_THRESHOLDS


def configure() -> dict:
  """Process-level settings; idempotent. Call before JAX allocates or compiles anything."""
  global _configured
  if _configured is None:
    _configured = {**configure_start_up(), "malloc": configure_malloc(), "threefry": configure_threefry(),
                   "gc": configure_gc(),
                   "compile_clock": start_compile_clock()}
  return _configured


# ----------------------------------------------------------------------------- start-up time

EXEC_SLACK_S = 2.0  # interpreter start-up before gp_jax's import, and more: the process exec'd Python late
COMPILE_EVENTS = ("/jax/core/compile/backend_compile_duration",)
_compile = {"seconds": 0.0, "count": 0, "listening": False}
_compile_lock = threading.Lock()


def process_seconds() -> float:
  """Seconds since this process started (/proc/self/stat; a forked child counts from its fork), unless the process
  ran something else for a while before it exec'd Python (`bash -c "pip install ... && python -m gp_jax.main"`, `exec
  python` in a job script): then from gp_jax's import, the interpreter's start near enough."""
  since_import = time.time() - gp_jax.IMPORTED_AT
  try:
    with open("/proc/self/stat") as f:
      start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/uptime") as f:
      uptime = float(f.read().split()[0])
  except (OSError, ValueError, IndexError):
    return since_import
  since_start = max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))
  return since_start if since_start < since_import + EXEC_SLACK_S else since_import


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


EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a process that Ctrl-C stopped
_stop_callbacks: list = []


def _exit_at_once(signum, frame) -> None:
  os._exit(EXIT_INTERRUPTED)


def stop_now(name: str, message: str, *, code: int = EXIT_INTERRUPTED) -> None:
  """Ends the process at once: each `on_stop` callback (newest first) with the signal's name, then `message` as one
  line on stderr, then exit `code`. Threads (compiles, a save in flight) are not waited for; a Ctrl-C meanwhile ends
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
  os._exit(code)


def _sigint_at_once(signum, frame) -> None:
  stop_now("SIGINT", "Ctrl-C outside the training steps; stopped at once. Rerun the same command to continue from "
                     "the last checkpoint, if any")


def _sigterm_at_once(signum, frame) -> None:
  stop_now("SIGTERM", "SIGTERM outside the training steps; stopped at once. Rerun the same command to continue from "
                      "the last checkpoint, if any", code=0)


def stop_at_once_on_signals() -> None:
  """`gp_jax.main` with one process: Ctrl-C and SIGTERM stop at once (`stop_now`) wherever `Preemption` does not turn
  them into a checkpoint: before the first step (data, compile) and after the loop (final evaluation)."""
  signal.signal(signal.SIGINT, _sigint_at_once)
  signal.signal(signal.SIGTERM, _sigterm_at_once)


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
