"""What launch.slurm submits: the sbatch script of one submission (one array task per point, the signal traps that
turn preemption and the time limit into a checkpoint and a requeue, srun for several processes a point) and the
report job that runs after the array."""

from __future__ import annotations

import os
import shlex

from . import module_name


def _q(text: str) -> str:
  return shlex.quote(str(text))


def batch_script(sub: dict) -> str:
  """The sbatch script of one submission: one array task per point."""
  n, procs = len(sub["points"]), sub["nodes"] * sub["tasks_per_node"]
  array = f"0-{n - 1}" + (f"%{sub['max_parallel']}" if sub["max_parallel"] else "")
  lines = ["#!/bin/bash",
           f"# launch.slurm submission {os.path.basename(sub['dir'])}: {n} point(s) of {sub['config']} under "
           f"{sub['workdir']}, one array task each.",
           f"# Written by: {sub['command']}",
           f"#SBATCH --job-name={sub['job_name']}",
           f"#SBATCH --array={array}"]
  opts = [("partition", sub["partition"]), ("time", sub["time"]), ("nodes", sub["nodes"]),
          ("ntasks-per-node", sub["tasks_per_node"]),
          ("gpus-per-node", sub["gpus_per_node"] or None), ("cpus-per-task", sub["cpus_per_task"] or None),
          ("output", os.path.join(sub["log_dir"], "%A_%a.log")), ("open-mode", "append"), ("requeue", True),
          ("signal", f"B:USR1@{sub['signal_s']}"), ("chdir", sub["chdir"])]
  lines += [f"#SBATCH --{k}" + ("" if v is True else f"={v}") for k, v in opts if v]
  lines += [f"#SBATCH {a}" for a in sub["sbatch_args"]]
  python = shlex.split(sub["python"])  # a command: e.g. `apptainer exec --nv IMAGE python`
  run = [*python, "-m", module_name("slurm_task"), "run", f"--submission={sub['dir']}", "--index=$SLURM_ARRAY_TASK_ID"]
  ended = [*python, "-m", module_name("slurm_task"), "ended", f"--submission={sub['dir']}",
           "--index=$SLURM_ARRAY_TASK_ID"]
  lines += ["", "set -u", "POINTS=(  # array index -> point (also in submission.json)"]
  lines += [f"  {_q(name)}  # {i}" for i, name in enumerate(sub["points"])]
  lines += [")",
            'POINT=${POINTS[$SLURM_ARRAY_TASK_ID]}',
            'log() { echo "[launch.slurm $(date +%Y-%m-%dT%H:%M:%S)] $*"; }',
            'log "job $SLURM_JOB_ID = ${SLURM_ARRAY_JOB_ID}_$SLURM_ARRAY_TASK_ID, point $POINT, attempt '
            '$((${SLURM_RESTART_COUNT:-0} + 1)), on $(hostname)"']
  if sub["setup"]:
    lines += ["", "# --setup", *sub["setup"]]
  lines += ["",
            "# USR1 (--signal: the time limit is near) and SIGTERM (preemption, scontrol requeue, scancel) reach this",
            "# shell; the point's processes get SIGTERM, save a checkpoint at their current step and exit 3."]
  if procs > 1:
    lines += ["# SLURM sends SIGTERM to the srun step's processes itself; USR1 goes to this shell alone, so it is",
              "# passed on with scancel (to the steps, never to srun, which answers SIGTERM by killing its tasks).",
              "# No scancel after SIGTERM: the job is in transition then and scancel waits for it.",
              'stop() { [ "$1" = USR1 ] && scancel --signal=TERM "$SLURM_JOB_ID"; }']
  else:
    lines += ['stop() { kill -TERM "$child" 2>/dev/null; }']
  lines += ["signal=none child=",
            'on_usr1() { log "USR1: time limit near: SIGTERM to the point, then requeue"; signal=USR1; stop USR1; }',
            'on_term() { log "SIGTERM (preempted, requeued or cancelled): the point saves a checkpoint and stops"; '
            '[ "$signal" = none ] && signal=TERM; stop TERM; }',
            "trap on_usr1 USR1",
            "trap on_term TERM",
            ""]
  if procs > 1:
    srun = ["srun", f"--nodes={sub['nodes']}", f"--ntasks={procs}", f"--ntasks-per-node={sub['tasks_per_node']}",
            "--kill-on-bad-exit=1"]
    lines.append(" ".join([*srun, *map(_shell_arg, run), "--multihost"]) + " &")
  else:
    lines.append(" ".join(map(_shell_arg, run)) + " &")
  lines += ["child=$!",
            "while :; do  # a trap interrupts wait; wait again until the point's processes are gone",
            '  wait "$child"; rc=$?',
            '  kill -0 "$child" 2>/dev/null && continue',
            '  if [ "$rc" -gt 128 ]; then wait "$child" 2>/dev/null; again=$?; [ "$again" -ne 127 ] && rc=$again; fi',
            "  break",
            "done",
            'log "point process(es) ended: exit $rc, signal $signal"',
            " ".join(map(_shell_arg, ended)) + ' --rc="$rc" --signal="$signal" || exit 0',
            'log "requeueing $SLURM_JOB_ID"',
            'scontrol requeue "$SLURM_JOB_ID"',
            ""]
  return "\n".join(lines)


def _shell_arg(arg: str) -> str:
  """Quoted for bash, leaving $SLURM_ARRAY_TASK_ID to expand."""
  if "$SLURM_ARRAY_TASK_ID" in arg:
    return '"' + arg.replace('"', '\\"') + '"'
  return _q(arg)


def report_command(sub: dict, after: str) -> list[str]:
  report = [*shlex.split(sub["python"]), "-m", module_name("report"), sub["workdir"]]
  if sub["report_out"]:
    report.append(f"--out={sub['report_out']}")
  return ["sbatch", "--parsable", f"--dependency=afterany:{after}", f"--job-name={sub['job_name']}-report",
          f"--output={os.path.join(sub['log_dir'], 'report-%j.log')}", f"--chdir={sub['chdir']}",
          *([f"--partition={sub['partition']}"] if sub["partition"] else []), *sub["sbatch_args"],
          f"--wrap={shlex.join(report)}"]
