"""tests/zygote.py against fresh interpreters: a forked child prints, exits and dies by a signal as `python -m` does,
with its own stdin, cwd, environment (XLA_FLAGS read after the fork), session and `__main__`."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests import helpers_train as ht
from tests import zygote

pytestmark = pytest.mark.skipif(os.environ.get(zygote.OFF_ENV) == "0", reason=f"{zygote.OFF_ENV}=0: no zygote")


def _both(cmd, **kw):
  fresh = subprocess.Popen(cmd, **kw)
  forked = zygote.popen(cmd, **kw)
  if not isinstance(forked, zygote.ZygotePopen):  # an environment's first child runs plain; its zygote starts next
    forked.kill()
    forked.communicate()
    forked = zygote.popen(cmd, **kw)
  assert isinstance(forked, zygote.ZygotePopen) and not isinstance(fresh, zygote.ZygotePopen)
  return fresh, forked


@pytest.mark.parametrize("args", [["--help"], ["--no_such_flag"], ["--config=/nonexistent/x.py", "--workdir=w"]])
def test_the_trainer_cli_prints_and_exits_the_same(args, tmp_path):
  procs = _both([sys.executable, "-m", "gp_jax.main", *args], cwd=tmp_path, env=ht.subprocess_env(devices=1),
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  fresh, forked = [(*p.communicate(timeout=120), p.returncode) for p in procs]
  assert forked == fresh and fresh[2] in (0, 2)


@pytest.mark.parametrize("devices", [1, 3])
def test_stdin_cwd_environment_and_exit_status_reach_the_child(devices, tmp_path):
  env = ht.subprocess_env(devices=devices, PROBE=f"p{devices}")
  procs = _both([sys.executable, "-m", "tests.zygote_probe", "a b"], cwd=tmp_path, env=env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
  fresh, forked = [(*p.communicate("line\n", timeout=120), p.returncode) for p in procs]
  assert forked == fresh and fresh[1:] == ("stderr line\n", 3)
  seen = json.loads(fresh[0])
  del seen["sigint"]  # the same in both (compared above); default_int_handler unless the suite runs with SIGINT ignored
  del seen["gc_thresholds"]  # the same in both (compared above): the interpreter's, whichever Python this is
  assert seen == {"argv": ["a b"], "cwd": str(tmp_path), "path0": str(tmp_path), "env": f"p{devices}",
                  "devices": devices, "stdin": "line\n", "session_leader": True, "main": "__main__"}


def test_a_signal_ends_the_child_as_it_ends_a_fresh_one():
  procs = _both([sys.executable, "-m", "tests.zygote_probe", "wait"], cwd=ht.REPO, env=ht.subprocess_env(devices=1),
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
  for p in procs:
    assert json.loads(p.stdout.readline())["argv"] == ["wait"]
    assert p.poll() is None
    p.send_signal(signal.SIGTERM)
  assert [p.wait(timeout=60) for p in procs] == [-signal.SIGTERM] * 2


def test_cpu_of_forked_children_counts_once_when_their_zygote_is_reaped():
  """benchmarks.suite_cpu counts RUSAGE_CHILDREN plus `zygote.cpu_seconds`: a zygote that exits (gives way, or at the
  end) moves its imports' and its children's CPU into RUSAGE_CHILDREN, and out of `cpu_seconds`."""
  cmd = [sys.executable, "-m", "tests.zygote_probe"]
  env = ht.subprocess_env(devices=1, PROBE="cpu")
  for _ in range(3):  # the first runs plain; the second starts the zygote
    proc = zygote.run(cmd, cwd=ht.REPO, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=120)
    assert proc.returncode == 3
  forked = zygote.cpu_seconds
  counted = zygote._children_cpu() + zygote.cpu_seconds  # pylint: disable=protected-access
  zygote._close_all()  # pylint: disable=protected-access
  assert forked > 1.0  # the zygote's imports (jax) and two children
  assert abs(zygote._children_cpu() + zygote.cpu_seconds - counted) < 0.3  # pylint: disable=protected-access
