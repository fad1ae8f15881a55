"""A/B of the encoder dropout masks' bit source (`gp_jax.ops.dropout`: "threefry" vs "hash"), in one process.

  step   the MiniLM + GlobalPointer train step as `benchmarks.train_step` builds it, once per source
  block  one attention block (QK^T, key mask, softmax, probability dropout, PV), forward + backward, per source
         and with no dropout at all (the floor)

Alternating rounds (`benchmarks.common.alternate`); prints each variant's median with min..max and the ratio
threefry / hash per round (median [min..max]), then the load and CPU steal over the rounds.

  python -m benchmarks.dropout_bits step --shapes 4x512,16x128 --pairs 5 --steps 2
  python -m benchmarks.dropout_bits block --shapes 4x512 --pairs 7 --steps 3
"""

from __future__ import annotations

import argparse
import functools
import os

from benchmarks import common

SOURCES = ("threefry", "hash")


def step_fns(batch: int, seq: int) -> dict:
  from benchmarks.inputs import minilm_step  # pylint: disable=g-import-not-at-top

  fns, before = {}, os.environ.get("GP_JAX_DROPOUT_BITS")
  try:
    for bits in SOURCES:
      os.environ["GP_JAX_DROPOUT_BITS"] = bits  # read when the step is traced, inside minilm_step
      step, b = minilm_step(batch, seq)
      fns[bits] = functools.partial(step.step, b)
  finally:
    if before is None:
      os.environ.pop("GP_JAX_DROPOUT_BITS", None)
    else:
      os.environ["GP_JAX_DROPOUT_BITS"] = before
  return fns


def block_fns(batch: int, seq: int, heads: int = 12, head_dim: int = 32) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import dropout as dropout_lib  # pylint: disable=g-import-not-at-top

  rate = 0.1

  def block(q, k, v, mask, key, bits):
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.float32(np.sqrt(head_dim))
    probs = jax.nn.softmax(jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min), axis=-1)
    if bits is not None:
      keep = dropout_lib.keep_mask(key, probs.shape, rate, bits)
      probs = jax.lax.select(keep, probs / np.float32(1 - rate), jnp.zeros_like(probs))
    return jnp.einsum("bhqs,bshk->bqhk", probs, v)

  rng = np.random.default_rng(0)
  q, k, v, g = (jnp.asarray(rng.standard_normal((batch, seq, heads, head_dim)), jnp.float32) for _ in range(4))
  mask = jnp.asarray(np.arange(seq)[None, :] < rng.integers(seq // 2, seq + 1, batch)[:, None])
  key = jax.random.key(0)
  fns = {}
  for bits in (*SOURCES, None):
    grad = jax.jit(jax.grad(lambda q, k, v, bits=bits: jnp.sum(block(q, k, v, mask, key, bits) * g), argnums=(0, 1, 2)))
    jax.block_until_ready(grad(q, k, v))
    fns[bits or "no dropout"] = functools.partial(lambda f: jax.block_until_ready(f(q, k, v)), grad)
  return fns


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("what", choices=("step", "block"), help="the whole train step, or one attention block")
  p.add_argument("--shapes", default="4x512,16x128", help="comma list of BATCHxSEQ")
  p.add_argument("--pairs", type=int, default=5, help="alternating rounds")
  p.add_argument("--steps", type=int, default=2, help="calls per variant and round (median taken)")
  args = p.parse_args(argv)
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure()
  start = common.LoadWatch()
  print(common.machine_line("dropout_bits"), flush=True)
  for shape in args.shapes.split(","):
    batch, seq = (int(x) for x in shape.split("x"))
    fns = (step_fns if args.what == "step" else block_fns)(batch, seq)
    rounds = common.alternate(fns, rounds=args.pairs, calls=args.steps)
    cells = [f"{name} {rounds.spread(name).fmt('.4f', ' s')}" for name in fns]
    print(f"{args.what} B{batch}xL{seq}: " + "; ".join(cells)
          + f"; threefry/hash {rounds.ratio('threefry', 'hash').fmt()}; {rounds.watch.readout()}", flush=True)
  print(f"whole run: {start.readout()}")


if __name__ == "__main__":
  main()
