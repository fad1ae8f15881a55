"""Leases (gp_jax/lease.py) and sweep workers (launch/worker.py) with a stand-in point runner (no JAX):
4 workers over a local and an emulated gs:// workdir, one SIGKILLed mid-point and restarted; every point
finishes exactly once, no two workers ever hold a point at once, the killed worker's stale lease is taken over.
Also: the emulator's ifGenerationMatch (412) and lost answers; a holder killed on this host (a lease or a workdir
lock) taken over at once; gp_jax.main refused by a live holder (exit 2, one line), taking a dead worker's point."""

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
from tests.helpers_gcs import emulator, fault_counts, scale_gcsfs_backoff, set_faults

# Every test starts a process (the GCS emulator, workers, a lock or lease holder, gp_jax.main).
pytestmark = pytest.mark.e2e
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
POINTS = 8
BEAT = 0.3  # heartbeat seconds in these tests; stale after 3 missed beats


# ----------------------------------------------------------------------------- emulator


@pytest.fixture(scope="module")
def gcs():
  """The emulator, with this process's gcsfs retrying after 1% of its sleeps (a lost answer costs 1-2 s otherwise)."""
  restore = scale_gcsfs_backoff(0.01)
  try:
    with emulator() as (url, env):
      yield url, env
  finally:
    restore()


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
  killed_at = time.time()  # before the kill: a claimer may see the zombie before wait() returns here
  victim.kill()
  victim.wait()
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


def test_four_workers_local_one_killed(tmp_path):
  _run_pool(str(tmp_path / "sweep"), tmp_path, {})
  assert not any((tmp_path / "sweep" / d / "_launch").exists() for d in os.listdir(tmp_path / "sweep")
                 if d != "_launch")


def test_four_workers_gcs_one_killed(gcs, tmp_path):
  _run_pool("gs://bucket/pool", tmp_path, gcs[1])


# ----------------------------------------------------------------------------- a dead holder on this host


def _child(code: str) -> tuple[subprocess.Popen, str]:
  """A Python child that runs `code`, prints one line (what `code` leaves in `out`) and then waits on its stdin."""
  child = subprocess.Popen([sys.executable, "-c", f"{code}\nprint(out, flush=True)\ninput()"], cwd=REPO,
                           env={**os.environ, "PYTHONPATH": REPO}, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True)
  return child, child.stdout.readline().strip()


def test_process_gone_only_for_a_dead_process_of_this_host():
  me = lease_lib.process_identity()
  assert not lease_lib.process_gone(me)
  child, out = _child("import json; from gp_jax import lease; out = json.dumps(lease.process_identity())")
  them = json.loads(out)
  assert them["pid"] == child.pid and not lease_lib.process_gone(them)
  child.kill()
  if hasattr(os, "waitid"):
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie
    assert lease_lib.process_gone(them)
  child.wait()
  assert lease_lib.process_gone(them)
  # Unknowable from here: another host, another pid namespace (a container), a lease without the record.
  assert not lease_lib.process_gone({**them, "host": them["host"] + "-elsewhere"})
  assert not lease_lib.process_gone({**them, "pid_ns": "pid:[1]"})
  assert not lease_lib.process_gone(None)
  if me["start"] is not None:  # Linux: our pid with another start time is a later process under a reused pid
    assert lease_lib.process_gone({**me, "start": me["start"] - 1})


def test_a_killed_holders_lease_is_taken_over_at_once(tmp_path):
  """Heartbeats of an hour: only the holder's recorded process, gone from this host, makes its lease stale."""
  folder = str(tmp_path / "_launch" / "leases" / "p")
  child, out = _child(f"from gp_jax import lease; l = lease.Lease({folder!r}, owner='w7@' + lease.owner_label(), "
                      "heartbeat=3600); out = l.try_acquire()")
  assert out == "True"
  waiting = lease_lib.Lease(folder, owner="me", heartbeat=3600)
  assert not waiting.try_acquire() and waiting.holder.owner == f"w7@{lease_lib.owner_label().split(':')[0]}:{child.pid}"
  child.kill()
  child.wait()
  assert waiting.try_acquire() and waiting.epoch == 1
  assert lease_lib.history(folder)[1]["took_over"]
  waiting.release()


def test_workdir_lock_goes_with_its_process(tmp_path):
  child, out = _child(f"from gp_jax import lease; l = lease.WorkdirLock({str(tmp_path)!r}); out = l.try_acquire()")
  assert out == "True"
  mine = lease_lib.WorkdirLock(str(tmp_path))
  assert not mine.try_acquire()
  holder = mine.holder()
  assert holder.owner.endswith(f":{child.pid}") and holder.process["pid"] == child.pid
  assert f"a live process holding {tmp_path / 'run.lock'}" in holder.describe()
  child.kill()
  child.wait()
  assert mine.try_acquire()
  other = lease_lib.WorkdirLock(str(tmp_path))
  assert not other.try_acquire()  # another open of the file, even in this process
  mine.release()
  assert other.try_acquire()
  other.release()
  assert os.listdir(tmp_path) == ["run.lock"]


# ----------------------------------------------------------------------------- gp_jax.main against holders


def _main(workdir: str, **env):
  from tests import helpers_train as ht
  from tests import zygote

  return zygote.run(ht.main_command(workdir, num_train_steps=2, **{"data.max_eval_records": 8}), cwd=REPO,
                    env=ht.subprocess_env(devices=1, **env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True, timeout=180)


def _refusal(out) -> str:
  assert out.returncode == 2, out.stderr[-3000:]
  err = [line for line in out.stderr.splitlines() if line.startswith("error:")]
  assert len(err) == 1 and "Traceback" not in out.stderr, out.stderr[-3000:]
  return err[0]


def test_second_main_on_a_plain_workdir_refuses_and_writes_nothing_beside_it(tmp_path):
  """A plain local workdir held by a live process (its lock): gp_jax.main exits 2 in one line naming the holder,
  before touching JAX state; the lock file is the only thing written, inside the workdir."""
  workdir = str(tmp_path / "run")
  os.makedirs(workdir)
  holder = lease_lib.WorkdirLock(workdir)
  assert holder.try_acquire()
  try:
    out = _main(workdir)
  finally:
    holder.release()
  line = _refusal(out)
  assert f"{workdir} is held by {lease_lib.owner_label()} (a live process holding" in line, line
  assert "another --workdir" in line
  assert os.listdir(tmp_path) == ["run"] and os.listdir(workdir) == ["run.lock"]


def test_main_under_a_sweep_root_respects_a_live_workers_lease_and_takes_a_dead_ones(tmp_path):
  """A point of a sweep root (ROOT/_launch/ exists): a live worker's lease refuses gp_jax.main; the lease of a worker
  SIGKILLed on this host is taken over at once (lease timings of an hour), and the run finishes."""
  root = tmp_path / "sweep"
  (root / "_launch").mkdir(parents=True)
  point = str(root / "default" / "seed=0")
  folder = lease_lib.lease_dir(point, root=str(root))
  live = lease_lib.Lease(folder, owner=f"w9@{lease_lib.owner_label()}", heartbeat=3600)
  assert live.try_acquire()
  try:
    line = _refusal(_main(point, GP_JAX_LEASE_HEARTBEAT_S=3600))
  finally:
    live.release(outcome="test")
  assert f"held by w9@{lease_lib.owner_label()} (lease epoch 0" in line and "taken over at once" in line, line
  assert not os.path.exists(point)  # refused before creating it

  child, out = _child(f"from gp_jax import lease; l = lease.Lease({folder!r}, owner='w8@' + lease.owner_label(), "
                      "heartbeat=3600); out = l.try_acquire()")
  assert out == "True"
  child.kill()
  child.wait()
  done = _main(point, GP_JAX_LEASE_HEARTBEAT_S=3600)
  assert done.returncode == 0, done.stderr[-3000:]
  hist = lease_lib.history(folder)
  host = lease_lib.owner_label().split(":")[0]
  assert [h["owner"].split(":")[0] for h in hist] == [f"w9@{host}", f"w8@{host}", host]  # the last: gp_jax.main
  assert hist[2]["took_over"] and hist[2]["released"] and not hist[1].get("released")
