"""Test-only entry point: `launch.worker` with one process of the group blind to the sweep's state.

  python -m tests.fault_worker BLIND_PROCESS_ID [launch.worker flags ...]

Starts the worker once a line arrives on stdin (the test's go, once it has prepared the sweep; JAX and the
training code are imported before, meanwhile).
On the process whose --process_id is BLIND_PROCESS_ID every read the worker makes to choose fails: each point
looks unstarted (results.json unreadable), no checkpoint is listed, no config.json matches; and listings of the
points' ckpt/ and best/ folders come back empty. A worker that let each process choose from its own reads would
send that process to another point (launch.worker has process 0 choose and broadcast the choice, resume step and
config check); a checkpoint manager that listed steps on each process would have that one see no best
checkpoint at the final evaluation and save one alone (gp_jax.checkpoint has process 0 list and broadcast).
"""

import os
import sys

from launch import sweep, worker


def blind(root: str) -> None:
  from etils import epath

  sweep.run_status = lambda workdir: (sweep.MISSING, None)
  worker.resume_step = lambda workdir: -1
  worker.config_matches = lambda run, config: (False, "config.json unreadable (injected)")
  cls = type(epath.Path(root))
  iterdir = cls.iterdir

  def blind_iterdir(self):
    if self.name in ("ckpt", "best") and os.fspath(self).startswith(root):
      return iter(())
    return iterdir(self)

  cls.iterdir = blind_iterdir


def main(argv: list[str]) -> int:
  import gp_jax.train  # noqa: F401  (the slow imports, before the go)

  blind_id, *argv = argv
  sys.stdin.readline()
  if f"--process_id={blind_id}" in argv:
    root = next(a.split("=", 1)[1] for a in argv if a.startswith("--workdir="))
    print(f"process {blind_id}: reads of the sweep's state fail (injected)", flush=True)
    blind(root)
  return worker.main(argv)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
