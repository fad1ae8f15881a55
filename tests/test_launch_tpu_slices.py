"""launch.tpu create / run --slices / --hosts_per_point=1 / watch: exact commands, worker script, watch decisions."""

import subprocess

from launch import tpu, tpu_commands


def test_create_four_spot_v4_8_slices_exact(capsys):
  assert tpu.main(["create", "--tpu=gp", "--zone=us-central2-b", "--accelerator_type=v4-8", "--spot", "--slices=4",
                   "--dry_run"]) == 0
  assert capsys.readouterr().out.splitlines() == [
      f"gcloud compute tpus queued-resources create gp-{i} --node-id=gp-{i} --zone=us-central2-b "
      "--accelerator-type=v4-8 --runtime-version=tpu-ubuntu2204-base --spot" for i in range(4)]


def test_create_v5e_reserved_runtime():
  assert tpu_commands.create_command("v5", zone="z", project="p", accelerator_type="v5litepod-16",
                                     runtime_version=tpu_commands.default_runtime("v5litepod-16"), reserved=True) == [
      "gcloud", "compute", "tpus", "queued-resources", "create", "v5", "--node-id=v5", "--zone=z", "--project=p",
      "--accelerator-type=v5litepod-16", "--runtime-version=v2-alpha-tpuv5-lite", "--reserved"]


def test_delete_describe_and_watch_decisions():
  assert tpu_commands.delete_command("gp-1", zone="z", project=None) == [
      "gcloud", "compute", "tpus", "queued-resources", "delete", "gp-1", "--zone=z", "--force", "--quiet"]
  assert tpu_commands.describe_command("gp-1", zone="z", project=None)[-1] == "--format=value(state.state)"
  assert tpu_commands.watch_actions("SUSPENDED", spot=True) == ["recreate"]
  assert tpu_commands.watch_actions(None, spot=True) == ["recreate"]
  assert tpu_commands.watch_actions("ACTIVE", spot=True) == ["start"]
  assert tpu_commands.watch_actions("WAITING_FOR_RESOURCES", spot=True) == []


def test_worker_script_per_host_env_and_restart_loop(tmp_path):
  s = tpu_commands.worker_script(sha="abc", slice_name="gp", config="experiments/synthetic.py:quick",
                                 workdir="gs://b/r", extra=["--config.seed=1"], hosts_per_point="1",
                                 accelerator_type="v4-32")
  for line in ("export TPU_SKIP_MDS_QUERY=1", "export TPU_ACCELERATOR_TYPE=v4-8", "export TPU_HOST_BOUNDS=1,1,1",
               "export TPU_CHIPS_PER_HOST_BOUNDS=2,2,1", "export TPU_WORKER_HOSTNAMES=localhost",
               "export TPU_WORKER_ID=0",
               '  .venv/bin/python -m launch.worker --config=experiments/synthetic.py:quick --workdir=gs://b/r '
               '"--name=$NAME" -- --config.seed=1 >>logs/worker.log 2>&1 &'):
    assert line in s.splitlines(), line
  assert "--multihost" not in s
  every = tpu_commands.worker_script(sha="abc", slice_name="gp", config="e.py", workdir="gs://b/r")
  assert "TPU_SKIP_MDS_QUERY" not in every and '"--name=$NAME" --multihost >>logs/worker.log' in every
  path = tmp_path / "w.sh"
  path.write_text(s)
  assert subprocess.run(["bash", "-n", str(path)]).returncode == 0


def _watch_dry_run(tmp_path, capsys, *flags) -> str:
  """One `watch --dry_run` pass over spot v4-8 slices of the synthetic sweep; its output."""
  args = ["watch", "--tpu=gp", "--zone=z", "--accelerator_type=v4-8", "--spot", *flags,
          "--config=experiments/synthetic.py", f"--workdir={tmp_path}", "--dry_run"]
  assert tpu.main(args) == 0
  return capsys.readouterr().out


def test_watch_dry_run_recreates_a_suspended_spot_slice(tmp_path, capsys):
  out = _watch_dry_run(tmp_path, capsys, "--slices=2", "--assume_state=SUSPENDED")
  assert "gp-0: state SUSPENDED; 2 points left; actions: recreate" in out
  assert ("(dry run) + gcloud compute tpus queued-resources delete gp-1 --zone=z --force --quiet" in out)
  assert ("(dry run) + gcloud compute tpus queued-resources create gp-1 --node-id=gp-1 --zone=z "
          "--accelerator-type=v4-8 --runtime-version=tpu-ubuntu2204-base --spot") in out


def test_watch_restarts_workers_with_the_runs_python(tmp_path, capsys):
  out = _watch_dry_run(tmp_path, capsys, "--python=~/gp_venv/bin/python", "--assume_state=ACTIVE")
  assert "gp: state ACTIVE; 2 points left; actions: start" in out
  assert "&& \"$HOME\"/gp_venv/bin/python -m pip install -q" in out and "uv venv" not in out
