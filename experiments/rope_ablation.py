"""RoPE on/off in the span head x standard/efficient head x seeds, on four datasets.

The paper's People's Daily collapse (96.25 vs 54.35 dev F1, BERT-base) needs People's Daily's example.train,
which the staged copy lacks (put it in ../shared/data/people_daily; experiments/su2022.py reruns it with his
BERT settings). The study runs on:
  dataset=people_daily  People's Daily 1998 (needs example.train), scratch char CNN, 3 epochs, seeds 0-1
  dataset=msra          MSRA (PyPI copy), scratch char CNN, 2 epochs, seeds 0-4
  dataset=cluener2020   CLUENER 2020, scratch char CNN, 10 epochs, seeds 0-4 (the RoPE rows of GP; the other
                        cells ran seeds 0-2: --only 'seed=[012]|head=standard'); its test split is unlabelled, so the
                        checkpoint is chosen on a held-out 10% of train (data.dev_split=holdout) and the official
                        dev split is reported as the test figure (data.test_split=dev), never the split that chose
  dataset=germeval2014  GermEval 2014 (nested, 2 levels), scratch char CNN, 2 epochs, seed 0
  dataset=conll2003     CoNLL-2003 with MiniLM-L6 (pretrained BERT; closest to the paper), 2 epochs, seeds 0-2
  dataset=synthetic_distance  a DEMONSTRATION, not evidence: generated texts where only the distance between two
                        brackets says which pair is an entity (gp_jax.data.sources.distance_records), a 2-layer
                        char CNN that cannot see from one bracket to the other, 5 epochs, seeds 0-2; the 12 runs
                        take minutes on a 2-core CPU, and without RoPE a span head can at best predict every
                        bracket pair (F1 0.75). It shows the mechanism, not its size on real text
                        (docs/studies/rope_synthetic.md).

  python -m launch.local --config=experiments/rope_ablation.py:dataset=cluener2020 --workdir=runs/rope
  python -m launch.local --config=experiments/rope_ablation.py:dataset=synthetic_distance --workdir=runs/rope \
      --workers=1
"""

from gp_jax.configs import base
from gp_jax.errors import UserError

SYNTHETIC = "synthetic_distance"
# MSRA and CLUENER: 5 seeds, fixed by the power section of docs/studies/rope_heads.md (2026-11-28) before the runs;
# MSRA's seeds 0-1 of 2026-11-22 (no per-record counts) are in docs/study_history/dataset=msra/.
SEEDS = {SYNTHETIC: (0, 1, 2), "msra": (0, 1, 2, 3, 4), "cluener2020": (0, 1, 2, 3, 4), "germeval2014": (0,),
         "conll2003": (0, 1, 2), "people_daily": (0, 1)}
EPOCHS = {"msra": 2.0, "cluener2020": 10.0, "germeval2014": 2.0, "conll2003": 2.0, "people_daily": 3.0}


def get_config(arg=None):
  a = base.parsed_arg(arg)
  encoder = "bert" if a.dataset == "conll2003" else "scratch"
  a = base.parsed_arg(arg, encoder=encoder)
  c = base.get_config(arg, encoder=encoder, _defer_quick=True)
  if a.dataset == SYNTHETIC:
    return base.shrink_if_quick(synthetic_config(c, a), a)
  if a.dataset not in EPOCHS:
    raise UserError(f"experiments/rope_ablation.py: dataset must be one of {sorted([*EPOCHS, SYNTHETIC])}, "
                    f"got {a.dataset!r}")
  c.num_epochs = a.epochs or EPOCHS[a.dataset]
  c.log_every_steps = 200
  c.checkpoint_every_steps = 1000
  if encoder == "scratch":
    c.model.hidden_size = 128
    c.model.num_layers = 4
    c.batch_size = 32
    c.eval_batch_size = 256
    c.data.max_len = 128
    c.data.buckets = (16, 32, 48, 64, 96, 128)
  else:
    c.model.pretrained = a.pretrained  # 'minilm' unless pretrained= says otherwise
    c.batch_size = 32
    c.eval_batch_size = 128
  if a.dataset == "cluener2020":
    c.data.max_len = 64
    c.data.buckets = (16, 32, 48, 64)
    c.data.dev_split = "holdout"  # CLUENER's test is unlabelled: choose the checkpoint on 10% of train ...
    c.data.dev_fraction = 0.1
    c.data.test_split = "dev"  # ... and report the official dev, which chose nothing
  return base.shrink_if_quick(c, a)


def synthetic_config(c, a):
  """synthetic_distance: a 2-layer char CNN (`base.tiny_char_model`), which sees 3 characters left and 4 right of a
  bracket (an entity's brackets are 8-11 apart)."""
  base.tiny_char_model(c)
  c.num_epochs = a.epochs or 5.0
  c.data.synthetic_records = 2000
  c.data.max_len = 64
  c.data.buckets = (64,)  # one compile per step function
  c.batch_size = 32
  c.eval_batch_size = 256
  c.log_every_steps = 50
  c.checkpoint_every_steps = 10_000
  return c


def get_sweep(arg=None):
  dataset = base.parsed_arg(arg).dataset
  # Seed-major: every (head, RoPE) cell gets a first result before any second seed runs.
  return [{"config.model.use_rope": rope, "config.model.head": head, "config.seed": seed}
          for seed in SEEDS.get(dataset, (0,)) for head in ("standard", "efficient") for rope in (True, False)]
