"""A/B of the MSRA main job's train step: two builds of the same step in one process, timed in alternating pairs.

Variants (the main job's model and step, `experiments/msra_scratch.py`, built by `benchmarks.inputs.ProjectStep`):
  threefry   JAX's rolled CPU threefry lowering (a while loop) vs the unrolled one `gp_jax.runtime` registers
  conv_impl  the scratch encoder's conv as "unfold" (k shifted copies + one matmul) vs "xla" (lax.conv)
  linear     Linear layers through `lax.dot_general` on `[B, L, K]` ("nested") vs `ops.flat_dot_general` ("flat")
  qkv        BERT attention's q, k, v as three matmuls ("separate") vs one `[D, 3D]` matmul
             (`models.layers.fused_linear`, "fused"), on all-MiniLM-L6-v2 + GlobalPointer (`--model`, like
             benchmarks.train_step; `--lengths` are then sequence lengths at batch `--batch`)

Each pair runs `--steps` steps of A, then of B, on the same synthetic batch (B32, rows of random length in
[L/2, L]); the ratio A/B of the median step times is taken per pair (`benchmarks.common.alternate`); prints
the median ratio over `--pairs` with its min..max, both variants' last losses (equal when the variants compute
the same bits), and the load average and CPU steal over the pairs.

  python -m benchmarks.step_variants --variant threefry --lengths 32,64,96
  python -m benchmarks.step_variants --variant conv_impl
  python -m benchmarks.step_variants --variant linear
  python -m benchmarks.step_variants --variant qkv --lengths 128 --batch 16
"""

from __future__ import annotations

import argparse

import jax

from benchmarks import common
from benchmarks.inputs import (MSRA_TYPES, ProjectStep, bert_config, bert_inputs, encoder_source, msra_config,
                               msra_inputs, synthetic_batch)
from gp_jax import ops, runtime

VARIANTS = {"threefry": ("rolled", "unrolled"), "conv_impl": ("unfold", "xla"), "linear": ("nested", "flat"),
            "qkv": ("separate", "fused")}


def build_bert(value: str, seq_lengths, *, batch: int, model: str):
  """A ProjectStep of benchmarks.train_step's BERT + GlobalPointer with q/k/v `value` ("separate" | "fused")."""
  from gp_jax.models import layers  # pylint: disable=g-import-not-at-top

  hf, pretrained = encoder_source(model, 0)
  config, types = bert_config(10, 64)
  config.batch_size = batch
  tokenizer, feats = bert_inputs(hf)
  fused = layers.fused_linear
  if value == "separate":
    layers.fused_linear = lambda x, parts: [part(x) for part in parts]  # traced when the step compiles
  try:
    step = ProjectStep(config, tokenizer, types, **({} if pretrained else {"load_weights": False,
                                                                        "encoder_config": hf}))
    batches = {}
    for L in seq_lengths:
      b = synthetic_batch(batch=batch, seq=L, num_types=len(types), num_prefix=1, num_suffix=1, features=feats)
      batches[L] = step.device_batch(b)
      for _ in range(2):  # compile + warm up
        step.step(batches[L])
  finally:
    layers.fused_linear = fused
  return step, batches


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
  p.add_argument("--batch", type=int, default=16, help="qkv: batch size (the main job's variants use B32)")
  p.add_argument("--model", choices=("minilm", "bert-base"), default="minilm", help="qkv: the encoder")
  args = p.parse_args(argv)
  settings = runtime.configure()
  lengths = [int(x) for x in args.lengths.split(",")]
  a_name, b_name = VARIANTS[args.variant]
  start = common.LoadWatch()
  print(common.machine_line("step_variants"))
  print(f"runtime={settings}; variant {args.variant}: A={a_name} B={b_name}", flush=True)
  if args.variant == "qkv":
    a, a_batches = build_bert(a_name, lengths, batch=args.batch, model=args.model)
    b, b_batches = build_bert(b_name, lengths, batch=args.batch, model=args.model)
  else:
    a, a_batches = build(args.variant, a_name, lengths)
    b, b_batches = build(args.variant, b_name, lengths)
  batch = args.batch if args.variant == "qkv" else 32
  runtime.configure_threefry()  # back to the process default for anything compiled later
  for L in lengths:
    rounds = common.alternate({a_name: lambda: a.step(a_batches[L]), b_name: lambda: b.step(b_batches[L])},
                              rounds=args.pairs, calls=args.steps)
    ms = {name: rounds.spread(name).median * 1e3 for name in (a_name, b_name)}
    la, lb = float(a.step(a_batches[L])["loss"]), float(b.step(b_batches[L])["loss"])
    print(f"B{batch}xL{L}: {a_name} {ms[a_name]:.1f} ms, {b_name} {ms[b_name]:.1f} ms per step; "
          f"{a_name}/{b_name} median {rounds.ratio(a_name, b_name).fmt('.3f', '')} over {args.pairs} pairs; "
          f"last losses {la:.7f} / {lb:.7f} ({'equal' if la == lb else 'differ'}); {rounds.watch.readout()}",
          flush=True)
  print(f"whole run: {start.readout()}")


if __name__ == "__main__":
  main()
