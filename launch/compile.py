"""Compile every point of a sweep for its TPU slice or GPU hosts on this CPU machine, before the hardware is paid for.

  python -m launch.compile --config=CONFIG[:ARG] --accelerator_type=TYPE [--mesh=data:N,fsdp:M]
      [--points=all|I,J] [--buckets=largest|all] [--steps=train,eval] [--json=FILE] [--hlo_dir=DIR]
      [--scratch_vocab=N] [--num_types=N] [-- --config.key=value ...]
  python -m launch.compile --install_gpu_compiler     # once, for TYPE h100-N / h200-N

TYPE is a Cloud TPU accelerator type as `launch.tpu` takes it (v4-8 ... v4-4096, v5litepod-1 ... -256, v5p-8 ...,
v6e-1 ... -256), compiled by XLA:TPU and Mosaic from libtpu beside jax (`pip install -e '.[aot]'`); or h100-N /
h200-N (N GPUs, 8 per host), compiled by XLA:GPU from jax's CUDA plugin (`--install_gpu_compiler`, kept in the
user's cache folder, not in the environment). No TPU or GPU is needed: JAX itself runs on this machine's CPU.

Each point gets the config `gp_jax.main` would build and is built as the trainer builds it on that slice (target
platform, mesh, shardings, jitted train and eval steps) at its largest length bucket (`--buckets=all`: every one),
from shapes alone: nothing is allocated. A pretrained encoder needs only its config.json; the scratch encoder's
vocabulary (--scratch_vocab) and user files' entity types (--num_types) are stand-ins. Points that differ only in
what no step reads (seed, epochs, logging) are built once; points that lower to the same program compile once.

One line per (point, step, bucket), in order, then one for the run:

  POINT STEP LLENGTH BBATCH: compiled in S s; HBM per chip USED / HBM GiB; G GFLOP per chip; K TPU kernels; \
compute floor T ms [mesh, dtype, attention, loss]
  compiled N programs in W s wall, S s of compile summed, T threads

HBM per chip: arguments + outputs - aliased (the donated state) + temporaries + generated code, against the chip's
HBM. The compute floor is GFLOP per chip over the chip's bf16 peak. A GPU's line has memory per GPU against what JAX's
allocator takes (XLA_PYTHON_CLIENT_MEM_FRACTION, else 0.75) and cuDNN kernels, no GFLOP (XLA:GPU gives no cost
analysis without a GPU); it says where the XLA attention stands in for cuDNN's or Triton GEMM fusions were turned
off. What compiling proves and what not: docs/tpu.md section 11; for GPUs docs/benchmarks.md, "Compiling for a GPU
here".

Exit status 0 when every line fits; 2 when one does not, the reason named (HBM, VMEM with the kernel and its block
size, a Mosaic lowering error, or a config the trainer refuses on that slice), or when the command line or the
experiment is refused (one `error:` line); 1 when the compiler is not installed (one line naming the fix) or on an
unexpected error (its traceback on stderr).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from importlib import metadata

from gp_jax import runtime  # jax-free at import, as launch.accelerators needs it

from . import prog, sweep
from .accelerators import (accelerator_slice, gpu_compiler_missing, gpu_memory_fraction, install_gpu_compiler,
                           libtpu_missing, use_cpu)
# tests/test_hlo_traffic.py takes the compile-only devices from here.
from .points import NUM_TYPES, SCRATCH_VOCAB, STEPS, build_points, preview_runs

# launch.compiler and gp_jax import jax, so main imports them once `use_cpu` has set JAX_PLATFORMS: this process
# computes on the CPU whatever libtpu or GPU plugin is installed.

EXIT_FITS, EXIT_ERROR, EXIT_DOES_NOT_FIT = 0, 1, 2
EXIT_USAGE = EXIT_DOES_NOT_FIT  # a refused command line or experiment: the sweep cannot be built as given


def versions(platform: str = "tpu") -> str:
  def v(name):
    try:
      return metadata.version(name)
    except metadata.PackageNotFoundError:
      return "not installed"

  if platform == "cuda":
    return f"jax {v('jax')}, XLA:GPU from jax-cuda13-plugin {v('jaxlib')}"
  return f"jax {v('jax')}, libtpu {v('libtpu')}"


def exit_status(rows: list, unexpected: bool) -> int:
  if unexpected:
    return EXIT_ERROR
  return EXIT_DOES_NOT_FIT if any(r.status != "compiled" for r in rows) else EXIT_FITS


def parse_args(argv):
  p = argparse.ArgumentParser(prog=prog("compile"), description=__doc__,
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
  runtime.quicken_imports()
  try:
    s = accelerator_slice(args.accelerator_type)
    if s.platform == "cuda":
      gpu_memory_fraction()  # a bad XLA_PYTHON_CLIENT_MEM_FRACTION is an error line here, not a traceback later
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE
  missing = gpu_compiler_missing() if s.platform == "cuda" else libtpu_missing()
  if missing:
    print(missing, file=sys.stderr)
    return EXIT_ERROR
  if s.platform == "cuda":  # libtpu (the aot extra) starts when JAX looks for plugins: given a slice, it stays quiet
    for k, v in runtime.libtpu_compile_only_env("v5litepod-1").items():
      os.environ.setdefault(k, v)
  # Programs compiled for a TPU topology or XLA:GPU without a GPU cannot be loaded back here (no client): a
  # persistent cache ($JAX_COMPILATION_CACHE_DIR) would only store entries and warn on reading them.
  runtime.configure_compilation_cache("off")
  from gp_jax import aot  # pylint: disable=g-import-not-at-top
  from . import compiler as compiler_lib  # pylint: disable=g-import-not-at-top

  try:
    mesh_sizes = aot.parse_mesh(args.mesh) if args.mesh else None
    steps = [x.strip() for x in args.steps.split(",") if x.strip()]
    if not steps or set(steps) - set(STEPS):
      raise ValueError(f"--steps takes a comma list of {', '.join(STEPS)}, got {args.steps!r}")
    runs = preview_runs(args.config, extra=args.extra)
    # Of every point, before --points chooses: what `sweep.expand` refuses for a sweep with run folders.
    overridden = sweep.swept_overrides(args.config.partition(":")[0], [dict(r.overrides) for r in runs], args.extra)
    points = build_points(runs, args.points)
  except (ValueError, FileNotFoundError) as e:  # UserError is a ValueError
    print(f"error: {e}", file=sys.stderr)
    return EXIT_USAGE
  if overridden:  # no run folders here: compiled as asked, the names keep the swept values
    print(f"note: {overridden}", file=sys.stderr, flush=True)
  print(f"{s.describe()}; {len(points)} point{'s' * (len(points) != 1)} of {args.config}; {versions(s.platform)}",
        flush=True)
  compiler = compiler_lib.Compiler(s, mesh_sizes=mesh_sizes, buckets=args.buckets, steps=steps,
                                   scratch_vocab=args.scratch_vocab, num_types=args.num_types,
                                   out=lambda line: print(line, flush=True), hlo_dir=args.hlo_dir)
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
