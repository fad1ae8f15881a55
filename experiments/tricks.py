"""The training tricks GlobalPointer users combine it with (issue 33), as ablations: plain, EMA, FGM, FGM + EMA, PGD.

GlobalPointer (standard head, RoPE on) with the study's scratch settings, those of experiments/rope_ablation.py
(char CNN, hidden 128, 4 layers, batch 32; CLUENER 2020 10 epochs with max_len 64, the checkpoint chosen on a held-out
10% of train and the official dev reported), seeds 0-2, seed-major. MSRA trains to convergence: at most 6 epochs with
early stopping on its dev (carved from its training data; patience 2 epochs), test reported. The tricks' settings are the common public defaults:
  EMA  optimizer.ema_decay = 0.999 with optimizer.ema_warmup (decay min(0.999, (1+t)/(10+t)) at update t, as
       tf.train.ExponentialMovingAverage with num_updates; without it 0.999^3000 = 5% of the random init would
       still be in the weights at the end of MSRA's ~3k steps); evaluation and best/ use the EMA weights
  FGM  adversarial.epsilon = 1.0 on the char + bigram embedding output
  PGD  adversarial.steps = 3, epsilon = 1.0, alpha = 0.3
Every run also tunes the decision threshold on dev (tune_threshold; results.json keeps the F1 at 0 beside it;
the threshold is tuned on the split that chose the checkpoint, never on the reported one).

  python -m launch.local --config=experiments/tricks.py:dataset=msra --workdir=runs/tricks_msra
  python -m launch.local --config=experiments/tricks.py:dataset=cluener2020 --workdir=runs/tricks_cluener2020
  python -m launch.report runs/tricks_msra runs/tricks_cluener2020 --out docs/figures/tricks

Report these runs apart from the RoPE study's: their plain cells repeat seeds of its MSRA and CLUENER GP cells, and
the report refuses two runs of one cell with the same seed. docs/study/tricks_* keep each finished run's
config.json and results.json.
"""

from experiments import rope_ablation
from gp_jax.configs import base
from gp_jax.errors import UserError

DATASETS = ("msra", "cluener2020")
SEEDS = (0, 1, 2)
EMA_DECAY = 0.999
MSRA_MAX_EPOCHS, MSRA_PATIENCE = 6.0, 2
# cell -> (optimizer.ema_decay, adversarial.kind)
CELLS = {"plain": (0.0, "none"), "ema": (EMA_DECAY, "none"), "fgm": (0.0, "fgm"), "fgm_ema": (EMA_DECAY, "fgm"),
         "pgd": (0.0, "pgd")}


def get_config(arg=None):
  dataset = base.parsed_arg(arg).dataset
  if dataset not in DATASETS:
    raise UserError(f"experiments/tricks.py: dataset must be one of {DATASETS}, got {dataset!r}")
  c = rope_ablation.get_config(arg)
  c.model.head = "standard"
  c.model.use_rope = True
  c.adversarial.epsilon = 1.0
  c.adversarial.steps = 3
  c.adversarial.alpha = 0.3
  c.tune_threshold = True
  c.optimizer.ema_warmup = True  # used by the EMA cells only
  if dataset == "msra":
    c.num_epochs = MSRA_MAX_EPOCHS
    c.early_stop_patience = MSRA_PATIENCE
  return c


def get_sweep(arg=None):
  del arg
  return [{"config.optimizer.ema_decay": ema, "config.adversarial.kind": kind, "config.seed": seed}
          for seed in SEEDS for ema, kind in CELLS.values()]
