"""What the -1 padding of `span_ids` costs the blockwise ZLPR loss: loss + gradient with the same gold spans padded
to K = L (as the pipeline sends them) and to K = 8, XLA op and Pallas kernel (interpreted off TPU).

B x H = 2 x 4, six gold spans per type (width <= 5), d = 64, tile `--block` (default 128), jitted, compile excluded.
Alternating rounds (`benchmarks.common.alternate`: K=L, K=8, K=L, ...); the ratio is the median of the per-round
time(K=L) / time(K=8), with min..max, then the load and CPU steal over the rounds.

  python -m benchmarks.gold_padding [--lengths 1024,2048] [--impls xla,pallas] [--rounds 3]
"""

from __future__ import annotations

import argparse

import numpy as np

from benchmarks import common


def case(L: int, K: int, *, B: int = 2, H: int = 4, d: int = 64, spans: int = 6, seed: int = 0):
  """(q, k, attention mask, span ids `[B, H, K]`): the same `spans` gold spans per (b, h) whatever K."""
  rng = np.random.default_rng(seed)
  q, k = (rng.normal(size=(B, L, H, d)).astype(np.float32) for _ in range(2))
  i = rng.integers(0, L - 5, size=(B, H, spans))
  ids = np.full((B, H, K), -1, np.int32)
  ids[..., :spans] = i * L + i + rng.integers(0, 5, size=i.shape)
  return q, k, np.ones((B, L), np.int32), ids


def step_fn(impl: str, L: int, K: int, block: int):
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import blockwise_zlpr_loss  # pylint: disable=g-import-not-at-top

  q, k, am, ids = (jnp.asarray(x) for x in case(L, K))
  grad = jax.jit(jax.value_and_grad(lambda q, k: blockwise_zlpr_loss(
      q, k, span_ids=ids, attention_mask=am, block_size=block, implementation=impl), argnums=(0, 1)))
  run = lambda: jax.block_until_ready(grad(q, k))  # noqa: E731
  loss = float(run()[0])
  return run, loss


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--lengths", default="1024,2048")
  p.add_argument("--impls", default="xla,pallas")
  p.add_argument("--block", type=int, default=128)
  p.add_argument("--rounds", type=int, default=3)
  args = p.parse_args(argv)
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure()
  print(common.machine_line("gold_padding"), flush=True)
  print("| impl | L | K=L s | K=8 s | K=L / K=8 | load |\n|---|---|---|---|---|---|", flush=True)
  for impl in args.impls.split(","):
    for L in (int(x) for x in args.lengths.split(",")):
      (full, loss_full), (short, loss_short) = step_fn(impl, L, L, args.block), step_fn(impl, L, 8, args.block)
      assert abs(loss_full - loss_short) <= 1e-5 * abs(loss_short), (loss_full, loss_short)
      rounds = common.alternate({"K=L": full, "K=8": short}, rounds=args.rounds)
      print(f"| {impl} | {L} | {rounds.spread('K=L').fmt('.3f', ' s')} | {rounds.spread('K=8').fmt('.3f', ' s')} | "
            f"{rounds.ratio('K=L', 'K=8').fmt()} | {rounds.watch.readout()} |", flush=True)


if __name__ == "__main__":
  main()
