"""The harness every benchmark uses: call timers, alternating rounds of variants, a load/steal readout, a
machine line.

  secs = median_seconds(fn, 5)                               # median wall seconds of 5 calls of fn
  rounds = alternate({"ours": f, "torch": g}, rounds=5, calls=3)   # f g f g ...: per round, median of 3 calls
  rounds.spread("ours").fmt(".3f")        -> "0.123 [0.120..0.130]"  (median over rounds [min..max])
  rounds.ratio("torch", "ours").fmt()     -> "1.45x [1.30..1.52]"   (per-round torch/ours, median [min..max])
  rounds.watch.readout()                  -> "load 0.52..0.61, steal 0.3%"
  print(machine_line("train_step"))       # UTC time, CPU, RAM, jax + device, git commit, load now

Callables must block until their work is done (`jax.block_until_ready`).
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
import os
import pathlib
import platform
import statistics
import subprocess
import time
from typing import Callable, TypeVar

# The test suite's XLA:CPU settings (tests/conftest.py): its programs are tiny, so compiling them costs more than
# running them, and cheap codegen (no LLVM optimisation, no fusion emitters, one codegen thread) halves the suite's
# compile time. benchmarks.compile_step measures compiles under the same settings.
CHEAP_CODEGEN_XLA_FLAGS = {"xla_backend_optimization_level": "0", "xla_llvm_disable_expensive_passes": "true",
                           "xla_cpu_use_fusion_emitters": "false", "xla_cpu_parallel_codegen_split_count": "1",
                           "xla_cpu_enable_concurrency_optimized_scheduler": "false"}

# Deferred import below: jax, in machine_line only. Modules that set JAX_PLATFORMS before jax reads it import this one
# first (benchmarks.head_scaling's tpu_tiles), and device_check's parent, which imports it, stays free of jax.

ROOT = pathlib.Path(__file__).resolve().parents[1]
T = TypeVar("T")

# ----------------------------------------------------------------------------- timers


def call_seconds(fn: Callable[[], object], n: int) -> list[float]:
  """Wall seconds of each of `n` calls of `fn`."""
  times = []
  for _ in range(n):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return times


def median_seconds(fn: Callable[[], object], n: int) -> float:
  """Median wall seconds of `n` calls of `fn`."""
  return statistics.median(call_seconds(fn, n))


# ----------------------------------------------------------------------------- load and steal


def _cpu_jiffies() -> list[int] | None:
  """(user, nice, system, idle, iowait, irq, softirq, steal) of all CPUs from /proc/stat; None off Linux."""
  try:
    with open("/proc/stat") as f:
      fields = f.readline().split()
  except OSError:
    return None
  return [int(x) for x in fields[1:9]] if fields and fields[0] == "cpu" else None


class LoadWatch:
  """How idle the machine was: the 1-minute load average at each `mark()`, and the CPU steal share
  (steal jiffies / all jiffies in /proc/stat) since the watch was made."""

  def __init__(self):
    self.loads: list[float] = []
    self._start = _cpu_jiffies()
    self.mark()

  def mark(self) -> None:
    self.loads.append(os.getloadavg()[0])

  def steal(self) -> float | None:
    now = _cpu_jiffies()
    if now is None or self._start is None:
      return None
    total = sum(now) - sum(self._start)
    return (now[7] - self._start[7]) / total if total > 0 else 0.0

  def readout(self) -> str:
    """Marks the load once more (the end of the run) -> "load MIN..MAX, steal S%"."""
    self.mark()
    steal = self.steal()
    return (f"load {min(self.loads):.2f}..{max(self.loads):.2f}, steal "
            + ("n/a" if steal is None else f"{steal:.1%}"))


# ----------------------------------------------------------------------------- alternating rounds


@dataclasses.dataclass
class Spread:
  """Values over rounds: median with min..max."""

  values: list[float]

  @property
  def median(self) -> float:
    return statistics.median(self.values)

  def fmt(self, spec: str = ".2f", suffix: str = "x") -> str:
    """"1.45x [1.30..1.52]"; one value has no brackets; no values give "-"."""
    if not self.values:
      return "-"
    text = f"{self.median:{spec}}{suffix}"
    if len(self.values) > 1:
      text += f" [{min(self.values):{spec}}..{max(self.values):{spec}}]"
    return text


@dataclasses.dataclass
class Rounds:
  """Per variant one value per round (None where that round failed); `watch` covers the rounds."""

  values: dict[str, list[float | None]]
  watch: LoadWatch | None = None

  def spread(self, name: str) -> Spread:
    return Spread([v for v in self.values[name] if v is not None])

  def ratio(self, a: str, b: str) -> Spread:
    """a / b per round, over the rounds where both ran. For seconds, a/b is b's speedup over a."""
    pairs = zip(self.values[a], self.values[b])
    return Spread([x / y for x, y in pairs if x is not None and y is not None])


def in_rounds(fns: dict[str, Callable[[], T]], rounds: int, watch: LoadWatch | None = None) -> dict[str, list[T]]:
  """Calls each of `fns` once per round, alternating (A B A B ...); returns what each call gave, per name.
  `watch` marks the load before every round."""
  out = {name: [] for name in fns}
  for _ in range(rounds):
    if watch is not None:
      watch.mark()
    for name, fn in fns.items():
      out[name].append(fn())
  return out


def alternate(fns: dict[str, Callable[[], object]], *, rounds: int, calls: int = 1) -> Rounds:
  """Times `fns` in alternating rounds: per round and variant, the median seconds of `calls` calls."""
  watch = LoadWatch()
  timed = {name: functools.partial(median_seconds, fn, calls) for name, fn in fns.items()}
  return Rounds(in_rounds(timed, rounds, watch), watch)


# ----------------------------------------------------------------------------- records


def jsonl_records(folder: str) -> dict[str, list[dict]]:
  """The JSON lines of each `*.jsonl` file in `folder` (a process or worker each), keyed by file stem, in name order;
  blank lines skipped."""
  return {path.stem: [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
          for path in sorted(pathlib.Path(folder).glob("*.jsonl"))}


# ----------------------------------------------------------------------------- machine line


def _cpu_model() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def _git_commit() -> str:
  def git(*args):
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()

  try:
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")
  except (OSError, subprocess.CalledProcessError):
    return "unknown"


def machine_line(name: str) -> str:
  """"NAME 2026-11-22 04:31 UTC | CPU x N cores | RAM G GiB | jax V BACKEND (N x KIND) | commit C | load1 L"."""
  import jax  # pylint: disable=g-import-not-at-top

  ram_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
  devices = jax.devices()
  return (f"{name} {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC | {_cpu_model()} x "
          f"{os.cpu_count()} cores | RAM {ram_gib:.1f} GiB | jax {jax.__version__} {jax.default_backend()} "
          f"({len(devices)} x {devices[0].device_kind}) | commit {_git_commit()} | load1 {os.getloadavg()[0]:.2f}")
