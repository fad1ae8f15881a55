"""Off-device lowering of the blockwise ZLPR loss + gradient with the Pallas kernel (`implementation="pallas"`).

For each platform, `jax.export` of a jitted loss + gradient (Efficient GlobalPointer: bf16 q, k of one shared head
and float32 start/end biases; standard: float32 q, k of H heads, no biases) and a count of the kernel calls in the module: `tpu_custom_call` (Mosaic) on TPU; on other platforms
the kernel is interpreted, i.e. plain HLO, and no custom call is expected. A TPU export made on a CPU machine holds
the serialised Mosaic kernel; Mosaic compiles it (layout passes, VMEM checks) only on the TPU.

  python -m benchmarks.lowering_loss [--platforms tpu,cpu,cuda]
"""

from __future__ import annotations

import argparse
import re

# Kernel calls in the StableHLO text of a module, by platform.
CUSTOM_CALLS = {"tpu": "tpu_custom_call"}  # no Mosaic GPU body yet: cuda runs the interpreted kernel


def export_loss(platform: str, *, head="efficient", B=2, L=300, H=3, d=64, K=4, block_size=128, max_span_width=None):
  """`jax.export.Exported` of loss + gradient w.r.t. q, k (and the biases of the efficient head) for `platform`."""
  import jax
  import jax.numpy as jnp

  from gp_jax.ops import blockwise_zlpr_loss

  efficient = head == "efficient"

  def loss_and_grad(span_ids_BHK, mask_BL, q_BLHD, k_BLHD, *biases):
    def loss(q, k, sb=None, eb=None):
      return blockwise_zlpr_loss(q, k, span_ids=span_ids_BHK, attention_mask=mask_BL, start_bias_BHL=sb,
                                 end_bias_BHL=eb, max_span_width=max_span_width, block_size=block_size,
                                 implementation="pallas")

    return jax.value_and_grad(loss, tuple(range(2 + len(biases))))(q_BLHD, k_BLHD, *biases)

  qk = ((B, L, 1, d), jnp.bfloat16) if efficient else ((B, L, H, d), jnp.float32)
  shapes = [((B, H, K), jnp.int32), ((B, L), jnp.int32), qk, qk] + [((B, H, L), jnp.float32)] * (2 * efficient)
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
  return jax.export.export(jax.jit(loss_and_grad), platforms=[platform])(*args)


def loss_lines(platforms=("tpu",), **kwargs) -> list[str]:
  """One line per platform: `tpu loss: lowered (pallas, 3 tpu_custom_call)` or `... : not lowered: REASON`.

  The loss + gradient holds three kernels: the forward and the backward's dq and dk passes. A GPU target is refused
  (`blockwise.pallas_refusal`: no GPU body)."""
  from gp_jax.ops import blockwise  # pylint: disable=g-import-not-at-top

  lines = []
  for platform in platforms:
    refusal = blockwise.pallas_refusal(platform)
    if refusal:
      lines.append(f"{platform} loss: not lowered: refused: {refusal}")
      continue
    try:
      text = export_loss(platform, **kwargs).mlir_module()
    except Exception as e:  # pylint: disable=broad-except
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
      lines.append(f"{platform} loss: not lowered: {type(e).__name__}: {reason[:200]}")
      continue
    call = CUSTOM_CALLS.get(platform)
    if call is None:
      lines.append(f"{platform} loss: lowered (pallas, interpreted: no custom call)")
    else:
      n = len(re.findall(rf'custom_call @{call}\b|call_target_name = "{call}"', text))
      lines.append(f"{platform} loss: lowered (pallas, {n} {call})")
  return lines


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--platforms", default="tpu,cpu", help="comma-separated jax.export platforms")
  args = parser.parse_args(argv)
  for line in loss_lines(tuple(args.platforms.split(","))):
    print(line)


if __name__ == "__main__":
  main()
