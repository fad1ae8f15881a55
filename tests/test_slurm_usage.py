"""launch.slurm's usage errors, in-process and without a cluster: submit's numbers and --time, --only, a mistyped
--workdir for status and cancel."""

import argparse
import shutil

import pytest

from gp_jax.errors import UserError
from launch import slurm

SUBMIT = ["submit", "--config=experiments/synthetic.py:quick", "--nocheck", "--dry_run"]


def _usage_error(capsys, argv) -> str:
  """The one stderr line of a usage error (exit 2, no traceback)."""
  assert slurm.main(argv) == 2
  err = capsys.readouterr().err
  assert len(err.splitlines()) == 1 and err.startswith("error: "), err
  return err.strip()


REFUSED = {  # flag: what the error line starts with
    "--max_parallel=-3": "--max_parallel=-3: expected a count >= 1",
    "--max_parallel=0": "--max_parallel=0: expected a count >= 1",
    "--nodes_per_point=0": "--nodes_per_point=0: expected a count >= 1",
    "--gpus_per_node=-1": "--gpus_per_node=-1: expected a count >= 0",
    "--tasks_per_node=-2": "--tasks_per_node=-2: expected a count >= 0",
    "--cpus_per_task=-4": "--cpus_per_task=-4: expected a count >= 0",
    "--signal_s=-5": "--signal_s=-5: expected seconds >= 1",
    "--max_failures=0": "--max_failures=0: expected a count >= 1",
    "--time=banana": "--time=banana: expected one of SLURM's forms: minutes, minutes:seconds, hours:minutes:seconds, "
        "days-hours, days-hours:minutes, days-hours:minutes:seconds",
    "--time=1:2:3:4": "--time=1:2:3:4: expected one of SLURM's forms",
    "--time=24h": "--time=24h: expected one of SLURM's forms",
    "--only=seed=(": "--only 'seed=(' is not a regular expression: missing ), unterminated subpattern",
    "--only=seed=7": "no point matches --only 'seed=7' (2 points: quick/head=standard, quick/head=efficient)"}


@pytest.mark.parametrize("flag", list(REFUSED))
def test_submit_refuses_bad_numbers_times_and_only(tmp_path, capsys, flag):
  """--time=banana --max_parallel=-3 wrote `#SBATCH --array=0-1%-3` and `#SBATCH --time=banana`, exit 0."""
  err = _usage_error(capsys, [*SUBMIT, f"--workdir={tmp_path / 'sweep'}", flag])
  assert err.startswith(f"error: {REFUSED[flag]}"), err
  assert not (tmp_path / "sweep").exists()  # nothing written, not even the dry run's script


def test_slurm_time_forms_and_no_max_parallel_pass(tmp_path, capsys, monkeypatch):
  ok = dict(nodes_per_point=1, gpus_per_node=0, tasks_per_node=0, cpus_per_task=0, max_parallel=None, signal_s=300,
            max_failures=3)
  for time in ("", "90", "90:30", "24:00:00", "1-12", "1-12:30", "1-12:30:15", "0", "INFINITE", "unlimited"):
    slurm.check_numbers(argparse.Namespace(time=time, **ok))
  with pytest.raises(UserError, match="--time=1-:30"):
    slurm.check_numbers(argparse.Namespace(time="1-:30", **ok))
  # No --max_parallel: no limit on the array.
  monkeypatch.setattr(shutil, "which", lambda name: None)  # no `sbatch --test-only`
  assert slurm.main([*SUBMIT, f"--workdir={tmp_path}", "--time=1-12"]) == 0
  out = capsys.readouterr().out
  assert "#SBATCH --array=0-1\n" in out and "#SBATCH --time=1-12\n" in out


def test_status_and_cancel_of_a_mistyped_workdir(tmp_path, capsys):
  """status --workdir=/tmp/nope printed "(no points ...)" and exit 0."""
  nope = tmp_path / "nope"
  for command in ("status", "cancel"):
    assert _usage_error(capsys, [command, f"--workdir={nope}"]) == (
        f"error: --workdir={nope}: no such folder (the sweep root given to submit)")
  assert not nope.exists()
  assert _usage_error(capsys, ["cancel", f"--workdir={tmp_path}", "--only=("]).startswith(
      "error: --only '(' is not a regular expression")
  # A sweep root with nothing in it yet keeps its answer.
  assert slurm.main(["status", f"--workdir={tmp_path}"]) == 0
  assert "(no points: nothing submitted" in capsys.readouterr().out
