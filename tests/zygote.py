"""Forked `python -m MODULE` children for the e2e tests: `popen` and `run` take the arguments of `subprocess.Popen` and
`subprocess.run`.

A trainer, predict or export child spends ~0.9 CPU-s importing jax, flax, optax and orbax before its first line, and
the suite starts ~80 of them. A zygote (per xdist worker and environment) imports those libraries once, never
initializes a jax backend, and forks each child from there: the child is a process of its own (pid, signals, exit
status, stdin/stdout/stderr, cwd, environment, session), writes first what those imports printed, runs MODULE as
`__main__` from a fresh import of that module, and reads XLA_FLAGS and GP_JAX_* when a fresh interpreter would, after
the fork. Environments that differ in anything else get zygotes of their own; a command of another shape runs as a
plain subprocess.

Tests of what a fresh interpreter imports or prints before its imports (import bans, start-up) keep `subprocess`."""

from __future__ import annotations

import atexit
import json
import os
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import weakref

MODULES = ("gp_jax.main", "gp_jax.predict", "gp_jax.export", "tests.fault_main", "tests.helpers_train",
           "tests.zygote_probe", "tests.e2e.test_su2022_train")
PRELOAD = ("gp_jax.train", "gp_jax.serving")  # libraries only: the entry modules define flags when run
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_PER_CHILD = ("XLA_FLAGS", "PYTEST_CURRENT_TEST")
_PER_CHILD_PREFIX = ("GP_JAX_",)
OFF_ENV = "GP_JAX_TEST_ZYGOTE"  # "0": every child a plain subprocess
_MAX_ZYGOTES = 4  # per xdist worker; the least recently used one with no child running makes room


class _Zygote:

  def __init__(self, env: dict):
    self.folder = tempfile.mkdtemp(prefix="gp_jax_zygote_")
    self.path = os.path.join(self.folder, "socket")
    self.children: weakref.WeakSet[ZygotePopen] = weakref.WeakSet()
    with open(os.path.join(self.folder, "stderr"), "wb") as err:
      self.proc = subprocess.Popen([sys.executable, "-m", "tests.zygote", self.path], env=env, cwd=REPO,
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err)
    ready = self.proc.stdout.readline().split()
    if ready[:1] != [b"ready"]:
      self.proc.kill()
      self.proc.wait()
      with open(os.path.join(self.folder, "stderr"), errors="replace") as f:
        raise RuntimeError(f"the zygote did not start: {f.read()[-2000:]}")
    global cpu_seconds
    cpu_seconds += float(ready[1])

  def busy(self) -> bool:
    return any(child.poll() is None for child in list(self.children))

  def close(self) -> None:
    global cpu_seconds
    before = _children_cpu()
    self.proc.stdin.close()  # it exits at EOF
    self.proc.wait()
    cpu_seconds -= _children_cpu() - before  # reaped: RUSAGE_CHILDREN counts it and its children from here on
    self.proc.stdout.close()
    shutil.rmtree(self.folder, ignore_errors=True)


_zygotes: dict[tuple, _Zygote] = {}  # least recently used first
_PID = struct.Struct("q")
_STATUS = struct.Struct("qd")  # wait status, the child's CPU seconds
# CPU seconds of this process's zygotes (their imports) and of the children they forked and reaped: the zygote, not
# this process, reaps them, so RUSAGE_CHILDREN counts none of it until the zygote exits (benchmarks/suite_cpu.py).
cpu_seconds = 0.0


def _children_cpu() -> float:
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  return usage.ru_utime + usage.ru_stime


def _key(env: dict) -> tuple:
  return tuple(sorted((k, v) for k, v in env.items() if k not in _PER_CHILD and not k.startswith(_PER_CHILD_PREFIX)))


def _zygote_for(env: dict) -> _Zygote | None:
  """The zygote for `env`, started at its first request (its imports cost what a plain child's would, and a second
  request forks from them); None when `_MAX_ZYGOTES` run and each has a child running."""
  key = _key(env)
  zygote = _zygotes.pop(key, None)
  if zygote is None:
    while len(_zygotes) >= _MAX_ZYGOTES:
      idle = next((k for k, z in _zygotes.items() if not z.busy()), None)
      if idle is None:
        return None
      _zygotes.pop(idle).close()
    zygote = _Zygote(env)
  _zygotes[key] = zygote
  return zygote


@atexit.register
def _close_all() -> None:
  while _zygotes:
    _zygotes.popitem()[1].close()


def _module(args) -> str | None:
  if isinstance(args, (list, tuple)) and len(args) >= 3 and args[0] == sys.executable and args[1] == "-m":
    return args[2] if args[2] in MODULES else None
  return None


class ZygotePopen(subprocess.Popen):
  """`subprocess.Popen` whose child is forked by a zygote: the pipes, `communicate`, `wait(timeout)`, `poll` and
  `send_signal` are Popen's; the exit status comes from the zygote, the child's parent."""

  def __init__(self, zygote_path: str, args, **kw):
    self._zygote_path = zygote_path
    super().__init__(args, **kw)

  def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                     shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid,
                     umask, start_new_session, *rest):
    fds = [p2cread if p2cread != -1 else 0, c2pwrite if c2pwrite != -1 else 1, errwrite if errwrite != -1 else 2]
    spec = {"module": args[2], "argv": list(map(str, args[3:])), "cwd": os.path.abspath(cwd or os.getcwd()),
            "env": dict(env if env is not None else os.environ), "new_session": bool(start_new_session)}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
      conn.connect(self._zygote_path)
      socket.send_fds(conn, [json.dumps(spec).encode()], fds)
      reply = conn.recv(_PID.size)
      if len(reply) != _PID.size:
        raise OSError(f"the zygote at {self._zygote_path} gave no pid")
    except BaseException:
      conn.close()
      raise
    finally:
      self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
    self.pid, = _PID.unpack(reply)
    self._child_created = True
    self._conn = conn

  def _try_wait(self, wait_flags):
    import select

    if wait_flags & os.WNOHANG and not select.select([self._conn], [], [], 0)[0]:
      return 0, 0
    data = self._conn.recv(_STATUS.size)
    self._conn.close()
    if len(data) != _STATUS.size:
      raise ChildProcessError(f"the zygote lost child {self.pid}")
    status, cpu = _STATUS.unpack(data)
    global cpu_seconds
    cpu_seconds += cpu
    return self.pid, status

  def _internal_poll(self, _deadstate=None, **_):
    if self.returncode is None and self._waitpid_lock.acquire(False):
      try:
        if self.returncode is None:
          pid, sts = self._try_wait(os.WNOHANG)
          if pid == self.pid:
            self._handle_exitstatus(sts)
      except (OSError, ChildProcessError):
        if _deadstate is not None:
          self.returncode = _deadstate
      finally:
        self._waitpid_lock.release()
    return self.returncode


def popen(args, **kw) -> subprocess.Popen:
  """`subprocess.Popen(args, **kw)`, forked by a zygote when `args` is `[sys.executable, "-m", MODULE, ...]`."""
  module = _module(args)
  zygote = None
  env = dict(kw["env"]) if kw.get("env") is not None else dict(os.environ)
  if (module is not None and os.environ.get(OFF_ENV, "") != "0" and REPO in env.get("PYTHONPATH", "").split(os.pathsep)
      and not any(kw.get(k) for k in ("preexec_fn", "pass_fds", "shell", "executable"))):
    zygote = _zygote_for(env)
  if zygote is None:
    return subprocess.Popen(args, **kw)
  proc = ZygotePopen(zygote.path, args, **kw)
  zygote.children.add(proc)
  return proc


def run(args, *, input=None, timeout=None, check=False, **kw) -> subprocess.CompletedProcess:  # noqa: A002
  """`subprocess.run` over `popen`."""
  if input is not None:
    kw["stdin"] = subprocess.PIPE
  if kw.pop("capture_output", False):
    kw["stdout"] = kw["stderr"] = subprocess.PIPE
  with popen(args, **kw) as proc:
    try:
      out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      raise
    except BaseException:
      proc.kill()
      raise
  done = subprocess.CompletedProcess(args, proc.returncode, out, err)
  if check:
    done.check_returncode()
  return done


# The zygote's side.


def _child(spec: dict, fds: list[int], printed: dict[int, bytes], gc_thresholds: tuple[int, ...]) -> None:
  """In the forked child: becomes `python -m MODULE ARGV` with the spec's fds, cwd and environment, and the
  interpreter's collector thresholds (`gc_thresholds`; runtime.configure sets its own); never returns."""
  import gc
  import runpy
  import signal
  import threading
  import traceback

  code = 1
  try:
    if spec["new_session"]:
      os.setsid()
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
    for fd in set(fds):
      if fd > 2:
        os.close(fd)
    for fd, data in printed.items():
      if data:
        os.write(fd, data)
    os.chdir(spec["cwd"])
    os.environ.clear()
    os.environ.update(spec["env"])
    sys.path[0] = spec["cwd"]
    sys.argv = [spec["module"], *spec["argv"]]
    gc.set_threshold(*gc_thresholds)
    code = 0
    runpy.run_module(spec["module"], run_name="__main__", alter_sys=True)
  except SystemExit as e:
    if e.code is None:
      code = 0
    elif isinstance(e.code, int):
      code = e.code
    else:
      print(e.code, file=sys.stderr)
      code = 1
  except KeyboardInterrupt:
    traceback.print_exc()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGINT)
  except BaseException:  # noqa: BLE001 (as the interpreter: traceback, exit 1)
    sys.excepthook(*sys.exc_info())
    code = 1
  try:
    threading._shutdown()  # pylint: disable=protected-access  (non-daemon threads, as at interpreter exit)
    atexit._run_exitfuncs()  # pylint: disable=protected-access
    for stream in (sys.stdout, sys.stderr):
      stream.flush()
  finally:
    os._exit(code)


def _serve(path: str) -> None:
  import gc
  import importlib
  import selectors

  from gp_jax import runtime  # jax-free

  interpreter_gc_thresholds = gc.get_threshold()  # each child's, as a fresh interpreter's
  gc.set_threshold(*runtime.GC_THRESHOLDS)  # the imports below allocate ~1M objects (runtime.configure_gc)

  # What the imports print a fresh interpreter prints too: kept, and written first by every child.
  saved = {fd: os.dup(fd) for fd in (1, 2)}
  printed = {}
  with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    for name in PRELOAD:
      importlib.import_module(name)
    gc.freeze()  # every child inherits them: no collector pass of a child walks them
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, f in ((1, out), (2, err)):
      f.seek(0)
      printed[fd] = f.read()
      os.dup2(saved[fd], fd)
      os.close(saved[fd])
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  listener.bind(path)
  listener.listen(16)
  sel = selectors.DefaultSelector()
  sel.register(listener, selectors.EVENT_READ, "accept")
  sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
  usage = resource.getrusage(resource.RUSAGE_SELF)
  sys.stdout.write(f"ready {usage.ru_utime + usage.ru_stime}\n")
  sys.stdout.flush()
  devnull = os.open(os.devnull, os.O_RDWR)
  os.dup2(devnull, 1)
  os.close(devnull)
  conns: list[socket.socket] = []
  while True:
    for key, _ in sel.select():
      if key.data == "parent":
        if not os.read(sys.stdin.fileno(), 4096):
          os._exit(0)
      elif key.data == "accept":
        conn, _ = listener.accept()
        msg, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
          for other in sel.get_map().values():
            if isinstance(other.data, tuple):
              os.close(other.fd)  # another child's pidfd
          sel.close()
          listener.close()
          for c in (*conns, conn):
            c.close()
          _child(json.loads(msg), fds, printed, interpreter_gc_thresholds)
        for fd in fds:
          os.close(fd)
        conn.sendall(_PID.pack(pid))
        pidfd = os.pidfd_open(pid)
        conns.append(conn)
        sel.register(pidfd, selectors.EVENT_READ, (pid, conn))
      else:
        pid, conn = key.data
        sel.unregister(key.fd)
        os.close(key.fd)
        _, status, usage = os.wait4(pid, 0)
        try:
          conn.sendall(_STATUS.pack(status, usage.ru_utime + usage.ru_stime))
        except OSError:
          pass  # the test is gone
        conns.remove(conn)
        conn.close()


if __name__ == "__main__":
  _serve(sys.argv[1])
