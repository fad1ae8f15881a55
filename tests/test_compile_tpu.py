"""launch.compile and the launch.tpu preflight: the trainer's steps compiled for TPU slices on this CPU machine with
libtpu (tiny models, `experiments/synthetic.py:quick`), and what happens to a point that does not fit."""

import argparse
import os
import re
import subprocess
import sys

import pytest

from launch import accelerators, failures, tpu
from launch import compiler as compiler_lib
from launch import points as points_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("no_jit_cache")  # compile-only targets: entries no process loads
SYNTHETIC = os.path.join(REPO, "experiments", "synthetic.py") + ":quick"
needs_libtpu = pytest.mark.skipif(accelerators.libtpu_missing() is not None,
                                  reason="libtpu is not installed: pip install -e '.[aot]'")
# A tiny model that holds both kinds of TPU kernel: one splash attention block, the Pallas ZLPR loss.
KERNELS = ["--config.model.num_attn_layers=1", "--config.loss.block_size=128", "--config.loss.implementation=pallas",
           "--config.data.max_len=128", "--config.data.buckets=(128,)"]
# Far past any chip's HBM; built from shapes only, so it costs nothing here.
HUGE_BATCH = ["--config.batch_size=1048576", "--config.eval_batch_size=1048576"]


def _rows(accelerator_type, extra, *, points="0", steps=("train",), config=SYNTHETIC):
  compiler = compiler_lib.Compiler(accelerators.tpu_slice(accelerator_type), steps=steps, out=lambda line: None)
  rows = compiler.run(points_lib.sweep_points(config, extra=extra, points=points))
  assert not compiler.unexpected
  return rows


def test_accelerator_types_map_to_topologies():
  expected = {"v4-8": ("v4:2x2x1", 4, 1, (2, 2, 1)), "v4-32": ("v4:2x2x4", 16, 4, (2, 2, 1)),
              "v5litepod-8": ("v5e:2x4", 8, 1, (2, 4, 1)), "v5litepod-16": ("v5e:4x4", 16, 4, (2, 2, 1)),
              "v5litepod-1": ("v5e:1x1", 1, 1, (1, 1, 1)), "v5p-8": ("v5:2x2x1", 4, 1, (2, 2, 1)),
              "v6e-8": ("v6e:2x4", 8, 1, (2, 4, 1)), "v6e-256": ("v6e:16x16", 256, 64, (2, 2, 1)),
              "v4-4096": ("v4:8x16x16", 2048, 512, (2, 2, 1))}
  for name, (topology, chips, hosts, per_host) in expected.items():
    s = accelerators.tpu_slice(name)
    assert (s.topology, s.chips, s.hosts, s.chips_per_host) == (topology, chips, hosts, per_host), name
  assert accelerators.tpu_slice("v5litepod-8").family.hbm_gib == 16
  for bad in ("v5e-16", "v4-6", "v5litepod-2", "v4"):
    with pytest.raises(ValueError):
      accelerators.tpu_slice(bad)


def test_failure_reasons_name_hbm_vmem_mosaic_and_refusals():
  from gp_jax.configs import base
  from gp_jax.errors import UserError

  config = base.get_config()
  config.loss.block_size = 1024
  vmem = RuntimeError('RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom:\nRan out of memory in memory space vmem '
                      'while allocating on stack for %zlpr_neg_fwd.1 = f32[1] custom-call(), custom_call_target='
                      '"tpu_custom_call", metadata={op_name="jit(step)/jvp()/zlpr_neg_fwd/pallas_call"}. Scoped '
                      'allocation with size 26.89M and limit 16.00M exceeded scoped vmem limit by 10.89M.')
  assert failures.failure(vmem, config) == ("VMEM: kernel zlpr_neg_fwd (loss.block_size=1024): needs 26.89M of "
                                            "16.00M scoped VMEM")
  spill = RuntimeError("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
                       "Used 17.14M of 16.00M vmem.\n  1. Size: 8.00M\n     XLA label: register allocator spill slots "
                       "in HLO :: zlpr_neg_bwd_dq.1\n")
  assert failures.failure(spill, config).startswith("VMEM: kernel zlpr_neg_bwd_dq (loss.block_size=1024)")
  config.model.head = "efficient"  # a shared q/k head: tiles clamp to 512 on v5e (pallas_zlpr.TPU_MAX_TILE)
  assert "(loss.block_size=1024: 512 x 512 tiles on v5e)" in failures.failure(spill, config, length=4096,
                                                                                generation="v5e")
  hbm = RuntimeError("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
                     "(35.46G) exceeds available HBM (15.75G).")
  assert failures.failure(hbm, config) == "HBM: HLO temporaries need 35.46G, 15.75G available"
  assert failures.failure(ValueError("The Pallas TPU lowering currently requires that the last two dimensions of "
                                     "your block shape are divisible by 8 and 128"), config).startswith("Mosaic: ")
  assert failures.failure(UserError("batch_size=6 must be divisible"), config) == "refused: batch_size=6 must be " \
      "divisible"
  assert failures.failure(KeyError("surprise"), config) is None


@pytest.mark.e2e  # compiles with libtpu
@needs_libtpu
def test_tiny_train_step_with_splash_and_pallas_compiles_for_v5litepod_data_x_fsdp():
  row, = _rows("v5litepod-8", [*KERNELS, "--config.mesh.data=4", "--config.mesh.fsdp=2"])
  assert row.status == "compiled", row.line()
  assert (row.step, row.length, row.batch) == ("train", 128, 16)
  # one attention block: splash forward, dq and dkv; the ZLPR loss: forward, dq and dk passes
  assert row.kernels == 6
  assert row.labels == "data:4 x fsdp:2, bfloat16, attention splash, loss pallas"
  assert 0 < row.hbm_bytes < row.hbm_limit_bytes == 16 * accelerators.GIB and row.gflop > 0
  assert row.floor_ms == pytest.approx(row.gflop / 197)


# Efficient GlobalPointer, 16 types (user files: --num_types), q/k width 256, loss.block_size 1024: the kernel clamps its
# tiles to 512 on both v5e and v6e (pallas_zlpr.TPU_MAX_TILE, measured at width 64), and a program's 16 types of
# 512 x 512 cells with 256-wide q/k rows still exceed v5e's 16M of scoped VMEM, not v6e's. L 1024 (two row blocks)
# fails as L 4096 does. One test per generation: each compile is the slow part, and the two run side by side.
VMEM_EXTRA = ["--config.data.name=jsonl", "--config.model.head=efficient", "--config.model.head_size=256",
              "--config.loss.block_size=1024", "--config.loss.implementation=pallas", "--config.data.max_len=1024",
              "--config.data.buckets=(1024,)", "--config.batch_size=8"]


def _vmem_row(accelerator_type):
  compiler = compiler_lib.Compiler(accelerators.tpu_slice(accelerator_type), steps=("train",), num_types=16,
                                   out=lambda line: None)
  row, = compiler.run(points_lib.sweep_points(SYNTHETIC, extra=VMEM_EXTRA, points="0"))
  assert not compiler.unexpected
  return row


@pytest.mark.e2e  # compiles with libtpu
@needs_libtpu
def test_zlpr_loss_runs_out_of_vmem_on_v5e():
  v5e = _vmem_row("v5litepod-8")
  assert v5e.status == "does not fit" and v5e.reason.startswith("VMEM: kernel zlpr_neg_"), v5e.line()
  assert "(loss.block_size=1024: 512 x 512 tiles on v5e)" in v5e.reason and v5e.hbm_bytes is None


@pytest.mark.e2e  # compiles with libtpu
@needs_libtpu
def test_the_same_zlpr_loss_compiles_on_v6e():
  v6e = _vmem_row("v6e-8")
  assert v6e.status == "compiled" and v6e.kernels == 3, v6e.line()


@pytest.mark.e2e  # compiles with libtpu
@needs_libtpu
def test_points_that_build_the_same_program_compile_once(tmp_path):
  exp = tmp_path / "seeds.py"
  exp.write_text("from experiments import synthetic\n\nget_config = synthetic.get_config\n\n\n"
                 "def get_sweep(arg=None):\n  return [{'config.seed': s} for s in (0, 1)]\n")
  first, second = _rows("v4-8", [], points="all", config=f"{exp}:quick")
  assert first.status == "compiled" and not first.same_as
  assert second.same_as == first.point and second.hbm_bytes == first.hbm_bytes and second.point != first.point


@pytest.mark.e2e  # compiles with libtpu, runs launch.compile
@needs_libtpu
def test_a_point_that_cannot_fit_exits_2_and_the_dry_run_refuses(tmp_path, capfd):
  out = subprocess.run([sys.executable, "-m", "launch.compile", f"--config={SYNTHETIC}",
                        "--accelerator_type=v5litepod-8", "--points=0", "--", *HUGE_BATCH], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
  assert out.returncode == 2, out.stdout + out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("v5litepod-8: topology v5e:2x4 (default), 8 chips on 1 host, 16 GiB HBM")
  assert [ln.split(": does not fit: ")[1].split(" need")[0] for ln in lines[2:-1]] == ["HBM: HLO temporaries"] * 2
  # the train and eval steps compiled together: the compile time summed is both programs', the wall time less
  m = re.fullmatch(r"compiled 2 programs in ([\d.]+) s wall, ([\d.]+) s of compile summed, (\d+) threads?", lines[-1])
  assert m, lines[-1]
  if int(m.group(3)) > 1:
    assert float(m.group(1)) < float(m.group(2)), lines[-1]
  assert lines[2].startswith("quick/head=standard train L64 B1048576: does not fit: HBM: ")

  # Two seeds build one program, compiled once (train, eval) and reported for each point.
  seeds = os.path.join(REPO, "tests", "sweeps", "seeds.py") + ":quick"
  args = ["run", "--tpu=pod", "--zone=z", f"--config={seeds}", f"--workdir={tmp_path}", "--accelerator_type=v4-32",
          "--hosts_per_point=1", "--dry_run", "--", *HUGE_BATCH]
  assert tpu.main(args) == 2
  captured = capfd.readouterr()
  assert f"preflight: -m launch.compile --config={seeds} --accelerator_type=v4-8 --" in captured.out
  assert "v4-8: topology v4:2x2x1" in captured.out and "compiled 2 programs in " in captured.out
  assert "refused: 4 step(s) of the sweep do not fit on v4-8" in captured.err
  assert "quick/seed=1 eval L64 B1048576: does not fit: HBM" in captured.err
  assert "gcloud" not in captured.out and "git archive" not in captured.out  # nothing shipped, nothing printed


def test_dry_run_without_libtpu_says_so_and_goes_on(tmp_path, capsys, monkeypatch):
  monkeypatch.setattr(accelerators, "libtpu_missing", lambda: "libtpu is not installed: " + accelerators.INSTALL_HINT)
  args = ["run", "--tpu=pod", "--zone=z", f"--config={SYNTHETIC}", f"--workdir={tmp_path}", "--dry_run"]
  assert tpu.main(args) == 0
  out = capsys.readouterr().out
  assert "preflight skipped: libtpu is not installed: pip install -e '.[aot]'" in out
  assert "gcloud compute tpus tpu-vm scp" in out
  monkeypatch.setattr(accelerators, "libtpu_missing", lambda: pytest.fail("--nopreflight looked for libtpu"))
  assert tpu.main([*args, "--nopreflight"]) == 0
  assert "preflight" not in capsys.readouterr().out


def test_preflight_compiles_for_the_topology_a_point_runs_on():
  assert tpu.preflight_type("v4-32", "all") == "v4-32"
  assert tpu.preflight_type("v4-32", "1") == "v4-8"
  assert tpu.preflight_type("v5litepod-16", "1") == "v5litepod-4"
  args = argparse.Namespace(config="e.py:x", accelerator_type="v5litepod-16", hosts_per_point="all",
                            extra=["--config.seed=1"])
  assert tpu.preflight_command(args, python="py") == ["py", "-m", "launch.compile", "--config=e.py:x",
                                                      "--accelerator_type=v5litepod-16", "--", "--config.seed=1"]
