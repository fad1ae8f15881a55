"""Trains and evaluates GlobalPointer NER.

  python -m gp_jax.main --config=experiments/msra_scratch.py[:ARG] --workdir=DIR [--config.KEY=VALUE ...]

DIR may be local or gs://; a DIR holding a checkpoint is resumed.
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from gp_jax import runtime, train
from gp_jax.configs.args import check_override_keys

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (get_config(arg)).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory (local or gs://) for checkpoints, logs and results; "
                               "resumes if it holds a checkpoint.")
flags.mark_flags_as_required(["config", "workdir"])


def parse_flags(argv):
  try:
    return flags.FLAGS(argv)
  except (KeyError, AttributeError, flags.IllegalFlagValueError) as e:
    message = check_override_keys(argv)
    print(f"error: {message or e}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  del argv
  runtime.configure()  # process-level settings (malloc) before anything is allocated
  train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  app.run(main, flags_parser=parse_flags)
