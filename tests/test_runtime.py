"""gp_jax.runtime: the unrolled threefry lowering gives the Threefry-2x32 bits (NumPy reference from the
Random123 formulas) without the CPU while loop; malloc settings are what the docs say; Ctrl-C asks the loop to stop,
and a second one (or one outside the loop) stops the process at once; a CPU run prints none of libtpu's start-up
errors, JAX's "Unable to initialize backend" or Orbax's records unless --verbosity asks."""

import importlib.util
import json
import logging
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

from gp_jax import jax_private, runtime
from tests import helpers_train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def threefry2x32_reference(key, x0, x1):
  """Threefry-2x32, 20 rounds (Salmon et al. 2011), uint32 NumPy arrays."""
  with np.errstate(over="ignore"):
    k0, k1 = np.uint32(key[0]), np.uint32(key[1])
    ks = (k0, k1, k0 ^ k1 ^ np.uint32(0x1BD11BDA))
    x0, x1 = x0.astype(np.uint32) + ks[0], x1.astype(np.uint32) + ks[1]
    for group in range(5):
      for r in ROTATIONS[4 * (group % 2): 4 * (group % 2) + 4]:
        x0 = x0 + x1
        x1 = (x1 << np.uint32(r)) | (x1 >> np.uint32(32 - r))
        x1 = x1 ^ x0
      x0 = x0 + ks[(group + 1) % 3]
      x1 = x1 + ks[(group + 2) % 3] + np.uint32(group + 1)
  return x0, x1


def test_reference_matches_random123_known_answers():
  cases = [((0, 0), (0, 0), (0x6B200159, 0x99BA4EFE)),
           ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
           ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0))]
  for key, ctr, want in cases:
    got = threefry2x32_reference(key, np.array([ctr[0]], np.uint32), np.array([ctr[1]], np.uint32))
    assert (int(got[0][0]), int(got[1][0])) == want


CHILD = r"""
import json, sys
import numpy as np
from gp_jax import runtime
mode = runtime.configure()["threefry"]
import jax, jax.numpy as jnp
from jax.extend.random import threefry_2x32
rng = np.random.default_rng(0)
key = rng.integers(0, 2**32, 2, dtype=np.uint64).astype(np.uint32)
count = rng.integers(0, 2**32, 4096, dtype=np.uint64).astype(np.uint32)
f = jax.jit(threefry_2x32)
hlo = f.lower(jnp.asarray(key), jnp.asarray(count)).compile().as_text()
out = np.asarray(f(jnp.asarray(key), jnp.asarray(count)))
small = f.lower(jnp.asarray(key), jnp.asarray(count[:8])).compile().as_text()
small_out = np.asarray(f(jnp.asarray(key), jnp.asarray(count[:8])))
drop = jax.jit(lambda k: jax.random.bernoulli(k, 0.9, (64, 128)))
mask = np.asarray(drop(jax.random.key(7)))
json.dump({"mode": mode, "while": " while(" in hlo, "key": key.tolist(), "count": count.tolist(),
           "out": out.tolist(), "small_while": " while(" in small, "small_out": small_out.tolist(), "mask": np.packbits(mask).tolist()}, sys.stdout)
"""


def _child(threefry: str) -> dict:
  env = dict(os.environ, GP_JAX_THREEFRY=threefry, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  res = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
  assert res.returncode == 0, res.stderr[-3000:]
  return json.loads(res.stdout)


@pytest.fixture(scope="module")
def children():
  return {mode: _child(mode) for mode in ("unrolled", "rolled")}


@pytest.mark.e2e
def test_unrolled_threefry_gives_the_reference_bits_without_a_loop(children):
  run = children["unrolled"]
  assert run["mode"] == "unrolled"
  assert not run["while"], "the unrolled lowering still compiles to a while loop"
  count = np.asarray(run["count"], np.uint32)
  # threefry_2x32 hashes the two halves of the count array as the (x0, x1) pairs.
  x0, x1 = threefry2x32_reference(run["key"], count[:2048], count[2048:])
  np.testing.assert_array_equal(np.asarray(run["out"], np.uint32), np.concatenate([x0, x1]))


@pytest.mark.e2e
def test_small_draws_keep_the_loop_under_the_unrolled_lowering(children):
  """Key derivations (a few words) stay one loop each, so XLA cannot copy their hash into every fusion that reads
  the key; same bits."""
  run = children["unrolled"]
  assert run["small_while"], "an 8-word draw was unrolled"
  count = np.asarray(run["count"], np.uint32)[:8]
  x0, x1 = threefry2x32_reference(run["key"], count[:4], count[4:])
  np.testing.assert_array_equal(np.asarray(run["small_out"], np.uint32), np.concatenate([x0, x1]))
  assert 8 <= runtime.THREEFRY_ROLLED_MAX < 4096


@pytest.mark.e2e
def test_rolled_and_unrolled_lowerings_draw_the_same_dropout_masks(children):
  assert children["rolled"]["mode"] == "rolled" and children["rolled"]["while"]
  assert children["rolled"]["out"] == children["unrolled"]["out"]
  assert children["rolled"]["mask"] == children["unrolled"]["mask"]
  assert children["rolled"]["small_out"] == children["unrolled"]["small_out"]


def test_malloc_settings_turn_off_mmap_trimming_and_arenas():
  s = runtime.malloc_settings()
  assert s["M_MMAP_MAX"] == 0 and s["M_ARENA_MAX"] == 1 and s["M_TRIM_THRESHOLD"] >= 2 ** 30


def test_gc_freezes_what_is_alive_and_makes_young_passes_rarer(monkeypatch):
  import gc

  before = gc.get_threshold()
  try:
    gc.set_threshold(700, 10, 10)
    monkeypatch.setenv("GP_JAX_GC", "0")
    assert runtime.configure_gc() is None and gc.get_threshold() == (700, 10, 10)
    monkeypatch.delenv("GP_JAX_GC")
    gc.unfreeze()
    assert runtime.configure_gc() == runtime.GC_THRESHOLDS == gc.get_threshold()
    assert gc.get_threshold()[0] > 700 and gc.get_freeze_count() > 0
  finally:
    gc.set_threshold(*before)
    gc.freeze()  # as tests/conftest.py left this worker


_THRESHOLD_AT_JAX = """\
import gc, sys
seen = [gc.get_threshold()]
class Spy:
  def find_spec(self, name, path=None, target=None):
    if name == "jax" and len(seen) == 1:
      seen.append(gc.get_threshold())
sys.meta_path.insert(0, Spy())
import gp_jax.main
print(*seen[0], *seen[1])
"""


@pytest.mark.e2e  # fresh interpreters
def test_the_trainer_sets_the_collectors_thresholds_before_importing_jax():
  """jax's, flax's and orbax's imports run under GC_THRESHOLDS (each young pass at the default thresholds walks what
  the imports left so far); GP_JAX_GC=0 leaves Python's defaults."""
  def threshold_at_jax(**env):
    proc = subprocess.run([sys.executable, "-c", _THRESHOLD_AT_JAX], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", **env}, timeout=120, check=True)
    numbers = tuple(map(int, proc.stdout.split()))
    return numbers[:3], numbers[3:]  # Python's defaults, those in force at jax's import

  defaults, at_jax = threshold_at_jax()
  assert at_jax == runtime.GC_THRESHOLDS != defaults
  defaults, at_jax = threshold_at_jax(GP_JAX_GC="0")
  assert at_jax == defaults


def test_environ_sets_then_restores_each_variable(monkeypatch):
  monkeypatch.setenv("GP_JAX_TEST_SET", "before")
  monkeypatch.delenv("GP_JAX_TEST_UNSET", raising=False)
  with runtime.environ({"GP_JAX_TEST_SET": "inside", "GP_JAX_TEST_UNSET": "inside"}):
    assert os.environ["GP_JAX_TEST_SET"] == "inside" and os.environ["GP_JAX_TEST_UNSET"] == "inside"
  assert os.environ["GP_JAX_TEST_SET"] == "before" and "GP_JAX_TEST_UNSET" not in os.environ
  with pytest.raises(RuntimeError), runtime.environ({"GP_JAX_TEST_UNSET": "inside"}):
    raise RuntimeError
  assert "GP_JAX_TEST_UNSET" not in os.environ


def test_preemption_takes_ctrl_c_as_a_stop_request():
  before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
  with runtime.Preemption() as p:
    assert not p.should_stop(1)
    os.kill(os.getpid(), signal.SIGINT)
    assert p.should_stop(2) and p.signal_name == "SIGINT"
  assert {s: signal.getsignal(s) for s in before} == before


SECOND_CTRL_C = r"""
import os, signal, sys
from gp_jax import runtime
with runtime.on_stop(lambda name: open(sys.argv[1], "w").write(name)):
  with runtime.Preemption() as p:
    os.kill(os.getpid(), signal.SIGINT)
    assert p.should_stop(1)
    print("asked", flush=True)
    os.kill(os.getpid(), signal.SIGINT)
    print("not stopped", flush=True)
"""

CTRL_C_WHILE_WAITING = r"""
import concurrent.futures, sys, threading
from gp_jax import runtime
runtime.stop_at_once_on_signals()
with runtime.on_stop(lambda name: open(sys.argv[1], "w").write(name)):
  with concurrent.futures.ThreadPoolExecutor(1) as pool:  # leaving this block waits for the job: it never ends
    job = pool.submit(threading.Event().wait)
    print("waiting", flush=True)
    job.result()
"""


def _stopped(code: str, tmp_path, *, signal_after: str | None = None, sig=signal.SIGINT):
  """(exit status, stdout, stderr) of `code` run as a child; with `signal_after`, `sig` once it prints that."""
  record = tmp_path / "stopped_by"
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  child = subprocess.Popen([sys.executable, "-c", code, str(record)], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
  try:
    if signal_after is not None:
      assert child.stdout.readline().strip() == signal_after
      child.send_signal(sig)
    out, err = child.communicate(timeout=120)
  finally:
    if child.poll() is None:
      child.kill()
      child.wait()
  assert record.read_text() == signal.Signals(sig).name  # the on_stop callback ran
  return child.returncode, out, err


@pytest.mark.e2e  # a child process, signalled
def test_a_second_ctrl_c_stops_at_once_with_one_line(tmp_path):
  rc, out, err = _stopped(SECOND_CTRL_C, tmp_path)
  assert rc == runtime.EXIT_INTERRUPTED == 130 and out == "asked\n"
  assert err.strip().splitlines() == ["interrupted: a second Ctrl-C; stopped at once, without the checkpoint of this "
                                      "step. Rerun the same command to resume from the last checkpoint"], err


@pytest.mark.e2e  # a child process, signalled
@pytest.mark.parametrize("sig, code, says", [(signal.SIGINT, 130, "Ctrl-C"), (signal.SIGTERM, 0, "SIGTERM")])
def test_a_signal_outside_the_steps_stops_at_once_though_a_thread_pool_never_ends(tmp_path, sig, code, says):
  """SIGTERM (what a launcher forwards) before the first step was the default action: killed, no results.json, so
  the point read as failed; now it is a preemption like SIGTERM in the loop (exit 0, results.json "preempted")."""
  rc, _, err = _stopped(CTRL_C_WHILE_WAITING, tmp_path, signal_after="waiting", sig=sig)
  assert rc == code and err.strip().splitlines()[-1].startswith(f"interrupted: {says} outside the training steps"), err


def _record(name: str, level: int, msg: str, pathname: str = "/x/y.py") -> logging.LogRecord:
  return logging.LogRecord(name, level, pathname, 1, msg, (), None)


def test_start_up_noise_is_info_nobody_can_act_on(monkeypatch):
  tpu = "Unable to initialize backend 'tpu': INTERNAL: Failed to open libtpu.so: libtpu.so: cannot open shared object"
  orbax = "/venv/site-packages/orbax/checkpoint/_src/logging/standard_logger.py"
  real_find_spec = runtime.importlib.util.find_spec
  for libtpu, accelerators, noise in ((False, True, True),  # a GPU machine without libtpu
                                      (True, False, True),  # libtpu beside jax, no TPU or GPU here
                                      (True, True, False),  # a TPU VM whose libtpu failed: that line matters
                                      (True, None, False)):  # this jax cannot tell: shown
    monkeypatch.setattr(runtime.importlib.util, "find_spec",
                        lambda name, *a, libtpu=libtpu: (object() if libtpu else None) if name == "libtpu"
                        else real_find_spec(name, *a))
    monkeypatch.setattr(jax_private, "accelerators_present", lambda accelerators=accelerators: accelerators)
    assert runtime.start_up_noise(_record(runtime.BACKEND_LOGGER, logging.INFO, tpu)) is noise, (libtpu, accelerators)
    assert not runtime.start_up_noise(_record(runtime.BACKEND_LOGGER, logging.WARNING, tpu))
  monkeypatch.setattr(jax_private, "accelerators_present", lambda: False)
  assert runtime.start_up_noise(_record(runtime.BACKEND_LOGGER, logging.INFO, "Unable to initialize backend 'cuda'"))
  assert not runtime.start_up_noise(_record(runtime.BACKEND_LOGGER, logging.INFO, "another line of jax's"))
  assert runtime.start_up_noise(_record("absl", logging.INFO, "{'step': 4, 'event_type': 'restore'}", orbax))
  assert not runtime.start_up_noise(_record("absl", logging.WARNING, "a failed save", orbax))
  assert not runtime.start_up_noise(_record("absl", logging.INFO, "a line of another absl user", "/x/tfds/a.py"))
  assert not runtime.start_up_noise(_record("gp_jax.train", logging.INFO, "step 4", orbax))


# Hides libtpu from the child (every finder answers None for it), as on a machine without the `aot` extra.
HIDE_LIBTPU = """
import sys
class _Hide:
  def __init__(self, inner): self.inner = inner
  def find_spec(self, name, path=None, target=None):
    if name == "libtpu" or name.startswith("libtpu."): return None
    return self.inner.find_spec(name, path, target) if hasattr(self.inner, "find_spec") else None
  def __getattr__(self, name): return getattr(self.inner, name)
sys.meta_path[:] = [_Hide(f) for f in sys.meta_path]
"""
LIBTPU_ERRORS = ("E0000", "TPU_WORKER_HOSTNAMES", "could not determine TPU")
BACKEND_LINE = "Unable to initialize backend"
ORBAX_RECORD = "'event_type': 'restore'"


def _cpu_env(tmp_path, *, libtpu: bool = True) -> dict:
  """A child's environment as a user's shell gives it: JAX_PLATFORMS unset, libtpu visible or hidden."""
  env = helpers_train.subprocess_env(1)
  env.pop("JAX_PLATFORMS")
  if not libtpu:
    (tmp_path / "hide").mkdir(exist_ok=True)
    (tmp_path / "hide" / "sitecustomize.py").write_text(HIDE_LIBTPU)
    env["PYTHONPATH"] = f"{tmp_path / 'hide'}{os.pathsep}{env['PYTHONPATH']}"
  return env


def _run(cmd, env) -> str:
  proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A 2-step tiny run with a best checkpoint, trained as a user's shell would start it; (workdir, its output)."""
  workdir = tmp_path_factory.mktemp("quiet") / "run"
  cmd = helpers_train.main_command(str(workdir), num_train_steps=2, eval_every_steps=2, checkpoint_every_steps=2)
  return workdir, _run(cmd, _cpu_env(tmp_path_factory.mktemp("env")))


@pytest.mark.e2e
def test_a_cpu_run_prints_no_tpu_start_up_errors(trained, tmp_path):
  """gp_jax.main and gp_jax.export on this CPU with the JAX_PLATFORMS a user leaves unset: none of libtpu's
  start-up errors (where libtpu is installed: JAX alone prints them here), no backend line, no Orbax record."""
  workdir, out = trained
  export = _run([sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={tmp_path / 'a'}"],
                _cpu_env(tmp_path))
  for text in (out, export):
    assert not [line for line in text.splitlines() if any(s in line for s in (*LIBTPU_ERRORS, BACKEND_LINE,
                                                                               ORBAX_RECORD))], text[-3000:]
  assert "Done (finished)" in out and "Exported" in export
  if importlib.util.find_spec("libtpu") is not None:  # the control: JAX without gp_jax.runtime prints them on this machine
    bare = _run([sys.executable, "-c", "import jax; jax.devices()"], _cpu_env(tmp_path))
    assert any(s in bare for s in LIBTPU_ERRORS), bare[-2000:]


@pytest.mark.e2e
def test_the_backend_line_and_orbax_records_show_with_verbosity(trained, tmp_path):
  """Without libtpu, JAX logs `Unable to initialize backend 'tpu'` and Orbax its restore record: dropped by
  default, shown with --verbosity."""
  workdir, _ = trained
  env = _cpu_env(tmp_path, libtpu=False)
  quiet = _run([sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={tmp_path / 'q'}"], env)
  loud = _run([sys.executable, "-m", "gp_jax.export", f"--workdir={workdir}", f"--out={tmp_path / 'l'}",
               "--verbosity=0"], env)
  assert BACKEND_LINE not in quiet and ORBAX_RECORD not in quiet, quiet[-3000:]
  assert f"{BACKEND_LINE} 'tpu'" in loud and ORBAX_RECORD in loud, loud[-3000:]
