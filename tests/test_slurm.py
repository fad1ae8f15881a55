"""launch.slurm against a real one-node SLURM cluster on localhost (tests/slurm_cluster.py: Debian's packages are
installed when missing and the tests run as root; otherwise the cluster's tests skip with one line saying why).

Every scenario the selected tests need is submitted when the first of them starts, so the scheduler runs them side
by side (most of their time is SLURM's own: a requeued task starts again ~6 s later, the time-limit signal comes
within ~30 s); a thread signals the held points as soon as they hold, and the failing, queue and two-task scenarios
start once the held points have ended, in the time-limit scenario's wait (`Later`); each test then checks its own.
Orchestration uses a stand-in runner (no JAX); the trainer's tests (e2e) train experiments/synthetic.py, tiny:
- a 2-point sweep as one array (1 process x 2 CPU devices per point) finishes; status and launch.report read it, and
  so does the --report job, which runs once the array has ended;
- `scontrol requeue` of one point and a partition-priority preemption of the other, each while the point is held
  mid-run: the checkpoint is saved at the signal's step (not the periodic one), status goes preempted -> finished,
  and the final state is bit-identical to the uninterrupted sweep's;
- a point of 2 tasks x 1 CPU device under srun (jax.distributed from SLURM's variables) ends within rtol 1e-5 of
  1 process x 2 devices;
- stand-ins: a time-limit signal (USR1) requeues and finishes; a point that fails twice is marked failed with its
  log's tail; a second submit skips the finished, the running and the queued points; cancel shows cancelled.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import threading
import time

import numpy as np
import pytest

from gp_jax.errors import UserError
from launch import local, slurm, slurm_task, worker
from tests import helpers_train as ht
from tests import slurm_cluster

TIMEOUT_S = 300.0  # a safety net for each wait; the scenarios take well under it
GATE = 6  # a held trainer waits for SIGTERM before this step's call
# One checkpoint before the gate (step 4): the signal's checkpoint (step 7) is not it. Adam's eps = 1e-3 keeps updates
# linear in small gradients, so 2 processes match 1 within rtol 1e-5 (as tests/e2e/test_multihost.py).
OVERRIDES = {"num_train_steps": 12, "checkpoint_every_steps": 4, "optimizer.warmup_steps": 0, "optimizer.eps": 1e-3,
             "data.max_eval_records": 8}
STANDARD, EFFICIENT = "default/head=standard", "default/head=efficient"  # experiments/synthetic.py's sweep
STANDIN = "tests.test_slurm:standin"
STANDIN_EXPERIMENT = """
import ml_collections
def get_config(arg=None):
  return ml_collections.ConfigDict({"mode": "finish", "x": 0})
def get_sweep(arg=None):
  return [{"config.mode": m, "config.x": i} for i, m in enumerate(arg.split("+"))]
"""


# ----------------------------------------------------------------------------- runners (in the SLURM tasks)


def _attempt() -> int:
  return int(os.environ.get("SLURM_RESTART_COUNT", "0")) + 1


def _wait_for_sigterm(message: str, timeout: float = 120.0) -> bool:
  """Prints `message`, then waits until SIGTERM comes (the handler already installed still gets it)."""
  got = threading.Event()
  previous = signal.getsignal(signal.SIGTERM)

  def handler(signum, frame):
    got.set()
    if callable(previous):
      previous(signum, frame)

  signal.signal(signal.SIGTERM, handler)
  print(message, flush=True)
  end = time.monotonic() + timeout
  try:
    # Short waits: a signal delivered to another thread runs its Python handler only once this thread wakes.
    while not got.wait(0.05) and time.monotonic() < end:
      pass
  finally:
    signal.signal(signal.SIGTERM, previous)
  return got.is_set()


def standin(config, workdir: str) -> dict:
  """A point without a trainer, by config.mode: finish; fail (raises); block (a first attempt waits for SIGTERM and
  ends preempted, as the trainer would; a later attempt finishes)."""
  from etils import epath

  print(f"stand-in {config.mode}, attempt {_attempt()}", flush=True)
  if config.mode == "fail":
    raise RuntimeError(f"stand-in failure, attempt {_attempt()}")
  status = "finished"
  if config.mode == "block" and _attempt() == 1:
    if not _wait_for_sigterm("stand-in: waiting for SIGTERM"):
      raise RuntimeError("stand-in: no SIGTERM came")
    status = "preempted"
  folder = epath.Path(workdir)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "results.json").write_text(json.dumps({"status": status}))
  return {"status": status}


def gated_train(config, workdir: str) -> dict:
  """The trainer; on a first attempt it holds before step GATE + 1 until SIGTERM comes (the test sends it on seeing
  "GATE"), so the signal lands mid-point however fast the machine is. Host side only: the numerics are the trainer's."""
  from gp_jax import feed as feed_lib
  from gp_jax import runtime

  runtime.configure()
  if _attempt() == 1:
    iterate = feed_lib.Feed.__iter__

    def held(self):
      waiting = True
      for fed in iterate(self):
        if waiting and fed.group.first >= GATE:
          waiting = False
          if not _wait_for_sigterm(f"GATE at step {fed.group.first}"):
            raise RuntimeError("gated_train: no SIGTERM came")
        yield fed

    feed_lib.Feed.__iter__ = held
  return worker.train_point(config, workdir)


# ----------------------------------------------------------------------------- helpers


STDOUT = threading.Lock()  # held while sys.stdout is redirected: the scenarios' threads submit too


def submit(*argv) -> str:
  out = io.StringIO()
  with STDOUT, contextlib.redirect_stdout(out):
    rc = slurm.main(["submit", *map(str, argv)])
  assert rc == 0, out.getvalue()
  return out.getvalue()


def folder_of(workdir) -> str:
  return slurm.slurm_dir(str(workdir), None)


def last_submission(workdir) -> dict:
  return slurm.submissions(folder_of(workdir))[-1]


def statuses(workdir) -> dict[str, str]:
  rows, _ = slurm.status_table(str(workdir), folder_of(workdir))
  return {r["point"]: r["status"] for r in rows}


def expect_statuses(workdir, expected: dict) -> None:
  """`statuses(workdir) == expected`, asked again while squeue does not answer (a loaded machine)."""
  def answered():
    now = statuses(workdir)
    return now if "unknown" not in now.values() else None

  assert wait_for(answered, "squeue to answer") == expected


def wait_for(predicate, what: str, timeout: float = TIMEOUT_S):
  end = time.monotonic() + timeout
  while True:
    value = predicate()
    if value:
      return value
    if time.monotonic() > end:
      raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
    time.sleep(0.2)  # polling squeue and the workdir: SLURM announces nothing


def log_of(sub: dict, index: int = 0) -> str:
  return slurm_task.log_path(sub, sub["job_id"], index)


def read(path: str) -> str:
  try:
    with open(path, errors="replace") as f:
      return f.read()
  except FileNotFoundError:
    return ""


def wait_for_text(path: str, text: str) -> None:
  wait_for(lambda: text in read(path), f"{text!r} in {path}")


class Tracker:
  """Each point's statuses, in order, as `launch.slurm status` shows them, one look a `poll`."""

  def __init__(self, workdir, points: list[str]):
    self.workdir, self.seen, self.ended = workdir, {p: [] for p in points}, {p: False for p in points}

  def poll(self) -> bool:
    """Looks once; True when every point has ended: finished, failed, cancelled, stopped, or preempted and no longer
    in the queue."""
    rows = {r["point"]: r for r in slurm.status_table(str(self.workdir), folder_of(self.workdir))[0]}
    for p, seen in self.seen.items():
      row = rows.get(p, {"status": None, "queue": None})
      if not seen or seen[-1] != row["status"]:
        seen.append(row["status"])
      queued = (row["queue"] or "").upper() in slurm.QUEUED | slurm.RUNNING
      self.ended[p] = row["status"] in ("finished", "failed", "cancelled", "stopped") or (
          row["status"] == "preempted" and not queued)
    return all(self.ended.values())


def track(workdir, points: list[str]) -> dict[str, list[str]]:
  """Each point's statuses, in order, until every one has ended."""
  tracker = Tracker(workdir, points)
  wait_for(tracker.poll, f"{points} to end in {workdir}")
  return tracker.seen


def xla_setup(devices: int) -> str:
  return f"--setup=export XLA_FLAGS={shlex.quote(local.worker_env(devices)['XLA_FLAGS'])}"


def state(sub: dict, index: int) -> dict:
  return slurm_task.read_state(sub, index)


# ----------------------------------------------------------------------------- the cluster and the scenarios


@pytest.fixture(scope="module")
def cluster():
  if os.geteuid() != 0:
    pytest.skip(f"no SLURM cluster: its daemons start as root (slurmd, munged as the munge user); this is uid "
                f"{os.geteuid()}")
  with slurm_cluster.Cluster.lock():  # also one apt-get at a time
    why = slurm_cluster.install_packages()
    if why:
      pytest.skip(f"no SLURM cluster: {why}")
    root = tempfile.mkdtemp(prefix="gp_jax_slurm_", dir="/tmp")  # munged (the munge user) must reach it
    c = slurm_cluster.Cluster(root)
    try:
      c.start()
      with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", c.conf)
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [ht.REPO, os.environ.get("PYTHONPATH")])))
        mp.setenv("PYTHONUNBUFFERED", "1")
        yield c
    finally:
      c.stop()
      shutil.rmtree(root, ignore_errors=True)


def start_time_limit(tmp):
  workdir = tmp / "time_limit"
  submit(f"--config={tmp / 'standin.py'}:block", f"--workdir={workdir}", f"--runner={STANDIN}", "--time=1",
         "--signal_s=60")
  return workdir


def start_failing(tmp):
  workdir = tmp / "failing"
  submit(f"--config={tmp / 'standin.py'}:fail", f"--workdir={workdir}", f"--runner={STANDIN}", "--max_failures=2")
  return workdir


def start_queue(tmp):
  workdir = tmp / "queue"
  submit(f"--config={tmp / 'standin.py'}:finish+block+block", f"--workdir={workdir}", f"--runner={STANDIN}",
         "--max_parallel=1")
  return workdir


def start_reference(tmp):
  workdir = tmp / "reference"
  submit(f"--config={ht.CONFIG_FILE}", f"--workdir={workdir}", xla_setup(2), "--report", "--",
         *ht.flag_args(**OVERRIDES))
  return workdir


class Later(threading.Thread):
  """Submits a scenario and drives it (`body(self)`) in a thread: at once, or with `delayed` once the held points
  have ended (their scenario selected) or else once the reference's points have compiled their programs (so that it
  does not slow those scenarios' start-up and compile). What went wrong is kept for the test to raise."""

  def __init__(self, tmp, body, delayed: bool):
    super().__init__(daemon=True, name="slurm-scenario")
    self.tmp, self.body, self.delayed = tmp, body, delayed
    self.stop, self.error, self.high, self.seen = threading.Event(), None, None, None

  def wait_text(self, path: str, text: str, tracker: Tracker | None = None) -> None:
    """Until `text` is in the file at `path`; `tracker` looks at the statuses meanwhile."""
    def ready():
      if tracker is not None:
        tracker.poll()
      return self.stop.is_set() or text in read(path)

    wait_for(ready, f"{text!r} in {path}")
    self._go_on()

  def _go_on(self) -> None:
    if self.stop.is_set():
      raise RuntimeError("stopped: the module's scenarios ended")

  def _wait_for_the_held_points_or_the_reference(self) -> None:
    held, reference = LATER.get(str(self.tmp / "interrupted")), self.tmp / "reference"
    if held is not None:
      while held.is_alive() and not self.stop.is_set():
        held.join(0.5)
      self._go_on()
    elif os.path.isdir(folder_of(reference)):  # submitted first when a test reads it
      ref = last_submission(reference)
      for i in range(len(ref["points"])):
        self.wait_text(log_of(ref, i), " s of compile summed")  # aot's line once every program compiled

  def run(self):
    try:
      if self.delayed:
        self._wait_for_the_held_points_or_the_reference()
      self.body(self)
    except BaseException as e:  # pylint: disable=broad-except  (raised again by the test)
      self.error = e


LATER: dict[str, Later] = {}  # workdir -> its thread


def later(tmp, name: str, body, *, delayed: bool = False):
  workdir = tmp / name
  LATER[str(workdir)] = Later(tmp, body, delayed)
  LATER[str(workdir)].start()
  return workdir


def submitted(workdir) -> Later:
  """The scenario's thread, once it has submitted (and signalled) what it had to."""
  thread = LATER[str(workdir)]
  thread.join(TIMEOUT_S)
  assert not thread.is_alive(), f"the thread of {workdir} did not end"
  if thread.error is not None:
    raise thread.error
  return thread


def interrupt(thread: Later) -> None:
  """Both points held mid-run: the standard head on the default partition, requeued by `scontrol requeue`; the
  efficient head on `low` with most of the node's memory, evicted alone by a `high` job asking for as much. Each
  signalled as soon as it holds; their statuses followed from the start until both have ended (`thread.seen`)."""
  workdir = thread.tmp / "interrupted"
  common = [f"--config={ht.CONFIG_FILE}", f"--workdir={workdir}", "--runner=tests.test_slurm:gated_train",
            xla_setup(2)]
  flags = ["--", *ht.flag_args(**OVERRIDES)]
  submit(*common, "--only=head=standard", *flags)
  submit(*common, "--only=head=efficient", "--partition=low", "--sbatch_args=--mem=60000", *flags)
  requeued, preempted = slurm.submissions(folder_of(workdir))
  tracker = Tracker(workdir, [STANDARD, EFFICIENT])
  thread.wait_text(log_of(requeued), f"GATE at step {GATE}", tracker)
  subprocess.run(["scontrol", "requeue", f"{requeued['job_id']}_0"], check=True)
  thread.wait_text(log_of(preempted), f"GATE at step {GATE}", tracker)
  thread.high = subprocess.run(["sbatch", "--parsable", "--partition=high", "--mem=60000", "--output=/dev/null",
                                "--wrap=true"], check=True, capture_output=True, text=True).stdout.strip()
  wait_for(lambda: thread.stop.is_set() or tracker.poll(), f"{[STANDARD, EFFICIENT]} to end in {workdir}")
  thread.seen = tracker.seen


def two_tasks(thread: Later) -> None:
  submit(f"--config={ht.CONFIG_FILE}", f"--workdir={thread.tmp / 'two_tasks'}", "--only=head=standard",
         "--tasks_per_node=2", xla_setup(1), "--setup=export JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo", "--",
         *ht.flag_args(**OVERRIDES))


# The reference and the held points start at once (theirs are the paths of the first tests that wait), the time
# limit too: SLURM looks at time limits every 30 s (slurmctld's PERIODIC_TIMEOUT), so its point gets USR1 ~30 s after
# the cluster started and the module waits on it for ~35 s. The two-task point and the stand-ins' failing and queue
# scenarios start once the held points have ended: their work fills that wait instead of slowing the scenarios before
# it (their tests come after the time limit's). Insertion order matters: "interrupted" before the delayed ones.
START = {"time_limit": start_time_limit, "reference": start_reference,
         "interrupted": lambda tmp: later(tmp, "interrupted", interrupt),
         "failing": lambda tmp: later(tmp, "failing", lambda _: start_failing(tmp), delayed=True),
         "queue": lambda tmp: later(tmp, "queue", lambda _: start_queue(tmp), delayed=True),
         "two_tasks": lambda tmp: later(tmp, "two_tasks", two_tasks, delayed=True)}
NEEDS = {  # test -> the scenarios it reads
    "test_a_sweep_as_one_array_finishes_and_report_reads_it": ("reference",),
    "test_requeue_and_preemption_save_at_the_signal_and_resume_bit_identical": ("reference", "interrupted"),
    "test_two_tasks_under_srun_match_one_process_with_two_devices": ("reference", "two_tasks"),
    "test_time_limit_signal_requeues_and_finishes": ("time_limit",),
    "test_a_point_failing_twice_is_marked_failed_with_its_log_tail": ("failing",),
    "test_second_submit_skips_finished_running_and_queued_then_cancel": ("queue",),
}


@pytest.fixture(scope="module")
def scenarios(cluster, request, tmp_path_factory):
  """Submits, at once, every scenario the selected tests of this module read; name -> workdir."""
  selected = {item.originalname for item in request.session.items if item.module is request.module}
  tmp = tmp_path_factory.mktemp("slurm")
  (tmp / "standin.py").write_text(STANDIN_EXPERIMENT)
  try:
    yield {name: START[name](tmp) for name in START if any(name in NEEDS.get(t, ()) for t in selected)}
  finally:
    for thread in LATER.values():
      thread.stop.set()
      thread.join(timeout=30)
    LATER.clear()


# ----------------------------------------------------------------------------- no cluster needed


def test_local_device_ids_bind_each_process_to_its_own_gpus():
  env = lambda visible, local_id: {"CUDA_VISIBLE_DEVICES": visible, "SLURM_LOCALID": str(local_id)}  # noqa: E731
  assert slurm_task.local_device_ids(0, env("", 3)) is None  # CPU processes: nothing to bind
  # --gpus-per-task (SLURM bound them): each task sees only its own, numbered from 0, whatever its local id.
  assert slurm_task.local_device_ids(1, env("5", 3)) == [0]
  assert slurm_task.local_device_ids(2, env("4,5", 2)) == [0, 1]
  # Every task sees the node's GPUs (--gpus-per-node): the local id picks its group.
  assert slurm_task.local_device_ids(1, env("0,1,2,3,4,5,6,7", 3)) == [3]
  assert slurm_task.local_device_ids(2, env("0,1,2,3,4,5,6,7", 3)) == [6, 7]
  assert slurm_task.local_device_ids(1, {"SLURM_LOCALID": "2"}) == [2]
  with pytest.raises(UserError, match="CUDA_VISIBLE_DEVICES=0,1"):
    slurm_task.local_device_ids(1, env("0,1", 3))


def test_the_task_agrees_with_the_worker_on_exit_codes_and_runner():
  """slurm_task keeps launch.worker's exit codes and default runner as its own constants (it imports the worker, and
  with it jax, only to run a point): they must stay the worker's."""
  assert (slurm_task.EXIT_PREEMPTED, slurm_task.EXIT_USAGE) == (worker.EXIT_PREEMPTED, worker.EXIT_USAGE)
  assert slurm_task.TRAIN_POINT == worker.TRAIN_POINT


def test_a_gs_workdir_needs_a_slurm_dir():
  with pytest.raises(UserError, match="--slurm_dir"):
    slurm.slurm_dir("gs://bucket/runs", None)


# ----------------------------------------------------------------------------- with the cluster


def test_dry_run_prints_a_valid_script_and_submits_nothing(cluster, tmp_path):
  (tmp_path / "standin.py").write_text(STANDIN_EXPERIMENT)
  workdir = tmp_path / "dry"
  jobs = cluster.jobs()
  for tasks, expect in ((1, 'kill -TERM "$child"'), (2, 'scancel --signal=TERM "$SLURM_JOB_ID"')):
    out = submit(f"--config={tmp_path / 'standin.py'}:finish+block", f"--workdir={workdir}", f"--runner={STANDIN}",
                 "--dry_run", "--max_parallel=1", "--time=1:00:00", f"--tasks_per_node={tasks}")
    script = read(os.path.join(folder_of(workdir), "dry_run.sbatch"))
    assert script and script in out, out
    for line in ("#SBATCH --array=0-1%1", "#SBATCH --time=1:00:00", "#SBATCH --requeue", "#SBATCH --signal=B:USR1@300",
                 "#SBATCH --open-mode=append", f"#SBATCH --ntasks-per-node={tasks}", "trap on_usr1 USR1", expect,
                 "  finish+block/mode=finish,x=0  # 0", "  finish+block/mode=block,x=1  # 1", 'scontrol requeue'):
      assert line in script, line
    assert ("srun " in script) == (tasks > 1)
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # bash parses it
    assert "sbatch --test-only: sbatch: Job" in out and "to start at" in out, out
  assert cluster.jobs() == jobs and slurm.submissions(folder_of(workdir)) == []


@pytest.mark.e2e
def test_a_sweep_as_one_array_finishes_and_report_reads_it(scenarios):
  from launch import report

  workdir = scenarios["reference"]
  seen = track(workdir, [STANDARD, EFFICIENT])
  assert seen[STANDARD][-1] == seen[EFFICIENT][-1] == "finished", seen
  sub = last_submission(workdir)
  assert sub["points"] == [STANDARD, EFFICIENT] and "#SBATCH --array=0-1\n" in read(os.path.join(sub["dir"],
                                                                                                 "job.sbatch"))
  assert [state(sub, i)["attempts"] for i in (0, 1)] == [1, 1]
  out = io.StringIO()
  with STDOUT, contextlib.redirect_stdout(out):
    assert report.main([str(workdir)]) == 0
  # The --report job ran launch.report once the array had ended (afterany), with the same table.
  report_log = os.path.join(sub["log_dir"], f"report-{sub['report_job_id']}.log")
  wait_for(lambda: not job_alive(sub["report_job_id"]), "the report job to end")
  assert "## Finished runs" in read(report_log), read(report_log)
  for point in (STANDARD, EFFICIENT):
    with open(os.path.join(workdir, point, "results.json")) as f:
      results = json.load(f)
    assert results["steps"] == OVERRIDES["num_train_steps"]
    assert f"{100 * results['test']['f1']:.2f}" in out.getvalue(), out.getvalue()
    assert f"{100 * results['test']['f1']:.2f}" in read(report_log), read(report_log)


@pytest.mark.e2e
def test_requeue_and_preemption_save_at_the_signal_and_resume_bit_identical(scenarios):
  reference, workdir = scenarios["reference"], scenarios["interrupted"]
  thread = submitted(workdir)  # it signalled the held points and followed their statuses until both ended
  high, seen = thread.high, thread.seen
  requeued, preempted = slurm.submissions(folder_of(workdir))
  track(reference, [STANDARD, EFFICIENT])
  for point, sub in ((STANDARD, requeued), (EFFICIENT, preempted)):
    assert seen[point][-1] == "finished" and "preempted" in seen[point], (point, seen)
    assert seen[point].index("preempted") < len(seen[point]) - 1
    log = read(log_of(sub))
    assert log.count(f"GATE at step {GATE}") == 1, log[-3000:]
    # The checkpoint of the signal's step (GATE + 1), not the periodic one of step 4, and the restart resumed it.
    assert f"SIGTERM at step {GATE + 1}: saving its checkpoint" in log, log[-3000:]
    assert f"Resumed from {workdir}/{point}/ckpt at step {GATE + 1}" in log, log[-3000:]
    assert "SIGTERM (preempted, requeued or cancelled): the point saves a checkpoint and stops" in log
    record = state(sub, 0)
    assert record["attempts"] == 2 and record["failures"] == 0
    assert record["history"][0]["outcome"].startswith("stopped by SLURM"), record
    step_i, state_i = ht.restore_state(os.path.join(workdir, point))
    step_r, state_r = ht.restore_state(os.path.join(reference, point))
    assert step_i == step_r == OVERRIDES["num_train_steps"]
    flat_i, flat_r = ht.flat(state_i), ht.flat(state_r)
    assert flat_i.keys() == flat_r.keys()
    for k in flat_r:
      np.testing.assert_array_equal(flat_i[k], flat_r[k], err_msg=f"{point} {k}")
    results = [json.loads(read(os.path.join(w, point, "results.json"))) for w in (workdir, reference)]
    assert results[0]["dev"] == results[1]["dev"] and results[0]["test"] == results[1]["test"]
  assert "DUE TO PREEMPTION" in read(log_of(preempted)) and "DUE TO JOB REQUEUE" in read(log_of(requeued))
  assert high


def test_time_limit_signal_requeues_and_finishes(scenarios):
  workdir = scenarios["time_limit"]
  point = "block/mode=block,x=0"
  seen = track(workdir, [point])
  assert seen[point][-1] == "finished", seen
  sub = last_submission(workdir)
  first = state(sub, 0)["history"][0]
  # The first attempt saved (exit 3: preempted; or 143 when SLURM's own SIGTERM at the limit came after it saved)
  # and was requeued; the next one finished (every attempt gets a fresh limit, so USR1 may come again: then the
  # finished point stays finished).
  assert first["signal"] == "USR1" and first["outcome"].startswith("time limit"), first
  assert first["rc"] in (slurm_task.EXIT_PREEMPTED, 128 + signal.SIGTERM), first
  log = read(log_of(sub))
  assert "USR1: time limit near" in log and f"requeueing {sub['job_id']}" in log, log
  assert "stand-in block, attempt 2" in log, log
  with open(os.path.join(workdir, point, "results.json")) as f:
    assert json.load(f)["status"] == "finished"


@pytest.mark.e2e
def test_two_tasks_under_srun_match_one_process_with_two_devices(scenarios):
  reference, workdir = scenarios["reference"], scenarios["two_tasks"]
  submitted(workdir)
  assert track(workdir, [STANDARD])[STANDARD][-1] == "finished", read(log_of(last_submission(workdir)))[-4000:]
  track(reference, [STANDARD])
  log = read(log_of(last_submission(workdir)))
  assert "Distributed: process 0 of 2, 1 local / 2 global devices" in log, log[-4000:]
  _, multi = ht.restore_state(os.path.join(workdir, STANDARD))
  _, single = ht.restore_state(os.path.join(reference, STANDARD))
  pm, ps = ht.flat(multi["params"]), ht.flat(single["params"])
  assert pm.keys() == ps.keys()
  for k in ps:
    np.testing.assert_allclose(pm[k], ps[k], rtol=1e-5, atol=1e-7, err_msg=k)
  results = [json.loads(read(os.path.join(w, STANDARD, "results.json"))) for w in (workdir, reference)]
  assert results[0]["dev"]["gold"] == results[1]["dev"]["gold"] > 0
  assert abs(results[0]["dev"]["f1"] - results[1]["dev"]["f1"]) < 1e-6


def test_a_point_failing_twice_is_marked_failed_with_its_log_tail(scenarios):
  workdir = scenarios["failing"]
  submitted(workdir)
  point = "fail/mode=fail,x=0"
  seen = track(workdir, [point])
  assert seen[point][-1] == "failed", seen
  sub = last_submission(workdir)
  record = state(sub, 0)
  assert (record["attempts"], record["failures"]) == (2, 2), record
  assert any("RuntimeError: stand-in failure, attempt 2" in line for line in record["failed"]["log_tail"]), record
  _, text = slurm.status_table(str(workdir), folder_of(workdir))
  assert "failed 2 times (--max_failures=2)" in text and "RuntimeError: stand-in failure, attempt 2" in text, text
  wait_for(lambda: cluster_jobs_of(sub) == {}, "the failed task to leave the queue")


def job_alive(job_id: str) -> bool:
  """Whether the job is queued or running; True while squeue does not answer (a loaded machine)."""
  out = subprocess.run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], capture_output=True, text=True)
  if out.returncode and "Invalid job id" not in out.stderr:
    return True
  return any(state in slurm.QUEUED | slurm.RUNNING for state in out.stdout.split())


def cluster_jobs_of(sub: dict) -> dict | None:
  """(array job id, index) -> state of the submission's tasks still queued or running; None while squeue does not
  answer."""
  q = slurm.queue([sub["job_id"]])
  return None if q is None else {k: v for k, v in q.items() if v[0] in slurm.QUEUED | slurm.RUNNING}


def test_second_submit_skips_finished_running_and_queued_then_cancel(scenarios):
  workdir = scenarios["queue"]
  submitted(workdir)
  finished, running, queued = "finish+block+block/mode=finish,x=0", "finish+block+block/mode=block,x=1", \
      "finish+block+block/mode=block,x=2"
  first = last_submission(workdir)
  wait_for_text(log_of(first, 1), "stand-in: waiting for SIGTERM")
  expect_statuses(workdir, {finished: "finished", running: "running", queued: "pending"})
  out = submit(f"--config={first['config']}", f"--workdir={workdir}", f"--runner={STANDIN}")
  assert f"{finished}: finished; skipped" in out, out
  assert f"{running}: in the queue ({first['job_id']}_1 running); skipped" in out, out
  assert f"{queued}: in the queue ({first['job_id']}_2 pending); skipped" in out, out
  assert "nothing to submit" in out and len(slurm.submissions(folder_of(workdir))) == 1
  # The queued point alone, then the rest: the marker names the points it cancelled.
  assert cancel(workdir, "--only=x=2") == f"  {queued}: cancelled\n"
  wait_for(lambda: set(cluster_jobs_of(first) or ()) == {(first["job_id"], 1)}, "the cancelled task to leave the "
           "queue")
  expect_statuses(workdir, {finished: "finished", running: "running", queued: "cancelled"})
  assert cancel(workdir) == f"  {running}: cancelled\n"
  wait_for(lambda: cluster_jobs_of(first) == {}, "the cancelled tasks to leave the queue")
  expect_statuses(workdir, {finished: "finished", running: "cancelled", queued: "cancelled"})
  assert state(first, 1)["history"][-1]["outcome"] == "cancelled"  # its process saw SIGTERM only; the marker told
  assert state(first, 2)["attempts"] == 0


def cancel(workdir, *flags) -> str:
  out = io.StringIO()
  with STDOUT, contextlib.redirect_stdout(out):
    assert slurm.main(["cancel", f"--workdir={workdir}", *flags]) == 0
  return out.getvalue()
