"""What runs inside a SLURM array task of `launch.slurm submit`: one point, and the accounting of each attempt.

  python -m launch.slurm_task run --submission=DIR --index=I [--multihost]      (the point; under srun: every process)
  python -m launch.slurm_task ended --submission=DIR --index=I --rc=RC --signal=none|TERM|USR1  (exit 0: requeue)

The batch script (launch/slurm.py writes it) starts `run`, traps the signals, and calls `ended` once the point's
processes are gone; `ended` says whether the task requeues itself. No lease: the scheduler decides who runs a point,
so a requeued task starts at once. `run` trains the point as a sweep worker does (launch/worker.py: the config from
the point's flags, the config check against the workdir, the resume step, the runner), in-process; with --multihost
every process of the srun step calls jax.distributed.initialize() with SLURM's variables and the GPUs bound
explicitly (`local_device_ids`), and process 0 alone reads the workdir and tells the others (as launch.worker).

Records, in the submission's folder (launch.slurm status reads them): state/<index>.json (attempts, failures,
each attempt's start and end, "failed" with the log's tail once the point failed --max_failures times or was refused).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback

from gp_jax import runtime
from gp_jax.errors import UserError

from . import module_name, prog, sweep, user_errors_exit_2

# Deferred import below: launch.worker (gp_jax's trainer: jax, flax, optax; seconds to import) in `run` only, so that
# `ended`, which every attempt's end waits for, starts in a fraction of a second.

# `run`'s exit status: finished or skipped / checkpoint saved / refused (a user error, another config in the workdir:
# no retry helps); exit 2 is a user error before the point started (user_errors_exit_2). EXIT_PREEMPTED, EXIT_USAGE
# and TRAIN_POINT are launch.worker's (tests/test_slurm.py checks that they agree).
EXIT_DONE, EXIT_PREEMPTED, EXIT_REFUSED, EXIT_USAGE = 0, 3, 10, 2
REFUSED = (EXIT_REFUSED, EXIT_USAGE)
TRAIN_POINT = f"{module_name('worker')}:train_point"
REQUEUE, STAY = 0, 1  # `ended`
SKIP, RUN, REFUSE = 0, 1, 2
LOG_TAIL_LINES = 25


def _print(msg: str) -> None:
  print(f"[launch.slurm {time.strftime('%Y-%m-%dT%H:%M:%S')}] {msg}", flush=True)


# ----------------------------------------------------------------------------- the submission's records


def write_json(path: str, obj) -> None:
  """Written whole or not at all (a reader never sees half a file)."""
  os.makedirs(os.path.dirname(path), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(tmp, path)


def read_json(path: str) -> dict | None:
  try:
    with open(path) as f:
      return json.load(f)
  except (FileNotFoundError, json.JSONDecodeError):
    return None


def load_submission(folder: str) -> dict:
  sub = read_json(os.path.join(folder, "submission.json"))
  if sub is None:
    raise UserError(f"{folder}/submission.json is missing or unreadable: not a launch.slurm submission folder")
  return {**sub, "dir": folder}


def state_path(sub: dict, index: int) -> str:
  return os.path.join(sub["dir"], "state", f"{index}.json")


def read_state(sub: dict, index: int) -> dict:
  return read_json(state_path(sub, index)) or {"point": sub["points"][index], "attempts": 0, "failures": 0,
                                                "history": []}


def cancelled_indices(sub: dict) -> list[int]:
  """The array indices `launch.slurm cancel` marked in the submission's cancelled.json (a cancelled point's processes
  see only SIGTERM)."""
  return list((read_json(os.path.join(sub["dir"], "cancelled.json")) or {}).get("indices", []))


def cancelled(sub: dict, index: int) -> bool:
  return index in cancelled_indices(sub)


def log_path(sub: dict, array_job: str, index: int) -> str:
  return os.path.join(sub["log_dir"], f"{array_job}_{index}.log")


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> list[str]:
  try:
    with open(path, errors="replace") as f:
      return f.read().splitlines()[-lines:]
  except OSError:
    return []


# ----------------------------------------------------------------------------- run: the point


def local_device_ids(gpus_per_task: int, environ=os.environ) -> list[int] | None:
  """The GPUs this process drives, as indices into the GPUs it sees, for jax.distributed.initialize.

  jax's SLURM detection takes local process i to drive GPU i of those visible (jax-ml/jax#28194, #23452): wrong when
  SLURM bound each task to its own GPUs (--gpus-per-task, --gpu-bind: every task sees its GPUs as 0..k-1). So: when
  the visible GPUs are as many as one task drives, all of them; else the SLURM_LOCALID-th group of k.
  """
  if gpus_per_task <= 0:
    return None  # no GPUs asked for (CPU processes): nothing to bind
  visible = [d for d in environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
  local = int(environ.get("SLURM_LOCALID", "0"))
  if len(visible) == gpus_per_task:
    return list(range(gpus_per_task))
  if not visible or len(visible) >= (local + 1) * gpus_per_task:
    return list(range(local * gpus_per_task, (local + 1) * gpus_per_task))
  raise UserError(f"task {local} of this node drives {gpus_per_task} GPU(s) but sees CUDA_VISIBLE_DEVICES="
                  f"{','.join(visible)}: give every task of the node all the node's GPUs (--gpus-per-node) or "
                  "its own (--gpus-per-task)")


def _decide(sub: dict, index: int, run: sweep.Run) -> tuple[int, int, str]:
  """Process 0's look at the point: (SKIP|RUN|REFUSE, resume step, why)."""
  from . import worker  # pylint: disable=g-import-not-at-top

  status = sweep.run_status(run.workdir)[0]
  if status == sweep.FINISHED:
    return SKIP, -1, "already finished"
  if cancelled(sub, index):
    return SKIP, -1, "its submission was cancelled"
  matched, why = worker.config_matches(run, worker.load_named_config(run))
  if not matched:
    return REFUSE, -1, f"the workdir holds a run of another config ({why})"
  return RUN, worker.resume_step(run.workdir), ""


def run_point(sub: dict, index: int, multihost: bool) -> int:
  """Trains the point of array index `index` (skipped when finished or cancelled); returns `run`'s exit status."""
  from . import worker  # pylint: disable=g-import-not-at-top

  multi, is_main = False, True
  if multihost:
    import jax  # pylint: disable=g-import-not-at-top  (only here: a one-process point never starts jax.distributed)

    jax.distributed.initialize(local_device_ids=local_device_ids(int(sub.get("gpus_per_task", 0))))
    multi, is_main = jax.process_count() > 1, jax.process_index() == 0
  if sub["runner"] == TRAIN_POINT:
    runtime.configure()
  name = sub["points"][index]
  runs = {r.name: r for r in sweep.expand(sub["config"], sub["workdir"], extra=sub["extra"])}
  if name not in runs:
    raise UserError(f"{sub['config']} no longer has the point {name!r} (the experiment file changed since "
                    f"submission {sub['dir']}); submit again")
  run = runs[name]
  decision, step, why = _decide(sub, index, run) if is_main else (0, 0, "")
  decision, step = worker.broadcast([decision, step], multi)
  if is_main:
    state = read_state(sub, index)
    state["attempts"] += 1
    state["history"].append({"attempt": state["attempts"], "job": os.environ.get("SLURM_JOB_ID"),
                             "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0")),
                             "host": socket.gethostname(), "start": time.time(),
                             "decision": {SKIP: "skip", RUN: "run", REFUSE: "refused"}[decision], "why": why})
    write_json(state_path(sub, index), state)
  if decision == SKIP:
    _print(f"{name}: {why or 'nothing to do'}; not run")
    return EXIT_DONE
  if decision == REFUSE:
    _print(f"{name}: {why}; not run (marked failed)")
    return EXIT_REFUSED
  _print(f"{name}: {'resuming from step ' + str(step) if step >= 0 else 'starting'} in {run.workdir}")
  config = worker.load_named_config(run)
  if multi and config is not None and "multihost" in config:
    config.multihost = True
  try:
    summary = worker.runner(sub["runner"])(config, run.workdir) or {}
  except UserError as e:
    print(f"error: {e}", file=sys.stderr, flush=True)
    return EXIT_REFUSED
  except Exception:  # pylint: disable=broad-except
    if multi:
      raise  # srun --kill-on-bad-exit ends the other processes; `ended` counts the failure
    traceback.print_exc()
    return 1
  status = summary.get("status", sweep.FAILED)
  _print(f"{name}: {status}")
  return {sweep.FINISHED: EXIT_DONE, sweep.PREEMPTED: EXIT_PREEMPTED}.get(status, 1)


# ----------------------------------------------------------------------------- ended: the attempt's outcome


def attempt_ended(sub: dict, index: int, rc: int, signal_name: str, environ=os.environ) -> int:
  """Records how the attempt ended and decides: REQUEUE (the batch script runs `scontrol requeue`) or STAY.

  A point whose results.json says finished is done, whatever the exit status (a signal can end the process after
  it wrote them). A point that saved its checkpoint because the time limit is near (USR1) is requeued; after SIGTERM
  SLURM itself requeues (preemption, `scontrol requeue`) or ends the job (scancel); a failure that no signal explains
  counts, and the point is requeued until --max_failures, then marked failed with its log's tail.
  """
  state = read_state(sub, index)
  log = log_path(sub, environ.get("SLURM_ARRAY_JOB_ID", "?"), index)
  end = {"end": time.time(), "rc": rc, "signal": signal_name}
  finished = sweep.run_status(sweep.join(sub["workdir"], state["point"]))[0] == sweep.FINISHED
  if rc == EXIT_DONE or finished:
    outcome, decision = "done", STAY
  elif cancelled(sub, index):
    outcome, decision = "cancelled", STAY
  elif rc in REFUSED:
    outcome, decision = "refused (a user error or another config in the workdir: see the log)", STAY
    state["failed"] = {"why": (state["history"][-1].get("why") if state["history"] else "") or outcome, "log": log,
                       "log_tail": log_tail(log)}
  elif signal_name == "USR1":
    outcome, decision = "time limit: checkpoint saved" if rc == EXIT_PREEMPTED else "time limit", REQUEUE
  elif signal_name == "TERM":
    outcome, decision = "stopped by SLURM (preempted, requeued or cancelled)", STAY
  elif rc == EXIT_PREEMPTED:
    outcome, decision = "preempted by a SIGTERM from outside SLURM", REQUEUE
  else:
    state["failures"] = state.get("failures", 0) + 1
    if state["failures"] < int(sub["max_failures"]):
      outcome, decision = f"failed (exit {rc}), failure {state['failures']} of {sub['max_failures']}", REQUEUE
    else:
      outcome, decision = f"failed (exit {rc}) {state['failures']} times: marked failed", STAY
      state["failed"] = {"why": f"failed {state['failures']} times (--max_failures={sub['max_failures']})",
                         "log": log, "log_tail": log_tail(log)}
  end["outcome"] = outcome
  if state["history"]:
    state["history"][-1].update(end)
  else:
    state["history"].append(end)
  write_json(state_path(sub, index), state)
  _print(f"{state['point']}: {outcome}" + ("; requeueing" if decision == REQUEUE else ""))
  return decision


@user_errors_exit_2
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog=prog("slurm_task"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = parser.add_subparsers(dest="cmd", required=True)
  r = sub.add_parser("run", help="run the point of array task INDEX (every process of the step)")
  e = sub.add_parser("ended", help="record the attempt's end; exit 0 when the task should requeue itself")
  for p in (r, e):
    p.add_argument("--submission", required=True, help="the submission's folder (submission.json)")
    p.add_argument("--index", type=int, required=True, help="the array task's index (SLURM_ARRAY_TASK_ID)")
  r.add_argument("--multihost", action="store_true", help="one process of several (srun): jax.distributed first")
  e.add_argument("--rc", type=int, required=True, help="exit status of the point's process (srun's, for several)")
  e.add_argument("--signal", choices=("none", "TERM", "USR1"), default="none", help="what the batch script caught")
  args = parser.parse_args(argv)
  submission = load_submission(args.submission)
  if not 0 <= args.index < len(submission["points"]):
    raise UserError(f"{args.submission}: no array index {args.index} (0..{len(submission['points']) - 1})")
  if args.cmd == "run":
    runtime.quicken_imports()
    return run_point(submission, args.index, args.multihost)
  return attempt_ended(submission, args.index, args.rc, args.signal)


if __name__ == "__main__":
  sys.exit(main())
