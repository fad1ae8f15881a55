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
from gp_jax import threshold as threshold_lib
from gp_jax.data import batching
from gp_jax.steps import HitDecoder
from gp_jax.tasks.base import flat_result

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

  def tune_threshold(self, params, splits, *, at_zero: dict) -> dict:
    """Span heads: the dev-best threshold of `threshold.GRID` (`threshold.scan` on dev), applied to dev and test ->
    {"threshold": {...}, "dev_tuned", "test_tuned"} for results.json. `at_zero`: the splits' results at 0. Where it
    does not apply (taggers, no dev split): {"threshold": {"applies": False, "why"}}; a task that refuses it
    (`threshold_refusal`) was refused before training (`factory.task_name`)."""
    tagger = self.setup.spec.tag_scheme
    if tagger or "dev" not in splits:
      why = "tagger heads decode tags, not scores" if tagger else "there is no dev split"
      log.info("tune_threshold does not apply: %s", why)
      return {"threshold": {"applies": False, "why": why}}
    f1s = threshold_lib.scan(self, params, splits["dev"])
    value = threshold_lib.choose(threshold_lib.GRID, f1s)
    out = {"threshold": {"value": value, "grid": [min(threshold_lib.GRID), max(threshold_lib.GRID), 0.1],
                         "dev_f1_by_threshold": f1s}}
    for split in ("dev", "test"):
      if split in splits:
        result, _ = self.evaluate(params, splits[split], desc=f"{split}@threshold", threshold=value)
        out[f"{split}_tuned"] = dict(flat_result(result), per_record=result["per_record"])
        out["threshold"].update({f"{split}_f1_at_0": at_zero[split]["f1"], f"{split}_f1": result["f1"]})
        log.info("%s F1 at threshold 0: %.4f, at the dev-tuned %.1f: %.4f", split, at_zero[split]["f1"], value,
                 result["f1"])
    return out
