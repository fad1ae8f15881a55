"""The trainer's closing steps line (`train.Loop.finish`) as a rerun of a finished run meets it: 0 steps and why,
never a negative count. In-process, on a stand-in for the loop's state (no model, no training)."""

import logging
import types

import numpy as np
import pytest

from gp_jax import train


class _Manager:
  def wait_until_finished(self):
    pass


def _loop(*, step: int, start: int, first: int, total: int, calls: int, best_step: int | None = 64):
  """What `Loop.finish` reads: the state's step, where this call of the run started and would have started."""
  ts = types.SimpleNamespace(mngr=_Manager(), best_mngr=_Manager(), start_step=start, total_steps=total,
                             train_it=types.SimpleNamespace(steps_per_epoch=64, span_overflow=0))
  loop = types.SimpleNamespace(ts=ts, first=first, n_calls=calls, state={"step": np.int32(step)}, bar=None,
                               steps=types.SimpleNamespace(flush=lambda: None, tokens_per_s=0.0),
                               pace=types.SimpleNamespace(lines=lambda: []), preempted=False, stopped_early=False,
                               stop_signal=None, k=1, patience=train.EarlyStop(2, 64, best_step))
  if hasattr(train.Loop, "nothing_left"):
    loop.nothing_left = lambda done: train.Loop.nothing_left(loop, done)
  return loop


@pytest.mark.parametrize("kw, line", [
    # Early-stopped at 192 of 2064: the rerun starts at its end (first = total) and trains nothing.
    (dict(step=192, start=192, first=2064, total=2064, calls=0),
     "0 steps in 0 calls: nothing left to train (stopped early at step 192: dev F1 had not improved for 2 epochs "
     "since step 64)"),
    (dict(step=2064, start=2064, first=2064, total=2064, calls=0), "0 steps in 0 calls: nothing left to train"),
    (dict(step=2064, start=0, first=0, total=2064, calls=258), "2064 steps in 258 calls"),
])
def test_the_steps_line_never_counts_below_zero(caplog, kw, line):
  """A rerun of an early-stopped run said "-1872 steps in 0 calls"."""
  with caplog.at_level(logging.INFO, logger="gp_jax.train"):
    summary = train.Loop.finish(_loop(**kw))
  assert [r.getMessage() for r in caplog.records if " calls" in r.getMessage()] == [line]
  assert summary["steps"] == kw["step"] and summary["stopped_early"] == (kw["first"] != kw["start"])
