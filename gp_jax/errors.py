"""Errors that are the user's, not the code's: `gp_jax.main` prints them as one line and exits 2.

A bad config (an experiment refusing a dataset, an unknown arg), a bad data file (`readers.DataError` names
file:line or file and record index) and a missing corpus file raise `UserError`; anything else is a bug and
keeps its traceback. A subclass of ValueError, so callers that catch ValueError still do.
A full disk or quota is no bug either: `storage_full` finds it in an exception's chain, whoever raised it; nor is
storage that stopped answering (`storage_failure`: a checkpoint save past its time, gcsfs out of retries).
"""

from __future__ import annotations

import errno
import os
import re
import sys

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # EFBIG: a file past RLIMIT_FSIZE
_TS_OS_ERROR = re.compile(r"os_error_code='(\d+)'")  # how tensorstore's errors carry errno
_TS_PATH = re.compile(r'Failed writing: "([^"]+)"')


HELP_FLAGS = ("help", "h", "?", "helpshort", "helpfull", "helpxml")


def help_exits_zero(parse):
  """An absl `flags_parser` that exits 0 after printing the help a user asked for (absl's own exits 1)."""

  def parse_flags(argv):
    try:
      return parse(argv)
    except SystemExit as e:
      if e.code == 1 and any(a.lstrip("-").split("=")[0] in HELP_FLAGS for a in argv[1:] if a.startswith("-")):
        sys.exit(0)
      raise

  return parse_flags


class UserError(ValueError):
  """A mistake in the config or the data the user gave; the message says what and where, in one line."""


def storage_full(e: BaseException | None) -> str | None:
  """"<strerror> writing <path>" when `e` or an exception in its chain is a full disk or quota: an OSError, or
  tensorstore's ValueError (Orbax's array writes) carrying the OS error code. None otherwise."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in FULL_ERRNOS:
      return os.strerror(e.errno) + (f" writing {e.filename}" if e.filename else "")
    code = _TS_OS_ERROR.search(str(e))
    if code and int(code.group(1)) in FULL_ERRNOS:
      path = _TS_PATH.search(str(e))
      return os.strerror(int(code.group(1))) + (f" writing {path.group(1)}" if path else "")
    e = e.__cause__ or e.__context__
  return None


class StorageTimeout(TimeoutError):
  """Storage did not finish a checkpoint save in time (gp_jax.checkpoint); the message names the step, the wait, the
  storage's error when a probe finds one, and the last finished checkpoint."""


def storage_failure(e: BaseException | None) -> BaseException | None:
  """The exception in `e`'s chain that says storage stopped answering: a StorageTimeout (preferred), or gcsfs's last
  error after its retries (aiohttp's connection errors, fsspec's timeouts). None otherwise."""
  seen, found = set(), None
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, StorageTimeout):
      return e
    names = {c.__name__ for c in type(e).__mro__}  # by name: this module imports neither aiohttp nor fsspec
    if found is None and names & {"ClientConnectionError", "FSTimeoutError"}:
      found = e
    e = e.__cause__ or e.__context__
  return found
