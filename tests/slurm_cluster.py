"""A one-node SLURM cluster on localhost, for the tests of launch.slurm and for trying it by hand (as root).

  python -m tests.slurm_cluster start DIR    # then: export SLURM_CONF=DIR/slurm.conf (printed)
  python -m tests.slurm_cluster stop DIR

Everything lives in DIR: slurm.conf, a munge key and socket, state, spool, logs and the daemons' PIDs. munged runs as
the munge user (through setpriv, which execs it: the PID is munged's), slurmctld and slurmd as root (no systemd
here); they are stopped by the PIDs recorded in DIR/pids.json, never by name, once every job is cancelled. The node
is `localhost` (127.0.0.1) with 16 CPUs and 100 GB (config_overrides: more than the machine has, so that array
tasks and 2-task points share it; memory is counted, not enforced). Partitions: `main` (default, never preempted),
`low` and `high`: a `high` job evicts a `low` one that holds what it needs (preempt/partition_prio,
PreemptMode=REQUEUE). What this sandbox needs and why: proctrack/linuxproc and task/none (the cgroup plugins need a
freezer cgroup that is not mounted), cred_expire=5 (a requeued job may start again after it, not after the default
120 s; 5 is the least slurmctld takes), sched_interval=1 and bf_interval=1 (a requeued job starts ~6 s after the
requeue; sched_interval=5 made it ~8 s). One slurmd per host: `Cluster.lock` serialises the users of this module.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import time

import portpicker

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
BINARIES = ("slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "srun", "munged")
NODE, CPUS, MEMORY_MB = "localhost", 16, 100_000
LOCK = "/tmp/gp_jax_slurm_cluster.lock"
START_TIMEOUT_S = 30.0

CONF = """\
ClusterName=gpjax
SlurmctldHost={node}(127.0.0.1)
SlurmUser=root
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={dir}/munge/munge.socket,cred_expire=5
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1,bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
DefMemPerCPU=100
SlurmdParameters=config_overrides
ReturnToService=2
JobRequeue=1
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
KillWait=30
InactiveLimit=0
MinJobAge=300
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory_mb} State=UNKNOWN
PartitionName=main Nodes={node} Default=YES MaxTime=INFINITE State=UP PriorityTier=5 PreemptMode=OFF
PartitionName=low Nodes={node} MaxTime=INFINITE State=UP PriorityTier=1
PartitionName=high Nodes={node} MaxTime=INFINITE State=UP PriorityTier=10
"""


def missing_binaries() -> list[str]:
  return [b for b in BINARIES if shutil.which(b) is None and not os.path.exists(f"/usr/sbin/{b}")]


def install_packages() -> str | None:
  """Installs Debian's SLURM and munge packages when they are missing: None when they are there, else why not."""
  if not missing_binaries():
    return None
  if os.geteuid() != 0:
    return f"SLURM is not installed ({', '.join(missing_binaries())} missing) and installing it needs root"
  if shutil.which("apt-get") is None:
    return "SLURM is not installed and there is no apt-get to install it with"
  env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
  for cmd in (["apt-get", "update", "-q"],
              ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if out.returncode:
      tail = (out.stderr.strip().splitlines() or ["?"])[-1]
      return f"{' '.join(cmd[:2])} failed (exit {out.returncode}): {tail}"
  missing = missing_binaries()
  return f"installed {' '.join(PACKAGES)} but {', '.join(missing)} still missing" if missing else None


def _binary(name: str) -> str:
  return shutil.which(name) or f"/usr/sbin/{name}"


def _pid_alive(pid: int, marker: str) -> bool:
  """Whether `pid` runs and its command line mentions `marker` (our folder): a recycled PID is never ours."""
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      cmdline = f.read().decode(errors="replace")
    with open(f"/proc/{pid}/stat") as f:
      state = f.read().rsplit(")", 1)[1].split()[0]
  except OSError:
    return False
  return state != "Z" and marker in cmdline


class Cluster:
  """The daemons of a one-node cluster whose files live in `root`."""

  def __init__(self, root: str):
    self.root = os.path.abspath(root)
    self.conf = os.path.join(self.root, "slurm.conf")
    self.env = dict(os.environ, SLURM_CONF=self.conf)

  @staticmethod
  @contextlib.contextmanager
  def lock():
    """Holds the host's cluster lock (one slurmd per host), whatever process or pytest worker asks."""
    with open(LOCK, "a") as f:
      fcntl.flock(f, fcntl.LOCK_EX)
      try:
        yield
      finally:
        fcntl.flock(f, fcntl.LOCK_UN)

  def _write_files(self) -> None:
    munge = pwd.getpwnam("munge")
    os.makedirs(self.root, exist_ok=True)
    os.chmod(self.root, 0o755)  # munged, as the munge user, reaches its folder through this one
    for sub in ("state", "spool"):
      os.makedirs(os.path.join(self.root, sub), exist_ok=True)
    mdir = os.path.join(self.root, "munge")
    os.makedirs(mdir, mode=0o700, exist_ok=True)
    key = os.path.join(mdir, "munge.key")
    with open(key, "wb") as f:
      f.write(os.urandom(128))
    for path in (mdir, key):
      os.chown(path, munge.pw_uid, munge.pw_gid)
    os.chmod(key, 0o600)
    os.chmod(mdir, 0o711)  # the daemons and clients reach the socket inside
    ports = {"ctld_port": portpicker.pick_unused_port(), "slurmd_port": portpicker.pick_unused_port()}
    with open(self.conf, "w") as f:
      f.write(CONF.format(dir=self.root, node=NODE, cpus=CPUS, memory_mb=MEMORY_MB, **ports))

  def _spawn(self, name: str, argv: list[str]) -> int:
    log = open(os.path.join(self.root, f"{name}.out"), "ab")
    proc = subprocess.Popen(argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    self._procs[name] = proc
    self._pids[name] = proc.pid
    with open(os.path.join(self.root, "pids.json"), "w") as f:
      json.dump(self._pids, f)
    return proc.pid

  def start(self) -> "Cluster":
    """Writes the folder's files and starts munged, slurmctld and slurmd; returns once the node is idle."""
    self._pids: dict[str, int] = {}
    self._procs: dict[str, subprocess.Popen] = {}
    self._write_files()
    mdir = os.path.join(self.root, "munge")
    try:
      self._spawn("munged", ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", _binary("munged"), "-F",
                             f"--socket={mdir}/munge.socket",
                             f"--key-file={mdir}/munge.key", f"--pid-file={mdir}/munged.pid",
                             f"--log-file={mdir}/munged.log", f"--seed-file={mdir}/munged.seed"])
      self._wait(lambda: os.path.exists(f"{mdir}/munge.socket"), "munged's socket")
      self._spawn("slurmctld", [_binary("slurmctld"), "-D", "-i", "-f", self.conf])
      self._spawn("slurmd", [_binary("slurmd"), "-D", "-N", NODE, "-f", self.conf])
      self._wait(self._idle, f"node {NODE} idle")
    except BaseException:
      self.stop()
      raise
    return self

  def _idle(self) -> bool:
    out = subprocess.run(["sinfo", "-h", "-n", NODE, "-o", "%t"], env=self.env, capture_output=True, text=True)
    return out.returncode == 0 and out.stdout.strip().startswith("idle")

  def _wait(self, ready, what: str) -> None:
    end = time.monotonic() + START_TIMEOUT_S
    while not ready():
      dead = [n for n, pid in self._pids.items() if not _pid_alive(pid, self.root) and n != "munged"]
      if dead or time.monotonic() > end:
        raise RuntimeError(f"SLURM cluster in {self.root}: no {what}" + (f"; {', '.join(dead)} exited" if dead else
                           f" after {START_TIMEOUT_S:.0f} s") + f"\n{self.logs_tail()}")
      time.sleep(0.1)  # polling the daemons' readiness, which they do not announce

  def logs_tail(self, lines: int = 15) -> str:
    out = []
    for name in ("munge/munged.log", "slurmctld.log", "slurmd.log", "munged.out", "slurmctld.out", "slurmd.out"):
      path = os.path.join(self.root, name)
      if os.path.exists(path):
        with open(path, errors="replace") as f:
          tail = f.read().splitlines()[-lines:]
        out.append(f"--- {name}:\n" + "\n".join(tail))
    return "\n".join(out)

  def jobs(self) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%A"], env=self.env, capture_output=True, text=True)
    return out.stdout.split() if out.returncode == 0 else []

  def cancel_all(self, timeout: float = 60.0) -> None:
    """scancel every job of this cluster and wait until none is left (their processes end with them)."""
    ids = self.jobs()
    if ids:
      subprocess.run(["scancel", *ids], env=self.env, capture_output=True)
    end = time.monotonic() + timeout
    while self.jobs() and time.monotonic() < end:
      time.sleep(0.2)  # polling squeue: the jobs' ends are not announced

  def stop(self) -> None:
    """Cancels the jobs, then SIGTERM to each daemon this folder started (by PID, slurmd first), SIGKILL after 10 s."""
    path = os.path.join(self.root, "pids.json")
    pids = getattr(self, "_pids", None)
    if pids is None and os.path.exists(path):
      with open(path) as f:
        pids = json.load(f)
    pids = pids or {}
    if pids.get("slurmctld") and _pid_alive(pids["slurmctld"], self.root):
      self.cancel_all()
    procs = getattr(self, "_procs", {})
    for name in ("slurmd", "slurmctld", "munged"):
      pid = pids.get(name)
      if pid is None or not _pid_alive(pid, self.root):
        continue
      os.kill(pid, signal.SIGTERM)
      if name in procs:
        try:
          procs[name].wait(timeout=10)
        except subprocess.TimeoutExpired:
          procs[name].kill()
          procs[name].wait()
        continue
      end = time.monotonic() + 10
      while _pid_alive(pid, self.root) and time.monotonic() < end:
        time.sleep(0.05)  # a daemon started by another process: only /proc shows its exit
      if _pid_alive(pid, self.root):
        os.kill(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
  if len(argv) != 2 or argv[0] not in ("start", "stop"):
    print(__doc__, file=sys.stderr)
    return 2
  cluster = Cluster(argv[1])
  if argv[0] == "start":
    why = install_packages()
    if why:
      print(f"error: {why}", file=sys.stderr)
      return 2
    cluster.start()
    print(f"export SLURM_CONF={cluster.conf}")
  else:
    cluster.stop()
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
