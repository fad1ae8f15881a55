"""Workdir IO through `etils.epath`: local folders, `gs://` and other fsspec URLs behave the same.

Local paths are made absolute; URLs are left as they are (never `os.path.abspath` on `gs://b/run`).
Files that libraries can only write locally (logging, TensorBoard events) are written to a local
mirror folder and copied to the workdir on `sync()`.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from typing import Any

import fsspec
from etils import epath


def is_url(path: str | os.PathLike) -> bool:
  return "://" in os.fspath(path)


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
  p.parent.mkdir(parents=True, exist_ok=True)
  p.write_text(text)


def write_json(p, obj: Any, **kw) -> None:
  write_text(p, json.dumps(obj, **kw))


def read_json(p) -> Any:
  return json.loads(path(p).read_text())


def upload_dir(local_dir: str | os.PathLike, dst) -> None:
  """Copies a local folder's files (recursively) to `dst` (local or URL), overwriting."""
  dst = path(dst)
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
