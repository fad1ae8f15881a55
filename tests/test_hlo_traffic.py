"""benchmarks.hlo_traffic: kernels, bytes moved and scatters of an optimised HLO module's entry computation, while
loop bodies once per trip (real XLA:CPU text, and XLA:GPU text where `launch.compile --install_gpu_compiler` ran)."""

import functools
import re

import jax
import jax.numpy as jnp
import pytest

from benchmarks import hlo_traffic
from launch import accelerators as compile_lib

pytestmark = pytest.mark.usefixtures("no_jit_cache")  # compile-only targets: entries no process loads

MODULE = """HloModule jit_step, entry_computation_layout={(f32[1000,100]{1,0}, f32[1000,100]{1,0})->f32[1000,100]{1,0}}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_add (param_0: f32[1000,100], param_1: f32[1000,100]) -> f32[1000,100] {
  %param_0 = f32[1000,100]{1,0} parameter(0)
  %param_1 = f32[1000,100]{1,0} parameter(1)
  ROOT %add.1 = f32[1000,100]{1,0} add(%param_0, %param_1)
}

%fused_scatter (p0: bf16[10,8], p1: s32[4,1], p2: bf16[4,8]) -> bf16[10,8] {
  %p0 = bf16[10,8]{1,0} parameter(0)
  %p1 = s32[4,1]{1,0} parameter(1)
  %p2 = bf16[4,8]{1,0} parameter(2)
  ROOT %scatter.3 = bf16[10,8]{1,0} scatter(%p0, %p1, %p2), update_window_dims={1}, inserted_window_dims={0}, \
scatter_dims_to_operand_dims={0}, index_vector_dim=1, to_apply=%add_f32
}

ENTRY %main.9 (x: f32[1000,100], y: f32[1000,100], t: bf16[10,8], i: s32[4,1], u: bf16[4,8]) -> (f32[1000,100], \
bf16[10,8]) {
  %x = f32[1000,100]{1,0} parameter(0)
  %y = f32[1000,100]{1,0} parameter(1)
  %t = bf16[10,8]{1,0} parameter(2)
  %i = s32[4,1]{1,0} parameter(3)
  %u = bf16[4,8]{1,0} parameter(4)
  %loop_add_fusion = f32[1000,100]{1,0} fusion(%x, %y), kind=kLoop, calls=%fused_add
  %bitcast.2 = f32[100,1000]{1,0} bitcast(%loop_add_fusion)
  %loop_add_fusion.1 = f32[1000,100]{1,0} fusion(%loop_add_fusion, %y), kind=kLoop, calls=%fused_add
  %input_scatter_fusion = bf16[10,8]{1,0} fusion(%t, %i, %u), kind=kInput, calls=%fused_scatter
  ROOT %tuple.1 = (f32[1000,100]{1,0}, bf16[10,8]{1,0}) tuple(%loop_add_fusion.1, %input_scatter_fusion)
}
""".replace("\\\n", "")


def test_counts_kernels_bytes_and_scatters_of_a_written_module():
  ks, loops = hlo_traffic.kernels(MODULE)
  assert loops == []
  assert [k.name for k in ks] == ["loop_add_fusion", "loop_add_fusion.1", "input_scatter_fusion"]
  assert [k.bytes for k in ks] == [3 * 400_000, 3 * 400_000, 160 + 16 + 64 + 160]
  assert [k.scatter_dtype for k in ks] == ["", "", "bf16"]
  lines = hlo_traffic.report(MODULE, bandwidth_tbs=2.0, top=5)
  assert lines[0] == "3 kernels; 0.00 GB read + written at most; 0.00 ms at 2 TB/s"
  assert "     0.002     2  loop_add_fusion" in lines
  assert lines[-2:] == ["scatters: 1", "  bf16  input_scatter_fusion  bf16[10,8]{1,0}"]
  matched = hlo_traffic.report(MODULE, bandwidth_tbs=2.0, top=5, match="1000,100")
  assert "result shape matching '1000,100': 2 kernels, 0.00 GB" in matched


def test_reads_a_program_jax_compiled():
  x = jnp.ones((1000,), jnp.float32)
  text = jax.jit(lambda x: jnp.tanh(x) * 2.0 + 1.0).lower(x).compile().as_text()
  ks, _ = hlo_traffic.kernels(text)
  assert sum(k.bytes for k in ks) == 2 * 4000  # one elementwise pass: read x, write the result


def test_cli_names_a_file_that_is_not_hlo(tmp_path, capsys):
  bad = tmp_path / "x.txt"
  bad.write_text("hello")
  assert hlo_traffic.main([str(bad)]) == 1
  assert "no ENTRY computation" in capsys.readouterr().err


def _arg(platform: str) -> jax.ShapeDtypeStruct:
  """A [256, 256] f32 argument for XLA:CPU, or for one compile-only H100."""
  if platform == "cpu":
    return jax.ShapeDtypeStruct((256, 256), jnp.float32)
  if compile_lib.gpu_compiler_missing():
    pytest.skip(compile_lib.gpu_compiler_missing())
  device = compile_lib.topology_devices(compile_lib.accelerator_slice("h100-1"))[0]
  return jax.ShapeDtypeStruct((256, 256), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))


def _hlo(fn, x) -> str:
  return jax.jit(fn).lower(x, x).compile().as_text()


def _step(x, w):
  return jnp.tanh(x @ w) * 2.0 + 1.0


@functools.cache
def _step_kernels(platform: str) -> list:
  """The reference: the kernels of one step compiled alone, no loop (once per platform: a compile-only program's
  entry in the persistent cache cannot be read back)."""
  return hlo_traffic.kernels(_hlo(_step, _arg(platform)))[0]


def _scan(n):
  return lambda x, w: jax.lax.scan(lambda x, _: (_step(x, w), None), x, None, length=n)[0]


def _array(k) -> bool:
  return not re.match(r"\w+\[\]", k.shape)  # not the loop counter's scalar increment


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_a_scan_counts_its_body_once_per_step(platform):
  x = _arg(platform)
  step = _step_kernels(platform)
  text = _hlo(_scan(4), x)
  ks, loops = hlo_traffic.kernels(text)
  assert [(lp.trips, lp.runs, lp.outer) for lp in loops] == [(4, 1, "")]
  body = [k for k in ks if k.runs > 1 and _array(k)]
  assert {k.runs for k in ks} == {1, 4} and len(body) == len(step) >= 2
  assert sum(k.bytes * k.runs for k in body) == 4 * sum(k.bytes for k in step) > 0
  lines = hlo_traffic.report(text, bandwidth_tbs=1.0, top=3)
  assert lines[0].startswith(f"{sum(k.runs for k in ks)} kernels;") and sum(k.runs for k in ks) >= 4 * len(step)
  assert lines[1] == f"while loops: 1 counted, body x trip count: {loops[0].name} x4"
  assert any(re.search(r"\S x4  f32\[", line) for line in lines)  # the largest kernels say they run 4 times

  # nested loops multiply: 2 outer steps of 3 inner ones run the step 6 times
  text = _hlo(lambda x, w: jax.lax.scan(lambda x, _: (_scan(3)(x, w) * 3.0, None), x, None, length=2)[0], x)
  ks, loops = hlo_traffic.kernels(text)
  outer = [lp for lp in loops if not lp.outer]
  assert [(lp.trips, lp.runs, lp.outer) for lp in loops if lp.outer] == [(3, 2, outer[0].name)] and outer[0].trips == 2
  inner = [k for k in ks if k.runs == 6 and _array(k)]
  assert len(inner) == len(step) and sum(k.bytes * k.runs for k in inner) == 6 * sum(k.bytes for k in step)
  assert f"{loops[1].name} x3 (in {outer[0].name}, runs 2x)" in hlo_traffic.report(text, bandwidth_tbs=1.0, top=3)[1]


@pytest.mark.parametrize("platform", ["cpu", "cuda"])
def test_a_loop_of_unknown_trip_count_is_named_and_left_out(platform):
  x = _arg(platform)
  step = _step_kernels(platform)
  text = _hlo(lambda x, w: jax.lax.while_loop(lambda y: y[0, 0] < 10.0, lambda y: _step(y, w), x), x)
  ks, loops = hlo_traffic.kernels(text)
  assert [lp.trips for lp in loops] == [None] and all(k.runs == 1 for k in ks)
  assert sum(k.bytes for k in ks) < sum(k.bytes for k in step)  # the top level's copy in, no step
  lines = hlo_traffic.report(text, bandwidth_tbs=1.0, top=3)
  assert lines[1].startswith("while loops: 1, not counted") and lines[1].endswith(f": {loops[0].name}")
