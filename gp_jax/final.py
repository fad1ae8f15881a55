"""A run's end: the best parameters' dev and test figures, the tuned threshold, the dev history and results.json
(`train.train_and_evaluate` calls these after its loop)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import TYPE_CHECKING

from gp_jax import checkpoint as ckpt_lib
from gp_jax import reporting, storage
from gp_jax import state as state_lib
from gp_jax import threshold as threshold_lib
from gp_jax.tasks.base import flat_result

if TYPE_CHECKING:
  from gp_jax.evaluate import Evaluator
  from gp_jax.train import RunContext

log = logging.getLogger("gp_jax.train")


def final_evaluation(run: RunContext, ts: state_lib.Training, splits, evaluator: Evaluator, writer, steps: int) -> dict:
  """Dev and test figures of the best parameters by dev F1 (the last ones when there is no dev split)."""
  out = {}
  if ts.best_mngr.latest_step() is None:  # no dev split: the final parameters are the ones to keep
    ckpt_lib.save_params(ts.best_mngr, steps, params=state_lib.eval_params(ts.state), config_json=run.config_json,
                         dev_f1=-1.0)
    ts.best_mngr.wait_until_finished()
  best_step, params = ckpt_lib.restore_params(ts.best_mngr, state_lib.abstract_params(ts.setup))
  out["best_step"] = int(best_step)
  if "dev" in splits:
    out["best_dev_f1"] = float(ts.best_mngr.metrics(best_step)["dev_f1"])
  for split in ("dev", "test"):
    if split in splits:
      result, _ = evaluator.evaluate(params, splits[split], desc=split)
      out[split] = evaluator.task.final_fields(result)
      writer.write(steps, f"final_{split}", flat_result(result))
      log.info("final %s (best checkpoint): P %.4f R %.4f F1 %.4f", split, result["precision"], result["recall"],
               result["f1"])
      log.info("final %s per type (F1, gold spans): %s", split, reporting.per_type_line(result["per_type"]))
      for line in evaluator.task.result_lines(result):
        log.info("final %s %s", split, line)
  if run.spec.tune_threshold:
    out.update(tune_threshold(run, splits, evaluator, params, best_step, out))
  return out


def tune_threshold(run: RunContext, splits, evaluator: Evaluator, params, best_step: int, at_zero: dict) -> dict:
  """`Evaluator.tune_threshold` on the best parameters, saved to workdir/threshold.json where it applies."""
  out = evaluator.tune_threshold(params, splits, at_zero=at_zero)
  if run.is_main and "value" in out["threshold"]:
    threshold_lib.save(run.workdir, threshold=out["threshold"]["value"], best_step=best_step,
                       dev_f1=out["threshold"]["dev_f1"], dev_f1_at_0=at_zero["dev"]["f1"])
  return out


def dev_history(run: RunContext, steps_per_epoch: int) -> list[dict]:
  """Dev F1 by evaluation step, over every attempt of this run (metrics.jsonl; the last value of a step wins)."""
  path = os.path.join(run.mirror.local, "metrics.jsonl") if run.mirror is not None else None
  if path is None or not os.path.exists(path):
    return []
  with open(path) as f:
    by_step = {m["step"]: {"step": m["step"], "epoch": m["step"] / steps_per_epoch, "f1": m["f1"]}
               for m in map(json.loads, f) if m.get("split") == "dev"}
  return [by_step[k] for k in sorted(by_step)]


def write_results(run: RunContext, summary: dict) -> None:
  summary["wall_minutes"] = (time.time() - run.t_start) / 60
  if run.is_main:
    storage.write_json(run.workdir / "results.json", summary, indent=1, default=str)
