"""Forward and train-step throughput of the from-scratch encoder + GlobalPointer head, on the project's code.

The model and step are the ones the README main job runs: the config of `experiments/msra_scratch.py`
(char + bigram embeddings, hidden 128, 4 gated conv blocks, GlobalPointer d=64 with RoPE, sparse ZLPR,
AdamW), built by `gp_jax.state.init_model`, trained by `gp_jax.train.train_step` jitted as `train_loop`
jits it; the forward is the evaluation step (`gp_jax.evaluate.eval_step`: encoder, head, on-device hit
gathering), jitted as `Evaluator` jits it. Batches are synthetic, in the pipeline's format, rows of random
length in [seq/2, seq] (MSRA sentences vary); tokens/s counts real (non-padding) tokens, as the training
log does.

Prints one line per mode with tokens/s, ms per call, minor page faults and system CPU seconds per call
(`getrusage`: the kernel time the main job spends in fresh-memory faults shows up here), and the 1-minute
load average (the machine is shared: note it).

  python benchmarks/scratch_throughput.py                       # batch 32 x seq 64, the main job's model
  python benchmarks/scratch_throughput.py --batch 256 --seq 128 --modes forward
  python benchmarks/scratch_throughput.py --set hidden_size=192 --set num_layers=6
  python benchmarks/scratch_throughput.py --no-runtime          # without gp_jax.runtime's process settings
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from a checkout
import argparse
import datetime
import functools
import resource
import time
import types as pytypes

import jax
import numpy as np

from benchmarks.train_step import ProjectStep, load_average, synthetic_batch
from gp_jax import evaluate
from gp_jax import sharding as shd

MSRA_TYPES = ("LOC", "ORG", "PER")


def msra_config(overrides):
  from experiments import msra_scratch  # pylint: disable=g-import-not-at-top

  c = msra_scratch.get_config()
  for item in overrides or ():
    key, value = item.split("=", 1)
    old = c.model[key]
    c.model[key] = type(old)(value) if not isinstance(old, tuple) else tuple(int(v) for v in value.split(","))
  return c


def msra_inputs(vocab: int = 4734, bigram_vocab: int = 50002):
  """(tokenizer stand-in, synthetic_batch feature ranges) with the main job's vocabulary sizes."""
  tokenizer = pytypes.SimpleNamespace(vocab_size=vocab, bigram_vocab_size=bigram_vocab,
                                      feature_names=("input_ids", "bigram_ids"),
                                      pad_values={"input_ids": 0, "bigram_ids": 0})
  return tokenizer, {"input_ids": (2, vocab, 0), "bigram_ids": (2, bigram_vocab, 0)}


def usage():
  r = resource.getrusage(resource.RUSAGE_SELF)
  return time.perf_counter(), r.ru_minflt, r.ru_stime, r.ru_utime


def measure(fn, n: int) -> dict:
  """Per-call medians of wall time; per-call means of minor faults, system and user CPU seconds."""
  walls = []
  t0, f0, s0, u0 = usage()
  for _ in range(n):
    t = time.perf_counter()
    fn()
    walls.append(time.perf_counter() - t)
  t1, f1, s1, u1 = usage()
  return {"s": float(np.median(walls)), "faults": (f1 - f0) / n, "sys": (s1 - s0) / n, "user": (u1 - u0) / n}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", type=int, default=32, help="rows per train step (main job: 32)")
  p.add_argument("--eval-batch", type=int, default=256, help="rows per forward (main job eval: 256)")
  p.add_argument("--seq", type=int, default=64, help="padded length (a bucket of the main job: 16..128)")
  p.add_argument("--modes", default="train,forward", help="comma list of train, forward")
  p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a config.model field")
  p.add_argument("--vocab", type=int, default=4734, help="char vocabulary size (MSRA: 4734)")
  p.add_argument("--bigram-vocab", type=int, default=50002, help="bigram vocabulary size (MSRA: 50002)")
  p.add_argument("--steps", type=int, default=30, help="timed calls per mode (after compilation + 3 warm-up)")
  p.add_argument("--no-runtime", action="store_true", help="skip gp_jax.runtime.configure() (malloc settings)")
  args = p.parse_args(argv)
  settings = {}
  if not args.no_runtime:
    from gp_jax import runtime  # pylint: disable=g-import-not-at-top

    settings = runtime.configure()

  config = msra_config(args.set)
  config.batch_size = args.batch
  tokenizer, feats = msra_inputs(args.vocab, args.bigram_vocab)
  H = len(MSRA_TYPES)
  start_load = load_average()
  ours = ProjectStep(config, tokenizer, list(MSRA_TYPES))
  m = config.model
  print(f"scratch_throughput {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC "
        f"device={jax.devices()[0].platform} cores={os.cpu_count()} load_at_start={start_load:.2f} "
        f"runtime={settings or 'off'}; model: scratch h{m.hidden_size} x{m.num_layers} "
        f"{m.block} + {m.head} head d={m.head_size}, {ours.n_params:,} params")
  for mode in args.modes.split(","):
    rows = args.batch if mode == "train" else args.eval_batch
    batch = synthetic_batch(batch=rows, seq=args.seq, num_types=H, features=feats, min_len=args.seq // 2,
                            spans_per_row=2)
    real = int(batch["attention_mask"].sum())
    dbatch = ours.device_batch(batch)
    if mode == "train":
      fn = lambda: ours.step(dbatch)  # noqa: E731
    elif mode == "forward":
      s = ours.setup
      step = jax.jit(functools.partial(evaluate.eval_step, graphdef=s.graphdef, rest=s.rest, size=rows * 32,
                                       block_size=s.block_size, hit_sharding=shd.replicated(s.mesh)),
                     out_shardings=shd.replicated(s.mesh))
      fn = lambda: jax.block_until_ready(step(ours.state["params"], dbatch))  # noqa: E731
    else:
      raise SystemExit(f"unknown mode {mode!r}")
    t = time.perf_counter()
    fn()
    compile_s = time.perf_counter() - t
    for _ in range(3):
      fn()
    load = load_average()
    r = measure(fn, args.steps)
    print(f"{mode}: B={rows} L={args.seq} {real / r['s']:,.0f} real tok/s ({rows * args.seq / r['s']:,.0f} padded), "
          f"{r['s'] * 1e3:.1f} ms/call, {r['faults']:,.0f} minor faults/call, sys {r['sys'] * 1e3:.1f} ms/call, "
          f"user {r['user'] * 1e3:.1f} ms/call, compile {compile_s:.1f} s; load {load:.2f}", flush=True)
  print(f"load at end {load_average():.2f}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
  main()
