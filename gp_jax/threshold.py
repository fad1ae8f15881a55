"""A decision threshold for span heads chosen on dev (`--config.tune_threshold=True`), and where it is kept.

GRID: -2.0, -1.9, ..., 2.0 (41 values, in logits; 0 is ZLPR's own threshold). One dev pass decodes the best
parameters with the evaluator's threshold at the grid's lowest value; each grid value then keeps the hits whose
score is above it (a filter on the hit list, never on [B, H, L, L] cells), which are exactly the hits a decode
at that threshold returns. The value with the best dev F1 wins; ties go to the value nearest 0.

The choice is saved in the workdir as threshold.json {"threshold", "best_step", "dev_f1", "dev_f1_at_0",
"grid"}; `tuned_threshold(workdir)` reads it (predict and export take it as their default), and gives None when
there is none or when best/ now holds another step than the one it was tuned on.
"""

from __future__ import annotations

import logging

import numpy as np

from gp_jax import checkpoint as ckpt_lib
from gp_jax import storage
from gp_jax.data import merge
from gp_jax.metrics import span_prf

log = logging.getLogger(__name__)

GRID = tuple(round(-2.0 + 0.1 * i, 1) for i in range(41))
FILE = "threshold.json"


def scan(evaluator, params, prepared, grid=GRID) -> list[float]:
  """Corpus-level span F1 of `prepared` at each threshold of `grid` (one decode, at min(grid))."""
  hits = evaluator.hits(params, prepared, desc="threshold scan", threshold=min(grid))
  gold = merge.gold_spans(prepared)
  f1s = []
  for t in grid:
    keep = hits["score"] > np.float32(t)  # the device compares float32 scores with a float32 threshold
    merged = merge.merge_predictions(prepared, {k: v[keep] for k, v in hits.items()})
    f1s.append(span_prf(merge.prediction_spans(merged), gold)["f1"])
  return f1s


def choose(grid, f1s) -> float:
  """The grid value of the best F1; among equal F1s the one nearest 0."""
  return min(zip(grid, f1s), key=lambda gf: (-gf[1], abs(gf[0])))[0]


def save(workdir, *, threshold: float, best_step: int, dev_f1: float, dev_f1_at_0: float, grid=GRID) -> None:
  storage.write_json(storage.path(workdir) / FILE, {
      "threshold": float(threshold), "best_step": int(best_step), "dev_f1": float(dev_f1),
      "dev_f1_at_0": float(dev_f1_at_0), "grid": [min(grid), max(grid), round(grid[1] - grid[0], 6)]}, indent=1)


def tuned_threshold(workdir) -> float | None:
  """The dev-tuned threshold of `workdir`'s best/ checkpoint (threshold.json), or None when the run did not tune
  one or best/ has changed since."""
  root = storage.path(workdir)
  if not (root / FILE).exists():
    return None
  saved = storage.read_json(root / FILE)
  best_steps = ckpt_lib.finalised_steps(root / "best")
  if saved["best_step"] not in best_steps:
    log.warning("%s was tuned on best/ step %s, but best/ holds %s: ignoring it", root / FILE, saved["best_step"],
                best_steps)
    return None
  return float(saved["threshold"])
