"""Launching sweeps: sweep.py (points and run folders), local.py (this machine), worker.py (lease-based workers),
tpu.py (TPU slices; tpu_commands.py), slurm.py (SLURM job arrays; slurm_script.py: the sbatch script it submits and
the report job after the array; slurm_task.py: what runs in a task), compile.py (every point compiled for its slice
first; compiler.py, points.py, failures.py, accelerators.py), report/ (tables and figures).

Installed by `pip install` as the package `gp_jax_launch` (pyproject.toml maps this folder to it), with the console
scripts gp-jax-local, gp-jax-worker, gp-jax-report, gp-jax-compile, gp-jax-tpu and gp-jax-slurm; from the repository
root it is also `launch` (`python -m launch.local ...`). Modules import each other relatively and name their own
package (`__name__` here) where they start one another, so either name works throughout.
"""

from __future__ import annotations

import functools
import os
import sys

from gp_jax.errors import UserError

SCRIPT_PREFIX = "gp-jax-"  # console scripts: gp-jax-<module> (pyproject.toml [project.scripts])


def module_name(module: str) -> str:
  """The importable name of this package's `module` ("worker" -> "launch.worker" or "gp_jax_launch.worker")."""
  return f"{__name__}.{module}"


def command(module: str) -> str:
  """How to run `module`'s CLI, for messages: `python -m PACKAGE.module`."""
  return f"python -m {module_name(module)}"


def prog(module: str) -> str:
  """The program name a CLI's usage line shows: the console script it was started as, else `python -m ...`."""
  script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
  return script if script.startswith(SCRIPT_PREFIX) else command(module)


def user_errors_exit_2(main):
  """A CLI's main that prints a gp_jax UserError (a missing experiment file, a sweep it refuses) as one line on
  stderr and returns 2."""

  @functools.wraps(main)
  def wrapped(argv=None):
    try:
      return main(argv)
    except UserError as e:
      print(f"error: {e}", file=sys.stderr, flush=True)
      return 2

  return wrapped
