"""Accelerator types `launch.compile` targets (Cloud TPU slices, hosts of NVIDIA GPUs) and the compile-only devices
XLA gives for them on a machine that has none.

TPUs compile with libtpu beside jax (the `aot` extra); GPUs with jax's CUDA plugin, kept outside the environment
(`install_gpu_compiler`): installed there, it would start in every JAX process and fail to find a GPU.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import importlib.util
import math
import os
import subprocess
import sys
from importlib import metadata

from gp_jax import runtime

from . import command

# jax is imported in `topology_devices` only: launch.compile reads this module before it sets JAX_PLATFORMS
# (`use_cpu`), and launch.tpu reads it without starting JAX at all.

INSTALL_HINT = "pip install -e '.[aot]' (libtpu for this jax) compiles every point for its slice first"
GPU_INSTALL_HINT = f"{command('compile')} --install_gpu_compiler (jax's CUDA plugin for this jaxlib, ~130 MB)"
GPU_PLUGIN = "jax_plugins.xla_cuda13"
ENV_GPU_PLUGINS = (GPU_PLUGIN, "jax_plugins.xla_cuda12")  # either, installed in the environment, is used as it is
GPU_PLUGIN_WHEELS = ("jax-cuda13-plugin", "jax-cuda13-pjrt")
GPU_SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
GPUS_PER_HOST = 8
DEFAULT_GPU_MEM_FRACTION = 0.75  # JAX's allocator pool without XLA_PYTHON_CLIENT_MEM_FRACTION
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Family:
  """One TPU generation as libtpu names it, or one GPU card, and what a chip has."""

  topology: str  # topology-name prefix libtpu takes: "v5e:2x4"; a GPU's name
  chip_config: str  # megacore: one device over a chip's two TensorCores; default: one core per chip
  cores_per_chip: int  # what the number in the accelerator type counts: TensorCores (v4, v5p) or chips
  hbm_gib: float  # HBM per chip
  bf16_tflops: float  # peak bf16 matmul throughput per chip
  grids: dict  # chips -> topology bounds
  platform: str = "tpu"
  target_config: str = ""  # GPU: the XLA:GPU target config file in GPU_SPECS


GRIDS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 192: "4x4x12",
            256: "4x8x8", 512: "8x8x8", 768: "8x8x12", 1024: "8x8x16", 2048: "8x16x16"}
GRIDS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
# Cloud TPU's published figures (cloud.google.com/tpu/docs/system-architecture-tpu-vm).
FAMILIES = {
    "v4": Family("v4", "megacore", 2, 32, 275, GRIDS_3D),
    "v5litepod": Family("v5e", "default", 1, 16, 197, GRIDS_2D),
    "v5p": Family("v5", "megacore", 2, 95, 459, GRIDS_3D),
    "v6e": Family("v6e", "default", 1, 32, 918, GRIDS_2D),
}
HOST_CHIPS = 4  # chips per host of a multi-host slice; single-host v5e/v6e slices hold up to 8
# NVIDIA's datasheets (dense bf16 tensor-core peak, SXM); memory as nvidia-smi reports it (MiB / 1024).
GPU_FAMILIES = {
    "h100": Family("NVIDIA H100 80GB", "", 1, 81559 / 1024, 989, {}, "cuda", "h100.txtpb"),
    "h200": Family("NVIDIA H200 141GB", "", 1, 143771 / 1024, 989, {}, "cuda", "h200.txtpb"),
}


@dataclasses.dataclass(frozen=True)
class Slice:
  accelerator_type: str  # "v5litepod-16"
  family: Family
  chips: int
  topology: str  # "v5e:4x4"
  chips_per_host: tuple[int, int, int]

  @property
  def hosts(self) -> int:
    return self.chips // math.prod(self.chips_per_host)

  @property
  def platform(self) -> str:
    return self.family.platform

  @property
  def hbm_bytes(self) -> int:
    """What a step may use per chip: the HBM, or on a GPU the part JAX's allocator takes."""
    fraction = gpu_memory_fraction() if self.platform == "cuda" else 1.0
    return int(self.family.hbm_gib * GIB * fraction)

  def describe(self) -> str:
    f = self.family
    hosts = f"{self.hosts} host" + "s" * (self.hosts > 1)
    if self.platform == "cuda":
      gpus = f"{self.chips} GPU" + "s" * (self.chips > 1)
      return (f"{self.accelerator_type}: {gpus} {f.topology} on {hosts} (XLA:GPU topology {self.topology}), "
              f"{self.hbm_bytes / GIB:.1f} of {f.hbm_gib:.1f} GiB per GPU for JAX ({gpu_memory_fraction():g}: "
              f"XLA_PYTHON_CLIENT_MEM_FRACTION) and {f.bf16_tflops:g} bf16 TFLOP/s per GPU")
    chips = f"{self.chips} chip" + "s" * (self.chips > 1)
    return (f"{self.accelerator_type}: topology {self.topology} ({f.chip_config}), {chips} on {hosts}, "
            f"{f.hbm_gib:g} GiB HBM and {f.bf16_tflops:g} bf16 TFLOP/s per chip")


def gpu_memory_fraction() -> float:
  """The fraction of a GPU's memory JAX's allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, else 0.75)."""
  value = os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "").strip()
  try:
    fraction = float(value) if value else DEFAULT_GPU_MEM_FRACTION
  except ValueError:
    raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION must be a number in (0, 1], got {value!r}") from None
  if not 0 < fraction <= 1:
    raise ValueError(f"XLA_PYTHON_CLIENT_MEM_FRACTION must be in (0, 1], got {value!r}")
  return fraction


def gpu_slice(accelerator_type: str) -> Slice:
  """N GPUs of one card ("h100-8"): hosts of GPUS_PER_HOST; ValueError naming the known ones."""
  name, _, count = accelerator_type.rpartition("-")
  family = GPU_FAMILIES.get(name)
  n = int(count) if count.isdigit() else 0
  if family is None or n < 1 or (n > GPUS_PER_HOST and n % GPUS_PER_HOST):
    raise ValueError(f"unknown GPU type {accelerator_type!r}; known: {', '.join(GPU_FAMILIES)} with a GPU count of "
                     f"1 to {GPUS_PER_HOST} or a multiple of {GPUS_PER_HOST} (e.g. h100-1, h100-8, h200-16)")
  per_host = min(n, GPUS_PER_HOST)
  return Slice(accelerator_type, family, n, f"1x{n // per_host}x{per_host}", (1, 1, per_host))


def accelerator_slice(accelerator_type: str) -> Slice:
  """A TPU slice (`tpu_slice`) or GPU hosts (`gpu_slice`) by name."""
  if accelerator_type.rpartition("-")[0] in GPU_FAMILIES:
    return gpu_slice(accelerator_type)
  try:
    return tpu_slice(accelerator_type)
  except ValueError as e:
    raise ValueError(f"{e}; GPUs: {', '.join(f'{g}-N' for g in GPU_FAMILIES)}") from None


def tpu_slice(accelerator_type: str) -> Slice:
  """The topology of a Cloud TPU accelerator type ("v4-8", "v5litepod-16", ...); ValueError naming the known ones."""
  name, _, count = accelerator_type.rpartition("-")
  family = FAMILIES.get(name)
  if family is None or not count.isdigit() or int(count) % family.cores_per_chip:
    raise ValueError(f"unknown accelerator type {accelerator_type!r}; known families: {', '.join(FAMILIES)} "
                     "(e.g. v4-8, v5litepod-16, v5p-8, v6e-8)")
  chips = int(count) // family.cores_per_chip
  grid = family.grids.get(chips)
  if grid is None:
    sizes = ", ".join(f"{name}-{c * family.cores_per_chip}" for c in family.grids)
    raise ValueError(f"no topology known for {accelerator_type}; known: {sizes}")
  bounds = [int(x) for x in grid.split("x")]
  bounds += [1] * (3 - len(bounds))
  single_host = chips <= (8 if family.grids is GRIDS_2D else HOST_CHIPS)
  chips_per_host = tuple(bounds) if single_host else (2, 2, 1)
  return Slice(accelerator_type, family, chips, f"{family.topology}:{grid}", chips_per_host)


# ----------------------------------------------------------------------------- the compilers: libtpu, XLA:GPU


def libtpu_missing() -> str | None:
  """None when libtpu is importable, else one line saying so and how to install it."""
  if importlib.util.find_spec("libtpu") is None:
    return f"libtpu is not installed: {INSTALL_HINT}"
  return None


def gpu_compiler_dir() -> str:
  """Where `--install_gpu_compiler` puts jax's CUDA plugin: one folder per jaxlib version and Python, under
  GP_JAX_GPU_COMPILER or $XDG_CACHE_HOME/gp_jax/xla_gpu (~/.cache by default)."""
  base = os.environ.get("GP_JAX_GPU_COMPILER") or runtime.user_cache_dir("xla_gpu")
  return os.path.join(base, f"jaxlib-{metadata.version('jaxlib')}-py{sys.version_info[0]}{sys.version_info[1]}")


def _importable(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is absent
    return False


def gpu_compiler_missing() -> str | None:
  """None when jax's CUDA plugin is in this environment (a GPU machine's jax[cuda]) or in `gpu_compiler_dir()`,
  else one line saying how to get it."""
  if any(_importable(p) for p in ENV_GPU_PLUGINS):
    return None
  if not os.path.isdir(os.path.join(gpu_compiler_dir(), *GPU_PLUGIN.split("."))):
    return f"XLA:GPU is not installed in {gpu_compiler_dir()}: {GPU_INSTALL_HINT}"
  return None


def install_gpu_compiler() -> int:
  """pip-installs jax's CUDA plugin wheels for this jaxlib, without their CUDA libraries, into `gpu_compiler_dir()`."""
  target, version = gpu_compiler_dir(), metadata.version("jaxlib")
  if gpu_compiler_missing() is None:
    print(f"XLA:GPU for jaxlib {version} is already in {target}", flush=True)
    return 0
  cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
         "--target", target, *(f"{w}=={version}" for w in GPU_PLUGIN_WHEELS)]
  print(" ".join(cmd), flush=True)
  rc = subprocess.run(cmd, check=False).returncode
  print(f"XLA:GPU for jaxlib {version} in {target}" if rc == 0 else f"pip failed (exit {rc})", flush=True)
  return rc


def use_cpu() -> None:
  """JAX computes on this machine's CPU; libtpu and XLA:GPU only compile. Before jax is imported."""
  os.environ["JAX_PLATFORMS"] = "cpu"


@contextlib.contextmanager
def _libtpu_env(accelerator_type: str):
  """What libtpu reads when it starts: another process's libtpu may hold /tmp/libtpu_lockfile, and with no TPU
  here there is no metadata server to ask (its start-up warnings stay quiet)."""
  values = runtime.libtpu_compile_only_env(accelerator_type)
  with runtime.environ({k: v for k, v in values.items() if k not in os.environ}):  # the user's settings win
    yield


def _gpu_plugin_on_path() -> None:
  """jax's CUDA plugin findable (the environment's, else the one in `gpu_compiler_dir()`) and without its CUDA
  version checks: there are no CUDA libraries here."""
  missing = gpu_compiler_missing()
  if missing:
    raise RuntimeError(missing)
  path = gpu_compiler_dir()
  if path not in sys.path:
    sys.path.append(path)
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def topology_devices(s: Slice) -> list:
  """Compile-only devices of the slice; JAX itself computes on the CPU (`use_cpu`)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  if s.platform == "cuda":
    _gpu_plugin_on_path()
    with open(os.path.join(GPU_SPECS, s.family.target_config)) as f:
      spec = f.read()
    get = lambda: topologies.get_topology_desc("", "cuda", topology=s.topology, target_config=spec)
    try:
      desc = get()  # JAX discovers its plugins (`jax_plugins.*`) the first time it looks for one
    except NotImplementedError:  # it looked before the plugin's folder was on sys.path
      if any(p in sys.modules for p in ENV_GPU_PLUGINS):
        raise
      # What JAX's discovery does for each plugin it finds; jax has no public call to run discovery again.
      importlib.import_module(GPU_PLUGIN).initialize()
      desc = get()
    return list(desc.devices)
  with _libtpu_env(s.accelerator_type):
    desc = topologies.get_topology_desc(s.topology, "tpu", chip_config_name=s.family.chip_config,
                                        chips_per_host_bounds=s.chips_per_host, num_slices=1)
  return list(desc.devices)
