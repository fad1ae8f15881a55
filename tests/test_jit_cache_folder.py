"""The test suite's compilation cache folder (tests/conftest.py `_test_jit_cache`): kept between runs, emptied past
its cap, cleared of entries whose writer died, and an empty run-only folder when asked or when it cannot be used."""

import os
import time

from tests import conftest


def test_a_kept_folder_loses_only_dead_writers_files(tmp_path, monkeypatch):
  folder = tmp_path / "cache"
  folder.mkdir()
  (folder / "jit_step-abc-cache").write_bytes(b"x" * 1000)
  stale, live = folder / "jit_step-def-cache.tmp.12.34", folder / "jit_step-ghi-cache.tmp.56.78"
  stale.write_bytes(b"half")
  live.write_bytes(b"half")
  os.utime(stale, (time.time() - 7200,) * 2)
  monkeypatch.setenv(conftest.TEST_JIT_CACHE_ENV, str(folder))
  got, note = conftest._test_jit_cache()
  assert got == str(folder) and (folder / "jit_step-abc-cache").exists()
  assert not stale.exists() and live.exists()  # a writer of the last hour may be another run's, still writing
  assert note.startswith("2 entries, 0 MiB at the start")


def test_a_folder_past_the_cap_starts_empty(tmp_path, monkeypatch):
  folder = tmp_path / "cache"
  folder.mkdir()
  (folder / "a-cache").write_bytes(b"x" * 3000)
  monkeypatch.setattr(conftest, "TEST_JIT_CACHE_MAX_BYTES", 2048)
  monkeypatch.setenv(conftest.TEST_JIT_CACHE_ENV, str(folder))
  got, note = conftest._test_jit_cache()
  assert got == str(folder) and os.listdir(folder) == [] and note.startswith("emptied: past")


def test_fresh_and_unusable_folders_give_an_empty_one_for_the_run(tmp_path, monkeypatch):
  monkeypatch.setenv(conftest.TEST_JIT_CACHE_ENV, "fresh")
  got, note = conftest._test_jit_cache()
  assert os.listdir(got) == [] and "removed at exit" in note
  blocker = tmp_path / "file"
  blocker.write_text("")
  monkeypatch.setenv(conftest.TEST_JIT_CACHE_ENV, str(blocker / "cache"))  # under a file: cannot be made
  got, note = conftest._test_jit_cache()
  assert os.path.isdir(got) and os.listdir(got) == [] and note.startswith(f"{blocker / 'cache'} unusable (")
