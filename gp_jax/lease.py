"""Leases: at most one live holder per run folder, shared through the workdir's own storage (local or gs://).

Sweep workers guard a point `ROOT/NAME` with the objects `ROOT/_launch/leases/NAME/<epoch>.json` (never inside the
point's folder). `python -m gp_jax.main` (`hold_run`) takes, on a local workdir, an flock on `WORKDIR/run.lock` that
the OS releases with its process, however it ends (nothing is written outside the workdir); under a sweep root
(an ancestor holding `_launch/`) also the workers' lease of that point; on gs:// the lease alone, under the sweep
root or beside the workdir (`find_lease_dir`). The protocol:

  * claim: an exclusive create of epoch 0, or of `latest + 1` once the latest lease is released or stale. Locally
    the create is a `link()` of a written temp file (fails when the name exists, like O_EXCL); on gs:// it is an
    upload with `ifGenerationMatch=0` (gcsfs `pipe_file(mode="create")`), answered 412 when the object exists.
    A create whose first attempt landed but whose answer was lost comes back as 412 on gcsfs's retry: the lease
    is then read back and is ours when it carries our owner token.
  * heartbeat: the holder rewrites its own object every `heartbeat_s`; before each beat it checks that no later
    epoch exists (a holder that was taken over stops: `lost`).
  * stale: a lease whose object's storage-side modification time (`updated` on GCS, mtime locally) is more than
    `stale_beats` heartbeats older than the storage's "now" can be taken over. The storage's "now" is the
    modification time of a probe object the claimer writes (`_launch/clock/<owner>`), so only timestamps made
    by the storage are compared, never two hosts' clocks. A lease whose holder process is gone is stale at once:
    each lease records its process (`process_identity`: host, boot, pid namespace, pid, start time), and a claimer
    on the same host, boot and pid namespace sees that the pid is not running, is a zombie, or started later.
  * release: the holder rewrites its object with "released": true (the history of epochs stays, for audits).

Timings come from `GP_JAX_LEASE_HEARTBEAT_S` (default 30) and `GP_JAX_LEASE_STALE_BEATS` (default 4).
The storage behind both (local folder or gs://) is gp_jax/lease_storage.py.
"""

from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import logging
import os
import posixpath
import re
import socket
import threading
import time
import uuid

import numpy as np
from etils import epath

from gp_jax.errors import UserError
from gp_jax.lease_storage import GcsStore, LocalStore, store_for  # noqa: F401  (lease.GcsStore, ...)

# Deferred imports below: jax, in `hold_run` only. launch.compile imports this module (through launch.points and
# launch.worker) before it sets JAX_PLATFORMS, which jax reads when it is imported.

log = logging.getLogger("gp_jax.lease")

LAUNCH_DIR = "_launch"
LOCK_FILE = "run.lock"  # gp_jax.main's flock inside a local workdir


def heartbeat_s() -> float:
  return float(os.environ.get("GP_JAX_LEASE_HEARTBEAT_S", "30"))


def stale_beats() -> float:
  return float(os.environ.get("GP_JAX_LEASE_STALE_BEATS", "4"))


def _is_url(p: str) -> bool:
  return "://" in p


def _join(a: str, *parts: str) -> str:
  return posixpath.join(a.rstrip("/"), *parts) if _is_url(a) else os.path.join(a, *parts)


def split_workdir(workdir: str) -> tuple[str, str]:
  """(parent, name) of a run folder; local paths are made absolute."""
  w = os.fspath(workdir).rstrip("/")
  if not _is_url(w):
    w = os.path.abspath(w)
    return os.path.dirname(w), os.path.basename(w)
  head, _, name = w.rpartition("/")
  return head, name


def lease_dir(workdir: str, *, root: str | None = None) -> str:
  """Where the leases of the run folder `workdir` live: ROOT/_launch/leases/<workdir relative to ROOT>, ROOT being
  `root` (a sweep's root) or the folder's parent."""
  if root is None:
    parent, name = split_workdir(workdir)
    return _join(parent, LAUNCH_DIR, "leases", name)
  root = root.rstrip("/") if _is_url(root) else os.path.abspath(root)
  w = os.fspath(workdir).rstrip("/")
  w = w if _is_url(w) else os.path.abspath(w)
  rel = w[len(root):].lstrip("/") if w.startswith(root + "/") else split_workdir(w)[1]
  return _join(root, LAUNCH_DIR, "leases", *rel.split("/"))


# ----------------------------------------------------------------------------- the lease


def owner_label() -> str:
  return f"{socket.gethostname()}:{os.getpid()}"


def _read_text(path: str) -> str | None:
  try:
    with open(path) as f:
      return f.read().strip()
  except OSError:
    return None


def _proc_stat(pid: int) -> tuple[str, int] | None:
  """(state letter, start time in clock ticks since boot) of a process, from /proc; None when unreadable."""
  raw = _read_text(f"/proc/{pid}/stat")
  if raw is None:
    return None
  try:
    fields = raw.rsplit(")", 1)[1].split()
    return fields[0], int(fields[19])
  except (IndexError, ValueError):
    return None


def process_identity() -> dict:
  """This process as a lease records it: host, pid and, on Linux, the boot, the pid namespace and the start time
  (which tell a pid reused by a later process, and a pid seen from another container, from the holder itself)."""
  pid = os.getpid()
  stat = _proc_stat(pid)
  try:
    pid_ns = os.readlink("/proc/self/ns/pid")
  except OSError:
    pid_ns = None
  return {"host": socket.gethostname(), "pid": pid, "boot": _read_text("/proc/sys/kernel/random/boot_id"),
          "pid_ns": pid_ns, "start": stat[1] if stat else None}


def process_gone(identity: dict | None) -> bool:
  """True when the process `identity` (`process_identity`) names ran on this host, in this boot and pid namespace,
  and is no longer running (no such pid, a zombie, or a later process under its pid). False whenever that cannot
  be known (another host or container, an older lease without the record): the heartbeat decides then."""
  if not identity or not isinstance(identity.get("pid"), int):
    return False
  mine = process_identity()
  if any(identity.get(k) != mine[k] for k in ("host", "boot", "pid_ns")):
    return False
  pid = identity["pid"]
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return True
  except PermissionError:
    pass  # another user's live process
  stat = _proc_stat(pid)
  if stat is None:
    return False
  state, start = stat
  return state in ("Z", "X") or (identity.get("start") is not None and start != identity["start"])


@dataclasses.dataclass
class Holder:
  """What a lease object (or a workdir's lock file) says, and how old it is by the storage's clock."""

  epoch: int
  owner: str
  token: str
  released: bool
  age_s: float | None
  beats: int = 0
  process: dict | None = None  # the holder's `process_identity`
  lock: str | None = None  # a workdir lock held by a live process: the lock file

  def describe(self) -> str:
    if self.lock is not None:
      return f"{self.owner} (a live process holding {self.lock})"
    age = f"last heartbeat {self.age_s:.0f} s ago" if self.age_s is not None else "age unknown"
    return f"{self.owner} (lease epoch {self.epoch}, {age})"


class Held(RuntimeError):
  """The run folder is held by a live lease or lock; `hint` says how it is freed."""

  def __init__(self, folder: str, holder: Holder, hint: str = ""):
    self.holder = holder
    self.hint = hint
    super().__init__(f"{folder} is held by {holder.describe()}")


class Lease:
  """One claim on one run folder. `try_acquire()` -> True, or False with `self.holder` set to the live holder."""

  def __init__(self, folder: str, *, owner: str | None = None, heartbeat: float | None = None,
               stale_after_beats: float | None = None, store=None, extra: dict | None = None):
    self.folder = folder
    self.owner = owner or owner_label()
    self.token = uuid.uuid4().hex
    self.heartbeat_s = heartbeat_s() if heartbeat is None else heartbeat
    self.stale_beats = stale_beats() if stale_after_beats is None else stale_after_beats
    self.store = store or store_for(folder)
    self.extra = dict(extra or {})
    self.epoch: int | None = None
    self.holder: Holder | None = None
    self.lost = threading.Event()
    self._stop = threading.Event()
    self._thread: threading.Thread | None = None
    self._beats = 0
    self.on_lost = None  # callable(lease) run on the heartbeat thread when a later epoch shows up

  # -- reading
  def _path(self, epoch: int) -> str:
    return _join(self.folder, f"{epoch:08d}.json")

  def epochs(self) -> list[int]:
    return sorted(int(n[:-5]) for n in self.store.list(self.folder) if n.endswith(".json") and n[:-5].isdigit())

  def _storage_now(self) -> float | None:
    """The storage's clock: the modification time of a probe object written just now."""
    clock = _clock_path(self.folder, re.sub(r"[^A-Za-z0-9._=-]", "_", self.owner))
    self.store.write(clock, b"{}")
    return self.store.mtime(clock)

  def read(self, epoch: int, now: float | None = None) -> Holder | None:
    raw = self.store.read(self._path(epoch))
    if raw is None:
      return None
    try:
      d = json.loads(raw)
    except json.JSONDecodeError:
      d = {}
    mtime = self.store.mtime(self._path(epoch))
    age = (now - mtime) if (now is not None and mtime is not None) else None
    process = d.get("process") if isinstance(d.get("process"), dict) else None
    return Holder(epoch, str(d.get("owner", "?")), str(d.get("token", "")), bool(d.get("released")), age,
                  int(d.get("beats", 0)), process)

  def current(self) -> Holder | None:
    """The latest lease, its age by the storage's clock; None when the folder was never leased."""
    epochs = self.epochs()
    if not epochs:
      return None
    return self.read(epochs[-1], self._storage_now())

  def is_stale(self, h: Holder) -> bool:
    """No heartbeat for `stale_beats` beats, or its process is gone from this host (`process_gone`)."""
    return (h.age_s is not None and h.age_s > self.stale_beats * self.heartbeat_s) or process_gone(h.process)

  # -- writing
  def _body(self, **kw) -> bytes:
    return json.dumps({"owner": self.owner, "token": self.token, "epoch": self.epoch, "beats": self._beats,
                       "heartbeat_s": self.heartbeat_s, "process": process_identity(), **self.extra,
                       **kw}).encode()

  def try_acquire(self) -> bool:
    h = self.current()
    if h is not None and not h.released and not self.is_stale(h):
      self.holder = h
      return False
    epoch = 0 if h is None else h.epoch + 1
    self.epoch = epoch
    took_over = h is not None and not h.released
    self.extra["took_over"] = took_over
    if not self.store.create(self._path(epoch), self._body()):
      got = self.read(epoch)  # 412: someone else, or our own first attempt whose answer was lost
      if got is None or got.token != self.token:
        self.epoch = None
        self.holder = got
        return False
    if took_over:
      why = "its process is gone" if process_gone(h.process) else "no heartbeat"
      log.warning("Took over the stale lease of %s held by %s: %s", self.folder, h.describe(), why)
    self.holder = None
    return True

  def beat(self) -> bool:
    """One heartbeat; False (and `lost` set) when a later epoch exists."""
    if self.epochs()[-1:] != [self.epoch]:
      self.lost.set()
      return False
    self._beats += 1
    self.store.write(self._path(self.epoch), self._body())
    return True

  def start_heartbeat(self) -> None:
    def loop():
      while not self._stop.wait(self.heartbeat_s):
        try:
          ok = self.beat()
        except Exception as e:  # pylint: disable=broad-except
          log.warning("lease heartbeat of %s failed: %s", self.folder, e)  # storage retries failed; try again
          continue
        if not ok:
          log.error("Lease of %s was taken over (epoch %d is no longer the latest)", self.folder, self.epoch)
          if self.on_lost is not None:
            self.on_lost(self)
          return

    self._thread = threading.Thread(target=loop, name="gp_jax-lease", daemon=True)
    self._thread.start()

  def release(self, **kw) -> None:
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
      self._thread = None
    if self.epoch is not None and not self.lost.is_set() and self.epochs()[-1:] == [self.epoch]:
      self.store.write(self._path(self.epoch), self._body(released=True, **kw))
    self.epoch = None

  def __enter__(self):
    if not self.try_acquire():
      raise Held(self.folder, self.holder)
    self.start_heartbeat()
    return self

  def __exit__(self, *exc):
    self.release()


def _clock_path(folder: str, token: str) -> str:
  """_launch/clock/<token>.json of the _launch folder above a lease folder."""
  f = folder.rstrip("/")
  marker = f"/{LAUNCH_DIR}/leases/"
  base = f[:f.index(marker) + len(LAUNCH_DIR) + 1] if marker in f else f
  return _join(base, "clock", f"{token}.json")


def history(folder: str, store=None) -> list[dict]:
  """Every epoch of a lease folder, oldest first (for audits and tests)."""
  store = store or store_for(folder)
  out = []
  for n in sorted(store.list(folder)):
    if n.endswith(".json") and n[:-5].isdigit():
      raw = store.read(_join(folder, n))
      out.append(json.loads(raw) if raw else {})
  return out


# ----------------------------------------------------------------------------- one gp_jax.main run


def sweep_root(workdir: str, *, levels: int = 3) -> str | None:
  """The nearest ancestor of a run folder (up to `levels` up) that holds a `_launch/` folder (a sweep root that
  workers use), or None."""
  folder, _ = split_workdir(workdir)
  for _ in range(levels):
    if epath.Path(_join(folder, LAUNCH_DIR)).is_dir():
      return folder
    up = posixpath.dirname(folder) if _is_url(folder) else os.path.dirname(folder)
    if up == folder or (_is_url(folder) and up.endswith(":/")):
      break
    folder = up
  return None


def find_lease_dir(workdir: str, *, levels: int = 3) -> str:
  """The lease folder guarding a run folder: under its sweep root (`sweep_root`), else under its parent."""
  root = sweep_root(workdir, levels=levels)
  return lease_dir(workdir) if root is None else lease_dir(workdir, root=root)


class WorkdirLock:
  """An exclusive flock on WORKDIR/run.lock while this process keeps it: the OS releases it when the process ends,
  however it ends, so a killed run's workdir is free at once. The file names the holder, for the refusal; it is
  never deleted (a lock taken on a file unlinked meanwhile would guard nothing)."""

  def __init__(self, workdir: str):
    self.path = os.path.join(os.fspath(workdir), LOCK_FILE)
    self._fd: int | None = None

  def try_acquire(self) -> bool:
    """True when locked; False when another open of the file holds it; OSError when the filesystem has no locks."""
    fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
        return False
      raise
    body = json.dumps({"owner": owner_label(), "process": process_identity(), "since": time.time()}).encode()
    os.ftruncate(fd, 0)
    os.pwrite(fd, body, 0)
    self._fd = fd
    return True

  def holder(self) -> Holder:
    try:
      d = json.loads(_read_text(self.path) or "{}")
    except json.JSONDecodeError:
      d = {}
    return Holder(-1, str(d.get("owner") or "another process"), "", False, None,
                  process=d.get("process") if isinstance(d.get("process"), dict) else None, lock=self.path)

  def release(self) -> None:
    if self._fd is not None:
      fcntl.flock(self._fd, fcntl.LOCK_UN)
      os.close(self._fd)
      self._fd = None


LOCK_HINT = "wait for it to end or stop it, or use another --workdir"


def lease_hint() -> str:
  return (f"a holder that died on this host is taken over at once, one elsewhere after {stale_beats():g} missed "
          f"heartbeats of {heartbeat_s():g} s; or use another --workdir")


class hold_run:  # pylint: disable=invalid-name
  """Context manager for `python -m gp_jax.main`: process 0 takes the workdir, the group learns the outcome.

  A local workdir: its `WorkdirLock`, and under a sweep root also the workers' lease of that point; a gs:// workdir:
  the lease beside it (`find_lease_dir`). Raises Held (naming the holder) when a live process holds either. With
  several processes (jax.distributed initialised), only process 0 takes them and broadcasts whether it got them."""

  def __init__(self, workdir: str):
    self.workdir = os.fspath(workdir)
    self.lease: Lease | None = None
    self.lock: WorkdirLock | None = None

  def _take(self) -> Held | None:
    """Takes the lease and the lock this workdir needs; the Held error when a live holder has one."""
    if _is_url(self.workdir):
      return self._take_lease(find_lease_dir(self.workdir))
    root = sweep_root(self.workdir)
    if root is not None:
      held = self._take_lease(lease_dir(self.workdir, root=root))
      if held is not None:
        return held
    try:
      os.makedirs(self.workdir, exist_ok=True)
    except OSError as e:
      self.release()
      raise UserError(f"cannot create --workdir {self.workdir}: {e.strerror or e}") from e
    lock = WorkdirLock(self.workdir)
    try:
      if not lock.try_acquire():
        self.release()
        return Held(self.workdir, lock.holder(), LOCK_HINT)
    except OSError as e:  # a filesystem without flock: a lease inside the workdir instead
      log.warning("cannot lock %s (%s); using a lease in %s", lock.path, e.strerror or e, self.workdir)
      return None if self.lease is not None else self._take_lease(_join(self.workdir, "lease"))
    self.lock = lock
    return None

  def _take_lease(self, folder: str) -> Held | None:
    lease = Lease(folder, extra={"workdir": self.workdir})
    if not lease.try_acquire():
      return Held(self.workdir, lease.holder, lease_hint())
    lease.on_lost = _exit_lost
    lease.start_heartbeat()
    self.lease = lease
    return None

  def __enter__(self):
    import jax  # pylint: disable=g-import-not-at-top

    multi = jax.process_count() > 1
    held = self._take() if jax.process_index() == 0 else None
    if multi:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

      refused = int(multihost_utils.broadcast_one_to_all(np.asarray(int(held is not None), np.int32)))
      if refused and held is None:
        held = Held(self.workdir, Holder(-1, "another process group (see process 0)", "", False, None))
    if held is not None:
      raise held
    return self

  def release(self) -> None:
    if self.lease is not None:
      self.lease.release()
      self.lease = None
    if self.lock is not None:
      self.lock.release()
      self.lock = None

  def __exit__(self, *exc):
    self.release()


def _exit_lost(lease: Lease) -> None:
  log.error("Another process took over the lease of %s; stopping so that two runs never write one workdir",
            lease.folder)
  os._exit(4)
