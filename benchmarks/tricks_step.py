"""Step time of the training tricks (issue 33): plain, EMA, FGM, FGM + EMA and PGD train steps, in alternating rounds.

The study's config (`experiments/tricks.py`, dataset=msra: scratch char CNN, hidden 128, 4 layers, batch 32, GP
with RoPE) with the main job's vocabulary sizes, on a synthetic batch per padded length (rows of random length in
[L/2, L]); each variant is `gp_jax.steps.make_train_step` as training builds it (`benchmarks.inputs.ProjectStep`).
Per round every variant runs `--steps` steps (median taken); prints per length the median ms per step over the
rounds with its min..max, and each variant's time over plain's, median [min..max] of the per-round ratios.

  python -m benchmarks.tricks_step --lengths 32,64,96
  python -m benchmarks.tricks_step --tiny   # a few seconds: checks that it runs
"""

from __future__ import annotations

import argparse

from benchmarks import common
from benchmarks.inputs import MSRA_TYPES, ProjectStep, msra_inputs, synthetic_batch
from gp_jax import runtime

# variant -> config overrides (experiments/tricks.py's settings for each trick)
VARIANTS = {"plain": {}, "ema": {"optimizer.ema_decay": 0.999}, "fgm": {"adversarial.kind": "fgm"},
            "fgm+ema": {"adversarial.kind": "fgm", "optimizer.ema_decay": 0.999}, "pgd": {"adversarial.kind": "pgd"}}


def study_config(tiny: bool):
  from experiments import tricks  # pylint: disable=g-import-not-at-top

  c = tricks.get_config("dataset=msra")
  if tiny:
    c.model.hidden_size, c.model.num_layers, c.batch_size = 32, 1, 8
  return c


def build(name: str, lengths, tiny: bool):
  """ProjectStep of variant `name` and its device batch per length, compiled and warmed up."""
  config = study_config(tiny)
  for key, value in VARIANTS[name].items():
    group, field = key.split(".")
    config[group][field] = value
  tokenizer, feats = msra_inputs()
  step = ProjectStep(config, tokenizer, list(MSRA_TYPES))
  batches = {}
  for L in lengths:
    batches[L] = step.device_batch(synthetic_batch(batch=config.batch_size, seq=L, num_types=len(MSRA_TYPES),
                                                   features=feats, min_len=L // 2, spans_per_row=2))
    for _ in range(2):
      step.step(batches[L])
  return step, batches


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--lengths", default="32,64,96", help="comma list of padded lengths (the study's buckets)")
  p.add_argument("--rounds", type=int, default=6, help="alternating rounds (every variant once per round)")
  p.add_argument("--steps", type=int, default=5, help="timed steps per variant and round (median taken)")
  p.add_argument("--tiny", action="store_true", help="hidden 32, 1 layer, batch 8, length 16, 2 rounds of 2 steps")
  args = p.parse_args(argv)
  if args.tiny:
    args.lengths, args.rounds, args.steps = "16", 2, 2
  settings = runtime.configure()
  lengths = [int(x) for x in args.lengths.split(",")]
  print(common.machine_line("tricks_step"))
  print(f"runtime={settings}; variants {', '.join(VARIANTS)}{' (tiny)' if args.tiny else ''}", flush=True)
  built = {name: build(name, lengths, args.tiny) for name in VARIANTS}
  for L in lengths:
    rounds = common.alternate({name: (lambda s=s, b=b: s.step(b[L])) for name, (s, b) in built.items()},
                              rounds=args.rounds, calls=args.steps)
    ms = {name: common.Spread([v * 1e3 for v in rounds.spread(name).values]) for name in VARIANTS}
    times = ", ".join(f"{name} {ms[name].fmt('.1f', ' ms')}" for name in VARIANTS)
    ratios = ", ".join(f"{name} {rounds.ratio(name, 'plain').fmt()}" for name in VARIANTS if name != "plain")
    print(f"B{built['plain'][0].config.batch_size}xL{L}: {times}; over plain: {ratios}; {rounds.watch.readout()}",
          flush=True)


if __name__ == "__main__":
  main()
