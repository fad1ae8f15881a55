"""Time to first step: host-side parameter init, the persistent compilation cache (a config key, on by default), the
`first step after N s (compile M s)` line, and the pallas refusal on a GPU target."""

import os
import subprocess
import sys
import re

import jax
import numpy as np
import pytest

from gp_jax import factory, runtime
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.errors import UserError
from tests import helpers_train


def test_cache_dir_resolution(monkeypatch, tmp_path):
  monkeypatch.delenv(runtime.CACHE_ENV, raising=False)
  monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert runtime.compilation_cache_dir("auto") == str(tmp_path / "xdg" / "gp_jax" / "jax_cache")
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "jaxs"))
  assert runtime.compilation_cache_dir("auto") == str(tmp_path / "jaxs")  # jax's own variable is honoured
  monkeypatch.setenv(runtime.CACHE_ENV, "off")
  assert runtime.compilation_cache_dir("auto") is None
  monkeypatch.setenv(runtime.CACHE_ENV, str(tmp_path / "mine"))
  assert runtime.compilation_cache_dir("auto") == str(tmp_path / "mine")
  assert runtime.compilation_cache_dir("off") is None and runtime.compilation_cache_dir("") is None
  assert runtime.compilation_cache_dir(str(tmp_path / "cfg")) == str(tmp_path / "cfg")  # an explicit folder wins


def test_process_seconds_counts_from_process_start():
  age = runtime.process_seconds()
  with open("/proc/uptime") as f:
    uptime = float(f.read().split()[0])
  assert 0 < age < uptime



@pytest.mark.e2e
def test_process_seconds_when_python_is_execd_late_or_forked_late():
  """`bash -c "... && python ..."` execs Python in the shell's process (its start is the shell's): counted from
  gp_jax's import; a child forked long after the import counts from its fork; a benchmark's late import of
  gp_jax.runtime still counts from the process's start."""
  report = "runtime.EXEC_SLACK_S = 0.3; print(round(runtime.process_seconds(), 2))"
  execd = f"sleep 0.8 && exec {sys.executable} -c 'from gp_jax import runtime; {report}'"
  forked = (f"import os, time; from gp_jax import runtime; time.sleep(0.8); pid = os.fork()\n"
            f"if pid == 0: {report}; os._exit(0)\nos.waitpid(pid, 0)")
  # A benchmark (or launcher) that imports jax and more before gp_jax.runtime: its package recorded the start.
  late = f"import benchmarks, time; time.sleep(0.8); from gp_jax import runtime; {report}"
  procs = [subprocess.Popen(cmd, cwd=helpers_train.REPO, stdout=subprocess.PIPE, text=True)
           for cmd in (["bash", "-c", execd], [sys.executable, "-c", forked], [sys.executable, "-c", late])]
  ages = [float(p.communicate(timeout=60)[0]) for p in procs]
  assert 0 <= ages[0] < 0.6 and 0 <= ages[1] < 0.6 and ages[2] >= 0.8, ages

def test_a_later_run_in_one_process_is_timed_from_its_own_start(monkeypatch):
  monkeypatch.setattr(runtime, "_runs", {"count": 0, "start": 0.0, "compile_at_start": 0.0})
  monkeypatch.setattr(runtime, "process_seconds", lambda: 1000.0)
  monkeypatch.setattr(runtime, "_compile", {**runtime._compile, "seconds": 40.0})
  runtime.mark_run_start()
  assert runtime.first_step_line() == "first step after 1000.0 s (compile 40.0 s)"
  runtime.mark_run_start()
  runtime._compile["seconds"] = 43.5
  line = runtime.first_step_line()
  m = re.fullmatch(r"first step after ([\d.]+) s \(compile 3\.5 s; run 2 of this process, timed from its start\)",
                   line)
  assert m and float(m.group(1)) < 60, line


def test_host_init_is_the_same_on_any_mesh():
  """Parameters are drawn on the host and then placed with their shardings: one device and 8 devices (data x fsdp)
  hold the same values."""
  config = helpers_train.tiny_config()
  _, tokenizer, types = factory.prepare_data(config)
  values = []
  for mesh in (shd.make_mesh(1, 1, devices=jax.devices()[:1]), shd.make_mesh(-1, 2)):
    _, params = state_lib.init_model(config, tokenizer, types, mesh)
    leaves = jax.tree.leaves(params)
    assert all(leaf.sharding.mesh.shape == mesh.shape for leaf in leaves)
    values.append([np.asarray(leaf) for leaf in leaves])
  for a, b in zip(*values):
    np.testing.assert_array_equal(a, b)


def test_pallas_loss_is_refused_on_a_gpu_target():
  config = helpers_train.tiny_config(**{"loss.block_size": 16, "loss.implementation": "pallas"})
  with pytest.raises(UserError, match="has no GPU kernel"):
    factory.loss_implementation(config, "cuda")
  assert factory.loss_implementation(config, "tpu") == "pallas"


@pytest.mark.e2e
def test_first_step_line_and_the_cache_fills(tmp_path):
  """A training run logs `first step after N s (compile M s)` and fills the cache the config names; a second run
  from that cache compiles less."""
  cache = tmp_path / "cache"
  env = helpers_train.subprocess_env(jit_cache=False, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0)
  seen = []
  for run in ("cold", "warm"):
    out = helpers_train.run_main(str(tmp_path / run), env=env, num_train_steps=2, compilation_cache=str(cache),
                                 **{"model.num_layers": 1, "data.max_eval_records": 8})  # less to compile cold
    assert out.returncode == 0, out.stdout[-2000:]
    assert f"Compilation cache: {cache}" in out.stdout
    m = re.search(r"first step after ([\d.]+) s \(compile ([\d.]+) s\)", out.stdout)
    assert m, out.stdout[-2000:]
    seen.append((float(m.group(1)), float(m.group(2))))
    assert os.listdir(cache)
  (_, cold_compile), (_, warm_compile) = seen
  assert cold_compile > 0 and warm_compile < cold_compile


@pytest.mark.e2e
def test_the_metric_writer_does_not_import_torch_or_cloud_writers(tmp_path):
  """tensorboardX imports torch, boto3 and google.cloud.storage when they are installed (this venv has torch, for
  parity tests, and google-cloud-storage): the writer blocks those it never uses, and the event file still holds the
  scalar."""
  unused = ("torch", "google.cloud.storage")
  code = ("import sys, importlib.util; from gp_jax import reporting, storage; "
          f"w = reporting.MetricWriter(storage.LocalMirror(storage.path({str(tmp_path)!r}))); "
          "w.write(3, 'train', {'loss': 0.5}); w.close(); "
          f"print(*[(m in sys.modules, importlib.util.find_spec(m) is not None) for m in {unused!r}])")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env=helpers_train.subprocess_env(1), timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["(False,", "True)"] * len(unused)  # installed, not imported
  (event,) = (tmp_path / "tb").iterdir()
  assert b"train/loss" in event.read_bytes()
