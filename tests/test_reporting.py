"""Progress off a terminal: periodic log lines, never a flood of carriage returns."""

import logging

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
