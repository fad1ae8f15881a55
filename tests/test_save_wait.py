"""A signal while a checkpoint save is being waited for: a save that finishes within the grace period passes the
signal on to the run's own handler (which saves at the step and stops); a save that does not stops the run at once."""

import os
import signal
import threading
import types

from gp_jax import checkpoint as ckpt_lib


def _ends_when_set(done: threading.Event) -> threading.Thread:
  """Stands in for the thread running Orbax's wait: it ends when `done` is set."""
  waiter = threading.Thread(target=done.wait, daemon=True)
  waiter.start()
  return waiter


def test_a_save_that_finishes_in_the_grace_period_hands_the_signal_on(monkeypatch):
  monkeypatch.setenv(ckpt_lib.SIGNAL_GRACE_ENV, "30")
  received, done = [], threading.Event()
  old = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
  stopped = []
  fake = types.SimpleNamespace(in_flight=8, _stop_at_once=lambda name, waited: stopped.append(name))
  try:
    timer = threading.Timer(0.3, lambda: (os.kill(os.getpid(), signal.SIGTERM), threading.Timer(0.5, done.set).start()))
    timer.start()
    ckpt_lib.Manager._wait_interruptibly(fake, _ends_when_set(done))
    timer.join()
  finally:
    signal.signal(signal.SIGTERM, old)
  assert not stopped and received == [signal.SIGTERM]  # the run's handler got it, after the wait


def test_a_save_that_does_not_finish_stops_at_once_after_the_grace_period(monkeypatch):
  monkeypatch.setenv(ckpt_lib.SIGNAL_GRACE_ENV, "0.5")
  received, done, stopped = [], threading.Event(), []

  def stop_at_once(name, waited):
    stopped.append((name, waited))
    done.set()  # stands in for the process ending

  old = signal.signal(signal.SIGTERM, lambda signum, frame: received.append(signum))
  fake = types.SimpleNamespace(in_flight=8, _stop_at_once=stop_at_once)
  try:
    threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
    ckpt_lib.Manager._wait_interruptibly(fake, _ends_when_set(done))
  finally:
    signal.signal(signal.SIGTERM, old)
  (name, waited), = stopped
  assert name == "SIGTERM" and waited >= 0.5 + 0.2 and not received[1:]
