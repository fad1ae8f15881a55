"""Runs an experiment's sweep on a SLURM cluster as one job array, one task per point, and shows its progress.

  python -m launch.slurm submit --config=experiments/rope_ablation.py:dataset=cluener2020 --workdir=runs/rope \\
      [--partition=gpu --time=24:00:00 --gpus_per_node=1 --nodes_per_point=1 --tasks_per_node=N --max_parallel=8 \\
       --setup='module load cuda' --sbatch_args='--account=lab --qos=normal' --report] [--dry_run] [-- --config.k=v]
  python -m launch.slurm status --workdir=runs/rope
  python -m launch.slurm cancel --workdir=runs/rope [--only=REGEX]

`submit` writes WORKDIR/_launch/slurm/<n>/job.sbatch (printed by --dry_run, with `sbatch --test-only`'s answer when
a cluster answers) and submits it: `--array=0-(N-1)%max_parallel` over the points that need running. The index ->
point map is kept with it (submission.json; the script's POINTS array). A point whose results.json says finished is
skipped, and so is one still queued or running from an earlier submission (squeue), so the same command can be
rerun at any time. Each task runs its point in-process through launch.slurm_task (launch.worker's config building,
config check and resume); a preempted point resumes from its checkpoint. No lease: the scheduler decides who runs a
point, so a requeued task starts at once. Logs: WORKDIR/_launch/slurm/logs/<array job>_<index>.log, appended
across the task's attempts (requeues keep the name).

Several GPUs or nodes per point: one process per GPU (--tasks_per_node, default --gpus_per_node) under srun, each
calling jax.distributed.initialize() from SLURM's variables with its GPUs bound explicitly (see docs/slurm.md).

Preemption and time limits: the batch script (launch/slurm_script.py) traps USR1, which SLURM sends --signal_s
seconds before the time limit (--signal=B:USR1@S), and SIGTERM (preemption, `scontrol requeue`, scancel); it passes
SIGTERM to the training processes, which save a checkpoint at that step and stop; near the time limit the task then
requeues itself (`scontrol requeue`; SLURM never requeues a job that reaches its limit). A point that fails without a signal is
requeued until it has failed --max_failures times, then marked failed with its log's tail.

`status` shows each point (pending, running, requeued, preempted, finished, failed, cancelled) from the workdir and
the queue. `cancel` leaves a marker in each live submission (a cancelled point's trainer sees only SIGTERM) and
scancels it. --report adds a job that runs launch.report on WORKDIR once the array has ended (afterany).
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time

from gp_jax import storage
from gp_jax.errors import UserError

from . import command, points, prog, sweep, user_errors_exit_2, worker
from . import slurm_task as task
from .slurm_script import batch_script, report_command
from .sweep import only_pattern, select
from .tpu import status_rows

QUEUED = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED", "STOPPED"}
RUNNING = {"RUNNING", "CONFIGURING", "COMPLETING", "STAGE_OUT", "SIGNALING", "RESIZING"}
SQUEUE_FORMAT = "%F|%K|%T|%r"  # array job id | task index | state | reason


def slurm_dir(workdir: str, given: str | None) -> str:
  """Where submissions, scripts and logs live: a folder every node sees (default WORKDIR/_launch/slurm)."""
  if given:
    return os.path.abspath(given)
  if "://" in workdir:
    raise UserError(f"--workdir={workdir} is not a local path: give --slurm_dir=DIR, a folder on a filesystem "
                    "every node mounts, for the batch scripts, the point map and the logs")
  return os.path.join(os.path.abspath(workdir), "_launch", "slurm")


def submissions(folder: str) -> list[dict]:
  """Every submission in the folder, oldest first."""
  if not os.path.isdir(folder):
    return []
  out = []
  for name in sorted((n for n in os.listdir(folder) if n.isdigit()), key=int):
    sub = task.read_json(os.path.join(folder, name, "submission.json"))
    if sub is not None:
      out.append({**sub, "dir": os.path.join(folder, name)})
  return out


def _next_number(folder: str) -> int:
  return max((int(n) for n in os.listdir(folder) if n.isdigit()), default=0) + 1 if os.path.isdir(folder) else 1


def _new_submission_dir(folder: str) -> str:
  os.makedirs(folder, exist_ok=True)
  n = _next_number(folder)
  while True:
    try:
      os.makedirs(os.path.join(folder, str(n)))
      return os.path.join(folder, str(n))
    except FileExistsError:  # another submit took it
      n += 1


# ----------------------------------------------------------------------------- the queue


def queue(job_ids) -> dict[tuple[str, int], tuple[str, str]] | None:
  """(array job id, index) -> (state, reason) of every task squeue still knows, finished ones included; None when
  squeue cannot be asked."""
  ids = sorted({str(j) for j in job_ids if j})
  if not ids:
    return {}
  try:
    out = subprocess.run(["squeue", "-h", "-r", "--states=all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT],
                         capture_output=True, text=True, timeout=60)
  except (OSError, subprocess.TimeoutExpired):
    return None
  if out.returncode != 0:
    # Every id forgotten (MinJobAge passed): squeue refuses the list.
    return {} if "Invalid job id" in out.stderr else None
  found = {}
  for line in out.stdout.splitlines():
    parts = line.strip().split("|")
    if len(parts) == 4 and parts[1].isdigit():
      found[(parts[0], int(parts[1]))] = (parts[2], parts[3])
  return found


def latest(subs: list[dict]) -> dict[str, tuple[dict, int]]:
  """Point name -> (the latest submission that holds it, its index there)."""
  out = {}
  for sub in subs:
    for i, name in enumerate(sub["points"]):
      out[name] = (sub, i)
  return out


def in_flight(subs: list[dict], q: dict) -> dict[str, str]:
  """Point -> "A_i STATE" for each point whose latest submission's task is queued or running."""
  out = {}
  for name, (sub, i) in latest(subs).items():
    state = q.get((str(sub.get("job_id")), i), ("", ""))[0]
    if state in QUEUED or state in RUNNING:
      out[name] = f"{sub['job_id']}_{i} {state.lower()}"
  return out


# ----------------------------------------------------------------------------- submit

# sbatch --time's forms: minutes[:seconds], hours:minutes:seconds, days-hours[:minutes[:seconds]]
_TIME = re.compile(r"\d+(:\d+){0,2}|\d+-\d+(:\d+){0,2}")
# submit's numeric flags and the least value each takes (--max_parallel: None when not given)
LEAST = {"nodes_per_point": 1, "gpus_per_node": 0, "tasks_per_node": 0, "cpus_per_task": 0, "max_parallel": 1,
         "signal_s": 1, "max_failures": 1}


def check_numbers(args) -> None:
  """Usage errors for submit's counts and --time (sbatch takes --time=banana; --max_parallel=-3 made 0-1%-3)."""
  for flag, least in LEAST.items():
    value = getattr(args, flag)
    if value is not None and value < least:
      raise UserError(f"--{flag}={value}: expected {'seconds' if flag == 'signal_s' else 'a count'} >= {least}")
  if args.time and args.time.upper() not in ("INFINITE", "UNLIMITED") and not _TIME.fullmatch(args.time):
    raise UserError(f"--time={args.time}: expected one of SLURM's forms: minutes, minutes:seconds, "
                    "hours:minutes:seconds, days-hours, days-hours:minutes, days-hours:minutes:seconds (e.g. 24:00:00)")


def _tasks_per_node(args) -> int:
  tasks = args.tasks_per_node or max(args.gpus_per_node, 1)
  if args.gpus_per_node and args.gpus_per_node % tasks:
    raise UserError(f"--gpus_per_node={args.gpus_per_node} is not a multiple of --tasks_per_node={tasks}: "
                    "every process drives the same number of GPUs")
  return tasks


def _submission(args, folder: str, names: list[str]) -> dict:
  tasks = _tasks_per_node(args)
  stem = os.path.splitext(os.path.basename(args.config.partition(":")[0]))[0]
  return {"dir": folder, "points": names, "config": args.config, "workdir": args.workdir, "extra": list(args.extra),
          "runner": args.runner, "max_failures": args.max_failures, "nodes": args.nodes_per_point,
          "tasks_per_node": tasks, "gpus_per_node": args.gpus_per_node,
          "gpus_per_task": args.gpus_per_node // tasks if args.gpus_per_node else 0,
          "cpus_per_task": args.cpus_per_task, "partition": args.partition, "time": args.time,
          "max_parallel": args.max_parallel or 0, "signal_s": args.signal_s,
          "sbatch_args": shlex.split(args.sbatch_args),
          "setup": list(args.setup), "python": args.python, "chdir": os.getcwd(),
          "log_dir": os.path.join(os.path.dirname(folder), "logs"),
          "job_name": args.job_name or f"gp_jax-{stem}", "report_out": args.report_out,
          "command": " ".join([prog("slurm"), shlex.join(args.argv)]).strip(),
          "time_submitted": time.time()}


def cmd_submit(args) -> int:
  if "://" not in args.workdir:
    args.workdir = os.path.abspath(args.workdir)  # the tasks' paths do not depend on their directory
  folder = slurm_dir(args.workdir, args.slurm_dir)
  check_numbers(args)
  _tasks_per_node(args)
  runs = select(sweep.expand(args.config, args.workdir, extra=args.extra), args.only)
  subs = submissions(folder)
  q = queue(sub.get("job_id") for sub in subs) if subs else {}
  if q is None:
    if not args.dry_run:
      raise UserError("squeue does not answer: cannot tell which points are queued or running (is this a "
                      "SLURM login node? SLURM_CONF?)")
    print("(squeue does not answer: points queued or running elsewhere are not known)", flush=True)
    q = {}
  flying = in_flight(subs, q)
  todo = []
  for r in runs:
    status = sweep.run_status(r.workdir)[0]
    if status == sweep.FINISHED:
      print(f"  {r.name}: finished; skipped", flush=True)
    elif r.name in flying:
      print(f"  {r.name}: in the queue ({flying[r.name]}); skipped", flush=True)
    else:
      print(f"  {r.name}: {status}; {'resumes' if status == sweep.PREEMPTED else 'runs'}", flush=True)
      todo.append(r)
  if not todo:
    print(f"nothing to submit: every one of {len(runs)} points is finished or in the queue", flush=True)
    return 0
  if args.check and args.runner == worker.TRAIN_POINT:
    print(f"checking the configs of {len(todo)} point(s) ...", flush=True)
    bad = points.check_points(todo, platform="cuda" if args.gpus_per_node else None,
                              out=lambda line: print(line, file=sys.stderr, flush=True))
    if bad:
      print(f"refused: {len(bad)} of {len(todo)} points would stop before their first step (lines above); nothing "
            "was submitted (--nocheck submits anyway)", file=sys.stderr, flush=True)
      return 2
  if args.dry_run:
    # The script the submission would get (its folder, the next number, is not created).
    sub = _submission(args, os.path.join(folder, str(_next_number(folder))), [r.name for r in todo])
    path = os.path.join(folder, "dry_run.sbatch")
    os.makedirs(folder, exist_ok=True)
    with open(path, "w") as f:
      f.write(batch_script(sub))
    print(f"--- {path}\n{batch_script(sub)}--- end of {path}", flush=True)
    if args.report:
      print(shlex.join(report_command(sub, "<array job id>")), flush=True)
    if shutil.which("sbatch"):
      test = subprocess.run(["sbatch", "--test-only", path], capture_output=True, text=True)
      answer = ((test.stderr or test.stdout).strip().splitlines() or ["(no answer)"])[-1]
      print(f"sbatch --test-only: {answer}", flush=True)
    else:
      print("(no sbatch here: not checked with sbatch --test-only)", flush=True)
    print("(dry run: nothing was submitted)", flush=True)
    return 0
  sub_dir = _new_submission_dir(folder)
  sub = _submission(args, sub_dir, [r.name for r in todo])
  path = os.path.join(sub_dir, "job.sbatch")
  os.makedirs(sub["log_dir"], exist_ok=True)
  with open(path, "w") as f:
    f.write(batch_script(sub))
  task.write_json(os.path.join(sub_dir, "submission.json"), {k: v for k, v in sub.items() if k != "dir"})
  out = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True)
  if out.returncode:
    shutil.rmtree(sub_dir)
    why = (out.stderr.strip().splitlines() or ["no message"])[-1]
    print(f"error: sbatch failed (exit {out.returncode}): {why} (a SLURM login node? SLURM_CONF?)", file=sys.stderr)
    return 1
  sub["job_id"] = out.stdout.strip().split(";")[0]
  print(f"submitted job array {sub['job_id']} ({len(todo)} points): {path}", flush=True)
  if args.report:
    rep = subprocess.run(report_command(sub, sub["job_id"]), capture_output=True, text=True)
    if rep.returncode:
      print(f"report job not submitted: {rep.stderr.strip()}", file=sys.stderr)
    else:
      sub["report_job_id"] = rep.stdout.strip().split(";")[0]
      print(f"report job {sub['report_job_id']} runs launch.report when the array ends", flush=True)
  task.write_json(os.path.join(sub_dir, "submission.json"), {k: v for k, v in sub.items() if k != "dir"})
  print(f"logs: {sub['log_dir']}/; progress: {command('slurm')} status --workdir={args.workdir}", flush=True)
  return 0


# ----------------------------------------------------------------------------- status and cancel


def point_status(result: str, queued: tuple[str, str] | None, state: dict, was_cancelled: bool,
                 queue_known: bool = True) -> str:
  """One point's status from its results.json status, its task in the queue ((state, reason), None when squeue does
  not list it; `queue_known` False when squeue did not answer) and its task's records (empty for a point never
  submitted)."""
  if result == sweep.FINISHED:
    return "finished"
  if state.get("failed"):
    return "failed"
  if was_cancelled or (queued and queued[0] == "CANCELLED"):
    return "cancelled"
  if state and not queue_known:
    return "unknown"  # squeue did not answer: queued, running or gone cannot be told
  if queued and queued[0] in RUNNING:
    return "running"
  if queued and queued[0] in QUEUED:
    if result == sweep.PREEMPTED:
      return "preempted"  # its checkpoint is saved; it resumes when the task starts again
    return "requeued" if state.get("attempts") else "pending"
  if result in (sweep.PREEMPTED, sweep.FAILED):
    return result  # and not in the queue: submit again to resume or retry it
  if not state:
    return "not submitted"
  return "stopped"  # its task ended without a result (scancel'd by hand, node failure): submit again


def status_table(workdir: str, folder: str, config: str | None = None) -> tuple[list[dict], str]:
  subs = submissions(folder)
  q = queue(s.get("job_id") for s in subs)
  where = latest(subs)
  found = {r["point"]: r for r in status_rows(workdir, config)}
  rows = {name: found.get(name, {"point": name, "status": sweep.MISSING, "step": None, "dev_f1": None})
          for name in where}  # submitted points in submission order, then the others found in the workdir
  rows.update({name: row for name, row in found.items() if name not in rows})
  out = []
  for name, row in rows.items():
    result = {"not started": sweep.MISSING}.get(row["status"], row["status"])
    if name in where:
      sub, i = where[name]
      state = task.read_state(sub, i)
      job = f"{sub.get('job_id', '?')}_{i}"
      queued = (q or {}).get((str(sub.get("job_id")), i))
      status = point_status(result, queued, state, task.cancelled(sub, i), queue_known=q is not None)
      log = task.log_path(sub, sub.get("job_id", "?"), i)
    else:
      state, job, queued, log = {}, "-", None, ""
      status = point_status(result, None, state, False)
    out.append({**row, "status": status, "job": job, "attempts": state.get("attempts", 0),
                "failures": state.get("failures", 0), "failed": state.get("failed"), "log": log,
                "queue": queued[0].lower() if queued else None})
  if not out:
    return out, "(no points: nothing submitted from this workdir and no run folder in it)"
  lines = ["| point | status | job | attempts | step | dev F1 |", "|---|---|---|---|---|---|"]
  for r in out:
    f1 = f"{100 * r['dev_f1']:.2f}" if isinstance(r["dev_f1"], (int, float)) else "-"
    lines.append(f"| {r['point']} | {r['status']} | {r['job']} | {r['attempts']} | "
                 f"{r['step'] if r['step'] is not None else '-'} | {f1} |")
  for r in out:
    if r["status"] == "failed" and r["failed"]:
      lines += ["", f"{r['point']}: {r['failed'].get('why', 'failed')}; log {r['failed'].get('log') or r['log']}:",
                *[f"  {line}" for line in r["failed"].get("log_tail", [])]]
  if q is None:
    lines += ["", "(squeue does not answer: states from the workdir only)"]
  for s in subs:
    if s.get("report_job_id"):
      lines.append(f"report job {s['report_job_id']}: {s['log_dir']}/report-{s['report_job_id']}.log")
  return out, "\n".join(lines)


def _check_workdir(workdir: str) -> None:
  """A mistyped sweep root is a usage error (an existing one without points yet is not)."""
  if not storage.path(workdir).exists():
    raise UserError(f"--workdir={workdir}: no such folder (the sweep root given to submit)")


def cmd_status(args) -> int:
  _check_workdir(args.workdir)
  _, text = status_table(args.workdir, slurm_dir(args.workdir, args.slurm_dir), args.config)
  print(text, flush=True)
  return 0


def cmd_cancel(args) -> int:
  _check_workdir(args.workdir)
  only = only_pattern(args.only)
  folder = slurm_dir(args.workdir, args.slurm_dir)
  subs = submissions(folder)
  q = queue(s.get("job_id") for s in subs)
  if q is None:
    raise UserError("squeue does not answer: cannot tell what is queued (SLURM_CONF?)")
  targets = []
  for name, (sub, i) in latest(subs).items():
    state = q.get((str(sub.get("job_id")), i), ("", ""))[0]
    if (state in QUEUED or state in RUNNING) and (only is None or only.search(name)):
      targets.append((sub, i, name))
  if not targets:
    print("nothing to cancel: no point of this workdir is queued or running", flush=True)
    return 0
  for sub in {id(s): s for s, _, _ in targets}.values():
    mine = [i for s, i, _ in targets if s is sub]
    task.write_json(os.path.join(sub["dir"], "cancelled.json"),
                    {"time": time.time(), "indices": sorted(set(task.cancelled_indices(sub)) | set(mine))})
  ids = [f"{s['job_id']}_{i}" for s, i, _ in targets]
  if not args.only:  # the report jobs of what is cancelled (they wait on it)
    ids += [str(s["report_job_id"]) for s in {id(s): s for s, _, _ in targets}.values() if s.get("report_job_id")]
  out = subprocess.run(["scancel", *ids], capture_output=True, text=True)
  for _, _, name in targets:
    print(f"  {name}: cancelled", flush=True)
  if out.returncode:
    print(f"scancel: {out.stderr.strip()}", file=sys.stderr)
    return 1
  return 0


# ----------------------------------------------------------------------------- CLI


@user_errors_exit_2
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog=prog("slurm"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True)
  s = sub.add_parser("submit", help="submit the sweep's unfinished points as one job array")
  s.add_argument("--config", required=True, help="experiment file, optionally with ':arg'")
  s.add_argument("--workdir", required=True, help="sweep root, one sub-folder per point (every node must see it)")
  s.add_argument("--partition", default="", help="SLURM partition (default: the cluster's)")
  s.add_argument("--time", default="", help="time limit per task attempt, e.g. 24:00:00 (default: the partition's)")
  s.add_argument("--nodes_per_point", type=int, default=1, help="nodes each point runs on")
  s.add_argument("--gpus_per_node", type=int, default=0, help="GPUs per node (--gpus-per-node; 0: none asked for)")
  s.add_argument("--tasks_per_node", type=int, default=0, help="processes per node (default: one per GPU, else 1)")
  s.add_argument("--cpus_per_task", type=int, default=0, help="CPUs per process (0: the cluster's default)")
  s.add_argument("--max_parallel", type=int, default=None, help="at most this many points at once (--array=...%%N; "
                 "default: no limit)")
  s.add_argument("--signal_s", type=int, default=300, help="USR1 this many seconds before the time limit: the point "
                 "saves a checkpoint and requeues")
  s.add_argument("--max_failures", type=int, default=3, help="failures (without preemption) before a point is "
                 "marked failed")
  s.add_argument("--setup", action="append", default=[], help="a shell line run before the point, e.g. 'module load "
                 "cuda/12.4' or 'source .venv/bin/activate' (repeatable)")
  s.add_argument("--sbatch_args", default="", help="more sbatch options, e.g. '--account=lab --qos=high'")
  s.add_argument("--python", default=sys.executable, help="the Python command the tasks run (default: this "
                 "interpreter), e.g. 'python' after a --setup that activates an environment, or 'apptainer exec "
                 "--nv IMAGE.sif python'")
  s.add_argument("--job_name", default="", help="default gp_jax-<experiment>")
  s.add_argument("--only", default="", help="only the points whose folder name matches this regular expression")
  s.add_argument("--report", action="store_true", help="also a job that runs launch.report once the array ended")
  s.add_argument("--report_out", default="", help="with --report: launch.report --out PREFIX")
  s.add_argument("--check", dest="check", action="store_true", default=True, help="build every point's config first "
                 "and refuse the sweep when one would stop before its first step (default)")
  s.add_argument("--nocheck", dest="check", action="store_false", help="skip that check")
  s.add_argument("--runner", default=worker.TRAIN_POINT, help="module:function(config, workdir) -> summary dict "
                 "(tests use a stand-in)")
  s.add_argument("--slurm_dir", default=None, help="submissions, scripts and logs (default WORKDIR/_launch/slurm; "
                 "required for a gs:// workdir)")
  s.add_argument("--dry_run", action="store_true", help="write and print the batch script; submit nothing")
  s.add_argument("extra", nargs="*", help="flags for every point, after '--'")
  s.set_defaults(fn=cmd_submit)
  st = sub.add_parser("status", help="each point's status, job, attempts, step and dev F1")
  c = sub.add_parser("cancel", help="cancel the queued and running points (leaves a marker)")
  for p in (st, c):
    p.add_argument("--workdir", required=True, help="the sweep root given to submit")
    p.add_argument("--slurm_dir", default=None, help="as given to submit")
  st.add_argument("--config", default=None, help="experiment[:arg]: also list points never submitted")
  c.add_argument("--only", default="", help="only the points whose folder name matches this regular expression")
  st.set_defaults(fn=cmd_status)
  c.set_defaults(fn=cmd_cancel)
  args = parser.parse_args(argv)
  args.argv = list(sys.argv[1:] if argv is None else argv)
  return args.fn(args)


if __name__ == "__main__":
  sys.exit(main())
