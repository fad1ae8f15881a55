"""Nested NER at convergence: GermEval 2014, GP and EGP with and without RoPE, and the CRF tagger, seeds 0-2.

Settings are those of the GermEval runs of experiments/rope_ablation.py and head_comparison.py (scratch char
CNN, hidden 128, 4 layers, batch 32, max_len 128), but each run trains until dev F1 has not improved for
2 epochs, with a cap of 12 epochs (results.json records epochs, stopped_early and dev_history).
  python -m launch.local --config=experiments/nested_study.py --workdir=runs/nested
"""

from experiments import rope_ablation
from gp_jax.configs import base

SEEDS = (0, 1, 2)
MAX_EPOCHS = 12.0  # cap on training length; the linear LR decay is spread over it
PATIENCE = 2  # epochs without a dev F1 gain before stopping


def get_config(arg=None):
  if base.parsed_arg(arg, dataset="germeval2014").dataset != "germeval2014":
    raise ValueError("nested_study runs on dataset=germeval2014 only")
  # The arg comes last, so e.g. `epochs=4` or `quick` in it still wins.
  c = rope_ablation.get_config(",".join(filter(None, ["dataset=germeval2014", f"epochs={MAX_EPOCHS}", arg])))
  c.early_stop_patience = PATIENCE
  return c


def get_sweep(arg=None):
  del arg
  # Seed-major; per seed: GP and EGP with RoPE on and off, then the CRF tagger (no RoPE key, as head_comparison).
  return [p for s in SEEDS for p in (
      [{"config.model.use_rope": rope, "config.model.head": head, "config.seed": s}
       for head in ("standard", "efficient") for rope in (True, False)]
      + [{"config.model.head": "crf", "config.seed": s}])]
