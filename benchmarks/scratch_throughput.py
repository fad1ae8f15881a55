"""Forward and train-step throughput (tokens/s) of a ScratchEncoder + GlobalPointer head on CPU.

  python benchmarks/scratch_throughput.py                       # default config, batch 32 x seq 64
  python benchmarks/scratch_throughput.py --arch conv4_128_attn1 --batch 64
  python benchmarks/scratch_throughput.py --set hidden_size=192 --set num_layers=6

Prints one line: config, forward tokens/s, train-step tokens/s (fwd + bwd + AdamW), step ms,
parameter count, CPU seconds per step (all threads), and the 1-minute load average (the machine is shared: note it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from benchmarks.scratch_msra_probe import (  # noqa: E402
    ARCHS,
    DEFAULT_ARCH,
    TABLES,
    Tagger,
    build_train_step,
    make_config,
    parse_overrides,
)

def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(ARCHS))
  p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a ScratchConfig field")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--types", type=int, default=3, help="entity types (GP heads)")
  p.add_argument("--vocab", type=int, default=4734, help="char vocabulary size (MSRA: 4734)")
  p.add_argument("--bigram-vocab", type=int, default=50002, help="bigram vocabulary size, 0 = none")
  p.add_argument("--dense-tables", action="store_true", help="dense AdamW on embedding tables (default: lazy rows)")
  p.add_argument("--prng", default="threefry2x32", help="jax_default_prng_impl (threefry2x32, rbg, unsafe_rbg)")
  p.add_argument("--steps", type=int, default=30, help="timed steps (after 3 warm-up steps)")
  args = p.parse_args()
  jax.config.update("jax_default_prng_impl", args.prng)

  cfg = make_config(args.arch, parse_overrides(args.set), vocab_size=args.vocab, bigram_vocab_size=args.bigram_vocab)
  B, L = args.batch, args.seq
  model = Tagger(cfg, args.types, 64, rngs=nnx.Rngs(0))
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

  rng = np.random.default_rng(0)
  lengths = rng.integers(L // 2, L + 1, size=B)
  mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
  batch = {
      "input_ids": rng.integers(2, args.vocab, size=(B, L)).astype(np.int32) * mask,
      "bigram_ids": rng.integers(2, max(args.bigram_vocab, 3), size=(B, L)).astype(np.int32) * mask,
      "attention_mask": mask,
      "span_ids": np.full((B, args.types, 8), -1, np.int32),
  }
  batch["span_ids"][:, :, 0] = 2 * L + 3  # one gold span per row and type
  batch = jax.device_put(batch)

  model.eval()
  eval_graphdef = nnx.graphdef(model)
  model.train()
  graphdef, tables, params, rest = nnx.split(model, TABLES, nnx.Param, ...)
  opt_init, train_step = build_train_step(graphdef, wd=0.01, table_wd=0.0, lazy=not args.dense_tables)
  opt = opt_init(tables, params)

  @jax.jit
  def fwd_step(tables, params, rest, b):
    return nnx.merge(eval_graphdef, tables, params, rest)(b)

  def timeit(fn, n):
    out = None
    for _ in range(3):
      out = fn()
    jax.block_until_ready(out)
    t, c = time.perf_counter(), time.process_time()
    for _ in range(n):
      out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / n, (time.process_time() - c) / n

  fwd_s, _ = timeit(lambda: fwd_step(tables, params, rest, batch), args.steps)
  state = [tables, params, rest, opt]
  lr = jnp.float32(1e-3)

  def one_step():
    *state[:], loss = train_step(*state, batch, lr)
    return loss

  step_s, step_cpu_s = timeit(one_step, args.steps)
  tokens = B * L
  arch = args.arch + "".join(f",{s}" for s in args.set or [])
  print(
      f"arch={arch} B={B} L={L} params={n_params / 1e6:.2f}M fwd={tokens / fwd_s:,.0f} tok/s "
      f"train={tokens / step_s:,.0f} tok/s step={step_s * 1e3:.1f}ms (cpu {step_cpu_s * 1e3:.0f}ms) "
      f"load1={os.getloadavg()[0]:.2f}"
  )


if __name__ == "__main__":
  main()
