"""Metrics (JSON lines + TensorBoard), the training log file, and progress display.

Files are written into a `storage.LocalMirror` of the workdir and copied there on `sync()`, so a
`gs://` workdir gets metrics.jsonl, tb/ and train.log too. Only process 0 writes.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import numpy as np

from gp_jax import storage

log = logging.getLogger("gp_jax")
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class MetricWriter:
  """JSON lines + TensorBoard (tensorboardX, no TensorFlow)."""

  def __init__(self, mirror: storage.LocalMirror | None):
    self.mirror = mirror
    self.tb = None
    if mirror is not None:
      from tensorboardX import SummaryWriter  # pylint: disable=g-import-not-at-top

      self.jsonl = open(os.path.join(mirror.local, "metrics.jsonl"), "a")
      self.tb = SummaryWriter(os.path.join(mirror.local, "tb"))

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
    fh = logging.FileHandler(os.path.join(mirror.local, "train.log"))
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
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

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
