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

Two more harnesses of the span head, named by a first word (`python -m benchmarks.head_scaling WORD --help`):

speed: training and prediction speed of the span heads (GP, EGP) against the tagger baselines (CRF, softmax), same
encoder, same data, same process: the speed side of Su's GlobalPointer-vs-CRF table. Each round times every head in
turn on the same batches (`benchmarks.common.alternate`, so load drifts hit all heads alike): train tokens/s over
--steps training steps (`gp_jax.steps.make_train_step`, after one compile pass over every bucket) and predict
sentences/s over --predict_records records (Evaluator: device decode + window merge). Ratios to CRF are per round;
the median and the min..max over rounds are printed, with the load average and CPU steal over the rounds.

  python -m benchmarks.head_scaling speed                              # MSRA, scratch encoder (main job settings)
  python -m benchmarks.head_scaling speed --config=experiments/head_comparison.py:dataset=germeval2014 --rounds=5

tpu_tiles: the largest tile of the Pallas ZLPR kernel that compiles for one chip of each TPU generation, and its
compiled cost. Compiles (no TPU needed: libtpu beside jax, `jax.experimental.topologies`) the loss + gradient w.r.t.
q and k of `blockwise_zlpr_loss(..., implementation="pallas")` at B 1, `--length`, `--types`, d 64, bf16 q/k, per
generation and head (per-type q/k, or one shared q/k head with start/end biases), trying tiles 1024, 512, 256, 128
and keeping the first that compiles; prints one line per attempt (compile seconds, GFLOP and GB from
`cost_analysis()`, or the error's first line). `pallas_zlpr.TPU_MAX_TILE` holds the result
(docs/benchmarks/span_head.md). Needs the `aot` extra (libtpu); another process holding libtpu is allowed
(ALLOW_MULTIPLE_LIBTPU_LOAD).

  python -m benchmarks.head_scaling tpu_tiles [--generations v4,v5e,v5p,v6e] [--heads per_type,shared] [--json FILE]

This module imports no JAX at the top: the scaling parent only starts children, and tpu_tiles sets JAX_PLATFORMS
before JAX reads it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import subprocess
import sys
import time

import numpy as np

from benchmarks import common
from gp_jax import runtime
from gp_jax.configs import args as args_lib
from gp_jax.data import batching

# Deferred imports below: jax and whatever imports it (flax, gp_jax's models, ops, evaluate, factory and sharding,
# benchmarks.inputs), for the reason the docstring ends with.

MODES = ("dense", "blockwise", "banded", "pallas")
DEFAULT_MODES = ("dense", "blockwise", "banded")
DENSE_BYTES_PER_CELL = 4 * 3.2  # float32 logits + ~2 more [B, H, L, L] buffers in the backward pass
TAGGERS = ("crf", "softmax")  # speed: heads trained on tag sequences
TPU_TOPOLOGIES = {"v4": "v4:1x1x1", "v5e": "v5e:1x1", "v5p": "v5p:1x1x1", "v6e": "v6e:1x1"}
TPU_ACCELERATOR_TYPES = {"v4": "v4-8", "v5e": "v5litepod-1", "v5p": "v5p-8", "v6e": "v6e-1"}  # for libtpu's start
TPU_TILES = (1024, 512, 256, 128)


def run_child(spec: dict) -> dict:
  """Times one shape in this process; returns seconds per step and peak RSS."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from gp_jax.models import GlobalPointer

  if spec["runtime"]:
    runtime.configure()
  else:
    runtime.configure_start_up()  # JAX's other defaults, but libtpu unstarted on a CPU and its lines unprinted
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
    lines = proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"]
    raised = [ln for ln in lines if re.match(r"[\w.]+(Error|Exception|Exit)\b", ln)]
    return {"error": (raised or lines)[-1][:300]}
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


# ----------------------------------------------------------------------------- speed: span heads vs taggers


def load_experiment(path: str):
  """The experiment file at `path` as a module (gp_jax.configs.args.load_experiment)."""
  return args_lib.load_experiment(path)


def head_fns(config, tokenizer, types, mesh, head: str, batches, dev) -> dict:
  """{"train/HEAD": run every batch, "predict/HEAD": predict `dev`}, both compiled for every bucket."""
  import jax

  from benchmarks.inputs import ProjectStep
  from gp_jax.evaluate import Evaluator

  c = config.copy_and_resolve_references()
  c.model.head = head
  ours = ProjectStep(c, tokenizer, types, mesh=mesh)
  ev = Evaluator(ours.setup, batch_size=config.eval_batch_size, progress=False)

  def train():
    for b in batches:
      ours.state, metrics = ours.step_fn(ours.state, b)
    jax.block_until_ready(metrics)

  def predict():
    ev.predict(ours.state["params"], dev)

  train()
  predict()
  return {f"train/{head}": train, f"predict/{head}": predict}


def speed_main(argv) -> None:
  import jax

  from gp_jax import sharding as shd
  from gp_jax.evaluate import model_batch
  from gp_jax.factory import prepare_data

  p = argparse.ArgumentParser(prog="python -m benchmarks.head_scaling speed",
                              description="span heads vs taggers, train and predict speed (see head_scaling --help)")
  p.add_argument("--config", default="experiments/head_comparison.py:dataset=msra", help="experiment[:arg]")
  p.add_argument("--heads", default="standard,efficient,crf,softmax", help="comma list of model.head values")
  p.add_argument("--steps", type=int, default=40, help="timed training steps per head and round")
  p.add_argument("--predict_records", type=int, default=1000, help="dev records predicted per head and round")
  p.add_argument("--rounds", type=int, default=3, help="alternating rounds over the heads")
  p.add_argument("--train_records", type=int, default=4000, help="training records to build batches from")
  args = p.parse_args(argv)
  runtime.configure_start_up()  # libtpu unstarted on a CPU, and its lines unprinted

  path, _, arg = args.config.partition(":")
  config = load_experiment(path).get_config(arg or None)
  config.data.max_train_records = args.train_records
  config.data.max_eval_records = args.predict_records
  splits, tokenizer, types = prepare_data(config)
  dev = splits.get("dev") or splits.get("test")
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  heads = args.heads.split(",")
  batches = {}
  for tagged in (False, True):
    it = batching.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets, seed=0,
                                tag_scheme=config.model.tag_scheme if tagged else None)
    batches[tagged] = [shd.global_batch(model_batch(next(it)), mesh) for _ in range(args.steps)]
  tokens = sum(int(b["attention_mask"].sum()) for b in batches[False])

  print(common.machine_line("head_speed"))
  fns = {}
  for head in heads:
    fns.update(head_fns(config, tokenizer, types, mesh, head, batches[head in TAGGERS], dev))
  rounds = common.alternate(fns, rounds=args.rounds)

  print(f"config={args.config} B={config.batch_size} steps={args.steps} ({tokens} real tokens) "
        f"predict={dev.num_records} records rounds={args.rounds}; {rounds.watch.readout()}")
  print("| head | train tokens/s (median) | train / CRF (median, min..max) | predict sent/s (median) | "
        "predict / CRF (median, min..max) |")
  print("|---|---|---|---|---|")
  for head in heads:
    row = [head]
    for kind, count in (("train", tokens), ("predict", dev.num_records)):
      row.append(f"{count / rounds.spread(f'{kind}/{head}').median:,.0f}")
      row.append(rounds.ratio(f"{kind}/crf", f"{kind}/{head}").fmt() if "crf" in heads else "-")
    print("| " + " | ".join(row) + " |")


# ----------------------------------------------------------------------------- tpu_tiles: Pallas tiles per TPU


def try_tile(devices, *, head: str, tile: int, B: int, L: int, H: int, d: int = 64) -> dict:
  """Compiles the Pallas ZLPR loss + gradient at one tile for one TPU chip; -> ok, seconds, GFLOP, GB or error."""
  import jax
  import jax.numpy as jnp
  from jax.sharding import NamedSharding, PartitionSpec as P

  from gp_jax.ops import blockwise_zlpr_loss

  one = NamedSharding(jax.sharding.Mesh(np.array(devices[:1]), ("x",)), P())
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
  Hq = 1 if head == "shared" else H
  args = [sds((B, L, Hq, d), jnp.bfloat16)] * 2 + [sds((B, H, L), jnp.int32), sds((B, L), jnp.int32)]
  if head == "shared":
    args += [sds((B, H, L), jnp.float32)] * 2

  def loss_grad(q, k, ids, mask, sb=None, eb=None):
    return jax.value_and_grad(lambda q, k: blockwise_zlpr_loss(
        q, k, span_ids=ids, attention_mask=mask, start_bias_BHL=sb, end_bias_BHL=eb, block_size=tile,
        implementation="pallas"), argnums=(0, 1))(q, k)

  start = time.perf_counter()
  try:
    compiled = jax.jit(loss_grad).lower(*args).compile()
  except Exception as e:  # pylint: disable=broad-except
    return {"ok": False, "s": round(time.perf_counter() - start, 1),
            "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {"ok": True, "s": round(time.perf_counter() - start, 1), "gflop": round(cost.get("flops", 0) / 1e9, 2),
          "gbytes": round(cost.get("bytes accessed", 0) / 1e9, 3)}


def tpu_tiles_main(argv) -> None:
  p = argparse.ArgumentParser(prog="python -m benchmarks.head_scaling tpu_tiles",
                              description="the largest Pallas ZLPR tile per TPU generation (see head_scaling --help)")
  p.add_argument("--generations", default=",".join(TPU_TOPOLOGIES))
  p.add_argument("--heads", default="per_type,shared")
  p.add_argument("--length", type=int, default=4096)
  p.add_argument("--types", type=int, default=50)
  p.add_argument("--json", default="", help="also write the attempts here")
  args = p.parse_args(argv)
  os.environ["JAX_PLATFORMS"] = "cpu"
  generations = args.generations.split(",")
  for key, value in runtime.libtpu_compile_only_env(TPU_ACCELERATOR_TYPES[generations[0]]).items():
    os.environ.setdefault(key, value)  # the user's settings win; libtpu reads them once, at its start
  from jax.experimental import topologies

  out = {}
  for gen in generations:
    topo = topologies.get_topology_desc(platform="tpu", topology_name=TPU_TOPOLOGIES[gen], chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    for head in args.heads.split(","):
      for tile in TPU_TILES:
        row = try_tile(topo.devices, head=head, tile=tile, B=1, L=args.length, H=args.types)
        out[f"{gen} {head} {tile}"] = row
        print(gen, head, tile, row, flush=True)
        if row["ok"]:
          break
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


# ----------------------------------------------------------------------------- main


SUBCOMMANDS = {"speed": speed_main, "tpu_tiles": tpu_tiles_main}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else list(argv)
  if argv and argv[0] in SUBCOMMANDS:
    return SUBCOMMANDS[argv[0]](argv[1:])
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
  if min(lengths) <= args.width:
    parser.error(f"--lengths {min(lengths)}: every length must exceed --width={args.width} (the gold spans start in "
                 "[0, L - W) and are narrower than W)")
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
  errors = sorted({f"H={H} L={L} {m}: {r['error']}" for (H, L), (runs, _) in results.items()
                   for m, rounds in runs.items() for r in rounds or () if "error" in r})
  if errors:
    print("\nfailed (each child's error):\n" + "\n".join(f"- {e}" for e in errors))


if __name__ == "__main__":
  main()
