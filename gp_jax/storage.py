"""Workdir IO through `etils.epath`: local folders, `gs://` and other fsspec URLs behave the same.

Local paths are made absolute; URLs are left as they are (never `os.path.abspath` on `gs://b/run`).
Files that libraries can only write locally (logging, TensorBoard events) are written to a local
mirror folder and copied to the workdir on `sync()`.

The CLIs check every path a user gives before using it: `check_path` refuses a mistyped Cloud Storage URL
(`gs:/b/x`, `gs//b/x`), which would otherwise be a local folder named `gs:`; `check_bucket` probes a gs:// path
once, within $GP_JAX_GCS_PROBE_TIMEOUT_S (default 10 s), instead of gcsfs's retries (~30 s a request): storage
that does not answer, a missing bucket or (with `write`) a bucket that refuses writes are one line each. After
storage has stopped answering mid-run, `limit_writes` bounds this module's last writes (results.json, logs).
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import shutil
import tempfile
import threading
import time
import uuid
from typing import Any

import fsspec
from etils import epath

from gp_jax.errors import UserError

# Deferred imports below: gcsfs (and aiohttp through it), in the gs:// probes only; a local run never imports them.

PROBE_TIMEOUT_ENV = "GP_JAX_GCS_PROBE_TIMEOUT_S"
DEFAULT_PROBE_TIMEOUT_S = 10.0
GCS_SCHEMES = ("gs", "gcs")
_MISTYPED = re.compile(r"(gs|gcs)(:|//)(.*)", re.DOTALL)


def is_url(path: str | os.PathLike) -> bool:
  return "://" in os.fspath(path)


def check_path(value: str | os.PathLike, *, flag: str) -> None:
  """UserError for a mistyped Cloud Storage URL (`gs:/b/x`, `gs:b/x`, `gs:///b/x`, `gs//b/x`, and the same with
  gcs): taken as a local path, it would become a folder `./gs:/b/x` and the run would write there."""
  s = os.fspath(value)
  m = _MISTYPED.match(s)
  if m is None:
    return
  scheme, sep, rest = m.groups()
  if sep == ":" and rest.startswith("//") and rest[2:3] not in ("", "/"):
    return  # gs://bucket/...
  tail = rest.lstrip(":/")
  hint = f"did you mean {scheme}://{tail}?" if tail else f"a Cloud Storage URL is {scheme}://BUCKET/PATH"
  raise UserError(f"--{flag}={s} looks like a mistyped Cloud Storage URL: {hint} (a local folder: ./{s})")


def env_seconds(name: str, default: float) -> float:
  """Seconds from the environment variable `name` (unset or empty: `default`); UserError unless a number > 0."""
  raw = os.environ.get(name, "").strip()
  try:
    value = float(raw) if raw else default
  except ValueError:
    value = -1.0
  if not value > 0:
    raise UserError(f"{name}={raw!r}: expected a number of seconds > 0")
  return value


def probe_timeout_s() -> float:
  """$GP_JAX_GCS_PROBE_TIMEOUT_S: seconds a gs:// probe (`check_bucket`) or a last write (`limit_writes`) may take."""
  return env_seconds(PROBE_TIMEOUT_ENV, DEFAULT_PROBE_TIMEOUT_S)


def _gcs_endpoint() -> str:
  """Where gcsfs sends requests, and why: the emulator of $STORAGE_EMULATOR_HOST, or Google's."""
  host = os.environ.get("STORAGE_EMULATOR_HOST", "")
  if host and host != "default":
    return f"{host if host.startswith(('http://', 'https://')) else 'http://' + host} (STORAGE_EMULATOR_HOST)"
  return "https://storage.googleapis.com"


def _one_line(e: BaseException) -> str:
  return " ".join(str(e).split()) or type(e).__name__


def _gcs_parts(url: str) -> tuple[str, str, str] | None:
  """(scheme, bucket, key) of a gs:// or gcs:// URL; None for anything else."""
  scheme, sep, rest = os.fspath(url).partition("://")
  if not sep or scheme not in GCS_SCHEMES:
    return None
  bucket, _, key = rest.partition("/")
  return scheme, bucket, key


def _retriable(e: BaseException) -> bool:
  from gcsfs.retry import is_retriable  # pylint: disable=g-import-not-at-top

  return isinstance(e, TimeoutError) or is_retriable(e)


def _list_once(fs, bucket: str, key: str, timeout: float):
  """One listing request of at most one object under `key`: gcsfs's `_request` without its retries, whose backoff
  (1, 2, 4, 8, 16 s) the probe is meant to avoid; with them where this gcsfs has no undecorated `_request`."""
  # pylint: disable=protected-access
  once = getattr(type(fs)._request, "__wrapped__", None)
  request = functools.partial(once, fs) if once is not None else fs._request
  return fsspec.asyn.sync(fs.loop, request, "GET", "b/{}/o", bucket, prefix=key, maxResults=1, timeout=timeout)


def unreachable(url, *, seconds: float | None = None) -> str | None:
  """None when the storage of the gs:// `url` answers a listing within `seconds` (default `probe_timeout_s()`);
  else "cannot reach Google Cloud Storage at ENDPOINT: ERROR". Errors that are answers (a missing bucket: 404, 403)
  are raised. None for local paths."""
  parts = _gcs_parts(os.fspath(url))
  if parts is None:
    return None
  scheme, bucket, key = parts
  seconds = probe_timeout_s() if seconds is None else seconds
  fs = fsspec.filesystem(scheme)
  deadline, delay = time.monotonic() + seconds, 0.1
  while True:
    try:
      _list_once(fs, bucket, key, max(deadline - time.monotonic(), 0.1))
      return None
    except Exception as e:  # pylint: disable=broad-except
      if not _retriable(e):
        raise
      last = e
    if time.monotonic() + delay >= deadline:
      why = _one_line(last) if str(last) else f"no answer within {seconds:g} s ({PROBE_TIMEOUT_ENV})"
      return f"cannot reach Google Cloud Storage at {_gcs_endpoint()}: {why}"
    time.sleep(delay)  # a refused connection answers at once: a few tries spread over the probe's time
    delay = min(2 * delay, 1.0)


def check_bucket(value, *, flag: str, write: bool = False) -> None:
  """For a gs:// path a user gave as --`flag`: UserError (one line) unless its storage answers, its bucket exists and,
  with `write`, an object can be written beside it (written and removed). Nothing for local paths."""
  parts = _gcs_parts(os.fspath(value))
  if parts is None:
    return
  scheme, bucket, key = parts
  given = f"--{flag}={os.fspath(value)}"
  missing = f"bucket {scheme}://{bucket} does not exist or is not accessible ({given})"
  if not bucket:
    raise UserError(f"{given}: no bucket named: a Cloud Storage URL is {scheme}://BUCKET/PATH")
  try:
    why = unreachable(value)
  except FileNotFoundError:
    raise UserError(missing) from None
  except Exception as e:  # pylint: disable=broad-except  # 403, credentials: the answer, whoever raised it
    raise UserError(f"{missing}: {_one_line(e)}") from None
  if why is not None:
    raise UserError(why)
  if write:
    _check_writable(scheme, bucket, key, given=given, missing=missing)


def _check_writable(scheme: str, bucket: str, key: str, *, given: str, missing: str) -> None:
  """An empty object written beside `key` (in its parent) and removed."""
  fs = fsspec.filesystem(scheme)
  parent = posixpath.dirname(key.rstrip("/"))
  probe = posixpath.join(bucket, parent, f".gp_jax_write_probe_{uuid.uuid4().hex}")
  seconds = probe_timeout_s()
  try:
    fsspec.asyn.sync(fs.loop, fs._pipe_file, probe, b"", timeout=seconds)  # pylint: disable=protected-access
    fsspec.asyn.sync(fs.loop, fs._rm_file, probe, timeout=seconds)  # pylint: disable=protected-access
  except FileNotFoundError:
    raise UserError(missing) from None
  except Exception as e:  # pylint: disable=broad-except
    why = _one_line(e) if str(e) else f"no answer within {seconds:g} s ({PROBE_TIMEOUT_ENV})"
    raise UserError(f"{given}: cannot write in {scheme}://{bucket}/{key} ({why})") from None


_write_limit_s: float | None = None


def limit_writes(seconds: float | None) -> None:
  """From now on, each write of this module (`write_text`, `write_json`, `upload_dir`) gives up after `seconds` with
  TimeoutError (None: no limit). For a run whose storage stopped answering: its last writes (results.json, the
  logs) are tried, not waited for through every retry."""
  global _write_limit_s
  _write_limit_s = seconds


def in_background(fn, name: str) -> tuple[threading.Thread, list[BaseException]]:
  """`fn()` started on a daemon thread (left behind if it never returns), and the list that receives what it raises,
  for the caller to raise in its own thread."""
  failed: list[BaseException] = []

  def run():
    try:
      fn()
    except BaseException as e:  # pylint: disable=broad-except
      failed.append(e)

  t = threading.Thread(target=run, name=name, daemon=True)
  t.start()
  return t, failed


def _bounded(what: str, fn) -> None:
  if _write_limit_s is None:
    return fn()
  t, failed = in_background(fn, "gp_jax-storage-write")  # left behind if storage never answers
  t.join(_write_limit_s)
  if t.is_alive():
    raise TimeoutError(f"writing {what}: no answer from storage within {_write_limit_s:g} s")
  if failed:
    raise failed[0]
  return None


def path(p: str | os.PathLike) -> epath.Path:
  """An epath.Path; local paths are made absolute (the cwd of later calls must not matter)."""
  s = os.fspath(p)
  return epath.Path(s if is_url(s) else os.path.abspath(s))


def forget_listings(p) -> None:
  """Drops this process's cached folder listings under the URL `p` (fsspec filesystems such as gcsfs keep them for
  the process's life; etils.epath and our own code use two instances). Call it before reading a folder another
  process may have changed meanwhile, e.g. a sweep point a long-lived worker takes over. No-op locally."""
  s = os.fspath(p)
  if not is_url(s):
    return
  protocol, rest = s.split("://", 1)
  for kwargs in ({}, {"finalize_on_close": True}):  # fsspec's default instance, and etils.epath's
    try:
      fs = fsspec.filesystem(protocol, **kwargs)
    except (ImportError, ValueError, TypeError):
      continue
    folder = rest.rstrip("/")
    fs.invalidate_cache(folder)  # the folder and its parents
    cache = getattr(fs, "dircache", {})
    for key in [k for k in list(cache) if k.startswith(folder + "/")]:
      cache.pop(key, None)


def write_text(p, text: str) -> None:
  p = path(p)

  def write():
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)

  _bounded(os.fspath(p), write)


def write_json(p, obj: Any, **kw) -> None:
  write_text(p, json.dumps(obj, **kw))


def read_json(p) -> Any:
  return json.loads(path(p).read_text())


def upload_dir(local_dir: str | os.PathLike, dst) -> None:
  """Copies a local folder's files (recursively) to `dst` (local or URL), overwriting."""
  dst = path(dst)
  _bounded(os.fspath(dst), lambda: _upload(local_dir, dst))


def _upload(local_dir, dst: epath.Path) -> None:
  for root, _, files in os.walk(local_dir):
    rel = os.path.relpath(root, local_dir)
    target = dst if rel == "." else dst / rel
    target.mkdir(parents=True, exist_ok=True)
    for name in files:
      (target / name).write_bytes(open(os.path.join(root, name), "rb").read())


def download_dir(src, local_dir: str | os.PathLike) -> str:
  """Copies a folder (local or URL) into `local_dir` (the caller owns and removes it); returns its path."""
  src = path(src)
  if not src.is_dir():
    raise FileNotFoundError(f"no folder {src}")
  os.makedirs(local_dir, exist_ok=True)
  for p in src.iterdir():  # one listing per folder (no recursive glob on GCS)
    out = os.path.join(local_dir, p.name)
    if p.is_dir():
      download_dir(p, out)
    else:
      with open(out, "wb") as f:
        f.write(p.read_bytes())
  return local_dir


class LocalMirror:
  """A local folder whose files end up under `remote` (a workdir). For a local workdir it is the workdir
  itself and `sync` does nothing."""

  def __init__(self, remote):
    self.remote = path(remote)
    self.is_remote = is_url(os.fspath(self.remote))
    self.local = tempfile.mkdtemp(prefix="gp_jax_mirror_") if self.is_remote else os.fspath(self.remote)

  def sync(self) -> None:
    if self.is_remote:
      upload_dir(self.local, self.remote)

  def close(self) -> None:
    self.sync()
    if self.is_remote:
      shutil.rmtree(self.local, ignore_errors=True)
