"""The persistent compilation cache with real processes: several writing one folder at once, damaged entries, "off".

Each case starts fresh Python processes (`PROGRAM`) that call `runtime.configure_compilation_cache` and compile the
same three jitted functions; jax's own cache-hit events count what came back from the folder."""

import json
import os
import re
import subprocess
import sys

import pytest

from gp_jax import runtime
from tests import helpers_train

PROGRAM = r"""
import json, sys
import jax
import jax.numpy as jnp
import numpy as np
from gp_jax import runtime

folder = runtime.configure_compilation_cache(sys.argv[1])
hits = []
jax.monitoring.register_event_listener(lambda event, **_: hits.append(event) if event.endswith("/cache_hits") else None)
x_NN = np.linspace(-1, 1, 48 * 48, dtype=np.float32).reshape(48, 48)
got = [jax.jit(lambda x: jnp.sin(x) @ x.T + 1)(x_NN), jax.jit(lambda x: jnp.tanh(3 * x).sum(axis=0))(x_NN),
       jax.jit(lambda x: jnp.cumsum(x * x))(x_NN)]
want = [np.sin(x_NN) @ x_NN.T + 1, np.tanh(3 * x_NN).sum(axis=0), np.cumsum(x_NN * x_NN)]
for g, w in zip(got, want):
  np.testing.assert_allclose(np.asarray(g), w, rtol=1e-4, atol=1e-4)
c = jax.config
print("RESULT " + json.dumps({"folder": folder, "hits": len(hits), "enabled": c.jax_enable_compilation_cache,
                              "min_compile": c.jax_persistent_cache_min_compile_time_secs,
                              "xla_caches": c.jax_persistent_cache_enable_xla_caches,
                              "raise_errors": c.jax_raise_persistent_cache_errors}))
"""
NUM_PROGRAMS = 3
SKIPPED = re.compile(r"compilation cache: skipped unreadable entry (\S+)")


def _env(tmp_path, **extra) -> dict:
  env = helpers_train.subprocess_env(devices=1, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "xdg"), **extra)
  for name in (runtime.CACHE_ENV, "JAX_COMPILATION_CACHE_DIR"):  # the folder is the argument, nothing else
    env.pop(name, None)
  return env


def _start(tmp_path, setting: str, env: dict) -> subprocess.Popen:
  script = tmp_path / "program.py"
  if not script.exists():
    script.write_text(PROGRAM)
  return subprocess.Popen([sys.executable, str(script), setting], env=env, cwd=helpers_train.REPO,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen) -> tuple[dict, str]:
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert "Traceback" not in err and "warnings.warn" not in err, err[-3000:]
  line = next(line for line in out.splitlines() if line.startswith("RESULT "))
  return json.loads(line.removeprefix("RESULT ")), err


def _run(tmp_path, setting: str, env: dict) -> tuple[dict, str]:
  return _finish(_start(tmp_path, setting, env))


def _entries(folder) -> list[str]:
  return sorted(p.name for p in folder.iterdir() if p.name.endswith("-cache"))


@pytest.mark.e2e
def test_processes_share_a_folder_and_damaged_entries_cost_one_line_each(tmp_path):
  folder = tmp_path / "cache"
  env = _env(tmp_path, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0)
  # Two processes started together write the same entries into a fresh folder.
  results = [_finish(p) for p in [_start(tmp_path, str(folder), env) for _ in range(2)]]
  for result, err in results:
    assert result["folder"] == str(folder) and result["min_compile"] == 0.0  # the user's minimum wins
    assert not SKIPPED.search(err), err  # no process read a half-written entry
  entries = _entries(folder)
  assert len(entries) == NUM_PROGRAMS and sorted(os.listdir(folder)) == entries  # no temporary files left behind
  result, err = _run(tmp_path, str(folder), env)
  assert result["hits"] == NUM_PROGRAMS, err

  # Every entry truncated and followed by garbage: each is skipped with one line naming it, compiled and rewritten.
  for name in entries:
    data = (folder / name).read_bytes()
    (folder / name).write_bytes(data[:len(data) // 3] + os.urandom(64))
  result, err = _run(tmp_path, str(folder), env)
  assert result["hits"] == 0
  lines = [line for line in err.splitlines() if "compilation cache" in line]
  assert sorted(SKIPPED.search(line).group(1) for line in lines) == entries, err
  result, err = _run(tmp_path, str(folder), env)
  assert result["hits"] == NUM_PROGRAMS and not SKIPPED.search(err), err  # the rewritten entries read back


@pytest.mark.e2e
def test_off_writes_nothing(tmp_path):
  env = _env(tmp_path, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "jax_default"), **{runtime.XLA_CACHES_ENV: "all"})
  env.pop(runtime.MIN_COMPILE_TIME_ENV, None)
  result, _ = _run(tmp_path, "off", env)
  assert result["folder"] is None and not result["enabled"] and result["xla_caches"] == "none"
  assert not (tmp_path / "jax_default").exists() and not (tmp_path / "xdg").exists()


@pytest.mark.e2e
def test_settings_when_on_and_what_a_user_sets_wins(tmp_path):
  env = _env(tmp_path)
  env.pop(runtime.MIN_COMPILE_TIME_ENV, None)
  user = {**env, runtime.MIN_COMPILE_TIME_ENV: "7", runtime.XLA_CACHES_ENV: "xla_gpu_kernel_cache_file"}
  procs = [_start(tmp_path, str(tmp_path / "cache"), env), _start(tmp_path, str(tmp_path / "cache2"), user)]
  (ours, _), (theirs, _) = [_finish(p) for p in procs]
  assert ours["min_compile"] == runtime.CACHE_MIN_COMPILE_SECONDS and ours["enabled"]
  assert ours["xla_caches"] == runtime.XLA_CACHES and ours["raise_errors"] is False
  assert theirs["min_compile"] == 7.0 and theirs["xla_caches"] == "xla_gpu_kernel_cache_file"


def test_every_off_spelling_is_off():
  for setting in runtime.CACHE_OFF + ("OFF", " None "):
    assert runtime.compilation_cache_dir(setting) is None, setting
