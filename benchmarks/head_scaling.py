"""Span head scaling: GlobalPointer span loss forward+backward, dense vs blockwise vs banded.

GlobalPointer(D=384, d=64), B=1, random hidden states, 8 gold spans per type (width < W), gradients
w.r.t. the head parameters, jitted; compile excluded. Each shape runs in its own subprocess and
reports its peak RSS (`ru_maxrss` in the child, which includes the Python + JAX baseline).
  dense:     `head.span_loss(..., block_size=None)` ([B, H, L, L] logits, full triangle)
  blockwise: `head.span_loss(..., block_size=bs)` (upper-triangle tiles, no max_span_width)
  banded:    the same with `max_span_width=W` (only j - i < W; a different, narrower mask)
Dense shapes whose estimated peak exceeds --max_dense_gib are skipped (marked in the table).
Children call `gp_jax.runtime.configure()` as `gp_jax.main` does (`--no-runtime`: leave it out).
`--rounds N` runs the modes of a shape N times in alternation (dense, blockwise, banded, dense, ...);
times are medians over rounds and each ratio is the median of the per-round ratios, with min..max.

  python benchmarks/head_scaling.py [--lengths 512,1024,2048,4096,8192 --types 10,50 --width 64]
  python benchmarks/head_scaling.py --lengths 8192 --types 10 --rounds 3
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # run from a checkout
import argparse
import json
import resource
import statistics
import subprocess
import time

MODES = ("dense", "blockwise", "banded")
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
      return nnx.merge(graphdef, p).span_loss(hidden_BLD, mask_BL, span_ids=span_ids_BHK, block_size=block_size)

    return jax.value_and_grad(loss_fn)(params)

  start = time.perf_counter()
  jax.block_until_ready(step(params, hidden_BLD, mask_BL, span_ids_BHK))
  first = time.perf_counter() - start
  times = []
  for _ in range(spec["iters"] if first < 20 else 1):
    start = time.perf_counter()
    loss, _ = jax.block_until_ready(step(params, hidden_BLD, mask_BL, span_ids_BHK))
    times.append(time.perf_counter() - start)
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux
  return {"seconds": float(np.median(times)), "first_call_s": first, "rss_gib": rss_gib, "loss": float(loss)}


def run_shape(spec: dict) -> dict:
  proc = subprocess.run(
      [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], capture_output=True, text=True
  )
  if proc.returncode:
    return {"error": (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]}
  return json.loads(proc.stdout.strip().splitlines()[-1])


def fmt(r: dict | None, key: str, f: str) -> str:
  if r is None:
    return "-"
  if "skipped" in r:
    return r["skipped"]
  if "error" in r:
    return "failed"
  failed = f" ({r['failed_rounds']} round(s) failed)" if r.get("failed_rounds") else ""
  return format(r[key], f) + failed


def ratio(dense: dict | None, other: dict | None, key: str) -> str:
  """Median over rounds where both ran of dense/other, with min..max."""
  if not dense or not other or key not in dense or key not in other:
    return "-"
  a_rounds = dense.get(f"{key}_rounds", [dense[key]])
  b_rounds = other.get(f"{key}_rounds", [other[key]])
  per_round = [a / b for a, b in zip(a_rounds, b_rounds) if a is not None and b is not None]
  if not per_round:
    return "-"
  text = f"{statistics.median(per_round):.1f}x"
  return text + (f" [{min(per_round):.1f}..{max(per_round):.1f}]" if len(per_round) > 1 else "")


def merge_rounds(rounds: list[dict]) -> dict:
  """Per-round results of one shape and mode -> medians over the rounds that ran, per-round lists kept
  (None for a failed round); the first failure if none ran."""
  ran = ["error" not in r and "skipped" not in r for r in rounds]
  if not any(ran):
    return rounds[0]
  out = dict(rounds[ran.index(True)], failed_rounds=ran.count(False))
  for key in ("seconds", "rss_gib"):
    out[f"{key}_rounds"] = [r[key] if ok else None for r, ok in zip(rounds, ran)]
    out[key] = statistics.median([r[key] for r, ok in zip(rounds, ran) if ok])
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--lengths", default="512,1024,2048,4096,8192", help="comma list of sequence lengths L")
  parser.add_argument("--types", default="10,50", help="comma list of entity type counts H")
  parser.add_argument("--modes", default=",".join(MODES), help=f"comma list from {MODES}")
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
      rounds = {mode: [] for mode in modes}
      for k in range(args.rounds):
        for mode in modes:
          est_gib = H * L * L * DENSE_BYTES_PER_CELL / 2**30
          if mode == "dense" and est_gib > args.max_dense_gib:
            r = {"skipped": f"skipped (~{est_gib:.0f} GiB)"}
          else:
            spec = dict(L=L, H=H, mode=mode, width=args.width, block_size=args.block_size, D=args.hidden,
                        d=args.head_size, iters=args.iters, runtime=args.runtime)
            r = run_shape(spec)
          rounds[mode].append(r)
          print(f"# H={H} L={L} {mode} round {k + 1}, load {os.getloadavg()[0]:.2f}: {json.dumps(r)}",
                file=sys.stderr, flush=True)
      for mode in modes:
        results[(H, L, mode)] = merge_rounds(rounds[mode])

  print(f"GlobalPointer D={args.hidden} d={args.head_size} B=1, span loss forward+backward (jit), "
        f"block_size={args.block_size}, banded W={args.width}, runtime settings {'on' if args.runtime else 'off'}, "
        f"{args.rounds} round(s); seconds/step (median), peak RSS GiB\n")
  print("| H | L | dense s | blockwise s | banded s | dense GiB | blockwise GiB | banded GiB "
        "| dense/blockwise time | dense/banded time | dense/blockwise RSS |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for H in types:
    for L in lengths:
      d, b, w = (results.get((H, L, m)) for m in MODES)
      print(f"| {H} | {L} | {fmt(d, 'seconds', '.3f')} | {fmt(b, 'seconds', '.3f')} | {fmt(w, 'seconds', '.3f')} "
            f"| {fmt(d, 'rss_gib', '.2f')} | {fmt(b, 'rss_gib', '.2f')} | {fmt(w, 'rss_gib', '.2f')} "
            f"| {ratio(d, b, 'seconds')} | {ratio(d, w, 'seconds')} | {ratio(d, b, 'rss_gib')} |")


if __name__ == "__main__":
  main()
