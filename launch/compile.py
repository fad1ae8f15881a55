"""Compile every point of a sweep for its TPU slice or GPU host on this CPU machine, before the hardware is paid for.

  python -m launch.compile --config=CONFIG[:ARG] --accelerator_type=TYPE [--mesh=data:N,fsdp:M]
      [--points=all|I,J] [--buckets=largest|all] [--steps=train,eval] [--json=FILE] [--hlo_dir=DIR]
      [--scratch_vocab=N] [--num_types=N] [-- --config.key=value ...]
  python -m launch.compile --install_gpu_compiler     # once, for TYPE h100-N / h200-N

Needs libtpu beside jax (`pip install -e '.[aot]'`): XLA:TPU and Mosaic then compile for a named TPU topology with
no TPU present (`jax.experimental.topologies.get_topology_desc`). JAX itself runs on this machine's CPU
(JAX_PLATFORMS=cpu is set here). TYPE is a Cloud TPU accelerator type as `launch.tpu` takes it (v4-8 ... v4-4096,
v5litepod-1 ... -256, v5p-8 ..., v6e-1 ... -256); `tpu_slice` maps each to its topology, chip config, hosts, HBM
and bf16 peak (`FAMILIES`).

Each point of the sweep (`launch.sweep.expand`, the flags after `--` added to every point) gets the config
`gp_jax.main` would build (`launch.worker.load_config`), then is built as the trainer builds it on that slice:
target platform tpu (`factory.precision`: dtype, attention and loss implementation resolved for TPU), the mesh of
`config.mesh` (or --mesh) over the slice's devices, the trainer's shardings and its jitted steps
(`steps.make_train_step` with the state donated, `steps.make_eval_step` with the first hit buffer `HitDecoder`
uses; the Pallas ZLPR kernel's tiles picked for that TPU generation, `pallas_zlpr.tpu_target`), at the config's
length buckets (`--buckets=largest`, the default: the memory bound; `all`: every bucket).
Everything is abstract (`ShapeDtypeStruct`): no parameter or batch is allocated, so a batch of 2^20 costs nothing
here. A pretrained encoder's shape comes from its config.json alone (a folder holding only config.json is enough;
a hub id reads the HF cache or downloads that one file); the scratch encoder's vocabulary is a stand-in
(--scratch_vocab chars, tokenizer.max_bigrams + 2 bigrams), as is the number of entity types of user files
(--num_types; corpora and synthetic data know theirs). Points whose configs differ only in what no step reads
(seed, epochs, logging) are built once, and points that lower to the same program are compiled once. A point's
programs (every step and bucket: `gp_jax.aot.Program`) are lowered one after another and compiled together in a
thread pool bounded by cores and memory (`gp_jax.aot.compile_all`; $GP_JAX_COMPILE_THREADS overrides).

One line per (point, step, bucket):

  dataset=msra/use_rope=True,head=standard,seed=0 train L128 B32: compiled in 10 s; HBM per chip 0.10 / 16 GiB; \
1.9 GFLOP per chip; 0 TPU kernels; compute floor 0.01 ms [data:8 x fsdp:1, bfloat16, attention none, loss xla]
  dataset=msra/use_rope=True,head=standard,seed=1 train L128 B32: same program as dataset=msra/use_rope=True,...

in the order of the points, buckets and steps (a line's seconds are its own compile's, beside the others), then one
line for the whole run:

  compiled 8 programs in 184.1 s wall, 353.4 s of compile summed, 2 threads

HBM per chip = arguments + outputs - aliased (the donated state) + temporaries + generated code, from the compiled
program's memory analysis, against the chip's HBM. GFLOP per chip per step from its cost analysis (Pallas kernels
count as far as their `pl.CostEstimate` says); the compute floor is that over the chip's bf16 peak. TPU kernels:
Mosaic custom calls per step (splash attention, the Pallas ZLPR loss), counted per call site
(`gp_jax.aot.kernel_calls`). What compiling proves and what it does not: docs/tpu.md section 11.

GPUs: TYPE h100-N or h200-N (N GPUs, 8 per host: h100-8 is one host, h100-16 two) compiles with XLA:GPU for
that card (its target config in launch/gpu_specs/), no GPU present. It needs jax's CUDA plugin for this jaxlib beside
the project, not inside its environment (`--install_gpu_compiler` puts it in the user's cache folder: ~130 MB).
Memory per GPU is checked against what JAX's allocator takes of the card (XLA_PYTHON_CLIENT_MEM_FRACTION, 0.75 by
default). No GFLOP or compute floor: XLA:GPU gives no cost analysis without a GPU. Attention that would take cuDNN
is compiled as the XLA attention (cuDNN cannot be traced without cuDNN): its memory is an upper bound. A program
for which XLA:GPU, not autotuning, finds no Triton GEMM tiling (an L that is not a multiple of 16) is compiled again
with Triton GEMM fusions off, and its line says so. What this proves and what not: docs/benchmarks.md, "Compiling
for a GPU here".

Exit status 0 when every line fits; 2 when one does not, the reason named (HBM, VMEM with the kernel and its block
size, a Mosaic lowering error, or a config the trainer refuses on that slice); 1 on an unexpected error (its
traceback on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import re
import sys
import traceback
from typing import Any

from launch import sweep

# gp_jax modules are imported inside the functions that use them: they import jax, and main sets JAX_PLATFORMS
# (`use_cpu`) before jax is imported.

INSTALL_HINT = "pip install -e '.[aot]' (libtpu for this jax) compiles every point for its slice first"
GPU_INSTALL_HINT = "python -m launch.compile --install_gpu_compiler (jax's CUDA plugin for this jaxlib, ~130 MB)"
GPU_PLUGIN = "jax_plugins.xla_cuda13"
ENV_GPU_PLUGINS = (GPU_PLUGIN, "jax_plugins.xla_cuda12")  # either, installed in the environment, is used as it is
GPU_PLUGIN_WHEELS = ("jax-cuda13-plugin", "jax-cuda13-pjrt")
GPU_SPECS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
GPUS_PER_HOST = 8
DEFAULT_GPU_MEM_FRACTION = 0.75  # JAX's allocator pool without XLA_PYTHON_CLIENT_MEM_FRACTION
TRITON_TILING = "Couldn't find output tile sizes"  # XLA:GPU, no autotuning: a GEMM fusion no Triton tiling fits
EXIT_FITS, EXIT_ERROR, EXIT_DOES_NOT_FIT = 0, 1, 2
GIB = 1 << 30
TOTAL_STEPS = 10_000  # the schedule's length only sets constants in the step
SCRATCH_VOCAB = 6000  # stand-in: CJK corpora have 4-6k distinct chars (MSRA: 4734)
STEPS = ("train", "eval")
NUM_TYPES = 10  # stand-in for user files, whose types are known only once read
# Keys no step reads (the schedule is built for TOTAL_STEPS): points differing only in these are built once.
NOT_IN_PROGRAM = ("seed", "num_epochs", "num_train_steps", "log_every_steps", "eval_every_steps",
                  "checkpoint_every_steps", "keep_checkpoints", "early_stop_patience", "progress_bar",
                  "compilation_cache", "init_from", "allow_config_change", "tune_threshold")


# ----------------------------------------------------------------------------- accelerator types


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


# ----------------------------------------------------------------------------- libtpu and the topology


def libtpu_missing() -> str | None:
  """None when libtpu is importable, else one line saying so and how to install it."""
  if importlib.util.find_spec("libtpu") is None:
    return f"libtpu is not installed: {INSTALL_HINT}"
  return None


def gpu_compiler_dir() -> str:
  """Where `--install_gpu_compiler` puts jax's CUDA plugin: one folder per jaxlib version and Python, under
  GP_JAX_GPU_COMPILER or $XDG_CACHE_HOME/gp_jax/xla_gpu (~/.cache by default). Kept out of the environment: installed
  there, the plugin would start (and fail to find a GPU) in every JAX process."""
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

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
  import subprocess  # pylint: disable=g-import-not-at-top
  from importlib import metadata  # pylint: disable=g-import-not-at-top

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
  """JAX computes on this machine's CPU; libtpu only compiles. Before jax is imported."""
  os.environ["JAX_PLATFORMS"] = "cpu"


@contextlib.contextmanager
def _libtpu_env(accelerator_type: str):
  """What libtpu reads when it starts: another process's libtpu may hold /tmp/libtpu_lockfile, and with no TPU
  here there is no metadata server to ask (its start-up warnings stay quiet)."""
  values = {"ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": accelerator_type,
            "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}
  old = {k: os.environ.get(k) for k in values}
  os.environ.update({k: v for k, v in values.items() if old[k] is None})
  try:
    yield
  finally:
    for k, v in old.items():
      if v is None:
        os.environ.pop(k, None)


def _gpu_plugin() -> None:
  """jax's CUDA plugin registered (the environment's, else the one in `gpu_compiler_dir()`), without its CUDA
  version checks: there are no CUDA libraries here, and JAX still computes on the CPU (JAX_PLATFORMS=cpu)."""
  import importlib  # pylint: disable=g-import-not-at-top

  from jax._src import xla_bridge  # pylint: disable=g-import-not-at-top

  path = gpu_compiler_dir()
  if path not in sys.path:
    sys.path.append(path)
  os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
  xla_bridge._discover_and_register_pjrt_plugins()  # pylint: disable=protected-access
  if "cuda" not in xla_bridge._topology_factories:  # pylint: disable=protected-access
    importlib.import_module(GPU_PLUGIN).initialize()  # plugins were discovered before the path was added


def topology_devices(s: Slice) -> list:
  """Compile-only devices of the slice."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  if s.platform == "cuda":
    missing = gpu_compiler_missing()
    if missing:
      raise RuntimeError(missing)
    _gpu_plugin()
    with open(os.path.join(GPU_SPECS, s.family.target_config)) as f:
      spec = f.read()
    return list(topologies.get_topology_desc("", "cuda", topology=s.topology, target_config=spec).devices)
  with _libtpu_env(s.accelerator_type):
    desc = topologies.get_topology_desc(s.topology, "tpu", chip_config_name=s.family.chip_config,
                                        chips_per_host_bounds=s.chips_per_host, num_slices=1)
  return list(desc.devices)


# ----------------------------------------------------------------------------- points


@dataclasses.dataclass
class Point:
  name: str  # the run folder `launch.sweep` gives it
  config: object  # the ConfigDict gp_jax.main builds for it


def sweep_points(config_spec: str, *, extra=(), points: str = "all") -> list[Point]:
  """The chosen points of `config_spec`'s sweep (one point when it has none), configs as `gp_jax.main` builds them."""
  from launch import worker  # pylint: disable=g-import-not-at-top

  runs = sweep.expand(config_spec, "compile", extra=list(extra))
  if points != "all":
    chosen = [int(i) for i in points.split(",") if i.strip()]
    bad = [i for i in chosen if not 0 <= i < len(runs)]
    if bad:
      raise ValueError(f"--points {bad} out of range: the sweep has {len(runs)} points (0 ... {len(runs) - 1})")
    runs = [runs[i] for i in chosen]
  return [Point(r.name, worker.load_config(r)) for r in runs]


def program_key(config) -> str:
  """The config without the keys no step reads: equal keys build equal steps."""
  flat = json.loads(config.to_json_best_effort(sort_keys=True))
  for k in NOT_IN_PROGRAM:
    flat.pop(k, None)
  return json.dumps(flat, sort_keys=True)


def encoder_config_json(pretrained: str) -> dict:
  """A pretrained encoder's config.json and nothing else: a folder (config.json alone is enough), gs://, minilm, or
  a hub id (the HF cache, else that one file is downloaded)."""
  from gp_jax.models import pretrained as pretrained_lib  # pylint: disable=g-import-not-at-top

  kind, arg = pretrained_lib._parse(pretrained)  # pylint: disable=protected-access
  if kind == "hub":
    from huggingface_hub import hf_hub_download  # pylint: disable=g-import-not-at-top

    path = hf_hub_download(arg[0], "config.json", revision=arg[1])
  elif kind == "minilm":
    path = pretrained_lib.minilm_l6_path() / "config.json"
  elif kind == "url":
    from etils import epath  # pylint: disable=g-import-not-at-top

    return json.loads((epath.Path(arg) / "config.json").read_text())
  else:
    path = arg / "config.json"
  with open(path) as f:
    return json.load(f)


def entity_types(config, num_types: int) -> tuple[list[str], str]:
  """(types, where they came from): the corpus's own, else `num_types` stand-ins."""
  from gp_jax.data import corpora, sources  # pylint: disable=g-import-not-at-top

  name = config.data.name
  if name == "synthetic":
    return list(sources.SYNTHETIC_TYPES), "synthetic"
  if name in corpora.NAMES:
    return list(corpora.corpus_types(name)), name
  return [f"T{i}" for i in range(num_types)], f"stand-in for {name} files (--num_types)"


def stand_ins(config, *, scratch_vocab: int):
  """(tokenizer stand-in, encoder config.json or None, note)."""
  from gp_jax import aot  # pylint: disable=g-import-not-at-top

  if config.model.encoder == "bert":
    hf = encoder_config_json(config.model.pretrained)
    note = (f"encoder {config.model.pretrained} (config.json: {hf.get('num_hidden_layers')} layers, width "
            f"{hf.get('hidden_size')}, vocabulary {hf.get('vocab_size')})")
    return aot.bert_tokenizer(hf), hf, note
  bigrams = int(config.tokenizer.max_bigrams or 50_000) + 2 if config.model.bigram_dim else 0
  note = (f"scratch encoder, vocabulary {scratch_vocab} chars (stand-in, --scratch_vocab) and {bigrams} bigrams "
          "(tokenizer.max_bigrams + [PAD], [UNK])")
  return aot.char_tokenizer(scratch_vocab, max(bigrams, 3)), None, note


# ----------------------------------------------------------------------------- compiling one step


@dataclasses.dataclass
class Row:
  """One (point, step, bucket)."""

  point: str
  step: str  # train | eval
  length: int
  batch: int
  status: str  # compiled | does not fit | error
  labels: str = ""  # mesh, dtype, attention, loss
  seconds: float | None = None
  hbm_bytes: int | None = None
  hbm_limit_bytes: int | None = None
  gflop: float | None = None
  kernels: int | None = None
  floor_ms: float | None = None
  reason: str = ""
  same_as: str = ""  # the point whose compile this one's program shares
  memory: dict = dataclasses.field(default_factory=dict)
  kernel_kind: str = "TPU"  # what `kernels` counts: TPU (Mosaic) or cuDNN custom calls

  def line(self) -> str:
    head = f"{self.point} {self.step} L{self.length} B{self.batch}: "
    tail = f" [{self.labels}]" if self.labels else ""
    if self.status == "error":
      return head + f"error: {self.reason}" + tail
    if self.hbm_bytes is None:
      return head + f"does not fit: {self.reason}" + tail
    how = f"same program as {self.same_as}" if self.same_as else f"compiled in {self.seconds:.0f} s"
    if self.kernel_kind == "TPU":
      figures = (f"HBM per chip {self.hbm_bytes / GIB:.2f} / {self.hbm_limit_bytes / GIB:g} GiB; "
                 f"{self.gflop:.1f} GFLOP per chip; {self.kernels} TPU kernels; compute floor {self.floor_ms:.2f} ms")
    else:
      figures = (f"memory per GPU {self.hbm_bytes / GIB:.2f} / {self.hbm_limit_bytes / GIB:.1f} GiB; "
                 f"{self.kernels} {self.kernel_kind} kernels")
    if self.status == "does not fit":
      return head + f"does not fit: {self.reason} ({how}); {figures}" + tail
    return head + f"{how}; {figures}" + tail


def hbm_bytes(memory) -> int:
  """Arguments + outputs - aliased + temporaries + generated code of a compiled program, per device."""
  return (memory.argument_size_in_bytes + memory.output_size_in_bytes - memory.alias_size_in_bytes
          + memory.temp_size_in_bytes + memory.generated_code_size_in_bytes)


_KERNEL_OP = re.compile(r'op_name="[^"]*?/([\w.-]+)/pallas_call"')
_KERNEL_LABEL = re.compile(r"(?:HLO :: |for %)([A-Za-z_][\w-]*?)(?:\.\d+)?\s")
_HBM_NEED = re.compile(r"required for (.+?) \(([\d.]+[KMGT]?)\) exceeds available HBM \(([\d.]+[KMGT]?)\)")
_HBM_USED = re.compile(r"Used ([\d.]+[KMGT]) of ([\d.]+[KMGT]) hbm")
_VMEM_SIZES = re.compile(r"(?:size|Used) ([\d.]+[KMG]) (?:and limit|of) ([\d.]+[KMG])")


def zlpr_tile(config, *, length: int, generation: str | None) -> int:
  """The ZLPR kernel's compiled tile: loss.block_size (at most L) rounded up to 128 lanes, clamped to what the TPU
  generation fits (`pallas_zlpr.clamp_tile`)."""
  from gp_jax.ops import pallas_zlpr  # pylint: disable=g-import-not-at-top

  tile = -(-min(int(config.loss.block_size), length) // 128) * 128
  with pallas_zlpr.tpu_target(generation):
    return pallas_zlpr.clamp_tile(tile, shared=config.model.head == "efficient")


def failure(e: BaseException, config, *, length: int | None = None, generation: str | None = None) -> str | None:
  """The reason a step cannot run on the slice, for the compiler's and Mosaic's refusals and the trainer's own; None
  for anything else (a bug). `length` and `generation` name the ZLPR kernel's tile in a VMEM reason."""
  from gp_jax.errors import UserError  # pylint: disable=g-import-not-at-top

  text = str(e)
  first = (text.strip().splitlines() or [type(e).__name__])[0][:300]
  if isinstance(e, UserError):
    return f"refused: {first}"
  if "vmem" in text.lower() and ("RESOURCE_EXHAUSTED" in text or "Vmem" in text):
    kernel = _KERNEL_OP.search(text)
    kernel = kernel or _KERNEL_LABEL.search(text)
    kernel = kernel.group(1) if kernel else "a TPU kernel"
    block = "splash block 128"
    if kernel.startswith("zlpr"):
      block = f"loss.block_size={config.loss.block_size}"
      if length:
        tile = zlpr_tile(config, length=length, generation=generation)
        block += f": {tile} x {tile} tiles" + (f" on {generation}" if generation else "")
    sizes = _VMEM_SIZES.search(text)
    need = f": needs {sizes.group(1)} of {sizes.group(2)} scoped VMEM" if sizes else ""
    return f"VMEM: kernel {kernel} ({block}){need}"
  if "RESOURCE_EXHAUSTED" in text and "hbm" in text.lower():
    need = _HBM_NEED.search(text)
    if need:
      return f"HBM: {need.group(1)} need {need.group(2)}, {need.group(3)} available"
    used = _HBM_USED.search(text)
    return "HBM: " + (f"needs {used.group(1)} of {used.group(2)}" if used else first)
  if "Mosaic" in text or "Pallas TPU lowering" in text:
    return f"Mosaic: {first}"
  return None


@dataclasses.dataclass
class Built:
  """A config built for the slice: what every step and bucket of its point shares."""

  config: Any
  tokenizer: Any
  types: list
  mesh: Any
  encoder_config: dict | None
  setups: dict  # model.attention override (None: the config's) -> state.Setup


@dataclasses.dataclass
class Job:
  """One (step, bucket) of a point: its labels, its lowered program (`aot.Program`) and what compiling it gave."""

  point: str
  step: str
  length: int
  batch: int
  labels: str = ""
  program: Any = None  # shared by the jobs of a point that lower to the same program
  digest: str = ""  # of the lowered program's text
  kernels: int = 0
  error: BaseException | None = None  # building or lowering it failed
  retried: bool = False  # compiled again with Triton GEMM fusions off
  seconds: float = 0.0  # its compiles, a retry included
  memory: Any = None
  cost: Any = None


class Compiler:
  """Builds and compiles the points of one slice; remembers programs it has compiled."""

  def __init__(self, s: Slice, *, mesh_sizes: dict | None = None, buckets: str = "largest",
               steps=STEPS, scratch_vocab: int = SCRATCH_VOCAB, num_types: int = NUM_TYPES, out=print,
               hlo_dir: str = ""):
    self.slice = s
    self.hlo_dir = hlo_dir
    self.steps = tuple(steps)
    self.devices = topology_devices(s)
    self.generation = pallas_generation(self.devices)
    self.mesh_sizes = mesh_sizes
    self.buckets = buckets
    self.scratch_vocab = scratch_vocab
    self.num_types = num_types
    self.out = out
    self.rows: list[Row] = []
    self.unexpected = False
    self.reports: list = []  # aot.Report of each concurrent compile (a point's, its retries')
    self.programs = 0  # programs compiled
    self._built: dict[str, str] = {}  # program_key -> first point with it
    self._compiled: dict[str, tuple[str, Row]] = {}  # lowered program hash -> (point, its row)
    self._notes: set[str] = set()

  def _note(self, text: str) -> None:
    if text not in self._notes:
      self._notes.add(text)
      self.out(text)

  def lengths(self, config) -> list[int]:
    from gp_jax.data import batching  # pylint: disable=g-import-not-at-top

    buckets = batching.normalize_buckets(config.data.buckets, config.data.max_len)
    return list(buckets) if self.buckets == "all" else [buckets[-1]]

  def run(self, points: list[Point]) -> list[Row]:
    for point in points:
      if self.mesh_sizes:
        point.config.mesh.data, point.config.mesh.fsdp = self.mesh_sizes["data"], self.mesh_sizes["fsdp"]
      key = program_key(point.config)
      if key in self._built:
        for row in [r for r in self.rows if r.point == self._built[key]]:
          self._emit(dataclasses.replace(row, point=point.name, same_as=row.same_as or row.point))
        continue
      self._built[key] = point.name
      self.point(point)
    return self.rows

  def summary(self) -> str:
    """One line: the programs compiled, the wall time of their concurrent compiles against the compile time summed."""
    n, threads = self.programs, max([r.threads for r in self.reports] or [1])
    wall, summed = sum(r.wall for r in self.reports), sum(r.summed for r in self.reports)
    return (f"compiled {n} program{'s' * (n != 1)} in {wall:.1f} s wall, {summed:.1f} s of compile summed, "
            f"{threads} thread{'s' * (threads != 1)}")

  def _emit(self, row: Row) -> None:
    self.rows.append(row)
    self.out(row.line())

  def point(self, point: Point) -> None:
    """Every step and bucket of a point: lowered in turn, the programs not compiled before compiled together, then
    a row each in order."""
    import jax  # pylint: disable=g-import-not-at-top

    config = point.config
    try:
      built = self._build(config)
    except Exception as e:  # pylint: disable=broad-except
      for length in self._safe_lengths(config):
        for step in self.steps:
          self._fail(point, step, length, config.batch_size if step == "train" else config.eval_batch_size, "", e,
                     config)
      return
    jobs = [self._lower(point.name, built, step, length) for length in self.lengths(config) for step in self.steps]
    firsts: dict[str, Job] = {}  # digest -> the point's first job with it
    for job in jobs:
      if job.error is None and job.digest not in self._compiled:
        first = firsts.setdefault(job.digest, job)
        job.program = first.program
    self._compile(list(firsts.values()))
    for job in jobs:
      self._row(point, job)
    for job in jobs:
      job.program = None
    jax.clear_caches()  # a BERT-base program holds GBs of host memory; none is run

  def _compile(self, jobs: list[Job]) -> None:
    """The jobs' programs compiled concurrently (`aot.compile_all`); a GPU program for which XLA:GPU found no Triton
    tiling again with Triton GEMM fusions off. Memory and cost analysis as each finishes, in this thread."""
    from gp_jax import aot  # pylint: disable=g-import-not-at-top

    if not jobs:
      return
    self.programs += len(jobs)
    owner = {id(job.program): job for job in jobs}

    def done(program) -> None:
      job = owner[id(program)]
      job.seconds += program.seconds or 0.0
      if program.error is None:
        try:
          self._analyse(job)
        except Exception as e:  # pylint: disable=broad-except
          program.error = e

    self.reports.append(aot.compile_all([job.program for job in jobs], on_done=done))
    retry = [job for job in jobs if self.slice.platform == "cuda" and TRITON_TILING in str(job.program.error or "")]
    for job in retry:  # the lowered module does not depend on the options: compiled again, not lowered again
      job.retried = True
      job.program.options = dict(job.program.options, xla_gpu_enable_triton_gemm=False)
      job.program.error = None
    if retry:
      self.reports.append(aot.compile_all([job.program for job in retry], on_done=done))

  def _analyse(self, job: Job) -> None:
    """Memory and cost of a compiled program (its HLO written with --hlo_dir); the executable is dropped."""
    compiled = job.program.compiled
    if self.hlo_dir:
      self._write_hlo(job.point, job.step, job.length, compiled.as_text())
    job.memory = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    job.cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    job.program.compiled = job.program.lowered = None

  def _row(self, point: Point, job: Job) -> None:
    """The job's row, in order: a failure, the same program as an earlier row, does not fit, or compiled."""
    step, L, B, labels = job.step, job.length, job.batch, job.labels
    if job.error is not None:
      self._fail(point, step, L, B, labels, job.error, point.config)
      return
    if job.digest in self._compiled:
      first, row = self._compiled[job.digest]
      self._emit(dataclasses.replace(row, point=point.name, same_as=first, labels=labels))
      return
    program = job.program
    if job.retried and program.error is None:
      labels += (f"; Triton GEMM fusions off: without a GPU to autotune, XLA:GPU found no Triton tiling for a GEMM "
                 f"at L{L}" + (" (L a multiple of 16 compiles with them)" if L % 16 else ""))
    if program.error is not None:
      reason = failure(program.error, point.config, length=L, generation=self.generation)
      if reason is None:
        self._fail(point, step, L, B, labels, program.error, point.config)
        return
      row = Row(point.name, step, L, B, "does not fit", labels, seconds=job.seconds, kernels=job.kernels,
                reason=reason)
      self._compiled[job.digest] = (point.name, row)
      self._emit(row)
      return
    memory, cost = job.memory, job.cost
    gflop = None if cost is None and self.slice.platform == "cuda" else float((cost or {}).get("flops", 0.0)) / 1e9
    used, limit = hbm_bytes(memory), self.slice.hbm_bytes
    row = Row(point.name, step, L, B, "compiled", labels, seconds=job.seconds, hbm_bytes=used, hbm_limit_bytes=limit,
              gflop=gflop, kernels=job.kernels,
              floor_ms=None if gflop is None else gflop / self.slice.family.bf16_tflops,
              memory={k: int(getattr(memory, k)) for k in dir(memory) if k.endswith("_in_bytes")},
              kernel_kind="cuDNN" if self.slice.platform == "cuda" else "TPU")
    if used > limit:
      row.status, row.reason = "does not fit", f"HBM: needs {used / GIB:.2f} of {limit / GIB:.4g} GiB"
    self._compiled[job.digest] = (point.name, row)
    self._emit(row)

  def _safe_lengths(self, config) -> list[int]:
    try:
      return self.lengths(config)
    except Exception:  # pylint: disable=broad-except
      return [int(config.data.max_len)]

  def _fail(self, point, step, length, batch, labels, e, config) -> None:
    reason = failure(e, config, length=length, generation=self.generation)
    if reason is None:
      self.unexpected = True
      print(f"{point.name} {step} L{length}: unexpected error", file=sys.stderr)
      traceback.print_exception(e, file=sys.stderr)
      reason = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}"
      self._emit(Row(point.name, step, length, batch, "error", labels, reason=reason))
    else:
      self._emit(Row(point.name, step, length, batch, "does not fit", labels, reason=reason))

  def _build(self, config) -> Built:
    """A config on this slice: the mesh over its devices, the model built for its platform, parameters abstract.
    Batch size and length do not enter it."""
    from gp_jax import aot  # pylint: disable=g-import-not-at-top
    from gp_jax import sharding as shd  # pylint: disable=g-import-not-at-top
    from gp_jax.errors import UserError  # pylint: disable=g-import-not-at-top

    tokenizer, hf, note = stand_ins(config, scratch_vocab=self.scratch_vocab)
    types, source = entity_types(config, self.num_types)
    self._note(f"{note}; {len(types)} entity types ({source})")
    try:
      mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp, devices=self.devices)
    except ValueError as e:
      raise UserError(f"{e} of {self.slice.accelerator_type}") from None
    for name in ("batch_size", "eval_batch_size"):  # as train.setup_run checks
      if config[name] % mesh.size or config[name] % self.slice.hosts:
        raise UserError(f"{name}={config[name]} must be divisible by the {mesh.size} data-parallel devices (mesh "
                        f"{dict(mesh.shape)}) and by the {self.slice.hosts} hosts of {self.slice.accelerator_type}")
    built = Built(config, tokenizer, types, mesh, hf, {})
    self._setup(built, None)
    return built

  def _setup(self, built: Built, attention: str | None):
    """The `state.Setup` of a built config, with `model.attention` overridden where `attention` is given."""
    from gp_jax import aot  # pylint: disable=g-import-not-at-top

    if attention not in built.setups:
      built.setups[attention] = aot.target_setup(built.config, built.tokenizer, built.types, built.mesh,
                                                 self.slice.platform, encoder_config=built.encoder_config,
                                                 attention=attention)
    return built.setups[attention]

  def _lower(self, point: str, built: Built, step: str, length: int) -> Job:
    """One step at one bucket, labelled and lowered (on a machine without cuDNN, with the XLA attention in place of
    cuDNN's); an error is kept on the job."""
    from gp_jax import aot, factory  # pylint: disable=g-import-not-at-top
    from gp_jax.ops import pallas_zlpr  # pylint: disable=g-import-not-at-top

    config, mesh, platform = built.config, built.mesh, self.slice.platform
    job = Job(point, step, length, config.batch_size if step == "train" else config.eval_batch_size)
    try:
      policy = factory.precision(config, platform)
      attention = attention_choice(config, built.encoder_config, length=length, train=step == "train",
                                   platform=platform)
      job.labels = (f"data:{mesh.shape['data']} x fsdp:{mesh.shape['fsdp']}, {policy.dtype}, attention {attention}, "
                    f"loss {factory.loss_implementation(config, platform)}")
      with pallas_zlpr.tpu_target(self.generation):
        job.program, _, without_cudnn = aot.lower_or_xla_attention(
            lambda s: lower_step(step, s, platform, batch=job.batch, length=length), lambda a: self._setup(built, a),
            built.setups[None])
      if without_cudnn:
        job.labels = re.sub(r"attention cudnn\b", "attention xla (in place of cudnn: cuDNN cannot be traced here)",
                            job.labels)
      text = job.program.lowered.as_text()
      job.digest = hashlib.sha256(text.encode()).hexdigest()
      job.kernels = sum(aot.kernel_calls(text).values())
    except Exception as e:  # pylint: disable=broad-except
      job.error = e
    return job

  def _write_hlo(self, point: str, step: str, length: int, text: str) -> None:
    """The compiled program's optimised HLO as HLO_DIR/POINT.STEP.LLENGTH.hlo.txt (POINT: the point's name made a
    file name)."""
    os.makedirs(self.hlo_dir, exist_ok=True)
    name = re.sub(r"[^\w.=,-]+", "_", point)
    with open(os.path.join(self.hlo_dir, f"{name}.{step}.L{length}.hlo.txt"), "w") as f:
      f.write(text)


def pallas_generation(devices) -> str | None:
  """The slice's TPU generation as `pallas_zlpr` names it (v4, v5e, v5p, v6e): its kernel picks tiles for it
  (`pallas_zlpr.tpu_target`) as it would on the chip."""
  from gp_jax.ops import pallas_zlpr  # pylint: disable=g-import-not-at-top

  return pallas_zlpr.tpu_generation(devices[0].device_kind)


def attention_choice(config, encoder_config: dict | None, *, length: int, train: bool, platform: str = "tpu") -> str:
  """The self-attention the step holds on `platform` (`aot.attention_choice`): splash or cudnn, or xla and why; none
  for a scratch encoder without attention blocks."""
  from gp_jax import aot  # pylint: disable=g-import-not-at-top

  impl, why = aot.attention_choice(config, encoder_config, platform=platform, length=length, train=train)
  return impl + (f" ({why})" if why else "")


def lower_step(step: str, setup, platform: str, *, batch: int, length: int):
  """The trainer's jitted train step (state donated) or eval step (at `HitDecoder`'s first hit buffer) as an
  `aot.Program` with the XLA options a run on `platform` gives it (`aot.resolve`), lowered for the abstract state
  and batch; a lowering error is raised."""
  from gp_jax import aot, steps  # pylint: disable=g-import-not-at-top
  from gp_jax.optim import make_optimizer  # pylint: disable=g-import-not-at-top

  if step == "train":
    tx, _ = make_optimizer(setup.config.optimizer, TOTAL_STEPS, setup.abstract_params)
    fn = steps.make_train_step(setup, tx, loss_kind=setup.config.loss.kind)
    program = aot.train_program(fn, setup, tx, batch=batch, length=length)
  else:
    hits = max(64, 32 * batch)
    program = aot.eval_program(steps.make_eval_step(setup, size=hits), setup, batch=batch, length=length, hits=hits)
  aot.resolve(program, setup, platform)
  program.lowered = program.fn.lower(*program.args)
  return program


# ----------------------------------------------------------------------------- CLI


def versions(platform: str = "tpu") -> str:
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  def v(name):
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      return "not installed"

  if platform == "cuda":
    return f"jax {v('jax')}, XLA:GPU from jax-cuda13-plugin {v('jaxlib')}"
  return f"jax {v('jax')}, libtpu {v('libtpu')}"


def exit_status(rows: list[Row], unexpected: bool) -> int:
  if unexpected:
    return EXIT_ERROR
  return EXIT_DOES_NOT_FIT if any(r.status != "compiled" for r in rows) else EXIT_FITS


def parse_args(argv):
  p = argparse.ArgumentParser(prog="python -m launch.compile", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", help="experiment file, optionally with ':arg' (required unless installing)")
  p.add_argument("--accelerator_type", help="v4-8, v5litepod-16, v5p-8, v6e-8, ...; GPUs: h100-1, h100-8, h200-16, ...")
  p.add_argument("--install_gpu_compiler", action="store_true",
                 help="pip-install jax's CUDA plugin for this jaxlib into the user's cache folder (what --accelerator_"
                      "type=h100-N / h200-N compiles with; no CUDA libraries, no GPU needed) and exit")
  p.add_argument("--mesh", default="", help="data:N,fsdp:M over the slice's chips (default: each point's config.mesh)")
  p.add_argument("--points", default="all", help="all, or comma-separated indices of the sweep's points")
  p.add_argument("--buckets", choices=("largest", "all"), default="largest",
                 help="largest: the longest length bucket only (the memory bound); all: every bucket")
  p.add_argument("--steps", default=",".join(STEPS), help="comma list of the steps to compile: train, eval")
  p.add_argument("--json", default="", help="also write the rows to this file")
  p.add_argument("--hlo_dir", default="", help="also write each compiled program's optimised HLO text here "
                 "(benchmarks.hlo_traffic reads it)")
  p.add_argument("--scratch_vocab", type=int, default=SCRATCH_VOCAB, help="scratch encoder: chars in the vocabulary")
  p.add_argument("--num_types", type=int, default=NUM_TYPES, help="entity types of user data files (corpora know)")
  p.add_argument("extra", nargs="*", help="flags for every point, after '--' (e.g. -- --config.batch_size=64)")
  args = p.parse_args(argv)
  if not args.install_gpu_compiler and not (args.config and args.accelerator_type):
    p.error("--config and --accelerator_type are required (or --install_gpu_compiler alone)")
  return args


def main(argv=None) -> int:
  args = parse_args(argv)
  if args.install_gpu_compiler:
    return EXIT_ERROR if install_gpu_compiler() else EXIT_FITS
  use_cpu()
  try:
    s = accelerator_slice(args.accelerator_type)
    if s.platform == "cuda":
      gpu_memory_fraction()  # a bad XLA_PYTHON_CLIENT_MEM_FRACTION is an error line here, not a traceback later
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_ERROR
  missing = gpu_compiler_missing() if s.platform == "cuda" else libtpu_missing()
  if missing:
    print(missing, file=sys.stderr)
    return EXIT_ERROR
  try:
    mesh_sizes = None
    if args.mesh:
      from gp_jax import aot  # pylint: disable=g-import-not-at-top

      mesh_sizes = aot.parse_mesh(args.mesh)
    steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    if not steps or set(steps) - set(STEPS):
      raise ValueError(f"--steps takes a comma list of {', '.join(STEPS)}, got {args.steps!r}")
    points = sweep_points(args.config, extra=args.extra, points=args.points)
  except (ValueError, FileNotFoundError) as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_ERROR
  print(f"{s.describe()}; {len(points)} point{'s' * (len(points) != 1)} of {args.config}; {versions(s.platform)}",
        flush=True)
  compiler = Compiler(s, mesh_sizes=mesh_sizes, buckets=args.buckets, steps=steps, scratch_vocab=args.scratch_vocab,
                      num_types=args.num_types, out=lambda line: print(line, flush=True), hlo_dir=args.hlo_dir)
  rows = compiler.run(points)
  print(compiler.summary(), flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"accelerator_type": s.accelerator_type, "topology": s.topology, "chips": s.chips,
                 "hbm_gib_per_chip": s.family.hbm_gib, "bf16_tflops_per_chip": s.family.bf16_tflops,
                 "config": args.config, "rows": [dataclasses.asdict(r) for r in rows]}, f, indent=1)
  return exit_status(rows, compiler.unexpected)


if __name__ == "__main__":
  sys.exit(main())
