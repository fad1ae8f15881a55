"""Why a step cannot run on a slice, in one line, read from the compiler's, Mosaic's or the trainer's refusal.

A refusal found here is the one the first step would raise on the slice; anything else is a bug and keeps its
traceback.
"""

from __future__ import annotations

import re

from gp_jax.errors import UserError
from gp_jax.ops import pallas_zlpr

_KERNEL_OP = re.compile(r'op_name="[^"]*?/([\w.-]+)/pallas_call"')
_KERNEL_LABEL = re.compile(r"(?:HLO :: |for %)([A-Za-z_][\w-]*?)(?:\.\d+)?\s")
_HBM_NEED = re.compile(r"required for (.+?) \(([\d.]+[KMGT]?)\) exceeds available HBM \(([\d.]+[KMGT]?)\)")
_HBM_USED = re.compile(r"Used ([\d.]+[KMGT]) of ([\d.]+[KMGT]) hbm")
_VMEM_SIZES = re.compile(r"(?:size|Used) ([\d.]+[KMG]) (?:and limit|of) ([\d.]+[KMG])")


def zlpr_tile(config, *, length: int, generation: str | None) -> int:
  """The ZLPR kernel's compiled tile: loss.block_size (at most L) rounded up to 128 lanes, clamped to what the TPU
  generation fits (`pallas_zlpr.clamp_tile`)."""
  tile = -(-min(int(config.loss.block_size), length) // 128) * 128
  with pallas_zlpr.tpu_target(generation):
    return pallas_zlpr.clamp_tile(tile, shared=config.model.head == "efficient")


def failure(e: BaseException, config, *, length: int | None = None, generation: str | None = None) -> str | None:
  """The reason a step cannot run on the slice, for the compiler's and Mosaic's refusals and the trainer's own; None
  for anything else (a bug). `length` and `generation` name the ZLPR kernel's tile in a VMEM reason."""
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
