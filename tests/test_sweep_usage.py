"""A sweep as the launchers build it, given what a user gets wrong: a flag after `--` that overrides a swept key, a
get_sweep that returns strings, a workdir that is a file, a head name the run would refuse, a bad `:arg` or key for
launch.compile, an experiment outside the repository for launch.tpu. Each is one line, exit 2, nothing run."""

import os
import subprocess
import sys
import textwrap

import pytest

from gp_jax.errors import UserError
from launch import local, points, sweep, tpu

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNTHETIC = os.path.join(REPO, "experiments", "synthetic.py")  # sweeps config.model.head: standard, efficient


def _experiment(folder, body: str) -> str:
  path = os.path.join(folder, "exp.py")
  with open(path, "w") as f:
    f.write(textwrap.dedent(body))
  return path


def test_a_flag_that_overrides_a_swept_key_is_refused(tmp_path, capsys):
  """The flag came after each point's own: every folder named head=standard or head=efficient ran the efficient head,
  and launch.report counted the two as two seeds of each."""
  root = str(tmp_path / "runs")
  says = ("--config.model.head is swept by {}'s points (efficient, standard): a flag after '--' would set it in every "
          "point while each keeps its swept name; drop the flag or the key from get_sweep")
  with pytest.raises(UserError) as e:
    sweep.expand(f"{SYNTHETIC}:quick", root, extra=["--config.num_epochs=1", "--config.model.head=efficient"])
  assert str(e.value) == says.format(SYNTHETIC)
  assert local.main([f"--config={SYNTHETIC}:quick", f"--workdir={root}", "--dry_run", "--",
                     "--config.model.head=efficient"]) == 2
  assert capsys.readouterr().err.splitlines() == ["error: " + says.format(SYNTHETIC)]
  assert not os.path.exists(root)
  # Keys the points do not sweep pass; launch.compile (no run folders) compiles the override and reports it itself.
  assert len(sweep.expand(f"{SYNTHETIC}:quick", root, extra=["--config.num_epochs=1"])) == 2
  built = points.sweep_points(f"{SYNTHETIC}:quick", extra=["--config.model.head=efficient"])
  assert [p.config.model.head for p in built] == ["efficient", "efficient"]
  assert sweep.swept_overrides(SYNTHETIC, [{"config.seed": 0}], ["--config.model.head=crf"]) is None


def test_sweep_entries_that_are_not_dicts_are_one_line(tmp_path, capsys):
  exp = _experiment(tmp_path, """
      from experiments import synthetic
      get_config = synthetic.get_config
      def get_sweep(arg=None):
        return ["config.seed=1"]
      """)
  assert local.main([f"--config={exp}", f"--workdir={tmp_path / 'runs'}", "--dry_run"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"error: {exp}: get_sweep(None) entry 0 is str 'config.seed=1'; expected a dict of 'config.key': value"]


def test_a_workdir_that_is_a_file_is_one_line(tmp_path, capsys):
  afile = tmp_path / "afile"
  afile.write_text("")
  assert local.main([f"--config={SYNTHETIC}:quick", f"--workdir={afile}", "--dry_run"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"error: --workdir {afile} is a file; expected a folder (the sweep's root) or a path not yet made"]


def test_the_dry_run_refuses_a_head_the_run_would_refuse(tmp_path, capsys):
  """The dry run passed model.head=nosuchhead; the run then failed at its first model build."""
  exp = _experiment(tmp_path, """
      from experiments import synthetic
      get_config = synthetic.get_config
      def get_sweep(arg=None):
        return [{"config.model.head": h} for h in ("standard", "nosuchhead")]
      """)
  assert local.main([f"--config={exp}:quick", f"--workdir={tmp_path / 'runs'}", "--dry_run"]) == 2
  err = capsys.readouterr().err.splitlines()
  assert err == ["error: quick/head=nosuchhead: model.head='nosuchhead': expected one of standard, efficient, softmax, "
                 "crf"], err


def test_compile_points_that_do_not_build_are_one_line(tmp_path):
  with pytest.raises(UserError, match=r"^quick,nosuch=1/head=standard: unknown config arg 'nosuch'; known: "):
    points.sweep_points(f"{SYNTHETIC}:quick,nosuch=1")
  exp = _experiment(tmp_path, """
      from experiments import synthetic
      get_config = synthetic.get_config
      def get_sweep(arg=None):
        return [{"config.model.use_ropee": False}]
      """)
  with pytest.raises(UserError, match=r"^quick/use_ropee=False: unknown config key 'model.use_ropee' .*closest: "
                                      r"model.use_rope"):
    points.sweep_points(f"{exp}:quick")
  with pytest.raises(UserError, match=r"^--points \[5\] out of range: the sweep has 2 points"):
    points.sweep_points(f"{SYNTHETIC}:quick", points="5")


@pytest.mark.e2e  # launch.compile in its own process (it turns this process's compilation cache off)
def test_compile_exits_2_on_a_refused_experiment_with_one_line(tmp_path):
  out = subprocess.run([sys.executable, "-m", "launch.compile", f"--config={SYNTHETIC}:quick,nosuch=1",
                        "--accelerator_type=v5litepod-8"], cwd=REPO, capture_output=True, text=True, timeout=300)
  assert out.returncode == 2 and out.stdout == "", out.stdout + out.stderr
  assert out.stderr.splitlines() == ["error: quick,nosuch=1/head=standard: unknown config arg 'nosuch'; known: "
                                     "dataset, dtype, encoder, epochs, head, pretrained, quick, rope, seed"]


def test_tpu_run_refuses_an_experiment_outside_the_repository(tmp_path, capsys):
  exp = _experiment(tmp_path, "from experiments.synthetic import get_config, get_sweep\n")
  rc = tpu.main(["run", "--tpu=pod", "--zone=z", f"--config={exp}:quick", "--workdir=gs://b/r", "--dry_run",
                 "--nopreflight"])
  assert rc == 2
  assert capsys.readouterr().err.splitlines()[-1] == (
      f"error: --config {exp} is outside the repository {REPO}; only files in the repo are shipped")


def test_a_launcher_names_a_point_once_and_groups_a_shared_reason(tmp_path, capsys):
  """load_config's reason ended in "(point NAME)": launch.compile's and the dry runs' lines, which name the point
  themselves, named it twice, and points sharing an unknown key each had a reason of their own (a line each)."""
  exp = _experiment(tmp_path, """
      from experiments import synthetic
      get_config = synthetic.get_config
      def get_sweep(arg=None):
        return [{"config.seed": s, "config.model.use_ropee": False} for s in range(3)]
      """)
  says = ("unknown config key 'model.use_ropee' in '--config.model.use_ropee=False'; closest: model.use_rope, "
          "model.pointer_rope, model.embed_dropout")
  with pytest.raises(UserError) as e:
    points.sweep_points(f"{exp}:quick", points="1")
  assert str(e.value) == f"quick/seed=1,use_ropee=False: {says}"
  assert local.main([f"--config={exp}:quick", f"--workdir={tmp_path / 'runs'}", "--dry_run"]) == 2
  assert capsys.readouterr().err.splitlines() == [
      f"error: 3 points (quick/seed=0,use_ropee=False, quick/seed=1,use_ropee=False, quick/seed=2,use_ropee=False): "
      f"{says}"]
