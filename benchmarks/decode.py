"""Decoding spans: on-device hit gathering vs a host numpy decode of the same logits.

A GlobalPointer(D=384, d=64) head on random hidden states; the threshold is set so that about
--hits_per_example cells fire per example (a trained model's regime). Per shape, median seconds of:
  host numpy:        device_get(logits) + numpy (logits > t) & mask + argwhere + score gather
  device gather:     `ops.decode_hits(logits, ...)` (threshold + `gather_hits` on device, hits to host)
  head dense:        jit(head.decode_hits(..., block_size=None)): head forward + gather, from hidden states
  head blockwise:    jit(head.decode_hits(..., block_size=bs)): tiles, never a [B, H, L, L] tensor
The first two start from the same logits already on device; the last two include the head. The last column is
the load average and CPU steal over the shape's run.

  python -m benchmarks.decode [--shapes 8x512x10,4x2048x10,1x4096x10 --iters 5]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from gp_jax import ops
from gp_jax.models import GlobalPointer


def median_time(fn, iters: int) -> tuple[float, object]:
  """(median seconds of `iters` calls after a compile / warm-up call, that call's output)."""
  out = fn()
  return common.median_seconds(fn, iters), out


def host_decode(logits, mask_B1LL, threshold):
  logits_np = np.asarray(jax.device_get(logits))
  hit = (logits_np > threshold) & np.asarray(mask_B1LL)
  coords = np.argwhere(hit)
  return coords, logits_np[tuple(coords.T)]


def measure(B: int, L: int, H: int, *, args) -> dict:
  head = GlobalPointer(args.hidden, H, head_size=args.head_size, rngs=nnx.Rngs(0))
  rng = np.random.default_rng(0)
  hidden_BLD = jnp.asarray(rng.normal(size=(B, L, args.hidden)), jnp.float32)
  lengths = rng.integers(L // 2, L + 1, size=B)
  mask_BL = jnp.asarray(np.arange(L)[None] < lengths[:, None], jnp.int32)
  mask_B1LL = ops.span_mask(mask_BL)
  logits = jax.jit(lambda x, m: head(x, m))(hidden_BLD, mask_BL).block_until_ready()
  # Threshold: about hits_per_example cells per example fire.
  valid = np.asarray(jax.device_get(logits))[np.broadcast_to(np.asarray(mask_B1LL), logits.shape)]
  threshold = float(np.partition(valid, valid.size - B * args.hits_per_example)[valid.size - B * args.hits_per_example])
  size = 1 << int(2 * B * args.hits_per_example - 1).bit_length()

  t_host, (coords, _) = median_time(lambda: host_decode(logits, mask_B1LL, threshold), args.iters)
  t_gather, (coords_dev, _) = median_time(
      lambda: ops.decode_hits(logits, mask=mask_B1LL, threshold=threshold, initial_size=size), args.iters
  )
  graphdef, state = nnx.split(head)

  def head_decode(block_size):
    fn = jax.jit(lambda s, x, m: nnx.merge(graphdef, s).decode_hits(
        x, m, size=size, block_size=block_size, threshold=threshold))
    return lambda: jax.device_get(fn(state, hidden_BLD, mask_BL))

  t_dense, (n_dense, _, _) = median_time(head_decode(None), args.iters)
  t_block, (n_block, c_block, _) = median_time(head_decode(args.block_size), args.iters)
  as_set = lambda c: {tuple(r) for r in np.asarray(c).tolist()}  # noqa: E731
  same = as_set(coords) == as_set(coords_dev) == as_set(c_block[:n_block]) and int(n_dense) == len(coords)
  return dict(B=B, L=L, H=H, hits=len(coords), host=t_host, gather=t_gather, dense=t_dense, block=t_block, same=same)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--shapes", default="8x512x10,4x2048x10,1x4096x10", help="comma list of BxLxH")
  parser.add_argument("--hits_per_example", type=int, default=20, help="cells firing per example (sets the threshold)")
  parser.add_argument("--block_size", type=int, default=128, help="tile size of the blockwise decode")
  parser.add_argument("--hidden", type=int, default=384, help="hidden size D")
  parser.add_argument("--head_size", type=int, default=64, help="head size d")
  parser.add_argument("--iters", type=int, default=5, help="timed calls per method (median)")
  args = parser.parse_args(argv)

  print(common.machine_line("decode"))
  print(f"GlobalPointer D={args.hidden} d={args.head_size}, ~{args.hits_per_example} hits/example, "
        f"device={jax.devices()[0].platform}; median seconds\n")
  print("| B x L x H | hits | host numpy (from logits) | device gather (from logits) | host/device "
        "| head dense decode | head blockwise decode | dense/blockwise | same hits | load, steal |")
  print("|---|---|---|---|---|---|---|---|---|---|")
  for shape in args.shapes.split(","):
    B, L, H = (int(x) for x in shape.split("x"))
    watch = common.LoadWatch()
    r = measure(B, L, H, args=args)
    print(f"| {B} x {L} x {H} | {r['hits']} | {r['host']:.4f} | {r['gather']:.4f} | {r['host'] / r['gather']:.1f}x "
          f"| {r['dense']:.4f} | {r['block']:.4f} | {r['dense'] / r['block']:.1f}x | {'yes' if r['same'] else 'NO'} "
          f"| {watch.readout()} |",
          flush=True)


if __name__ == "__main__":
  main()
