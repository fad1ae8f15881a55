"""launch.compile for GPUs: the trainer's steps compiled with XLA:GPU for an H100 / H200 target config on this CPU
machine (jax's CUDA plugin from `--install_gpu_compiler`, no GPU, no CUDA libraries)."""

import json
import os
import re
import subprocess
import sys

import pytest

from launch import accelerators
from launch import compiler as compiler_lib
from launch import points as points_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("no_jit_cache")  # compile-only targets: entries no process loads
SYNTHETIC = os.path.join(REPO, "experiments", "synthetic.py") + ":quick"
needs_gpu_compiler = pytest.mark.skipif(accelerators.gpu_compiler_missing() is not None,
                                        reason=str(accelerators.gpu_compiler_missing()))
HUGE_BATCH = ["--config.batch_size=1048576", "--config.eval_batch_size=1048576"]


def test_gpu_types_map_to_hosts_of_eight(monkeypatch):
  monkeypatch.delenv("XLA_PYTHON_CLIENT_MEM_FRACTION", raising=False)
  expected = {"h100-1": ("1x1x1", 1, 1), "h100-4": ("1x1x4", 4, 1), "h100-8": ("1x1x8", 8, 1),
              "h200-16": ("1x2x8", 16, 2), "h100-64": ("1x8x8", 64, 8)}
  for name, (topology, gpus, hosts) in expected.items():
    s = accelerators.accelerator_slice(name)
    assert (s.platform, s.topology, s.chips, s.hosts) == ("cuda", topology, gpus, hosts), name
  h100 = accelerators.accelerator_slice("h100-1")
  assert h100.hbm_bytes == int(81559 * 2**20 * 0.75)  # JAX's allocator takes 75% of nvidia-smi's 81559 MiB
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", ".9")
  assert h100.hbm_bytes == int(81559 * 2**20 * 0.9)
  assert "71.7 of 79.6 GiB per GPU" in h100.describe()
  monkeypatch.setenv("XLA_PYTHON_CLIENT_MEM_FRACTION", "2")
  with pytest.raises(ValueError, match="must be in"):
    h100.hbm_bytes  # pylint: disable=pointless-statement
  assert accelerators.accelerator_slice("v4-8").platform == "tpu"
  for bad in ("h100-12", "h100-0", "h100", "h300-8"):
    with pytest.raises(ValueError, match="h100|v4-8"):
      accelerators.accelerator_slice(bad)


@pytest.mark.e2e  # runs launch.compile
def test_the_gpu_compiler_lives_outside_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("GP_JAX_GPU_COMPILER", str(tmp_path))
  monkeypatch.setattr(accelerators, "ENV_GPU_PLUGINS", ())  # another test of this process may have put one on sys.path
  assert accelerators.gpu_compiler_dir().startswith(str(tmp_path / "jaxlib-"))
  assert "--install_gpu_compiler" in accelerators.gpu_compiler_missing()
  out = subprocess.run([sys.executable, "-m", "launch.compile", f"--config={SYNTHETIC}", "--accelerator_type=h100-1"],
                       cwd=REPO, capture_output=True, text=True, timeout=300,
                       env={**os.environ, "GP_JAX_GPU_COMPILER": str(tmp_path)})
  assert out.returncode == 1 and "XLA:GPU is not installed in" in out.stderr, out.stderr


@pytest.mark.e2e  # compiles with XLA:GPU
@needs_gpu_compiler
def test_a_pretrained_encoder_is_read_from_its_config_json_alone(tmp_path):
  """What the tool reads of `model.pretrained` (a folder here): config.json, nothing else; the tokenizer is a
  stand-in of its vocabulary."""
  from gp_jax.configs.args import build_config

  hf = {"model_type": "bert", "num_hidden_layers": 3, "hidden_size": 48, "vocab_size": 321, "pad_token_id": 5}
  (tmp_path / "config.json").write_text(json.dumps(hf))
  config = build_config(os.path.join(REPO, "experiments", "su2022.py") + ":dataset=cluener2020")
  config.model.pretrained = str(tmp_path)
  tokenizer, got, note = compiler_lib.stand_ins(config, scratch_vocab=100)
  assert got == hf and note == f"encoder {tmp_path} (config.json: 3 layers, width 48, vocabulary 321)"
  assert (tokenizer.vocab_size, tokenizer.pad_token_id) == (321, 5)
  config.model.pretrained = str(tmp_path / "elsewhere")
  with pytest.raises(FileNotFoundError):
    compiler_lib.stand_ins(config, scratch_vocab=100)


@pytest.mark.e2e  # compiles with XLA:GPU
@needs_gpu_compiler
def test_tiny_steps_compile_for_h100_with_memory_against_the_allocator(tmp_path):
  from benchmarks import hlo_traffic

  compiler = compiler_lib.Compiler(accelerators.accelerator_slice("h100-8"), out=lambda line: None,
                                   hlo_dir=str(tmp_path))
  rows = compiler.run(points_lib.sweep_points(SYNTHETIC, extra=["--config.model.num_attn_layers=1"], points="0"))
  assert not compiler.unexpected
  assert [(r.step, r.status) for r in rows] == [("train", "compiled"), ("eval", "compiled")], [r.line() for r in rows]
  for row in rows:
    assert 0 < row.hbm_bytes < row.hbm_limit_bytes and row.gflop is None and row.kernel_kind == "cuDNN"
    assert row.labels.startswith("data:8 x fsdp:1, bfloat16, attention ")
    assert "cuDNN kernels" in row.line() and "GFLOP" not in row.line()
  # the eval step would take cuDNN on a GPU; here it is compiled with the XLA attention and says so
  assert "attention xla (in place of cudnn: cuDNN cannot be traced here)" in rows[1].labels
  written = sorted(p.name for p in tmp_path.iterdir())
  assert written == ["quick_head=standard.eval.L64.hlo.txt", "quick_head=standard.train.L64.hlo.txt"]
  ks, loops = hlo_traffic.kernels((tmp_path / written[1]).read_text())
  assert len(ks) > 20 and not loops and all(k.scatter_dtype != "bf16" for k in ks)


@pytest.mark.e2e  # compiles with XLA:GPU
@needs_gpu_compiler
def test_a_k_step_run_compiles_its_k_step_program(tmp_path):
  """steps_per_execution=0 (auto) is k = 8 on a GPU: the train program the trainer runs is the k-step one (a loop
  over the stacked batches), and its row says so."""
  from benchmarks import hlo_traffic

  compiler = compiler_lib.Compiler(accelerators.accelerator_slice("h100-1"), out=lambda line: None,
                                   hlo_dir=str(tmp_path), steps=("train",))
  extra = ["--config.model.num_attn_layers=1", "--config.steps_per_execution=0"]
  rows = compiler.run(points_lib.sweep_points(SYNTHETIC, extra=extra, points="0"))
  assert [(r.step, r.status) for r in rows] == [("train", "compiled")], [r.line() for r in rows]
  assert rows[0].labels.endswith(", 8 steps per call")
  _, loops = hlo_traffic.kernels((tmp_path / "quick_head=standard.train.L64.hlo.txt").read_text())
  assert loops


@pytest.mark.e2e  # compiles with XLA:GPU, runs launch.compile
@needs_gpu_compiler
def test_a_step_past_the_allocator_exits_2():
  user_env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}  # as a user's shell has it
  out = subprocess.run([sys.executable, "-m", "launch.compile", f"--config={SYNTHETIC}", "--accelerator_type=h200-1",
                        "--points=0", "--steps=train", "--", *HUGE_BATCH], cwd=REPO, capture_output=True, text=True,
                       timeout=600, env=user_env)
  assert out.returncode == 2, out.stdout + out.stderr
  lines = out.stdout.splitlines()
  assert lines[0].startswith("h200-1: 1 GPU NVIDIA H200 141GB on 1 host (XLA:GPU topology 1x1x1), 105.3 of 140.4 GiB")
  assert re.match(r"quick/head=standard train L64 B1048576: does not fit: HBM: needs [\d.]+ of 105.3 GiB", lines[-2])
  assert re.fullmatch(r"compiled 1 program in [\d.]+ s wall, [\d.]+ s of compile summed, 1 thread", lines[-1])
  # libtpu (the aot extra, in the test extra) starts when JAX looks for plugins; given a slice, it says nothing
  assert "TPU_WORKER_HOSTNAMES" not in out.stderr and "E0000" not in out.stderr, out.stderr


@pytest.mark.e2e  # compiles with XLA:GPU
@needs_gpu_compiler
def test_bf16_embedding_gradient_has_no_bf16_scatter_on_xla_gpu():
  """The token-type table's gradient compiled for an H100: nnx.Embed's bf16 lookup becomes a bf16 scatter-add (24 ms
  of a 28 ms step on an H200); layers.embed's one-hot matmul and f32 gather leave only the word table's f32 one."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import SingleDeviceSharding

  from gp_jax.models import layers

  device, = accelerators.topology_devices(accelerators.accelerator_slice("h100-1"))

  def scatters(lookup) -> list[str]:
    word, types = (nnx.Embed(n, 64, dtype=jnp.bfloat16, rngs=nnx.Rngs(0)) for n in (1000, 2))
    (gw, sw), (gt, st) = nnx.split(word), nnx.split(types)

    def loss(a, b, ids):
      return jnp.sum((lookup(nnx.merge(gw, a), ids) + lookup(nnx.merge(gt, b), ids)).astype(jnp.float32))

    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(device))
    args = jax.tree.map(spec, (sw, st, jnp.zeros((16, 256), jnp.int32)))
    text = jax.jit(jax.grad(loss, argnums=(0, 1))).lower(*args).compile().as_text()
    return sorted(set(re.findall(r"= (\w+)\[[\d,]+\]\{[\d,]+\} scatter\(", text)))

  assert scatters(lambda m, ids: m(ids)) == ["bf16"]  # the test fails on the old lookup
  assert scatters(layers.embed) == ["f32"]


@pytest.mark.e2e  # compiles with XLA:GPU
@needs_gpu_compiler
def test_a_gemm_without_a_triton_tiling_is_compiled_with_cublas_and_says_so():
  """Efficient GlobalPointer at L 75: without autotuning XLA:GPU finds no Triton tiling for the transposed GEMM of
  its backward pass; the step is compiled again with Triton GEMM fusions off. L 80 needs no retry."""
  def row(length):
    extra = ["--config.model.head=efficient", f"--config.data.max_len={length}", f"--config.data.buckets=({length},)"]
    compiler = compiler_lib.Compiler(accelerators.accelerator_slice("h100-1"), steps=("train",), out=lambda line: None)
    row, = compiler.run(points_lib.sweep_points(SYNTHETIC, extra=extra, points="0"))
    assert not compiler.unexpected and row.status == "compiled", row.line()
    return row

  assert row(75).labels.endswith("; Triton GEMM fusions off: without a GPU to autotune, XLA:GPU found no Triton "
                                 "tiling for a GEMM at L75 (L a multiple of 16 compiles with them)")
  assert "Triton" not in row(80).labels
