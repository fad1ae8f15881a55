"""Progress off a terminal: periodic log lines (batches; training steps with rate and ETA), never a flood of carriage
returns; the per-type F1 and config lines of the training log."""

import logging
import types

from gp_jax import reporting


def test_progress_logs_lines_off_tty(caplog, monkeypatch):
  monkeypatch.setattr(reporting, "is_tty", lambda: False)
  with caplog.at_level(logging.INFO, logger="gp_jax"):
    items = list(reporting.progress(range(5), total=5, desc="dev@10", every_s=0.0))
  assert items == list(range(5))
  lines = [r.getMessage() for r in caplog.records]
  assert lines[-1].startswith("dev@10: 5/5 batches in")
  assert any("dev@10: 1/5 batches (20%)" in m for m in lines)
  assert not any("\r" in m for m in lines)


def test_progress_disabled_is_silent(caplog):
  with caplog.at_level(logging.INFO, logger="gp_jax"):
    assert list(reporting.progress(iter([1, 2]), total=2, desc="x", enabled=False)) == [1, 2]
  assert not caplog.records


class _Clock:
  def __init__(self):
    self.now = 100.0

  def __call__(self):
    return self.now


def test_progress_line_every_n_seconds_with_rate_and_eta(caplog):
  clock = _Clock()
  progress = reporting.Progress(1000, start=200, every_s=30.0, clock=clock)
  with caplog.at_level(logging.INFO, logger="gp_jax"):
    clock.now += 29.0
    assert progress.update(258) is None  # not yet 30 s
    clock.now += 11.0  # 40 s for 200 -> 280: 2 steps/s, 720 steps left = 360 s
    assert progress.update(280) == ("progress: step 280/1000 (28%), 2.00 steps/s, elapsed 0:00:40, ETA 0:06:00")
    clock.now += 10.0
    assert progress.update(300) is None  # 10 s since the last line
    clock.now += 3750.0  # 3800 s for 200 -> 960 steps: 0.2 steps/s, 40 left = 200 s
    assert progress.update(960) == "progress: step 960/1000 (96%), 0.20 steps/s, elapsed 1:03:20, ETA 0:03:20"
  assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("progress:")] == [
      "progress: step 280/1000 (28%), 2.00 steps/s, elapsed 0:00:40, ETA 0:06:00",
      "progress: step 960/1000 (96%), 0.20 steps/s, elapsed 1:03:20, ETA 0:03:20"]
  off = reporting.Progress(1000, start=0, every_s=0.0, clock=clock)
  clock.now += 1e6
  assert off.update(500) is None  # 0 turns it off


def test_per_type_line_and_config_lines():
  per_type = {"LOC": {"f1": 0.91234, "gold": 412, "precision": 1.0, "recall": 0.8}, "ORG": {"f1": 0.5, "gold": 3}}
  assert reporting.per_type_line(per_type) == "LOC 0.9123 (412), ORG 0.5000 (3)"
  assert reporting.per_type_line({}) == "(no types)"
  lines = reporting.config_lines('{"b": {"c": [1, 2]}, "a": "x y"}', "Spec(k=1)")
  assert lines == ['Config: {"b":{"c":[1,2]},"a":"x y"}', "Run spec (resolved): Spec(k=1)"]


class _Writer:
  def __init__(self):
    self.lines = []

  def write(self, step, split, values):
    self.lines.append((step, split, values))


def test_a_run_stopped_right_after_a_logged_step_keeps_its_rate():
  """Preempted at step 11 with log_every 10: step 10's line, written at step 11's dispatch, took step 11's tokens, and
  step 11's own line read "0 tokens/s"; it now has the rate of the window that holds its tokens."""
  ts = types.SimpleNamespace(lr_schedule=lambda step: 1e-3, train_it=types.SimpleNamespace(steps_per_epoch=100))
  writer = _Writer()
  log = reporting.StepLog(ts, writer, 10, None)
  log.start()
  for step in range(1, 12):
    log.count(tokens=640, examples=16)
    log.dispatched(step, {"loss": 1.0 / step, "grad_norm": 1.0})
  log.flush()
  assert [s for s, _, _ in writer.lines] == [10, 11]
  rates = [v["tokens_per_s"] for _, _, v in writer.lines]
  assert rates[0] > 0 and rates[1] == rates[0]
  assert log.run_tokens == 11 * 640  # every call's tokens counted once
