"""benchmarks.hlo_traffic: kernels, bytes moved and scatters of an optimised HLO module's entry computation."""

import jax
import jax.numpy as jnp

from benchmarks import hlo_traffic

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
  assert loops == 0
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
