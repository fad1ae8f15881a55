"""Forward and train-step throughput of the from-scratch encoder + GlobalPointer head, on the project's code.

The model and step are the ones the README main job runs: the config of `experiments/msra_scratch.py`
(char + bigram embeddings, hidden 128, 4 gated conv blocks, GlobalPointer d=64 with RoPE, sparse ZLPR,
AdamW), built by `gp_jax.state.init_model`, trained by the step of `gp_jax.steps.make_train_step` (the one
training jits); the forward is the evaluation step of `gp_jax.steps.make_eval_step` (encoder, head, on-device
hit gathering), as `Evaluator` runs it. Batches are synthetic, in the pipeline's format, rows of random
length in [seq/2, seq] (MSRA sentences vary); tokens/s counts real (non-padding) tokens, as the training
log does.

Prints one line per mode with tokens/s, ms per call, minor page faults and system CPU seconds per call
(`getrusage`: the kernel time the main job spends in fresh-memory faults shows up here), and the 1-minute
load average and CPU steal over the timed calls (the machine is shared: note it).

  python -m benchmarks.scratch_throughput                       # batch 32 x seq 64, the main job's model
  python -m benchmarks.scratch_throughput --batch 256 --seq 128 --modes forward
  python -m benchmarks.scratch_throughput --set hidden_size=192 --set num_layers=6
  python -m benchmarks.scratch_throughput --no-runtime          # without gp_jax.runtime's process settings
"""

from __future__ import annotations

import argparse
import resource

import jax

from benchmarks import common
from benchmarks.inputs import MSRA_TYPES, ProjectStep, msra_config, msra_inputs, synthetic_batch
from gp_jax import steps


def measure(fn, n: int) -> dict:
  """Per-call median of wall time; per-call means of minor faults, system and user CPU seconds."""
  r0 = resource.getrusage(resource.RUSAGE_SELF)
  s = common.median_seconds(fn, n)
  r1 = resource.getrusage(resource.RUSAGE_SELF)
  return {"s": s, "faults": (r1.ru_minflt - r0.ru_minflt) / n, "sys": (r1.ru_stime - r0.ru_stime) / n,
          "user": (r1.ru_utime - r0.ru_utime) / n}


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
  start = common.LoadWatch()
  ours = ProjectStep(config, tokenizer, list(MSRA_TYPES))
  m = config.model
  print(common.machine_line("scratch_throughput"))
  print(f"runtime={settings or 'off'}; model: scratch h{m.hidden_size} x{m.num_layers} "
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
      step = steps.make_eval_step(ours.setup, size=rows * 32)
      fn = lambda: jax.block_until_ready(step(ours.state["params"], dbatch))  # noqa: E731
    else:
      raise SystemExit(f"unknown mode {mode!r}")
    compile_s = common.call_seconds(fn, 1)[0]
    for _ in range(3):
      fn()
    watch = common.LoadWatch()
    r = measure(fn, args.steps)
    print(f"{mode}: B={rows} L={args.seq} {real / r['s']:,.0f} real tok/s ({rows * args.seq / r['s']:,.0f} padded), "
          f"{r['s'] * 1e3:.1f} ms/call, {r['faults']:,.0f} minor faults/call, sys {r['sys'] * 1e3:.1f} ms/call, "
          f"user {r['user'] * 1e3:.1f} ms/call, compile {compile_s:.1f} s; {watch.readout()}", flush=True)
  print(f"whole run: {start.readout()}; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB")


if __name__ == "__main__":
  main()
