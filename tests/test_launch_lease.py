"""Leases (gp_jax/lease.py) and sweep workers (launch/worker.py) with a stand-in point runner (no JAX):
4 workers over a local and an emulated gs:// workdir, one SIGKILLed mid-point and restarted; every point
finishes exactly once, no two workers ever hold a point at once, the killed worker's stale lease is taken over.
Also: the emulator's ifGenerationMatch (412) and lost answers, a second gp_jax.main refused (exit 2)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from gp_jax import lease as lease_lib
from tests.helpers_gcs import emulator, fault_counts, set_faults

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINTS = 8
BEAT = 0.3  # heartbeat seconds in these tests; stale after 3 missed beats


# ----------------------------------------------------------------------------- emulator


@pytest.fixture(scope="module")
def gcs():
  with emulator() as (url, env):
    yield url, env


def test_emulator_if_generation_match_and_lost_answers(gcs):
  url, _ = gcs
  store = lease_lib.GcsStore()
  assert store.create("gs://bucket/t/a.json", b"1")
  assert not store.create("gs://bucket/t/a.json", b"2")  # 412: the package alone would overwrite
  assert store.read("gs://bucket/t/a.json") == b"1"
  # The next request runs but its answer is lost: gcsfs retries the create, which meets its own object (412).
  set_faults(url, 0.0, "lost_answer", next_=1)
  assert not store.create("gs://bucket/t/b.json", b"mine")
  assert store.read("gs://bucket/t/b.json") == b"mine"
  # A lease whose create is answered that way reads the object back and finds its own token: it holds the lease.
  lease = lease_lib.Lease("gs://bucket/t/_launch/leases/p", owner="me", heartbeat=10, stale_after_beats=3)
  real_create = lease.store.create

  def create_losing_the_answer(path, data):
    set_faults(url, 0.0, "lost_answer", next_=1)
    return real_create(path, data)

  lease.store.create = create_losing_the_answer
  assert lease.try_acquire() and lease.epoch == 0
  assert fault_counts(url)["counts"]["lost_answer"] == 1  # counted since the last set_faults
  other = lease_lib.Lease("gs://bucket/t/_launch/leases/p", owner="other", heartbeat=10, stale_after_beats=3)
  assert not other.try_acquire() and other.holder.owner == "me"


def test_forget_listings_shows_what_another_process_wrote(gcs):
  """A long-lived worker's cached listing of a point (gcsfs keeps them for the process's life) hides checkpoints
  another worker wrote since; storage.forget_listings drops it, deeper folders included."""
  import gcsfs
  from etils import epath

  from gp_jax import storage

  run = epath.Path("gs://bucket/forget/run")
  (run / "ckpt" / "4").mkdir(parents=True, exist_ok=True)
  (run / "ckpt" / "4" / "x").write_text("4")
  assert [p.name for p in (run / "ckpt").iterdir()] == ["4"]  # listed: now cached by this process
  other = gcsfs.GCSFileSystem(skip_instance_cache=True)  # another process's client
  other.pipe_file("bucket/forget/run/ckpt/8/x", b"8")
  assert [p.name for p in (run / "ckpt").iterdir()] == ["4"]  # the stale listing this fix is about
  storage.forget_listings("gs://bucket/forget/run")
  assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["4", "8"]
  storage.forget_listings("/not/a/url")  # local paths: nothing to drop


# ----------------------------------------------------------------------------- the stand-in runner


def standin(config, workdir: str) -> dict:
  """A point that takes STANDIN_S seconds: events to $STANDIN_EVENTS, then results.json "finished"."""
  from etils import epath

  events = os.environ["STANDIN_EVENTS"]
  me = f"{os.environ.get('STANDIN_NAME', '?')}:{os.getpid()}"
  with open(events, "a") as f:
    f.write(json.dumps({"event": "start", "point": workdir, "who": me, "t": time.time()}) + "\n")
  print(f"STANDIN START {workdir}", flush=True)
  time.sleep(float(os.environ.get("STANDIN_S", "0.5")))
  p = epath.Path(workdir)
  p.mkdir(parents=True, exist_ok=True)
  (p / "results.json").write_text(json.dumps({"status": "finished", "by": me}))
  with open(events, "a") as f:
    f.write(json.dumps({"event": "end", "point": workdir, "who": me, "t": time.time()}) + "\n")
  return {"status": "finished"}


EXPERIMENT = f"""
import ml_collections
def get_config(arg=None):
  return ml_collections.ConfigDict({{"x": 0}})
def get_sweep(arg=None):
  return [{{"config.x": i}} for i in range({POINTS})]
"""


def _worker(root, exp, name, env):
  cmd = [sys.executable, "-m", "launch.worker", f"--config={exp}", f"--workdir={root}", f"--name={name}",
         "--runner=tests.test_launch_lease:standin", f"--poll_s={BEAT}"]
  return subprocess.Popen(cmd, cwd=REPO, env={**env, "STANDIN_NAME": name}, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _wait_line(proc, text, timeout=30.0):
  end = time.monotonic() + timeout
  lines = []
  while time.monotonic() < end:
    line = proc.stdout.readline()
    if not line:
      break
    lines.append(line)
    if text in line:
      return lines
  raise AssertionError(f"no {text!r} in:\n{''.join(lines)}")


def _run_pool(root: str, tmp_path, extra_env: dict) -> None:
  exp = tmp_path / "exp.py"
  exp.write_text(textwrap.dedent(EXPERIMENT))
  events = tmp_path / "events.jsonl"
  env = {**os.environ, **extra_env, "PYTHONPATH": REPO, "STANDIN_EVENTS": str(events), "STANDIN_S": "0.6",
         "GP_JAX_LEASE_HEARTBEAT_S": str(BEAT), "GP_JAX_LEASE_STALE_BEATS": "3", "PYTHONFAULTHANDLER": "1"}
  victim = _worker(root, exp, "w0", env)
  _wait_line(victim, "STANDIN START")  # w0 holds a point mid-run
  others = [_worker(root, exp, f"w{i}", env) for i in (1, 2, 3)]
  time.sleep(0.3)
  victim.kill()
  victim.wait()
  killed_at = time.time()
  restarted = _worker(root, exp, "w0-restarted", env)
  outs, procs = [], [*others, restarted]
  try:
    for p in procs:
      outs.append(p.communicate(timeout=60)[0])
  except subprocess.TimeoutExpired:
    for p in procs:
      p.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER: every thread's stack goes to the output
    raise AssertionError("workers did not finish:\n" + "\n".join(p.communicate()[0][-6000:] for p in procs))
  for p, out in zip(procs, outs):
    assert p.returncode == 0, out
  assert all("nothing left (every point finished)" in o for o in outs), outs

  ev = [json.loads(line) for line in events.read_text().splitlines()]
  starts = [e for e in ev if e["event"] == "start"]
  ends = [e for e in ev if e["event"] == "end"]
  points = sorted({e["point"] for e in starts})
  assert len(points) == POINTS
  assert sorted(e["point"] for e in ends) == points  # every point finished exactly once
  # No two workers ran a point at once: intervals per point are disjoint (the killed one ended at the kill).
  for pt in points:
    spans = []
    for s in (e for e in starts if e["point"] == pt):
      end = next((e["t"] for e in ends if e["point"] == pt and e["who"] == s["who"]), killed_at)
      spans.append((s["t"], end))
    spans.sort()
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), (pt, spans)
  # From the lease history: epochs 0..n, each after the first follows a released lease or takes over a stale one.
  took_over = 0
  for pt in points:
    folder = lease_lib.lease_dir(pt, root=root)
    hist = lease_lib.history(folder)
    assert [h["epoch"] for h in hist] == list(range(len(hist)))
    assert hist[-1].get("released") and hist[-1].get("outcome") in ("finished", "already finished")
    for prev, cur in zip(hist, hist[1:]):
      assert prev.get("released") or (cur["took_over"] and prev["owner"].startswith("w0@")), (pt, hist)
      took_over += bool(cur["took_over"])
  assert took_over == 1  # the killed worker's point


@pytest.mark.e2e
def test_four_workers_local_one_killed(tmp_path):
  _run_pool(str(tmp_path / "sweep"), tmp_path, {})
  assert not any((tmp_path / "sweep" / d / "_launch").exists() for d in os.listdir(tmp_path / "sweep")
                 if d != "_launch")


@pytest.mark.e2e
def test_four_workers_gcs_one_killed(gcs, tmp_path):
  _run_pool("gs://bucket/pool", tmp_path, gcs[1])


@pytest.mark.e2e
def test_second_main_on_a_workdir_refuses(tmp_path):
  """A live lease on a workdir: gp_jax.main exits 2 in one line naming the holder, before touching JAX state."""
  from tests import helpers_train as ht

  workdir = str(tmp_path / "run")
  holder = lease_lib.Lease(lease_lib.find_lease_dir(workdir), owner="somebody-else:1234", heartbeat=30)
  assert holder.try_acquire()
  try:
    out = subprocess.run(ht.main_command(workdir, num_train_steps=2), cwd=REPO, env=ht.subprocess_env(devices=1),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
  finally:
    holder.release()
  assert out.returncode == 2, out.stderr[-3000:]
  err = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(err) == 1 and "held by somebody-else:1234 (lease epoch 0" in err[0], out.stderr[-3000:]
  assert not os.path.exists(os.path.join(workdir, "ckpt"))
