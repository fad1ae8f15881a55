"""Test-only entry point: `gp_jax.main` plus injected faults (never part of the user's config).

  python -m tests.fault_main --config=... --workdir=... [--sigkill_after_checkpoint_step=N] [--config.k=v ...]
"""

import os
import signal

from absl import app, flags

from gp_jax import main as gp_main
from gp_jax import train

_KILL = flags.DEFINE_integer("sigkill_after_checkpoint_step", 0, "SIGKILL this process once the resume "
                             "checkpoint of this step is on disk (0 = never).")


def main(argv):
  del argv

  def after_checkpoint(step):
    if _KILL.value and step == _KILL.value:
      os.kill(os.getpid(), signal.SIGKILL)

  train.train_and_evaluate(gp_main._CONFIG.value, gp_main._WORKDIR.value,
                           hooks=train.TrainHooks(after_checkpoint=after_checkpoint))


if __name__ == "__main__":
  app.run(main, flags_parser=gp_main.parse_flags)
