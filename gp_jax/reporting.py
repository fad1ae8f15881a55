"""Metrics (JSON lines + TensorBoard), the training log file, and progress display (a tqdm bar on a terminal, log
lines otherwise).

Files are written into a `storage.LocalMirror` of the workdir and copied there on `sync()`, so a
`gs://` workdir gets metrics.jsonl, tb/ and train.log too. Only process 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import jax
import numpy as np
from tqdm.auto import tqdm

from gp_jax import storage

# Deferred import below (summary_writer): tensorboardX is slow to import and only the process that writes metrics
# needs it.

log = logging.getLogger("gp_jax")
train_log = logging.getLogger("gp_jax.train")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class MetricWriter:
  """JSON lines + TensorBoard (tensorboardX, no TensorFlow)."""

  def __init__(self, mirror: storage.LocalMirror | None):
    self.mirror = mirror
    self.tb = None
    if mirror is not None:
      self.jsonl = open(os.path.join(mirror.local, "metrics.jsonl"), "a")  # noqa: SIM115 (open for the run)
      self.tb = summary_writer()(os.path.join(mirror.local, "tb"))

  def write(self, step: int, split: str, values: dict):
    if self.mirror is None:
      return
    flat = {k: float(v) for k, v in values.items() if isinstance(v, (int, float, np.floating, np.integer))}
    self.jsonl.write(json.dumps({"step": step, "split": split, **flat}) + "\n")
    self.jsonl.flush()
    for k, v in flat.items():
      self.tb.add_scalar(f"{split}/{k}", v, step)

  def sync(self):
    if self.mirror is not None:
      self.tb.flush()
      for h in logging.getLogger().handlers:
        h.flush()
      self.mirror.sync()

  def close(self):
    if self.mirror is not None:
      self.jsonl.close()
      self.tb.close()
      self.mirror.close()  # last copy to the workdir; a gs:// run's local mirror is removed


# Imports tensorboardX makes when installed, for what gp_jax never asks of it (the run writes its events to a local
# folder): torch's tensor types (~1.7 s and ~300 MB), S3 and GCS writers (google.cloud.storage ~0.1-0.2 s).
TENSORBOARDX_UNUSED = ("torch", "boto3", "google.cloud.storage")


def summary_writer():
  """tensorboardX's SummaryWriter, imported without the modules of `TENSORBOARDX_UNUSED` that are not imported yet
  (each raises ImportError inside tensorboardX's import, which it handles); every training process pays its import."""
  blocked = [name for name in TENSORBOARDX_UNUSED if name not in sys.modules]
  for name in blocked:
    sys.modules[name] = None
  try:
    from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top
  finally:
    for name in blocked:
      del sys.modules[name]
  return SummaryWriter


class TrainLog(logging.FileHandler):
  """train.log. A failed write (a full disk) stops it with one line on stderr, not a traceback per record."""

  failed = False

  def emit(self, record):
    if not self.failed:
      super().emit(record)

  def handleError(self, record):
    self.failed = True
    print(f"train.log: write failed ({sys.exc_info()[1]}); no longer written", file=sys.stderr)


def setup_logging(mirror: storage.LocalMirror | None) -> None:
  """INFO to stderr on process 0 (WARNING elsewhere), and a train.log in the mirror when given."""
  root = logging.getLogger()
  if not any(isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) for h in root.handlers):
    logging.basicConfig(level=logging.INFO, format=_FORMAT)
  root.setLevel(logging.INFO if mirror is not None else logging.WARNING)
  for h in [h for h in root.handlers if getattr(h, "_gp_jax_train_log", False)]:  # an earlier run in this process
    root.removeHandler(h)
    h.close()
  if mirror is not None:
    fh = TrainLog(os.path.join(mirror.local, "train.log"))
    fh._gp_jax_train_log = True
    fh.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(fh)
  for noisy in ("absl", "orbax", "jax._src", "fsspec"):
    logging.getLogger(noisy).setLevel(logging.WARNING)


def is_tty() -> bool:
  return sys.stderr.isatty()


def progress(iterable, *, total: int, desc: str, enabled: bool = True, every_s: float = 30.0):
  """A tqdm bar on a terminal; otherwise a log line every `every_s` seconds and one at the end."""
  if not enabled:
    yield from iterable
    return
  if is_tty():
    yield from tqdm(iterable, total=total, desc=desc, leave=False, dynamic_ncols=True)
    return
  t0 = last = time.time()
  n = 0
  for n, item in enumerate(iterable, 1):
    yield item
    now = time.time()
    if now - last >= every_s and n < total:
      log.info("%s: %d/%d batches (%.0f%%), %.0f s", desc, n, total, 100 * n / max(total, 1), now - t0)
      last = now
  if total > 1:
    log.info("%s: %d/%d batches in %.1f s", desc, n, total, time.time() - t0)


def clock_text(seconds: float) -> str:
  """H:MM:SS, as tqdm shows times."""
  seconds = int(round(max(seconds, 0.0)))
  return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class Progress:
  """The tqdm bar's figures as a log line every `every_s` seconds (0 = never), for logs without a terminal: steps
  done of the total, steps/s and the ETA, both over this run's steps so far (evaluations and checkpoints included,
  as they will recur)."""

  def __init__(self, total: int, *, start: int, every_s: float, clock=time.monotonic):
    self.total, self.start, self.every_s, self.clock = total, start, every_s, clock
    self.t0 = self.last = clock()

  def update(self, step: int) -> str | None:
    """Logs (and returns) the line when `every_s` has passed since the last one."""
    now = self.clock()
    if not self.every_s or now - self.last < self.every_s or step <= self.start:
      return None
    self.last = now
    rate = (step - self.start) / max(now - self.t0, 1e-9)
    line = (f"progress: step {step}/{self.total} ({100 * step / max(self.total, 1):.0f}%), {rate:.2f} steps/s, "
            f"elapsed {clock_text(now - self.t0)}, ETA {clock_text((self.total - step) / rate)}")
    train_log.info(line)
    return line


def per_type_line(per_type: dict) -> str:
  """`{type: {"f1", "gold", ...}}` as one line: "LOC 0.9123 (412), ORG 0.8011 (203)" (F1, gold spans)."""
  return ", ".join(f"{t} {v['f1']:.4f} ({v['gold']})" for t, v in per_type.items()) or "(no types)"


def config_lines(config_json: str, spec) -> list[str]:
  """The run's config (as config.json holds it) and its resolved run spec, one line each."""
  compact = json.dumps(json.loads(config_json), separators=(",", ":"))
  return [f"Config: {compact}", f"Run spec (resolved): {spec}"]


def at_step(metrics, i: int, size: int):
  """Step i's metrics of a call of `size` steps (stacked [size] when size > 1)."""
  return metrics if size == 1 else {k: v[i] for k, v in metrics.items()}


class StepLog:
  """Train metrics every `log_every` steps, read one step late (the host never waits on the step just
  dispatched); tokens/s count training time only (`pause` takes evaluation time out). `check(step, metrics)`
  runs before each write (e.g. raises on a non-finite loss)."""

  def __init__(self, ts, writer, log_every: int, bar, *, check=None):
    self.ts, self.writer, self.log_every, self.bar, self.check = ts, writer, log_every, bar, check
    self.tokens = self.examples = 0
    self.run_tokens, self.run_seconds = 0, 0.0
    self.t_log = time.time()
    self.pending = self.logged = None
    self.last_dev = self.last_rates = None

  def count(self, tokens: int, examples: int) -> None:
    """Real tokens and examples of this process's rows in the call just dispatched."""
    self.tokens += tokens
    self.examples += examples

  def dispatched(self, step: int, metrics, *, size: int = 1) -> None:
    """A call ending at `step` was dispatched; its metrics hold `size` steps (stacked [size] when > 1). The previous
    call's metrics are written now, for the steps of it that fall on `log_every`."""
    self._write_pending()
    self.pending = (step, size, metrics)
    if self.bar is not None:
      self.bar.update(size)

  def start(self) -> None:
    """The training clock starts now (after the programs are compiled)."""
    self.t_log = time.time()

  def pause(self, seconds: float) -> None:
    self.t_log += seconds

  def _write_pending(self, *, last: bool = False) -> None:
    """The pending call's steps that fall on `log_every` (and with `last` its last step) written."""
    if self.pending is None:
      return
    end, n, metrics = self.pending
    # The call's tokens went to the window a write at its dispatch closed: its last step keeps that window's rates.
    rates = self.last_rates if last and self.tokens == 0 else None
    for s in range(end - n + 1, end + 1):
      if (s % self.log_every == 0 or (last and s == end)) and s != self.logged:
        rates = self.write(s, at_step(metrics, n - 1 - (end - s), n), rates)

  def flush(self) -> None:
    self._write_pending(last=True)
    self.pending = None

  @property
  def tokens_per_s(self):
    return self.run_tokens / self.run_seconds if self.run_seconds else None

  def write(self, step: int, metrics, rates: dict | None = None) -> dict:
    """Writes step `step`'s metrics; `rates` given: the tokens/s of a write earlier in the same call. Returns the
    rates written."""
    if self.check is not None:
      self.check(step, metrics)
    if rates is None:
      dt = max(time.time() - self.t_log, 1e-9)
      n = jax.process_count()  # this process saw 1/n of the tokens
      rates = {"tokens_per_s": self.tokens * n / dt, "examples_per_s": self.examples * n / dt}
      self.run_tokens, self.run_seconds = self.run_tokens + self.tokens * n, self.run_seconds + dt
    loss = float(metrics["loss"])
    self.writer.write(step, "train", {"loss": loss, "grad_norm": float(metrics["grad_norm"]),
                                      "lr": float(self.ts.lr_schedule(step)),
                                      "epoch": step / self.ts.train_it.steps_per_epoch, **rates})
    train_log.info("step %d train loss %.4f (%.0f tokens/s)", step, loss, rates["tokens_per_s"])
    if self.bar is not None:
      dev = f"{self.last_dev:.4f}" if self.last_dev is not None else "-"
      self.bar.set_postfix(loss=f"{loss:.4f}", dev_f1=dev)
    self.tokens = self.examples = 0
    self.t_log = time.time()
    self.logged, self.last_rates = step, rates
    return rates
