"""Evaluation shared by training and predict: a jitted eval step that returns hits, the hit buffers that grow when
a batch has more hits than they hold, window merging, and the task's corpus-level metric.

The model is reached only through the task's `decode`, the task's parts through its object (`gp_jax.tasks`); "f1"
is the task's selection F1.
"""

from __future__ import annotations

import logging

import jax

from gp_jax import reporting
from gp_jax import sharding as shd
from gp_jax.data import batching
from gp_jax.steps import HitDecoder

log = logging.getLogger(__name__)

HOST_ONLY_FIELDS = ("example_index", "window_start")


def model_batch(batch: dict) -> dict:
  """Pipeline batch -> flat dict of the arrays the model and loss read."""
  out = {k: v for k, v in batch.items() if k not in HOST_ONLY_FIELDS and k != "features"}
  out.update(batch["features"])
  return out


class Evaluator:
  """Runs a model over prepared splits: hits per window, merged into documents, scored (by the run's task)."""

  def __init__(self, setup, *, batch_size: int, progress: bool = True):
    self.setup = setup
    self.batch_size = batch_size
    self.progress = progress
    self.decoder = HitDecoder(setup, batch_size=batch_size)
    self.task = self.decoder.task

  def hits(self, params, prepared, *, desc: str = "eval", threshold: float = 0.0):
    """The task's window hits over every window of `prepared` (span heads: cells with score > threshold)."""
    s = self.setup
    batches = batching.eval_batches(prepared, batch_size=self.batch_size, buckets=s.spec.buckets,
                                    process_index=jax.process_index(), process_count=jax.process_count())
    self.decoder.name = desc
    return self.task.concat_hits([self.decoder(params, shd.global_batch(model_batch(batch), s.mesh), threshold)
                                  for batch in reporting.progress(batches, total=len(batches), desc=desc,
                                                                  enabled=self.progress)])

  def predict(self, params, prepared, *, desc: str = "predict", threshold: float = 0.0):
    """Per record, the task's prediction: a record of the task's fields (`Task.assemble`)."""
    return self.task.assemble(prepared, self.hits(params, prepared, desc=desc, threshold=threshold))

  def evaluate(self, params, prepared, *, desc: str = "eval", threshold: float = 0.0):
    """(result, merged): the task's metric over whole documents (`Task.score`; "f1" the selection F1), and the
    merged predictions."""
    merged = self.predict(params, prepared, desc=desc, threshold=threshold)
    return self.task.score(prepared, merged), merged
