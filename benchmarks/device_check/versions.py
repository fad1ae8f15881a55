"""Stage versions: python, jax, jaxlib, CUDA plugin, cuDNN, driver, device; measured matmul peaks (bf16, TF32,
f32)."""

from __future__ import annotations

import contextlib
import platform
import subprocess
from importlib import metadata

from benchmarks.device_check.base import Recorder
from gp_jax import jax_private


def _dist_version(*names: str) -> dict:
  out = {}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def stage_versions(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  from benchmarks.train_step import matmul_peak  # pylint: disable=g-import-not-at-top

  info = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "backend": jax.default_backend(), "devices": [d.device_kind for d in jax.devices()],
          "packages": _dist_version("jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                                    "flax", "optax", "orbax-checkpoint", "torch", "transformers", "numpy",
                                    "ml-dtypes")}
  try:
    cuda_versions = jax_private.cuda_versions()
    info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
  except (AttributeError, RuntimeError) as e:
    info["cudnn"] = f"unknown ({type(e).__name__})"
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20, check=True)
    info["nvidia_smi"] = smi.stdout.strip()
  except (OSError, subprocess.SubprocessError) as e:
    info["nvidia_smi"] = f"unavailable ({type(e).__name__})"
  rec.set("versions", info)
  n = ctx["shapes"]["peak_n"]
  rec.set("peak_note", f"{n}^3 matmul, best of 7; tf32 = float32 at jax's default precision (TF32 on a GPU's "
                       "tensor cores; plain f32 on a CPU; torch's float32 default stays full f32), f32 = precision "
                       "highest")  # first: a stage stopped at its limit keeps it
  peaks = {}
  for name, dtype, precision in (("bf16", "bfloat16", None), ("tf32", "float32", None),
                                 ("f32", "float32", "highest")):
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
      got = matmul_peak(n, repeats=7, dtype=dtype)
    peaks[name] = {k: round(v, 1) for k, v in got.items()}
    rec.set("peaks_gflops", peaks)
