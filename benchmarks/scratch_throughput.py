"""Forward and train-step throughput (tokens/s) of a ScratchEncoder + GlobalPointer head on CPU.

  python benchmarks/scratch_throughput.py                       # default config, batch 32 x seq 64
  python benchmarks/scratch_throughput.py --arch conv4_attn1 --batch 64
  python benchmarks/scratch_throughput.py --set hidden_size=192 --set num_layers=6

Prints one line: config, forward tokens/s, train-step tokens/s (fwd + bwd + AdamW), step ms,
parameter count, and the 1-minute load average (the machine is shared: note it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from gp_jax import ops  # noqa: E402
from gp_jax.models.heads import GlobalPointer  # noqa: E402
from gp_jax.models.scratch import ScratchConfig, ScratchEncoder  # noqa: E402

# Presets shared with benchmarks/scratch_msra_probe.py (vocab sizes filled in by the caller).
ARCHS = {
    "conv4": dict(hidden_size=256, num_layers=4, block="glu", dilations=(1, 2, 4, 1)),
    "conv4_attn1": dict(hidden_size=256, num_layers=4, block="glu", dilations=(1, 2, 4, 1), num_attn_layers=1),
    "conv6_192": dict(hidden_size=192, num_layers=6, block="glu", dilations=(1, 2, 4, 1, 2, 4)),
    "gelu4": dict(hidden_size=256, num_layers=4, block="gelu", dilations=(1, 2, 4, 1)),
    "attn2": dict(hidden_size=256, num_layers=0, num_attn_layers=2, mlp_ratio=4),
}
DEFAULT_ARCH = "conv4"


def parse_overrides(items):
  out = {}
  for item in items or []:
    key, _, value = item.partition("=")
    if key == "dilations":
      out[key] = tuple(int(v) for v in value.split(",") if v)
    elif key in ("block",):
      out[key] = value
    elif key in ("dropout", "embed_dropout", "rope_base"):
      out[key] = float(value)
    elif key == "conv_out_proj":
      out[key] = value.lower() in ("1", "true", "yes")
    else:
      out[key] = int(value)
  return out


def make_config(arch, overrides, *, vocab_size, bigram_vocab_size):
  fields = dict(ARCHS[arch], vocab_size=vocab_size, bigram_vocab_size=bigram_vocab_size)
  fields.update(overrides)
  return ScratchConfig(**fields)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--arch", default=DEFAULT_ARCH, choices=sorted(ARCHS))
  p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a ScratchConfig field")
  p.add_argument("--batch", type=int, default=32)
  p.add_argument("--seq", type=int, default=64)
  p.add_argument("--types", type=int, default=3, help="entity types (GP heads)")
  p.add_argument("--vocab", type=int, default=4800, help="char vocabulary size (MSRA: ~4.7k)")
  p.add_argument("--bigram-vocab", type=int, default=50002, help="bigram vocabulary size, 0 = none")
  p.add_argument("--steps", type=int, default=30, help="timed steps (after 3 warm-up steps)")
  args = p.parse_args()

  cfg = make_config(args.arch, parse_overrides(args.set), vocab_size=args.vocab, bigram_vocab_size=args.bigram_vocab)
  B, L = args.batch, args.seq
  rngs = nnx.Rngs(0)
  enc = ScratchEncoder(cfg, rngs=rngs)
  head = GlobalPointer(cfg.hidden_size, args.types, head_size=64, rngs=rngs)
  model = nnx.List([enc, head])
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

  def forward(m, b):
    enc, head = m
    h_BLD = enc(b["input_ids"], b["attention_mask"], bigram_ids=b["bigram_ids"] if cfg.bigram_vocab_size else None)
    return head(h_BLD, b["attention_mask"])

  tx = optax.adamw(1e-3, weight_decay=0.01)
  model.train()
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)
  opt_state = tx.init(params)

  def train_step(params, opt_state, rest, b):
    m = nnx.merge(graphdef, params, rest)

    def loss_fn(m):
      logits_BHLL = forward(m, b)
      return ops.sparse_zlpr_loss(logits_BHLL, span_ids=b["span_ids"], mask=ops.span_mask(b["attention_mask"]))

    loss, grads = nnx.value_and_grad(loss_fn)(m)
    _, params, rest = nnx.split(m, nnx.Param, ...)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, rest, loss

  train_step = jax.jit(train_step, donate_argnums=(0, 1, 2))
  model.eval()
  eval_graphdef, _, _ = nnx.split(model, nnx.Param, ...)

  @jax.jit
  def fwd_step(params, rest, b):
    return forward(nnx.merge(eval_graphdef, params, rest), b)

  def timeit(fn, n):
    out = None
    for _ in range(3):
      out = fn()
    jax.block_until_ready(out)
    t = time.perf_counter()
    for _ in range(n):
      out = fn()
    jax.block_until_ready(out)
    return (time.perf_counter() - t) / n

  fwd_s = timeit(lambda: fwd_step(params, rest, batch), args.steps)

  state = [params, opt_state, rest]

  def one_step():
    state[0], state[1], state[2], loss = train_step(*state, batch)
    return loss

  step_s = timeit(one_step, args.steps)
  tokens = B * L
  arch = args.arch + "".join(f",{s}" for s in args.set or [])
  print(
      f"arch={arch} B={B} L={L} params={n_params / 1e6:.2f}M fwd={tokens / fwd_s:,.0f} tok/s "
      f"train={tokens / step_s:,.0f} tok/s step={step_s * 1e3:.1f}ms load1={os.getloadavg()[0]:.2f}"
  )


if __name__ == "__main__":
  main()
