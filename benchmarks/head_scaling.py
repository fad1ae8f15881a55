"""Span head scaling: GlobalPointer span loss forward+backward, dense vs blockwise vs banded.

GlobalPointer(D=384, d=64), B=1, random hidden states, 8 gold spans per type (width < W), gradients
w.r.t. the head parameters, jitted; compile excluded. Each shape runs in its own subprocess and
reports its peak RSS (`ru_maxrss` in the child, which includes the Python + JAX baseline).
  dense:     `head.span_loss(..., block_size=None)` ([B, H, L, L] logits, full triangle)
  blockwise: `head.span_loss(..., block_size=bs)` (upper-triangle tiles, no max_span_width)
  banded:    the same with `max_span_width=W` (only j - i < W; a different, narrower mask)
  pallas:    blockwise with `implementation="pallas"` (opt-in via --modes: the Mosaic kernel on TPU, the
             interpreted kernel elsewhere, GPU included until it has a Mosaic GPU body)
Memory is the device's peak bytes in use where the backend reports it (GPU, TPU), else the child's peak RSS.
Dense shapes whose estimated peak exceeds --max_dense_gib are skipped (marked in the table).
Children call `gp_jax.runtime.configure()` as `gp_jax.main` does (`--no-runtime`: leave it out).
`--rounds N` runs the modes of a shape N times in alternation (dense, blockwise, banded, dense, ...;
`benchmarks.common.in_rounds`); times are medians over rounds and each ratio is the median of the per-round
ratios, with min..max; the last column is the load average and CPU steal over the shape's rounds.

  python -m benchmarks.head_scaling [--lengths 512,1024,2048,4096,8192 --types 10,50 --width 64]
  python -m benchmarks.head_scaling --lengths 8192 --types 10 --rounds 3
  python -m benchmarks.head_scaling --modes dense,blockwise,pallas --lengths 2048,4096,8192,16384 --types 10,50
      (a lent accelerator: the XLA op vs the kernel, d=64, B=1; dense where it fits under --max_dense_gib)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import subprocess
import sys
import time

from benchmarks import common

MODES = ("dense", "blockwise", "banded", "pallas")
DEFAULT_MODES = ("dense", "blockwise", "banded")
DENSE_BYTES_PER_CELL = 4 * 3.2  # float32 logits + ~2 more [B, H, L, L] buffers in the backward pass


def run_child(spec: dict) -> dict:
  """Times one shape in this process; returns seconds per step and peak RSS."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from gp_jax import runtime
  from gp_jax.models import GlobalPointer

  if spec["runtime"]:
    runtime.configure()
  L, H, mode = spec["L"], spec["H"], spec["mode"]
  width = spec["width"] if mode == "banded" else None
  block_size = None if mode == "dense" else spec["block_size"]
  implementation = "pallas" if mode == "pallas" else "auto"
  head = GlobalPointer(spec["D"], H, head_size=spec["d"], max_span_width=width, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(head)
  rng = np.random.default_rng(0)
  hidden_BLD = jnp.asarray(rng.normal(size=(1, L, spec["D"])), jnp.float32)
  mask_BL = jnp.ones((1, L), jnp.int32)
  starts = rng.integers(0, L - spec["width"], size=(1, H, 8))
  ends = starts + rng.integers(0, spec["width"], size=starts.shape)
  span_ids_BHK = jnp.asarray(starts * L + ends, jnp.int32)

  @jax.jit
  def step(params, hidden_BLD, mask_BL, span_ids_BHK):
    def loss_fn(p):
      return nnx.merge(graphdef, p).span_loss(hidden_BLD, mask_BL, span_ids=span_ids_BHK, block_size=block_size,
                                              implementation=implementation)

    return jax.value_and_grad(loss_fn)(params)

  call = lambda: jax.block_until_ready(step(params, hidden_BLD, mask_BL, span_ids_BHK))  # noqa: E731
  start = time.perf_counter()
  loss, _ = call()
  first = time.perf_counter() - start
  seconds = common.median_seconds(call, spec["iters"] if first < 20 else 1)
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
  stats = jax.devices()[0].memory_stats() or {}  # None on CPU
  peak_gib = stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else rss_gib
  return {"seconds": seconds, "first_call_s": first, "rss_gib": rss_gib, "peak_gib": peak_gib, "loss": float(loss)}


def run_shape(spec: dict) -> dict:
  proc = subprocess.run([sys.executable, "-m", "benchmarks.head_scaling", "--child", json.dumps(spec)],
                        capture_output=True, text=True, cwd=common.ROOT)
  if proc.returncode:
    return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(rounds: list[dict] | None, key: str, f: str) -> str:
  """Median over the rounds that ran (failed ones counted), or why none ran."""
  if rounds is None:
    return "-"
  ran = [r[key] for r in rounds if key in r]
  if not ran:
    return rounds[0].get("skipped", "failed")
  failed = len(rounds) - len(ran)
  return format(common.Spread(ran).median, f) + (f" ({failed} round(s) failed)" if failed else "")


def mode_runner(args, H: int, L: int, mode: str):
  """A callable running one round of `mode` at (H, L) in a child (or skipping it); logs each round to stderr."""
  rounds_done = itertools.count(1)

  def run() -> dict:
    est_gib = H * L * L * DENSE_BYTES_PER_CELL / 2**30
    if mode == "dense" and est_gib > args.max_dense_gib:
      r = {"skipped": f"skipped (~{est_gib:.0f} GiB)"}
    else:
      r = run_shape(dict(L=L, H=H, mode=mode, width=args.width, block_size=args.block_size, D=args.hidden,
                         d=args.head_size, iters=args.iters, runtime=args.runtime))
    print(f"# H={H} L={L} {mode} round {next(rounds_done)}, load {os.getloadavg()[0]:.2f}: {json.dumps(r)}",
          file=sys.stderr, flush=True)
    return r

  return run


RATIOS = (("seconds", "dense", "blockwise"), ("seconds", "dense", "banded"), ("peak_gib", "dense", "blockwise"),
          ("seconds", "blockwise", "pallas"), ("peak_gib", "blockwise", "pallas"))


def table_row(H: int, L: int, runs: dict[str, list[dict]], idle: str) -> str:
  """Times, peak memory, and per-round ratios (median [min..max]) of one shape."""
  cells = [fmt(runs.get(m), "seconds", ".3f") for m in MODES] + [fmt(runs.get(m), "peak_gib", ".2f") for m in MODES]
  for key, num, den in RATIOS:
    if num in runs and den in runs:
      rounds = common.Rounds({m: [r.get(key) for r in runs[m]] for m in (num, den)})
      cells.append(rounds.ratio(num, den).fmt(".1f"))
    else:
      cells.append("-")
  return f"| {H} | {L} | " + " | ".join(cells) + f" | {idle} |"


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192", help="comma list of sequence lengths L")
  parser.add_argument("--types", default="10,50", help="comma list of entity type counts H")
  parser.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma list from {MODES}")
  parser.add_argument("--width", type=int, default=64, help="max_span_width W of the banded mode")
  parser.add_argument("--block_size", type=int, default=128, help="tile rows (and columns) of the blockwise op")
  parser.add_argument("--hidden", type=int, default=384, help="hidden size D")
  parser.add_argument("--head_size", type=int, default=64, help="head size d")
  parser.add_argument("--iters", type=int, default=3, help="timed steps per shape (median); 1 when a step > 20 s")
  parser.add_argument("--rounds", type=int, default=1, help="alternating rounds of the modes per shape")
  parser.add_argument("--no-runtime", dest="runtime", action="store_false",
                      help="leave gp_jax.runtime.configure() out of the children")
  parser.add_argument("--max_dense_gib", type=float, default=12.0, help="skip dense shapes estimated above this")
  parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(run_child(json.loads(args.child))))
    return

  lengths = [int(x) for x in args.lengths.split(",")]
  types = [int(x) for x in args.types.split(",")]
  modes = [m for m in args.modes.split(",") if m]
  results = {}
  for H in types:
    for L in lengths:
      watch = common.LoadWatch()
      runs = common.in_rounds({m: mode_runner(args, H, L, m) for m in modes}, args.rounds, watch)
      results[(H, L)] = runs, watch.readout()

  print(common.machine_line("head_scaling"))
  print(f"GlobalPointer D={args.hidden} d={args.head_size} B=1, span loss forward+backward (jit), "
        f"block_size={args.block_size}, banded W={args.width}, runtime settings {'on' if args.runtime else 'off'}, "
        f"{args.rounds} round(s); seconds/step (median), peak GiB (device where reported, else RSS)\n")
  print("| H | L | " + " | ".join([f"{m} s" for m in MODES] + [f"{m} GiB" for m in MODES]
                                  + [f"{n}/{d} {'time' if k == 'seconds' else 'memory'}" for k, n, d in RATIOS])
        + " | load, steal |")
  print("|---" * (3 + 2 * len(MODES) + len(RATIOS)) + "|")
  for H in types:
    for L in lengths:
      print(table_row(H, L, *results[(H, L)]))


if __name__ == "__main__":
  main()
