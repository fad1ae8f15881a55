"""gp_jax.aot: batch shapes as the pipeline builds them, concurrent compiles, per-program XLA options, dispatch."""

import logging
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gp_jax import aot
from gp_jax.data import batching, windows
from gp_jax.evaluate import model_batch
from tests.data.fakes import TYPES, CharTok, random_records


@pytest.fixture(scope="module")
def prepared():
  return windows.prepare_split(random_records(1, n=30, max_chars=40), CharTok(), types=TYPES, max_len=32)


@pytest.mark.parametrize("scheme", [None, "BIO"])
def test_batch_structure_is_what_the_pipeline_builds(prepared, scheme):
  it = batching.train_batches(prepared, batch_size=4, buckets=(16,), seed=0, tag_scheme=scheme)
  for length in (16, 32):
    real = model_batch(it.filler(length))
    want = {k: (v.shape, v.dtype) for k, v in real.items()}
    got = aot.batch_structure(CharTok.feature_names, batch=4, length=length, tagger=scheme is not None,
                              targets={"span_ids": (4, len(TYPES), length)})
    assert {k: (v.shape, np.dtype(v.dtype)) for k, v in got.items()} == want
  evals = batching.eval_batches(prepared, batch_size=4, buckets=(16,))  # eval batches carry no targets, no tags
  got = aot.batch_structure(CharTok.feature_names, batch=4, length=16)
  assert "span_ids" not in got
  assert {k: v.shape for k, v in got.items()} == {k: v.shape for k, v in model_batch(evals.filler(16)).items()}
  first = model_batch(next(it))  # a real batch has the filler's structure
  assert {k: v.shape[1:] for k, v in first.items()} == {k: v.shape[1:] for k, v in model_batch(
      it.filler(first["attention_mask"].shape[1])).items()}


def _program(n, fn=None):
  fn = fn or jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0) * n)
  return aot.Program("train", n, 8, fn, (jax.ShapeDtypeStruct((8, n), jnp.float32),))


def test_compile_all_compiles_every_program_and_reports_the_totals(no_jit_cache):
  programs = [_program(n) for n in (16, 32, 48)]
  done = []
  report = aot.compile_all(programs, threads=2, on_done=done.append)
  assert sorted(p.length for p in done) == [16, 32, 48]
  assert report.threads == 2 and report.summed == pytest.approx(sum(p.seconds for p in programs))
  x = np.arange(8 * 32, dtype=np.float32).reshape(8, 32) / 100
  np.testing.assert_allclose(programs[1].compiled(x), np.tanh(x @ x.T).sum(axis=0) * 32, rtol=1e-5)
  assert all(p.cache_hit is False for p in programs)
  assert "compiled ahead: 3 programs in" in report.line() and "2 threads" in report.line()
  assert programs[0].line().startswith("compiled ahead: train L16 B8: ")


def test_a_program_that_fails_keeps_its_error_and_compile_for_run_raises_it():
  bad = _program(16, jax.jit(lambda x: x.reshape(3, -1)))  # 128 elements do not split into 3 rows
  good = _program(32)
  report = aot.compile_all([bad, good], threads=2)
  assert isinstance(bad.error, TypeError) and bad.compiled is None and good.compiled is not None
  assert "failed (TypeError)" in bad.line() and len(report.programs) == 2
  with pytest.raises(TypeError):
    aot.compile_for_run([_program(16, jax.jit(lambda x: x.reshape(3, -1)))])


def test_xla_flags_win_over_the_project_options(monkeypatch, caplog):
  p = _program(16)
  p.options = {"xla_cpu_enable_fast_math": False, "xla_cpu_use_thunk_runtime": True}
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1 --xla_cpu_use_thunk_runtime=false")
  with caplog.at_level(logging.INFO, logger="gp_jax.aot"):
    kept = aot.compiler_options(p)
  assert kept == {"xla_cpu_enable_fast_math": False}
  assert "xla_cpu_use_thunk_runtime from XLA_FLAGS wins" in caplog.text
  assert "XLA options {'xla_cpu_enable_fast_math': False}" in caplog.text
  aot.compile_all([p], threads=1)
  assert p.error is None and p.compiled is not None


def test_dispatch_calls_the_compiled_program_and_logs_a_late_shape_once(caplog):
  traced = []

  @jax.jit
  def step(state, batch):
    traced.append(batch["attention_mask"].shape)
    return state + batch["attention_mask"].sum(), {}

  state = jax.ShapeDtypeStruct((), jnp.int32)
  p = aot.Program("train", 8, 2, step, (state, {"attention_mask": jax.ShapeDtypeStruct((2, 8), jnp.int32)}))
  aot.compile_all([p], threads=1)
  dispatch = aot.Dispatch(step, "train")
  dispatch.adopt([p])
  traced.clear()
  out, _ = dispatch(jnp.int32(1), {"attention_mask": np.ones((2, 8), np.int32)})
  assert int(out) == 17 and traced == []  # the executable compiled ahead ran; nothing was traced again
  with caplog.at_level(logging.INFO, logger="gp_jax.steps"):
    for _ in range(2):
      out, _ = dispatch(jnp.int32(0), {"attention_mask": np.ones((2, 4), np.int32)})
  assert int(out) == 8 and caplog.text.count("not compiled ahead") == 1


def test_compile_threads_bounded_and_overridable(monkeypatch):
  monkeypatch.delenv(aot.THREADS_ENV, raising=False)
  assert 1 <= aot.compile_threads(64) <= (os.cpu_count() or 1)
  assert aot.compile_threads(1) == 1
  monkeypatch.setenv(aot.THREADS_ENV, "3")
  assert aot.compile_threads(10) == 3


def test_mesh_flag_parses_axis_sizes_and_refuses_the_rest_in_one_line():
  assert aot.parse_mesh("data:4,fsdp:2") == {"data": 4, "fsdp": 2}
  assert aot.parse_mesh("fsdp:8") == {"data": 1, "fsdp": 8}
  for bad, says in (("bad", "expected AXIS:N"), ("data:x", "expected AXIS:N"), ("data:0", "expected AXIS:N"),
                    ("model:2", "axes are data and fsdp")):
    with pytest.raises(ValueError, match=says):
      aot.parse_mesh(bad)
