"""Preemption agreement (runtime.Preemption), what Orbax already does for a save killed half-way, and tensorstore
retries of gs:// requests set through GP_JAX_GCS_RETRIES."""

import os
import signal

import jax
import numpy as np
import pytest

from gp_jax import checkpoint as ckpt_lib
from gp_jax import runtime
from launch import worker


def test_single_process_preemption_is_a_sigterm_flag_read_every_step():
  before = signal.getsignal(signal.SIGTERM)
  with runtime.Preemption() as p:
    assert not p.should_stop(1)
    os.kill(os.getpid(), signal.SIGTERM)
    assert p.should_stop(2)  # the very next step, no `every`
  assert signal.getsignal(signal.SIGTERM) is before


def test_unfinalised_checkpoint_of_a_killed_save_is_ignored(tmp_path):
  """A save killed before Orbax finalised it leaves <step>.orbax-checkpoint-tmp-*; restore takes the previous step."""
  d = tmp_path / "ckpt"
  state = {"w": jax.numpy.arange(4.0), "step": jax.numpy.asarray(3)}
  mngr = ckpt_lib.make_manager(d, keep=3)
  ckpt_lib.save(mngr, 3, state=state, data_state={"pos": 3}, config_json="{}")
  mngr.wait_until_finished()
  mngr.close()
  junk = d / "6.orbax-checkpoint-tmp-1234567"  # what a SIGKILL during step 6's save leaves behind
  (junk / "state").mkdir(parents=True)
  (junk / "state" / "partial").write_bytes(b"\0" * 10)
  mngr = ckpt_lib.make_manager(d, keep=3)
  try:
    assert mngr.latest_step() == 3
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state)
    step, restored, data = ckpt_lib.restore(mngr, abstract)
    assert step == 3 and data == {"pos": 3}
    np.testing.assert_array_equal(restored["w"], np.arange(4.0))
  finally:
    mngr.close()
  assert worker.resume_step(str(tmp_path)) == 3  # the worker's broadcast resume step skips it too


def test_replicated_arrays_are_saved_whole_on_one_cpu_process(tmp_path, monkeypatch):
  """An array replicated over the 8 CPU devices is written whole: no replica slices (an eager slice op each)."""
  slices = []
  slice_in_dim = jax.lax.slice_in_dim
  monkeypatch.setattr(jax.lax, "slice_in_dim", lambda *a, **k: slices.append(a[0].shape) or slice_in_dim(*a, **k))
  mesh = jax.make_mesh((8,), ("data",), devices=jax.devices()[:8])
  w = jax.device_put(np.arange(64.0).reshape(16, 4), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
  mngr = ckpt_lib.make_manager(tmp_path / "ckpt", keep=1)
  try:
    ckpt_lib.save(mngr, 1, state={"w": w}, data_state={}, config_json="{}")
    mngr.wait_until_finished()
    _, restored, _ = ckpt_lib.restore(mngr, {"w": jax.ShapeDtypeStruct(w.shape, w.dtype)})
  finally:
    mngr.close()
  assert not slices, slices
  np.testing.assert_array_equal(restored["w"], np.arange(64.0).reshape(16, 4))


def test_gcs_retries_reach_orbax_tensorstore_context(monkeypatch):
  from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils

  from gp_jax.errors import UserError

  for name in ("_BASE_TS_CONTEXT", "_DEFAULT_OCDBT_TS_CONTEXT"):  # restored after the test
    monkeypatch.setattr(ts_utils, name, dict(getattr(ts_utils, name)))
  monkeypatch.setattr(ckpt_lib, "_retries_set", None)
  monkeypatch.setenv(ckpt_lib.RETRIES_ENV, '{"max_retries": 5, "initial_delay": "10ms", "max_delay": "20ms"}')
  assert ckpt_lib.configure_gcs_retries() == {"max_retries": 5, "initial_delay": "10ms", "max_delay": "20ms"}
  for ocdbt in (True, False):
    got = ts_utils.get_ts_context(use_ocdbt=ocdbt)["gcs_request_retries"].to_json()
    assert got == {"max_retries": 5, "initial_delay": "10ms", "max_delay": "20ms"}, got
  monkeypatch.setenv(ckpt_lib.RETRIES_ENV, '{"max_retries": 5, "delay": "1s"}')
  with pytest.raises(UserError, match="GP_JAX_GCS_RETRIES"):
    ckpt_lib.configure_gcs_retries()


def test_storage_full_found_in_an_exception_chain():
  from gp_jax.errors import storage_full

  try:
    try:
      raise OSError(28, "No space left on device", "/w/metrics.jsonl")
    except OSError as e:
      raise RuntimeError("results.json not written") from e
  except RuntimeError as e:
    assert storage_full(e) == "No space left on device writing /w/metrics.jsonl"
  ts_error = ValueError('OUT_OF_RANGE: Error writing "w/0" in OCDBT database: Failed writing: "/w/ckpt/8/d/ab": '
                        "Failed to write 9 bytes to file 12: Disk quota exceeded [os_error_code='122']")
  assert storage_full(ts_error) == "Disk quota exceeded writing /w/ckpt/8/d/ab"
  assert storage_full(OSError(2, "No such file or directory")) is None
  assert storage_full(ValueError("[os_error_code='2']")) is None
