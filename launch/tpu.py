"""Runs an experiment's sweep on a Cloud TPU VM pod slice, detached, and shows its progress.

  python -m launch.tpu run --tpu=NAME --zone=ZONE [--project=P] [--ref=HEAD] \\
      --config=experiments/rope_ablation.py[:ARG] --workdir=gs://BUCKET/runs/rope [--dry_run] [-- --config.k=v ...]
  python -m launch.tpu status --workdir=gs://BUCKET/runs/rope [--config=experiments/rope_ablation.py[:ARG]]

`run` does, with gcloud (`--dry_run` prints every command and the queue script, and runs nothing):
  1. git archive --format=tar.gz REF  (the committed code at REF; uncommitted edits are NOT shipped)
  2. scp it to every worker as ~/gp_jax-<sha>.tar.gz; ssh --worker=all: unpack into ~/gp_jax-<sha>,
     `PYTHON -m pip install -q '.[tpu]'` there (--python, default python3; gp_jax needs >= 3.11 and
     tpu-ubuntu2204-base has 3.10: make a venv once per slice, see docs/tpu.md)
  3. scp a queue script (every sweep point once) to ~/gp_jax-<sha>/queue.sh on every worker
  4. ssh --worker=all: `nohup setsid bash queue.sh ... &`, so a dropped ssh session does not stop it.
Every worker runs the same `PYTHON -m gp_jax.main ... --config.multihost=True` per point (jax.distributed
finds the pod by itself). Points whose results.json says "finished" are skipped, so rerunning the same
`run` command after a preemption or a failure resumes the rest from their checkpoints. Each point's
output is logged on the worker and copied into its workdir as launch-w<worker>.log (every 5 minutes and
at the end). Only one queue runs per worker at a time (a lock in ~/.gp_jax_queue.lock).

`status` reads each point's results.json (or its last metrics.jsonl line) and prints point, status, step
and dev F1; with --config it also lists the points that have not started. See docs/tpu.md.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import tempfile

from launch import sweep

LOG_COPY_EVERY_S = 300  # queue script: copy the running point's log into its workdir this often


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


def install_command(sha: str, python: str = "python3") -> str:
  d = remote_dir(sha)
  return (f"set -e; mkdir -p {d} && tar -xzf {d}.tar.gz -C {d} && cd {d} && "
          f"{sh_path(python)} -m pip install -q '.[tpu]'")


def start_command(sha: str) -> str:
  d = remote_dir(sha)
  return f"cd {d} && nohup setsid bash queue.sh > {d}/queue.log 2>&1 < /dev/null &"


def queue_script(runs: list[sweep.Run], *, sha: str, config: str, python: str = "python3") -> str:
  """Bash script running every point in turn; the same file runs on every worker (see module doc)."""
  lines = [
      "#!/usr/bin/env bash",
      f"# gp_jax sweep queue, written by launch.tpu: {config}, {len(runs)} points, code {sha}.",
      "# Started on every worker with: nohup setsid bash queue.sh > queue.log 2>&1 &",
      "# Stop it (each run saves a checkpoint): kill -TERM -- -$(cat queue.pid)",
      "set -u",
      'cd "$(dirname "$0")"',
      'exec 9>"$HOME/.gp_jax_queue.lock"',
      'if ! flock -n 9; then echo "another gp_jax queue is running on $(hostname); not starting" >&2; exit 1; fi',
      "echo $$ > queue.pid",
      f"PY={sh_path(python)}",
      f"COPY_EVERY={LOG_COPY_EVERY_S}",
      # TPU VMs publish their worker number in the metadata server; the host name is the fallback.
      "W=$(curl -sf --max-time 5 -H Metadata-Flavor:Google "
      "http://metadata.google.internal/computeMetadata/v1/instance/attributes/agent-worker-number || hostname)",
      "mkdir -p logs",
      "stop=0",
      "child=",
      'trap \'stop=1; [ -n "$child" ] && kill -TERM "$child" 2>/dev/null\' TERM INT',
      "",
      "copy_log() {  # $1 local log, $2 point workdir",
      '  case "$2" in',
      '    gs://*) gcloud storage cp -q "$1" "$2/launch-w$W.log" >/dev/null 2>&1 ;;',
      '    *) mkdir -p "$2" && cp "$1" "$2/launch-w$W.log" ;;',
      "  esac",
      "}",
      "",
      "run_point() {  # $1 index, $2 name, $3 workdir, then the command",
      '  local i=$1 name=$2 workdir=$3 log="logs/point$1.log"',
      "  shift 3",
      '  if [ "$stop" = 1 ]; then return; fi',
      '  if "$PY" -m launch.sweep finished "$workdir"; then',
      f'    echo "[$i/{len(runs)}] $name: finished already, skipping"; return',
      "  fi",
      f'  echo "[$i/{len(runs)}] $name: starting $(date -u +%FT%TZ)"',
      '  "$@" >>"$log" 2>&1 &',
      "  child=$!",
      "  ( trap 'kill $s 2>/dev/null; exit 0' TERM",
      '    while :; do sleep "$COPY_EVERY" & s=$!; wait $s; copy_log "$log" "$workdir"; done ) >/dev/null 2>&1 &',
      "  local copier=$!",
      '  wait "$child"; local rc=$?',
      '  while kill -0 "$child" 2>/dev/null; do wait "$child"; rc=$?; done  # a trapped signal ends wait early',
      "  child=",
      '  kill "$copier" 2>/dev/null; wait "$copier" 2>/dev/null',
      '  copy_log "$log" "$workdir"',
      f'  echo "[$i/{len(runs)}] $name: exit $rc $(date -u +%FT%TZ)"',
      "}",
      "",
  ]
  for i, run in enumerate(runs, 1):  # run.argv[0] is the Python: "$PY" instead, so a ~/venv path still expands
    lines.append(shlex.join(["run_point", str(i), run.name, run.workdir]) + ' "$PY" ' + shlex.join(run.argv[1:]))
  lines += ["", 'echo "queue done (stop=$stop) $(date -u +%FT%TZ)"', ""]
  return "\n".join(lines)


def git_sha(ref: str, repo: str) -> str:
  return subprocess.run(["git", "rev-parse", "--short=12", f"{ref}^{{commit}}"], cwd=repo, check=True,
                        capture_output=True, text=True).stdout.strip()


def archive_command(ref: str, out: str) -> list[str]:
  return ["git", "archive", "--format=tar.gz", "-o", out, ref]


def run_commands(*, tpu, zone, project, sha, tarball, queue_file, python="python3") -> list[list[str]]:
  """The four gcloud commands of `run`: ship code, install, ship the queue, start it detached."""
  d = remote_dir(sha)
  return [
      scp_command(tarball, tpu, f"{d}.tar.gz", zone=zone, project=project),
      ssh_command(tpu, install_command(sha, python), zone=zone, project=project),
      scp_command(queue_file, tpu, f"{d}/queue.sh", zone=zone, project=project),
      ssh_command(tpu, start_command(sha), zone=zone, project=project),
  ]


def pod_runs(config: str, workdir: str, extra=(), *, repo: str, python: str = "python3") -> list[sweep.Run]:
  """Sweep points with repo-relative config paths (the workers run from the unpacked repo)."""
  path, colon, arg = config.partition(":")
  rel = os.path.relpath(os.path.abspath(path), repo)
  if rel.startswith(".."):
    raise ValueError(f"--config {path} is outside the repository {repo}; only files in the repo are shipped")
  rel = rel.replace(os.sep, "/")
  return sweep.expand(path + colon + arg, workdir, extra=[*extra, "--config.multihost=True"], python=python,
                      command_config=rel + colon + arg)


# ----------------------------------------------------------------------------- status


def status_rows(workdir: str, config: str | None = None) -> list[dict]:
  """One row per point: name, status, step, dev F1 (from results.json, else the last metrics.jsonl lines)."""
  from etils import epath

  from launch import report

  if config:
    names = [r.name for r in sweep.expand(config, workdir)]
  else:
    names = [rel for rel, _ in report.find_runs(workdir)]
  rows = []
  for name in names:
    point = epath.Path(sweep.join(workdir, name))
    status, results = sweep.run_status(str(point))
    step = dev_f1 = None
    if results is not None:
      step = results.get("steps")
      dev_f1 = (results.get("dev") or {}).get("f1")
    if step is None or dev_f1 is None:
      last_step, last_dev = report.last_metrics(point)
      step = step if step is not None else last_step
      dev_f1 = dev_f1 if dev_f1 is not None else last_dev
    rows.append({"point": name, "status": "not started" if status == sweep.MISSING else status,
                 "step": step, "dev_f1": dev_f1})
  return rows


def status_table(rows: list[dict]) -> str:
  if not rows:
    return "(no runs found)"
  lines = ["| point | status | step | dev F1 |", "|---|---|---|---|"]
  for r in rows:
    f1 = f"{100 * r['dev_f1']:.2f}" if isinstance(r["dev_f1"], (int, float)) else "-"
    lines.append(f"| {r['point']} | {r['status']} | {r['step'] if r['step'] is not None else '-'} | {f1} |")
  return "\n".join(lines)


# ----------------------------------------------------------------------------- CLI


def _repo_root() -> str:
  return subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                        text=True).stdout.strip()


def cmd_run(args) -> int:
  repo = _repo_root()
  if not args.workdir.startswith("gs://"):
    print(f"WARNING: --workdir={args.workdir} is not gs://: each worker writes to its own disk and "
          "checkpoints written by several hosts will not line up.", file=sys.stderr)
  sha = git_sha(args.ref, repo)
  dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=repo, capture_output=True,
                         text=True).stdout.strip()
  if dirty:
    print(f"WARNING: uncommitted changes are not shipped; workers get {args.ref} ({sha}).", file=sys.stderr)
  runs = pod_runs(args.config, args.workdir, args.extra, repo=repo, python=args.python)
  script = queue_script(runs, sha=sha, config=args.config, python=args.python)
  tmp = tempfile.mkdtemp(prefix="gp_jax_launch_")
  tarball, queue_file = os.path.join(tmp, f"gp_jax-{sha}.tar.gz"), os.path.join(tmp, "queue.sh")
  commands = [archive_command(args.ref, tarball)]
  commands += run_commands(tpu=args.tpu, zone=args.zone, project=args.project, sha=sha, tarball=tarball,
                           queue_file=queue_file, python=args.python)
  print(f"{len(runs)} points, code {args.ref} = {sha}, workers log to {remote_dir(sha)}/queue.log")
  if args.dry_run:
    print(f"--- {queue_file}:\n{script}--- end of {queue_file}")
    for cmd in commands:
      print(shlex.join(cmd), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return 0
  if shutil.which("gcloud") is None:
    print("gcloud not found: install the Google Cloud CLI (https://cloud.google.com/sdk) or use --dry_run",
          file=sys.stderr)
    return 1
  with open(queue_file, "w") as f:
    f.write(script)
  try:
    for cmd in commands:
      print("+ " + shlex.join(cmd), flush=True)
      if subprocess.run(cmd, cwd=repo).returncode != 0:
        print(f"failed: {shlex.join(cmd)}", file=sys.stderr)
        return 1
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(f"Started. Progress: python -m launch.tpu status --workdir={args.workdir} --config={args.config}")
  return 0


def cmd_status(args) -> int:
  print(status_table(status_rows(args.workdir, args.config)))
  return 0


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m launch.tpu", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True, metavar="{run,status}")
  run = sub.add_parser("run", help="ship the code and start the sweep, detached, on every worker",
                       description="Ship REF to every worker of the slice and start the sweep queue, detached. "
                       "Rerun the same command to resume after a preemption (finished points are skipped). "
                       "Details: python -m launch.tpu --help, docs/tpu.md.")
  run.add_argument("--tpu", required=True, help="TPU VM (pod slice) name")
  run.add_argument("--zone", required=True, help="its zone, e.g. us-central2-b")
  run.add_argument("--project", default=None, help="GCP project (default: gcloud's configured one)")
  run.add_argument("--ref", default="HEAD", help="git ref to ship (committed code only; default HEAD)")
  run.add_argument("--config", required=True, help="experiment file in this repo, optionally with ':arg'")
  run.add_argument("--workdir", required=True, help="sweep root, gs://BUCKET/... (every host must see it)")
  run.add_argument("--python", default="python3",
                   help="Python on the workers (>= 3.11), e.g. ~/venv/bin/python; default python3")
  run.add_argument("--dry_run", action="store_true", help="print every command and the queue script; run nothing")
  run.add_argument("extra", nargs="*", help="flags for every run, after '--' (e.g. -- --config.num_epochs=2)")
  run.set_defaults(fn=cmd_run)
  st = sub.add_parser("status", help="table of points: status, step, dev F1 (reads the workdir)",
                      description="Read every point's results.json / metrics.jsonl under --workdir.")
  st.add_argument("--workdir", required=True, help="sweep root (gs:// or local)")
  st.add_argument("--config", default=None, help="experiment[:arg]: also list points not started yet")
  st.set_defaults(fn=cmd_status)
  args = parser.parse_args(argv)
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
