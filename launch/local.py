"""Runs every point of an experiment's sweep on this machine, one after another.

  python -m launch.local --config=experiments/rope_ablation.py --workdir=runs/rope
  python -m launch.local --config=experiments/rope_ablation.py:dataset=cluener2020 --workdir=runs/rope
  python -m launch.local --config=experiments/synthetic.py:quick --workdir=runs/q --dry_run -- --config.seed=1
  gp-jax-local ...   (the same, once the package is installed: pip install -e .)

Each point gets the folder WORKDIR/<arg or "default">/<overrides> (see launch/sweep.py). Points whose
results.json says "finished" are skipped; the others (preempted, failed, never started) are run with the
same command, which resumes from their last checkpoint. So after a crash or a SIGTERM, rerun the same line. The final
summary names each failed point's reason (its last error line, else results.json's "error").

--dry_run runs nothing: it lists each point's status and command, then builds each unfinished point's config as
the run would (the experiment's get_config, the --config.k=v overrides, the trainer's run spec, a config.json the
point's folder already holds) and prints one `error: POINT: WHY` line per point that would stop before its first
step, one `error: N points (...): WHY` line for points that share a reason (exit status 2 when there is one).

SIGTERM or Ctrl-C to this process is passed to the running point as SIGTERM (it saves a checkpoint and stops) and no
further points start. WORKDIR may be a gs:// path (results are read through etils.epath).
Exit status: 1 if a point failed, 2 for a user error (a missing experiment file, a bad point under --dry_run),
else 0 (preempted points are listed; rerun to resume them).

With --workers=N, N sweep workers (`python -m launch.worker`, one JAX process each, --devices_per_worker=K fake
CPU devices each through XLA_FLAGS) share the points through leases in WORKDIR/_launch/ (a fake pod of N
single-host slices): each claims the next free point, trains it in-process and claims again; a killed worker's
point is taken over by another once its lease is stale (GP_JAX_LEASE_HEARTBEAT_S x GP_JAX_LEASE_STALE_BEATS).
Worker logs: WORKDIR/_launch/logs/local-w<i>.log. Exit status 0 when every point (--only's) finished, else 1.
On a GPU machine, --gpus_per_worker=K gives worker i its own K GPUs (CUDA_VISIBLE_DEVICES: the i-th K of those
visible, CUDA_VISIBLE_DEVICES or the driver's list), so that N workers neither share a GPU nor each take 75% of every
GPU's memory (JAX's allocator): 8 GPUs, --workers=8 --gpus_per_worker=1 trains eight points at once.
"""

from __future__ import annotations

import argparse
import codecs
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading

from gp_jax import storage

from . import command, module_name, prog, sweep, user_errors_exit_2
from .sweep import only_pattern, select

# Deferred import below: launch.points (it imports the trainer's config checks: jax, flax, optax; seconds), for
# --dry_run's check only: the launcher that runs the points starts in a fraction of a second.

# What happens to a point, from its status before this invocation.
_ACTION = {sweep.FINISHED: "skipped", sweep.MISSING: "new"}


def summary_lines(rows: list[tuple[str, str, str, str, str]]) -> list[str]:
  """rows: (name, status before, action, status after, why it failed or "") -> a small table and one count line."""
  width = max(len(r[0]) for r in rows)
  out = [f"  {n:<{width}}  {before:>9} -> {action:<7} -> {after}" + (f": {why}" if why else "")
         for n, before, action, after, why in rows]
  after = [r[3] for r in rows]
  actions = [r[2] for r in rows]
  counts = [f"{k} {after.count(k)}" for k in (sweep.FINISHED, sweep.PREEMPTED, sweep.FAILED)]
  counts += [f"{k} {actions.count(k)}" for k in ("skipped", "resumed", "new")]
  unfinished = len(after) - sum(after.count(k) for k in (sweep.FINISHED, sweep.PREEMPTED, sweep.FAILED))
  if unfinished:
    counts.append(f"unfinished {unfinished}")
  return [f"sweep summary ({len(rows)} points):", *out, "summary: " + " | ".join(counts)]


_ERROR_LINE = re.compile(r"^(error: .+|([\w.]+\.)?\w*(Error|Exception)\b.*)$")  # main's line; a traceback's last


def last_error(text: str) -> str:
  """The last error line of a run's output ("error: ..." or a traceback's last line), "" when there is none."""
  lines = [ln.strip() for ln in text.replace("\r", "\n").splitlines()]
  found = [ln for ln in lines if _ERROR_LINE.match(ln)]
  return found[-1].removeprefix("error: ")[:300] if found else ""


def failure_reason(results: dict | None, *, output: str | None = "", rc: int | None = None) -> str:
  """Why a point failed, in one line: the error its output names, else results.json's, else its exit status
  (`output` None: shown on the terminal, not kept)."""
  why = last_error(output or "") or str((results or {}).get("error", "")).strip().split("\n")[0][:300]
  if why:
    return why
  if rc is None:
    return "no error recorded"
  return f"exit {rc}, no error line" if output is not None else f"exit {rc}: see its output above"


class StderrTail:
  """Copies a child's stderr to ours as it comes, keeping its tail (for the failure's reason)."""

  def __init__(self, pipe):
    self.pipe, self.text = pipe, ""
    self.thread = threading.Thread(target=self._copy, daemon=True)
    self.thread.start()

  def _copy(self):
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := os.read(self.pipe.fileno(), 65536):
      text = decoder.decode(chunk)
      sys.stderr.write(text)
      sys.stderr.flush()
      self.text = (self.text + text)[-16384:]

  def close(self) -> str:
    self.thread.join(timeout=30)  # EOF once the run (and anything it started) has exited
    if not self.thread.is_alive():  # else a process the run left holds the pipe: the thread keeps copying
      self.pipe.close()
    return self.text


def print_problems(bad: list[tuple[str, str]]) -> None:
  """`error: POINT: WHY` lines on stderr; points sharing a WHY (a bad experiment arg) share one line."""
  groups: dict[str, list[str]] = {}
  for name, why in bad:
    groups.setdefault(why, []).append(name)
  for why, names in groups.items():
    if len(names) == 1:
      print(f"error: {names[0]}: {why}", file=sys.stderr, flush=True)
    else:
      shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
      print(f"error: {len(names)} points ({shown}): {why}", file=sys.stderr, flush=True)


def dry_run_check(runs: list[sweep.Run]) -> int:
  """The dry run's config check of the points that would run: 0 when every one would start, else 2."""
  pending = [r for r in runs if sweep.run_status(r.workdir)[0] != sweep.FINISHED]
  print(f"checking the configs of {len(pending)} unfinished point{'s' * (len(pending) != 1)} ...", flush=True)
  from . import points  # pylint: disable=g-import-not-at-top

  bad = points.check_points(pending, out=lambda line: None)
  print_problems(bad)
  if bad:
    print(f"{len(bad)} of {len(pending)} points would stop before their first step (lines above)", flush=True)
    return 2
  print("every config builds", flush=True)
  return 0


NON_NEGATIVE = ("workers", "devices_per_worker", "gpus_per_worker")  # flags that count


@user_errors_exit_2
def main(argv=None):
  parser = argparse.ArgumentParser(prog=prog("local"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiment file, optionally with ':arg' (passed to "
                      "get_config and get_sweep)")
  parser.add_argument("--workdir", required=True, help="sweep root; one sub-folder per point (local or gs://)")
  parser.add_argument("--dry_run", action="store_true", help="print each point's status and command, check every "
                      "unfinished point's config (an error line per bad point or shared reason, exit 2); run nothing")
  parser.add_argument("--only", default="", help="run only the points whose folder name matches this regular "
                      "expression (e.g. 'seed=0' for a first batch)")
  parser.add_argument("--workers", type=int, default=0, help="run N lease-sharing workers at once instead of "
                      "one point after another")
  parser.add_argument("--devices_per_worker", type=int, default=0, help="with --workers: fake CPU devices per "
                      "worker (XLA_FLAGS=--xla_force_host_platform_device_count=K; 0 = leave XLA_FLAGS alone)")
  parser.add_argument("--gpus_per_worker", type=int, default=0, help="with --workers: K GPUs of this machine per "
                      "worker, each worker its own (CUDA_VISIBLE_DEVICES); workers x K must not exceed the visible "
                      "GPUs")
  parser.add_argument("extra", nargs="*", help="flags passed to every run, after '--' (e.g. -- --config.seed=1)")
  args = parser.parse_args(argv)
  negative = [f"--{k}={getattr(args, k)}" for k in NON_NEGATIVE if getattr(args, k) < 0]
  if negative:
    parser.error(f"{', '.join(negative)}: expected a count >= 0")
  if args.gpus_per_worker and (not args.workers or args.devices_per_worker):
    parser.error("--gpus_per_worker goes with --workers=N and without --devices_per_worker")
  only_pattern(args.only)
  if args.workers:
    try:
      gpu_sets = worker_gpus(args.workers, args.gpus_per_worker) if args.gpus_per_worker else None
    except ValueError as e:
      parser.error(str(e))
    return run_workers(args, gpu_sets)
  runs = select(sweep.expand(args.config, args.workdir, extra=args.extra), args.only)

  state = {"child": None, "stop": False}

  def forward(signum, frame):
    state["stop"] = True
    if state["child"] is not None and state["child"].poll() is None:
      state["child"].send_signal(signal.SIGTERM)  # the run saves a checkpoint on SIGTERM

  old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  rows = []
  try:
    for n, run in enumerate(runs, 1):
      before, _ = sweep.run_status(run.workdir)
      action = _ACTION.get(before, "resumed")
      print(f"[{n}/{len(runs)}] {run.name} ({before}, {action}): {run.command}", flush=True)
      if args.dry_run or action == "skipped" or state["stop"]:
        rows.append((run.name, before, action if not state["stop"] else "not run", before, ""))
        continue
      # Own session: Ctrl-C reaches only this process, which turns it into a SIGTERM for the run. On a terminal the
      # run keeps it (its progress bar); elsewhere its stderr is copied through, and its error line kept.
      tee = not sys.stderr.isatty()
      child = state["child"] = subprocess.Popen(run.argv, start_new_session=True,
                                                stderr=subprocess.PIPE if tee else None)
      tail = StderrTail(child.stderr) if tee else None
      print(f"  pid {child.pid}", flush=True)
      rc = child.wait()
      output = tail.close() if tail else None
      state["child"] = None
      after, results = sweep.run_status(run.workdir)
      if rc != 0 and after != sweep.FAILED:
        after = sweep.FAILED  # crashed before (or while) writing results.json
      why = failure_reason(results, output=output, rc=rc) if after == sweep.FAILED else ""
      if why:
        print(f"  failed (exit {rc}): {why}", flush=True)
      rows.append((run.name, before, action, after, why))
  finally:
    for s, h in old.items():
      signal.signal(s, h)

  print("\n".join(summary_lines(rows)), flush=True)
  if args.dry_run:
    print("(dry run: nothing was run; statuses are the current ones)", flush=True)
    return dry_run_check(runs)
  if any(r[3] != sweep.FINISHED for r in rows):
    print("Rerun the same command to resume unfinished points; "
          f"results: {command('report')} {args.workdir}", flush=True)
  return 1 if any(r[3] == sweep.FAILED for r in rows) else 0


# ----------------------------------------------------------------------------- --workers=N


def worker_argv(args, i: int) -> list[str]:
  argv = [sys.executable, "-m", module_name("worker"), f"--config={args.config}", f"--workdir={args.workdir}",
          f"--name=local-w{i}"]
  if args.only:
    argv.append(f"--only={args.only}")
  if args.extra:
    argv += ["--", *args.extra]
  return argv


def worker_env(devices: int) -> dict:
  env = dict(os.environ)
  if devices:
    flags = [f for f in env.get("XLA_FLAGS", "").split() if not f.startswith("--xla_force_host_platform_device_count")]
    env["XLA_FLAGS"] = " ".join([*flags, f"--xla_force_host_platform_device_count={devices}"])
    env.setdefault("JAX_PLATFORMS", "cpu")
  return env


def visible_gpus() -> list[str]:
  """The GPUs a process started here would see: CUDA_VISIBLE_DEVICES's entries when set, else one index per GPU the
  NVIDIA driver lists (/proc/driver/nvidia/gpus), else none."""
  env = os.environ.get("CUDA_VISIBLE_DEVICES")
  if env is not None:
    return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
  try:
    return [str(i) for i in range(len(os.listdir("/proc/driver/nvidia/gpus")))]
  except OSError:
    return []


def worker_gpus(workers: int, per_worker: int) -> list[str]:
  """CUDA_VISIBLE_DEVICES of each worker: consecutive groups of `per_worker` visible GPUs."""
  gpus = visible_gpus()
  if per_worker < 1 or workers * per_worker > len(gpus):
    raise ValueError(f"--workers={workers} x --gpus_per_worker={per_worker} needs {workers * per_worker} GPUs; "
                     f"{len(gpus)} visible" + (f" ({','.join(gpus)})" if gpus else " (no NVIDIA driver or "
                                               "CUDA_VISIBLE_DEVICES)"))
  return [",".join(gpus[i * per_worker:(i + 1) * per_worker]) for i in range(workers)]


# A worker's lines about a point (launch.worker's _print): "[worker T] NAME: POINT: starting ...", "... failed: WHY".
_WORKER_LINE = re.compile(r"^\[worker [^\]]*\] [^:]*: (?P<point>[^:\s]+): "
                          r"(?:(?P<ran>starting|resuming)|failed: (?P<why>.*))")


def worker_log_points(texts: list[str]) -> tuple[set[str], dict[str, str]]:
  """From the workers' logs: the points they started or resumed, and why each failed one failed."""
  ran, why = set(), {}
  for text in texts:
    for line in text.splitlines():
      m = _WORKER_LINE.match(line)
      if m and m["ran"]:
        ran.add(m["point"])
      elif m:
        why[m["point"]] = m["why"].strip()[:300]
  return ran, why


def run_workers(args, gpu_sets: list[str] | None = None) -> int:
  runs = select(sweep.expand(args.config, args.workdir, extra=args.extra), args.only)
  remote = "://" in args.workdir
  commands = [worker_argv(args, i) for i in range(args.workers)]
  env = worker_env(args.devices_per_worker)
  envs = [dict(env, CUDA_VISIBLE_DEVICES=gpu_sets[i]) if gpu_sets else env for i in range(args.workers)]
  before = {r.name: sweep.run_status(r.workdir)[0] for r in runs}
  print(f"{len(runs)} points, {args.workers} workers; logs in {sweep.join(args.workdir, '_launch/logs')}", flush=True)
  for i, cmd in enumerate(commands):
    prefix = f"XLA_FLAGS={env['XLA_FLAGS']!r} " if args.devices_per_worker else ""
    prefix += f"CUDA_VISIBLE_DEVICES={gpu_sets[i]} " if gpu_sets else ""
    print(f"  worker {i}: {prefix}{' '.join(cmd)}", flush=True)
  if args.dry_run:
    for r in runs:
      print(f"  {r.name}: {before[r.name]}", flush=True)
    print("(dry run: nothing was run)", flush=True)
    return dry_run_check(runs)
  log_dir = tempfile.mkdtemp(prefix="gp_jax_workers_") if remote else sweep.join(args.workdir, "_launch/logs")
  os.makedirs(log_dir, exist_ok=True)
  procs, logs, starts = [], [], []
  for i, cmd in enumerate(commands):
    logs.append(open(os.path.join(log_dir, f"local-w{i}.log"), "ab"))
    starts.append(logs[-1].tell())  # appended to across invocations: this one's lines start here
    procs.append(subprocess.Popen(cmd, env=envs[i], stdout=logs[-1], stderr=subprocess.STDOUT,
                                  start_new_session=True))
    print(f"  worker {i} pid {procs[-1].pid}", flush=True)

  def forward(signum, frame):
    for p in procs:
      if p.poll() is None:
        p.send_signal(signal.SIGTERM)

  old = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
  try:
    codes = [p.wait() for p in procs]
  finally:
    for s, h in old.items():
      signal.signal(s, h)
    for f in logs:
      f.close()
  texts = []
  for f, start in zip(logs, starts):
    with open(f.name, "rb") as log:
      log.seek(start)
      texts.append(log.read().decode("utf-8", errors="replace"))
  if remote:
    storage.upload_dir(log_dir, sweep.join(args.workdir, "_launch/logs"))
    shutil.rmtree(log_dir, ignore_errors=True)
  print(f"worker exit codes: {codes}", flush=True)
  ran, why = worker_log_points(texts)
  rows = []
  for r in runs:
    after, results = sweep.run_status(r.workdir)
    if r.name in why and after not in (sweep.FINISHED, sweep.PREEMPTED):
      after = sweep.FAILED  # failed before (or while) writing results.json
    action = "skipped" if before[r.name] == sweep.FINISHED else (
        _ACTION.get(before[r.name], "resumed") if r.name in ran else "not run")
    reason = (why.get(r.name) or failure_reason(results)) if after == sweep.FAILED else ""
    rows.append((r.name, before[r.name], action, after, reason))
  print("\n".join(summary_lines(rows)), flush=True)
  if any(r[3] != sweep.FINISHED for r in rows):
    print("Rerun the same command to resume unfinished points; "
          f"results: {command('report')} {args.workdir}", flush=True)
  return 0 if all(r[3] == sweep.FINISHED for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
