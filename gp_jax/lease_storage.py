"""Where leases live (gp_jax/lease.py): a local folder or gs://, behind one interface: an exclusive create (fails
when the object exists, never leaves a partial one), a rewrite, a read, a listing and the storage's own
modification time, which the lease compares instead of two hosts' clocks."""

from __future__ import annotations

import os
import posixpath
import uuid

import fsspec


class LocalStore:
  def create(self, path: str, data: bytes) -> bool:
    """Writes `data` at `path` unless it exists (atomically: readers never see a partial file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
      f.write(data)
    try:
      os.link(tmp, path)  # fails with EEXIST like open(O_CREAT | O_EXCL), but the content is complete
      return True
    except FileExistsError:
      return False
    finally:
      os.unlink(tmp)

  def write(self, path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    with open(tmp, "wb") as f:
      f.write(data)
    os.replace(tmp, path)

  def read(self, path: str) -> bytes | None:
    try:
      with open(path, "rb") as f:
        return f.read()
    except FileNotFoundError:
      return None

  def list(self, folder: str) -> list[str]:
    try:
      return [n for n in os.listdir(folder) if not n.endswith(".tmp")]
    except FileNotFoundError:
      return []

  def mtime(self, path: str) -> float | None:
    try:
      return os.stat(path).st_mtime
    except FileNotFoundError:
      return None


class GcsStore:
  """gcsfs (fsspec) with its own retries; listings are never served from gcsfs's cache."""

  def __init__(self):
    self.fs = fsspec.filesystem("gs", skip_instance_cache=True, cache_timeout=0)

  def create(self, path: str, data: bytes) -> bool:
    try:
      self.fs.pipe_file(path, data, mode="create")  # ifGenerationMatch=0: 412 -> FileExistsError
      return True
    except FileExistsError:
      return False

  def write(self, path: str, data: bytes) -> None:
    self.fs.pipe_file(path, data)

  def read(self, path: str) -> bytes | None:
    try:
      return self.fs.cat_file(path)
    except FileNotFoundError:
      return None

  def list(self, folder: str) -> list[str]:
    self.fs.invalidate_cache(folder)
    try:
      return [posixpath.basename(p.rstrip("/")) for p in self.fs.ls(folder, detail=False, refresh=True)]
    except FileNotFoundError:
      return []

  def mtime(self, path: str) -> float | None:
    self.fs.invalidate_cache(path)
    try:
      info = self.fs.info(path)
    except FileNotFoundError:
      return None
    return info["mtime"].timestamp() if "mtime" in info else None


def store_for(path: str):
  return GcsStore() if path.startswith(("gs://", "gcs://")) else LocalStore()
