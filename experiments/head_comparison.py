"""GlobalPointer vs Efficient GlobalPointer vs the CRF and softmax tagger baselines, same encoder and data.

Su reports GP at CRF's F1 on flat data, above it on nested data, with 1.22-1.56x CRF's training speed.
  dataset=msra          MSRA, scratch char CNN, 2 epochs (flat)
  dataset=germeval2014  GermEval 2014, scratch char CNN, 2 epochs (nested: the taggers keep the outer level)
  dataset=cluener2020   CLUENER, scratch, 10 epochs, dev only
  dataset=conll2003     CoNLL-2003, MiniLM-L6
Settings are those of experiments/rope_ablation.py, so the span-head runs are shared with that study
(RoPE on); RoPE does not apply to taggers.
  python -m launch.local --config=experiments/head_comparison.py:dataset=germeval2014 --workdir=runs/study
"""

from experiments import rope_ablation


def get_config(arg=None):
  return rope_ablation.get_config(arg)


def get_sweep(arg=None):
  from gp_jax.configs import base

  seeds = rope_ablation.SEEDS.get(base.parsed_arg(arg).dataset, (0,))
  # Seed-major; the span-head points are the same runs (same folders) as rope_ablation's RoPE-on points.
  return [{"config.model.use_rope": True, "config.model.head": h, "config.seed": s} if h in ("standard", "efficient")
          else {"config.model.head": h, "config.seed": s}
          for s in seeds for h in ("standard", "efficient", "crf", "softmax")]
