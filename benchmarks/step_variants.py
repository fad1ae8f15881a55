"""A/B of the MSRA main job's train step: two builds of the same step in one process, timed in alternating pairs.

Variants (the main job's model and step, `experiments/msra_scratch.py`, built by `benchmarks.inputs.ProjectStep`):
  threefry   JAX's rolled CPU threefry lowering (a while loop) vs the unrolled one `gp_jax.runtime` registers
  conv_impl  the scratch encoder's conv as "unfold" (k shifted copies + one matmul) vs "xla" (lax.conv)
  linear     Linear layers through `lax.dot_general` on `[B, L, K]` ("nested") vs `ops.flat_dot_general` ("flat")

Each pair runs `--steps` steps of A, then of B, on the same synthetic batch (B32, rows of random length in
[L/2, L]); the ratio A/B of the median step times is taken per pair (`benchmarks.common.alternate`); prints
the median ratio over `--pairs` with its min..max, both variants' last losses (equal when the variants compute
the same bits), and the load average and CPU steal over the pairs.

  python -m benchmarks.step_variants --variant threefry --lengths 32,64,96
  python -m benchmarks.step_variants --variant conv_impl
  python -m benchmarks.step_variants --variant linear
"""

from __future__ import annotations

import argparse

import jax

from benchmarks import common
from benchmarks.inputs import MSRA_TYPES, ProjectStep, msra_config, msra_inputs, synthetic_batch
from gp_jax import ops, runtime

VARIANTS = {"threefry": ("rolled", "unrolled"), "conv_impl": ("unfold", "xla"), "linear": ("nested", "flat")}


def build(variant: str, value: str, seq_lengths):
  """A ProjectStep of the main job's config with `variant` set to `value`, compiled for every length."""
  config = msra_config()
  if variant == "threefry":
    if not runtime.set_threefry_lowering(value):
      raise SystemExit("this JAX has no threefry lowering to switch")
  elif variant == "conv_impl":
    config.model.conv_impl = value
  tokenizer, feats = msra_inputs()
  flat = ops.flat_dot_general
  if variant == "linear" and value == "nested":
    ops.flat_dot_general = jax.lax.dot_general  # `models.layers.linear` reads it per layer built
  try:
    step = ProjectStep(config, tokenizer, list(MSRA_TYPES))
  finally:
    ops.flat_dot_general = flat
  batches = {}
  for L in seq_lengths:
    batch = synthetic_batch(batch=config.batch_size, seq=L, num_types=len(MSRA_TYPES), features=feats,
                            min_len=L // 2, spans_per_row=2)
    batches[L] = step.device_batch(batch)
    for _ in range(3):  # compile + warm up
      step.step(batches[L])
  return step, batches


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--variant", choices=sorted(VARIANTS), default="threefry", help="what differs between A and B")
  p.add_argument("--lengths", default="32,64,96", help="comma list of padded lengths (main-job buckets)")
  p.add_argument("--pairs", type=int, default=6, help="alternating A/B pairs per length")
  p.add_argument("--steps", type=int, default=6, help="timed steps per variant and pair (median taken)")
  args = p.parse_args(argv)
  settings = runtime.configure()
  lengths = [int(x) for x in args.lengths.split(",")]
  a_name, b_name = VARIANTS[args.variant]
  start = common.LoadWatch()
  print(common.machine_line("step_variants"))
  print(f"runtime={settings}; variant {args.variant}: A={a_name} B={b_name}", flush=True)
  a, a_batches = build(args.variant, a_name, lengths)
  b, b_batches = build(args.variant, b_name, lengths)
  runtime.configure_threefry()  # back to the process default for anything compiled later
  for L in lengths:
    rounds = common.alternate({a_name: lambda: a.step(a_batches[L]), b_name: lambda: b.step(b_batches[L])},
                              rounds=args.pairs, calls=args.steps)
    ms = {name: rounds.spread(name).median * 1e3 for name in (a_name, b_name)}
    la, lb = float(a.step(a_batches[L])["loss"]), float(b.step(b_batches[L])["loss"])
    print(f"B32xL{L}: {a_name} {ms[a_name]:.1f} ms, {b_name} {ms[b_name]:.1f} ms per step; "
          f"{a_name}/{b_name} median {rounds.ratio(a_name, b_name).fmt('.3f', '')} over {args.pairs} pairs; "
          f"last losses {la:.7f} / {lb:.7f} ({'equal' if la == lb else 'differ'}); {rounds.watch.readout()}",
          flush=True)
  print(f"whole run: {start.readout()}")


if __name__ == "__main__":
  main()
