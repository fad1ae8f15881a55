"""Trains and evaluates GlobalPointer NER.

  python -m gp_jax.main --config=experiments/msra_scratch.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]
"""

from absl import app, flags
from ml_collections import config_flags

from gp_jax import train

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, logs and results (resumes if present).")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main)
