"""The gcloud commands and the workers script `launch.tpu` runs, built as plain data: a dry run prints exactly what a
launch would run, and tests compare them word for word."""

from __future__ import annotations

import os
import shlex

from gp_jax.errors import UserError

from . import module_name

LOG_COPY_EVERY_S = 300  # workers.sh: copy the running worker's log into WORKDIR/_launch/logs this often


# ----------------------------------------------------------------------------- pure command builders


def _where(zone: str, project: str | None) -> list[str]:
  return [f"--zone={zone}"] + ([f"--project={project}"] if project else [])


def scp_command(src: str, tpu: str, dest: str, *, zone: str, project: str | None = None) -> list[str]:
  """gcloud scp of a local file to `dest` (e.g. "~/x.tar.gz") on every worker."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "scp", src, f"{tpu}:{dest}", "--worker=all", *_where(zone, project)]


def ssh_command(tpu: str, command: str, *, zone: str, project: str | None = None) -> list[str]:
  """gcloud ssh running the shell line `command` on every worker."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", tpu, "--worker=all", *_where(zone, project),
          f"--command={command}"]


def sh_path(path: str) -> str:
  """Shell word for a remote path; a leading ~/ becomes "$HOME"/ (it would not expand inside quotes)."""
  if path.startswith("~/"):
    return '"$HOME"/' + shlex.quote(path[2:])
  return shlex.quote(path)


def remote_dir(sha: str) -> str:
  return f"~/gp_jax-{sha}"


def archive_command(ref: str, out: str) -> list[str]:
  return ["git", "archive", "--format=tar.gz", "-o", out, ref]


# ----------------------------------------------------------------------------- queued resources, slices, workers

# Runtime (software) versions by accelerator family (docs/tpu.md): v4 runs tpu-ubuntu2204-base, v5e the v5-lite one.
RUNTIMES = {"v4": "tpu-ubuntu2204-base", "v5litepod": "v2-alpha-tpuv5-lite"}
WORKER_RESTARTS = 5  # a crashed worker (not "nothing left", not preempted) is restarted this many times


def default_runtime(accelerator_type: str) -> str:
  family = accelerator_type.split("-")[0]
  if family not in RUNTIMES:
    raise UserError(f"no default --runtime_version for {accelerator_type}; pass one")
  return RUNTIMES[family]


def slice_names(tpu: str, slices: int) -> list[str]:
  """One queued resource (and node) per slice: NAME, or NAME-0 ... NAME-(N-1) for --slices=N."""
  return [tpu] if slices == 1 else [f"{tpu}-{i}" for i in range(slices)]


def create_command(name: str, *, zone: str, project: str | None, accelerator_type: str, runtime_version: str,
                   spot: bool = False, reserved: bool = False) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", "create", name, f"--node-id={name}",
          *_where(zone, project), f"--accelerator-type={accelerator_type}", f"--runtime-version={runtime_version}",
          *(["--spot"] if spot else []), *(["--reserved"] if reserved else [])]


def delete_command(name: str, *, zone: str, project: str | None) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", "delete", name, *_where(zone, project), "--force",
          "--quiet"]


def describe_command(name: str, *, zone: str, project: str | None) -> list[str]:
  return ["gcloud", "compute", "tpus", "queued-resources", "describe", name, *_where(zone, project),
          "--format=value(state.state)"]


def host_as_slice_env(accelerator_type: str) -> dict[str, str]:
  """libtpu settings that make one host of a multi-host slice its own single-host slice (pytorch/xla#7714).
  UNTESTED on a real TPU (docs/tpu.md)."""
  family = accelerator_type.split("-")[0]
  host_type = {"v4": "v4-8", "v5litepod": "v5litepod-4"}.get(family)
  if host_type is None:
    raise UserError(f"--hosts_per_point=1 knows v4 and v5litepod hosts, not {accelerator_type}")
  return {"TPU_SKIP_MDS_QUERY": "1", "TPU_ACCELERATOR_TYPE": host_type, "TPU_HOST_BOUNDS": "1,1,1",
          "TPU_CHIPS_PER_HOST_BOUNDS": "2,2,1", "TPU_WORKER_HOSTNAMES": "localhost", "TPU_WORKER_ID": "0"}


def install_command(sha: str, python: str | None = None) -> str:
  """Unpack the code and install '.[tpu]' from it: with `python -m pip` when given, else into a fresh Python 3.11
  venv made with uv in the code folder (tpu-ubuntu2204-base has 3.10)."""
  d = remote_dir(sha)
  unpack = f"set -e; mkdir -p {d} && tar -xzf {d}.tar.gz -C {d} && cd {d} && "
  if python:
    return unpack + f"{sh_path(python)} -m pip install -q '.[tpu]'"
  return (unpack + "{ [ -x ~/.local/bin/uv ] || curl -LsSf https://astral.sh/uv/install.sh | sh; } && "
          "rm -rf .venv && ~/.local/bin/uv venv --python 3.11 .venv && ~/.local/bin/uv pip install --python "
          ".venv/bin/python -q '.[tpu]'")


def worker_script(*, sha: str, slice_name: str, config: str, workdir: str, extra=(), hosts_per_point: str = "all",
                  accelerator_type: str = "v4-8", python: str | None = None) -> str:
  """Supervisor started on every host: runs `launch.worker` (with `python`, default the code folder's .venv) until
  nothing is left, restarting it after a crash; copies its log and queue.log into WORKDIR/_launch/logs/ every
  LOG_COPY_EVERY_S seconds and when it exits."""
  per_host = hosts_per_point == "1"
  worker = [module_name("worker"), f"--config={config}", f"--workdir={workdir}"]
  lines = [
      "#!/usr/bin/env bash",
      f"# gp_jax sweep workers, written by launch.tpu: {config}, code {sha}, slice {slice_name}, "
      f"hosts per point: {hosts_per_point}.",
      "set -u",
      'cd "$(dirname "$0")"',
      'exec 9>"$HOME/.gp_jax_queue.lock"',
      'if ! flock -n 9; then echo "another gp_jax queue is running on $(hostname); not starting" >&2; exit 1; fi',
      "echo $$ > queue.pid",
      "W=$(curl -sf --max-time 5 -H Metadata-Flavor:Google "
      "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname)",
      f"NAME={shlex.quote(slice_name)}-w$W",
      f"LOGS={shlex.quote(workdir.rstrip('/') + '/_launch/logs')}",
      f"COPY_EVERY={LOG_COPY_EVERY_S}",
      "mkdir -p logs",
  ]
  if per_host:
    lines.append("# Each host is its own slice and its own worker (pytorch/xla#7714; untested on a real TPU).")
    lines += [f"export {k}={shlex.quote(v)}" for k, v in host_as_slice_env(accelerator_type).items()]
  lines += [
      "copy_logs() {",
      '  case "$LOGS" in',
      '    gs://*) gcloud storage cp -q logs/worker.log "$LOGS/$NAME.log" >/dev/null 2>&1;'
      ' gcloud storage cp -q queue.log "$LOGS/$NAME-queue.log" >/dev/null 2>&1 ;;',
      '    *) mkdir -p "$LOGS" && cp logs/worker.log "$LOGS/$NAME.log" && cp queue.log "$LOGS/$NAME-queue.log" ;;',
      "  esac",
      "}",
      "child=",
      'trap \'[ -n "$child" ] && kill -TERM "$child" 2>/dev/null\' TERM INT',
      "tries=0",
      "while :; do",
      '  echo "worker $NAME starting $(date -u +%FT%TZ)"',
      f"  {sh_path(python) if python else '.venv/bin/python'} -m "
      + shlex.join([*worker, "--name=$NAME"]).replace("'--name=$NAME'", '"--name=$NAME"')
      + ("" if per_host else " --multihost")
      + (" -- " + shlex.join(list(extra)) if extra else "") + " >>logs/worker.log 2>&1 &",
      "  child=$!",
      "  ( trap 'kill $s 2>/dev/null; exit 0' TERM",
      '    while :; do sleep "$COPY_EVERY" & s=$!; wait $s; copy_logs; done ) >/dev/null 2>&1 &',
      "  copier=$!",
      "  wait $child; rc=$?",
      '  while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done  # a trapped signal ends wait early',
      "  child=",
      '  kill "$copier" 2>/dev/null; wait "$copier" 2>/dev/null',
      '  echo "worker $NAME exit $rc $(date -u +%FT%TZ)"',
      "  copy_logs",
      "  case $rc in 0|10) echo \"nothing left\"; break ;; 3) echo preempted; break ;; esac",
      "  tries=$((tries + 1))",
      f'  if [ "$tries" -ge {WORKER_RESTARTS} ]; then echo "giving up after $tries crashes"; break; fi',
      "  sleep 10",
      "done",
      "copy_logs",
      "",
  ]
  return "\n".join(lines)


def worker_start_command(sha: str) -> str:
  d = remote_dir(sha)
  return f"cd {d} && nohup setsid bash workers.sh > {d}/queue.log 2>&1 < /dev/null &"


def worker_running_command(sha: str) -> str:
  """Exit 0 when the workers' supervisor runs on this host."""
  d = remote_dir(sha)
  return f"kill -0 $(cat {d}/queue.pid 2>/dev/null) 2>/dev/null"


def start_workers_commands(*, name, zone, project, sha, tarball, script_file, python=None) -> list[list[str]]:
  """Ship the code, install it (`install_command`), ship workers.sh, start it detached (on every host of `name`)."""
  d = remote_dir(sha)
  return [
      scp_command(tarball, name, f"{d}.tar.gz", zone=zone, project=project),
      ssh_command(name, install_command(sha, python), zone=zone, project=project),
      scp_command(script_file, name, f"{d}/workers.sh", zone=zone, project=project),
      ssh_command(name, worker_start_command(sha), zone=zone, project=project),
  ]


def watch_actions(state: str | None, *, spot: bool) -> list[str]:
  """What `watch` does for a queued resource in `state` (None: gone): a list of 'recreate', 'start'."""
  if state is None or state in ("SUSPENDED", "FAILED") or (state == "SUSPENDING" and spot):
    return ["recreate"]
  if state == "ACTIVE":
    return ["start"]
  return []  # ACCEPTED, PROVISIONING, WAITING_FOR_RESOURCES, CREATING, DELETING: wait


# ----------------------------------------------------------------------------- a launch's plan


def _rel_config(config: str, repo: str) -> str:
  path, colon, arg = config.partition(":")
  rel = os.path.relpath(os.path.abspath(path), repo)
  if rel.startswith(".."):
    raise UserError(f"--config {path} is outside the repository {repo}; only files in the repo are shipped")
  return rel.replace(os.sep, "/") + colon + arg


def worker_plan(args, repo: str, sha: str, tmp: str) -> tuple[list[list[str]], dict[str, str]]:
  """(commands, {script file: text}) that ship the code and start the workers on every slice."""
  tarball = os.path.join(tmp, f"gp_jax-{sha}.tar.gz")
  commands, scripts = [archive_command(args.ref, tarball)], {}
  for name in slice_names(args.tpu, args.slices):
    script_file = os.path.join(tmp, f"workers-{name}.sh")
    scripts[script_file] = worker_script(sha=sha, slice_name=name, config=_rel_config(args.config, repo),
                                         workdir=args.workdir, extra=args.extra, hosts_per_point=args.hosts_per_point,
                                         accelerator_type=args.accelerator_type, python=args.python)
    commands += start_workers_commands(name=name, zone=args.zone, project=args.project, sha=sha, tarball=tarball,
                                       script_file=script_file, python=args.python)
  return commands, scripts
