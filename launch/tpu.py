"""Runs an experiment's sweep on Cloud TPU VM slices with lease-based workers, detached, and shows its progress.

  python -m launch.tpu run --tpu=NAME --zone=ZONE [--project=P] [--ref=HEAD] [--slices=N] [--hosts_per_point=all|1] \\
      [--accelerator_type=v4-8] [--python=PATH] --config=experiments/rope_ablation.py[:ARG] \\
      --workdir=gs://BUCKET/runs/rope [--dry_run] [--nopreflight] [-- --config.k=v ...]
  python -m launch.tpu create | watch ...     (queued resources, spot slices: docs/tpu.md section 8)
  python -m launch.tpu status --workdir=gs://BUCKET/runs/rope [--config=experiments/rope_ablation.py[:ARG]]

`run` does, with gcloud, on every slice (`--dry_run` prints every command and the workers scripts, runs nothing):
  1. git archive --format=tar.gz REF  (the committed code at REF; uncommitted edits are NOT shipped)
  2. scp it to every host as ~/gp_jax-<sha>.tar.gz; ssh --worker=all: unpack into ~/gp_jax-<sha> and install
     '.[tpu]' from it: into a fresh Python 3.11 venv there (uv; tpu-ubuntu2204-base has 3.10), or with
     `PYTHON -m pip install` when --python is given
  3. scp workers.sh (a supervisor) to ~/gp_jax-<sha>/workers.sh on every host
  4. ssh --worker=all: `nohup setsid bash workers.sh ... &`, so a dropped ssh session does not stop it.
workers.sh runs `launch.worker` until nothing is left, restarting it after a crash. With --hosts_per_point=all
(default) the hosts of a slice are one worker (`--multihost`: jax.distributed finds the slice by itself) that
trains one point at a time; with 1, every host is its own worker. Workers claim points through leases under
WORKDIR/_launch/, skip points whose results.json says "finished" and resume the others from their checkpoints,
so rerunning the same `run` command after a preemption or a failure finishes the rest. Worker logs are copied
to WORKDIR/_launch/logs/ every 5 minutes and at the end. One supervisor runs per host at a time (a lock in
~/.gp_jax_queue.lock).

Before anything is shipped (and under `--dry_run`), `run` builds every point's config as its worker will (the
experiment's get_config, the --config.k=v flags, the trainer's run spec for TPU) and refuses the sweep with one
`error: POINT: WHY` line per point that would stop before its first step (exit status 2). Then it compiles every
point for the topology it runs on (the whole slice, or one host's slice under --hosts_per_point=1) with
`launch.compile` (libtpu on this CPU machine) and refuses a sweep with a point that does not fit, naming the point
and the reason (`--nopreflight` skips the compile; without libtpu it says so in one line and goes on). `--dry_run`
prints that table too.

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
import time

from etils import epath

from gp_jax import storage
from gp_jax.errors import UserError

from . import accelerators, command, module_name, points, prog, sweep, user_errors_exit_2
from . import compile as compile_lib
from .report.runs import find_runs, last_metrics
from .tpu_commands import (create_command, default_runtime, delete_command, describe_command, host_as_slice_env,
                                 slice_names, ssh_command, watch_actions, worker_plan, worker_running_command)


# ----------------------------------------------------------------------------- status


def status_rows(workdir: str, config: str | None = None) -> list[dict]:
  """One row per point: name, status, step, dev F1 (from results.json, else the last metrics.jsonl lines)."""
  if config:
    names = [r.name for r in sweep.expand(config, workdir)]
  else:
    names = [rel for rel, _ in find_runs(workdir)]
  rows = []
  for name in names:
    point = epath.Path(sweep.join(workdir, name))
    status, results = sweep.run_status(str(point))
    step = dev_f1 = None
    if results is not None:
      step = results.get("steps")
      dev_f1 = (results.get("dev") or {}).get("f1")
    if step is None or dev_f1 is None:
      last_step, last_dev = last_metrics(point)
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


def git_sha(ref: str, repo: str) -> str:
  return subprocess.run(["git", "rev-parse", "--short=12", f"{ref}^{{commit}}"], cwd=repo, check=True,
                        capture_output=True, text=True).stdout.strip()


def _repo_root() -> str:
  """The git checkout whose --ref the workers get: the working directory's, else the one this code lives in."""
  for where in (os.getcwd(), os.path.dirname(os.path.abspath(__file__))):
    proc = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=where, capture_output=True, text=True)
    if proc.returncode == 0:
      return proc.stdout.strip()
  raise UserError(f"{prog('tpu')} ships a git checkout of gp_jax (git archive of --ref), and neither {os.getcwd()} "
                  "nor this installation is in one: run it from a clone (pip install -e .)")


def preflight_type(accelerator_type: str, hosts_per_point: str) -> str:
  """The accelerator type a point runs on: the slice's, or with one point per host the one `host_as_slice_env`
  tells libtpu."""
  if hosts_per_point == "1":
    return host_as_slice_env(accelerator_type)["TPU_ACCELERATOR_TYPE"]
  return accelerator_type


def preflight_command(args, python: str = sys.executable) -> list[str]:
  """`launch.compile` of every point of the sweep for the topology it runs on."""
  target = preflight_type(args.accelerator_type, args.hosts_per_point)
  return [python, "-m", module_name("compile"), f"--config={args.config}", f"--accelerator_type={target}",
          *(["--", *args.extra] if args.extra else [])]


def preflight(args, repo: str) -> int:
  """0 when every point compiles and fits (or libtpu is absent: one line says so), else launch.compile's status
  (2: a point does not fit or the sweep was refused, 1: the check itself failed). Its table goes to stdout line by
  line."""
  missing = accelerators.libtpu_missing()
  if missing:
    print(f"preflight skipped: {missing}", flush=True)
    return 0
  cmd = preflight_command(args)
  print(f"preflight: {shlex.join(cmd[1:])}", flush=True)
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [repo, os.environ.get("PYTHONPATH")])))
  failed = []
  with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True) as proc:
    for line in proc.stdout:
      print(line, end="", flush=True)
      if ": does not fit: " in line or ": error: " in line:
        failed.append(line.rstrip("\n"))
  if proc.returncode == compile_lib.EXIT_DOES_NOT_FIT and failed:
    target = preflight_type(args.accelerator_type, args.hosts_per_point)
    print(f"refused: {len(failed)} step(s) of the sweep do not fit on {target}; nothing was shipped "
          "(fix them, or --nopreflight to launch anyway):", file=sys.stderr)
    for line in failed:
      print(f"  {line}", file=sys.stderr)
  elif proc.returncode:
    print(f"refused: the preflight failed (launch.compile exit {proc.returncode}, see above); --nopreflight skips "
          "it", file=sys.stderr)
  return proc.returncode


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
  runs = sweep.expand(args.config, args.workdir, extra=args.extra)
  n = len(runs)
  print(f"checking the configs of {n} point{'s' * (n != 1)} for TPU ...", flush=True)
  bad = points.check_points(runs, platform="tpu", workdir=False,
                            out=lambda line: print(line, file=sys.stderr, flush=True))
  if bad:
    print(f"refused: {len(bad)} of {n} points would stop before their first step (lines above); nothing was "
          "shipped", file=sys.stderr, flush=True)
    return 2
  if args.preflight:
    status = preflight(args, repo)
    if status:
      return status
  tmp = tempfile.mkdtemp(prefix="gp_jax_launch_")
  try:
    commands, scripts = worker_plan(args, repo, sha, tmp)
    print(f"{n} points, code {args.ref} = {sha}, {args.slices} slice(s), hosts per point: {args.hosts_per_point}; "
          f"leases and logs in {args.workdir.rstrip('/')}/_launch/")
    if args.dry_run:
      for f, text in scripts.items():
        print(f"--- {f}:\n{text}--- end of {f}")
      for cmd in commands:
        print(shlex.join(cmd), flush=True)
      return 0
    if shutil.which("gcloud") is None:
      print("gcloud not found: install the Google Cloud CLI (https://cloud.google.com/sdk) or use --dry_run",
            file=sys.stderr)
      return 1
    for f, text in scripts.items():
      with open(f, "w") as fh:
        fh.write(text)
    if not _execute(commands, repo):
      return 1
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  print(f"Started. Progress: {command('tpu')} status --workdir={args.workdir} --config={args.config}")
  return 0


def _execute(commands, repo) -> bool:
  for cmd in commands:
    print("+ " + shlex.join(cmd), flush=True)
    if subprocess.run(cmd, cwd=repo).returncode != 0:
      print(f"failed: {shlex.join(cmd)}", file=sys.stderr)
      return False
  return True


def cmd_create(args) -> int:
  runtime = args.runtime_version or default_runtime(args.accelerator_type)
  commands = [create_command(n, zone=args.zone, project=args.project, accelerator_type=args.accelerator_type,
                             runtime_version=runtime, spot=args.spot, reserved=args.reserved)
              for n in slice_names(args.tpu, args.slices)]
  for cmd in commands:
    print(shlex.join(cmd), flush=True)
  if args.dry_run:
    return 0
  return 0 if _execute(commands, None) else 1


def _describe(name, args) -> str | None:
  out = subprocess.run(describe_command(name, zone=args.zone, project=args.project), capture_output=True, text=True)
  return out.stdout.strip() or None if out.returncode == 0 else None


def _log(msg: str) -> None:
  print(f"[watch {time.strftime('%Y-%m-%dT%H:%M:%S')}] {msg}", flush=True)


def _retries_file(args):
  return sweep.join(args.workdir, f"_launch/watch-{args.tpu}.json")


def cmd_watch(args) -> int:
  """Stateless: every pass reads the queued resources' states and the sweep's status and acts on them."""
  repo = _repo_root()
  sha = git_sha(args.ref, repo)
  runtime = args.runtime_version or default_runtime(args.accelerator_type)
  names = slice_names(args.tpu, args.slices)
  while True:
    runs = sweep.expand(args.config, args.workdir)
    left = [r.name for r in runs if sweep.run_status(r.workdir)[0] != sweep.FINISHED]
    if not left:
      _log(f"every point of {len(runs)} finished")
      if args.delete_when_done:
        for n in names:
          cmd = delete_command(n, zone=args.zone, project=args.project)
          _log(f"{n}: delete (done): {shlex.join(cmd)}")
          if not args.dry_run:
            subprocess.run(cmd)
      return 0
    counts = (None if args.dry_run else sweep.read_json(_retries_file(args))) or {}
    for n in names:
      state = args.assume_state if args.dry_run else _describe(n, args)
      state = None if state in ("", "GONE") else state
      actions = watch_actions(state, spot=args.spot)
      _log(f"{n}: state {state or 'gone'}; {len(left)} points left; actions: {', '.join(actions) or 'wait'}")
      commands = []
      if "recreate" in actions:
        if counts.get(n, 0) >= args.max_retries:
          _log(f"{n}: not re-created: {counts.get(n, 0)} re-creations reached --max_retries={args.max_retries}")
          continue
        counts[n] = counts.get(n, 0) + 1
        if state is not None:
          commands.append(delete_command(n, zone=args.zone, project=args.project))
        commands.append(create_command(n, zone=args.zone, project=args.project, accelerator_type=args.accelerator_type,
                                       runtime_version=runtime, spot=args.spot, reserved=args.reserved))
      if "start" in actions:
        probe = ssh_command(n, worker_running_command(sha), zone=args.zone, project=args.project)
        running = (not args.dry_run) and subprocess.run(probe, capture_output=True).returncode == 0
        _log(f"{n}: workers {'running' if running else 'not running'} ({shlex.join(probe)})")
        if not running:
          tmp = tempfile.mkdtemp(prefix="gp_jax_launch_")
          wargs = argparse.Namespace(**{**vars(args), "tpu": n, "slices": 1})
          start, scripts = worker_plan(wargs, repo, sha, tmp)
          for f, text in scripts.items():
            with open(f, "w") as fh:
              fh.write(text)
          commands += start
      for cmd in commands:
        _log(f"{n}: {'(dry run) ' if args.dry_run else ''}+ {shlex.join(cmd)}")
        if not args.dry_run and subprocess.run(cmd, cwd=repo).returncode != 0:
          _log(f"{n}: failed: {shlex.join(cmd)}")
          break
    if counts and not args.dry_run:
      storage.write_json(_retries_file(args), counts)
    if args.once or args.dry_run:
      return 0
    time.sleep(args.interval_s)


def cmd_status(args) -> int:
  print(status_table(status_rows(args.workdir, args.config)))
  return 0


def _slice_flags(p) -> None:
  p.add_argument("--tpu", required=True, help="queued resource / node name (NAME-i with --slices=N)")
  p.add_argument("--zone", required=True, help="its zone, e.g. us-central2-b")
  p.add_argument("--project", default=None, help="GCP project (default: gcloud's configured one)")
  p.add_argument("--accelerator_type", default="v4-8", help="e.g. v4-8, v4-32, v5litepod-16")
  p.add_argument("--runtime_version", default=None, help="default: tpu-ubuntu2204-base (v4), v2-alpha-tpuv5-lite (v5e)")
  p.add_argument("--slices", type=int, default=1, help="N separate single-slice queued resources sharing one workdir")
  kind = p.add_mutually_exclusive_group()
  kind.add_argument("--spot", action="store_true", help="spot capacity (can be suspended any time)")
  kind.add_argument("--reserved", action="store_true", help="reserved capacity")


def _python_flag(p) -> None:
  p.add_argument("--python", default=None, help="Python on the hosts (>= 3.11), e.g. ~/gp_venv/bin/python: '.[tpu]' "
                 "is pip-installed into it and the workers run with it; default: a fresh Python 3.11 venv (uv) in "
                 "the shipped code folder")


def _worker_flags(p) -> None:
  p.add_argument("--hosts_per_point", choices=("1", "all"), default="all", help="all: the hosts of a slice are one "
                 "worker and train one point together (default); 1: every host is its own worker (libtpu told the "
                 "host is a slice)")
  p.add_argument("--slices", type=int, default=1, help="run on NAME-0 ... NAME-(N-1) (see `create --slices`)")
  p.add_argument("--accelerator_type", default="v4-8", help="the slice type (v4-8, v4-32, v5litepod-16, ...): what the "
                 "preflight compiles for, and with --hosts_per_point=1 what each host is told")


@user_errors_exit_2
def main(argv=None):
  parser = argparse.ArgumentParser(prog=prog("tpu"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True, metavar="{run,create,watch,status}")
  run = sub.add_parser("run", help="ship the code and start the sweep's workers, detached, on every host",
                       description="Ship REF to every host of the slice(s) and start the lease-based workers, "
                       "detached. Rerun the same command to resume after a preemption (finished points are skipped). "
                       f"Details: {command('tpu')} --help, docs/tpu.md.")
  run.add_argument("--tpu", required=True, help="TPU VM (pod slice) name")
  run.add_argument("--zone", required=True, help="its zone, e.g. us-central2-b")
  run.add_argument("--project", default=None, help="GCP project (default: gcloud's configured one)")
  run.add_argument("--ref", default="HEAD", help="git ref to ship (committed code only; default HEAD)")
  run.add_argument("--config", required=True, help="experiment file in this repo, optionally with ':arg'")
  run.add_argument("--workdir", required=True, help="sweep root, gs://BUCKET/... (every host must see it)")
  _python_flag(run)
  run.add_argument("--dry_run", action="store_true", help="print the preflight table, every command and the workers "
                   "scripts; run nothing")
  run.add_argument("--preflight", dest="preflight", action="store_true", default=True,
                   help="compile every point for its topology here first (launch.compile; needs libtpu) and refuse "
                   "the sweep when one does not fit (default)")
  run.add_argument("--nopreflight", dest="preflight", action="store_false", help="skip that check")
  _worker_flags(run)
  run.add_argument("extra", nargs="*", help="flags for every run, after '--' (e.g. -- --config.num_epochs=2)")
  run.set_defaults(fn=cmd_run)
  cr = sub.add_parser("create", help="queued resources: one slice, or N separate slices (--slices=N)",
                      description="gcloud compute tpus queued-resources create, once per slice.")
  _slice_flags(cr)
  cr.add_argument("--dry_run", action="store_true", help="print the commands; run nothing")
  cr.set_defaults(fn=cmd_create)
  wa = sub.add_parser("watch", help="keep spot slices alive and their workers running until the sweep is done",
                      description="Stateless (safe from cron with --once): a SUSPENDED, FAILED or vanished queued "
                      "resource is deleted (--force) and re-created; an ACTIVE one without running workers gets the "
                      "code, a fresh venv and the workers. Every action is logged.")
  _slice_flags(wa)
  wa.add_argument("--config", required=True, help="experiment file in this repo, optionally with ':arg'")
  wa.add_argument("--workdir", required=True, help="sweep root, gs://BUCKET/...")
  wa.add_argument("--ref", default="HEAD", help="git ref to ship")
  wa.add_argument("--hosts_per_point", choices=("1", "all"), default="all", help="as for `run`: all (the hosts of "
                  "a slice train one point together) or 1 (every host its own worker)")
  _python_flag(wa)
  wa.add_argument("--once", action="store_true", help="one pass, then exit (for cron)")
  wa.add_argument("--max_retries", type=int, default=10, help="re-creations per slice, counted in WORKDIR/_launch/")
  wa.add_argument("--delete_when_done", action="store_true", help="delete the slices once every point finished")
  wa.add_argument("--interval_s", type=float, default=120.0, help="seconds between passes (default 120)")
  wa.add_argument("--dry_run", action="store_true", help="one pass with --assume_state; print what it would run")
  wa.add_argument("--assume_state", default="SUSPENDED", help="with --dry_run: the state every slice is taken to "
                  "be in (ACTIVE, SUSPENDED, GONE, ...)")
  wa.add_argument("extra", nargs="*", help="flags for every point, after '--'")
  wa.set_defaults(fn=cmd_watch)
  st = sub.add_parser("status", help="table of points: status, step, dev F1 (reads the workdir)",
                      description="Read every point's results.json / metrics.jsonl under --workdir.")
  st.add_argument("--workdir", required=True, help="sweep root (gs:// or local)")
  st.add_argument("--config", default=None, help="experiment[:arg]: also list points not started yet")
  st.set_defaults(fn=cmd_status)
  args = parser.parse_args(argv)
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
