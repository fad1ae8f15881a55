"""A sweep worker: claims the next unfinished point through a lease, trains it in-process, repeats.

  python -m launch.worker --config=experiments/synthetic.py:quick --workdir=ROOT [--name=w0] [-- --config.k=v ...]
  python -m launch.worker ... --multihost [--coordinator_address=H:P --num_processes=N --process_id=I]

One worker is one JAX process group (one process, or every host of a slice with --multihost). Process 0 alone
reads the workdir to choose: it skips finished points, claims the first free one with a lease under
ROOT/_launch/leases/<point>/ (gp_jax/lease.py: exclusive create, heartbeat, takeover of a stale lease), and
sends the choice, the resume step and the config check to the other processes with
`multihost_utils.broadcast_one_to_all`, so every process of the group runs the same point even when their
reads of the bucket disagree. The point is trained in-process (`gp_jax.train.train_and_evaluate`); then the
lease is released and the next point chosen. Points leased by live workers are waited for, so a killed
worker's point is taken over once its lease goes stale.

Exit status: 0 every point finished; 10 nothing left for this worker but some points are not finished (they
failed here, or their config does not match the workdir's); 3 preempted (SIGTERM: the point saved a checkpoint);
4 this worker's lease was taken over (it was stalled for longer than the stale limit); 2 usage errors.
A supervisor restarts a worker on any other status (a crash).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import time

import numpy as np
from absl import flags

from gp_jax import lease as lease_lib
from gp_jax import runtime, storage
from gp_jax import workdir as wd
from gp_jax.configs import base as base_config
from gp_jax.configs.args import check_override_keys, define_config_file
from gp_jax.errors import UserError

from . import module_name, prog, sweep, user_errors_exit_2

# Deferred imports below: jax, Orbax and the trainer, where they are used. They are slow to import and a worker with
# nothing left to run (or a test's stand-in runner) needs none of them; launch.compile imports this module (through
# launch.points) before it sets JAX_PLATFORMS, which jax reads when it is imported.

EXIT_DONE, EXIT_USAGE, EXIT_PREEMPTED, EXIT_LOST, EXIT_INCOMPLETE = 0, 2, 3, 4, 10
NONE_LEFT, WAIT = -1, -2  # choices besides a point index

log = logging.getLogger(module_name("worker"))
TRAIN_POINT = f"{module_name('worker')}:train_point"  # the default --runner


def _print(msg: str) -> None:
  print(f"[worker {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_config(run: sweep.Run):
  """The ConfigDict `python -m gp_jax.main` would build from the run's flags (`--config=...:arg --config.k=v`); a
  config that does not load (an unknown arg or key, a value get_config refuses) is a UserError in one line, as
  gp_jax.main says it (`config_error`), without the point's name: each caller names the point its own way."""
  argv = ["worker", *run.argv[3:]]
  fv = flags.FlagValues()
  try:
    # The override flags (--config.k=v) are defined while the config file is loaded, from `sys_argv`.
    holder = define_config_file("config", "experiment config", flag_values=fv, lock_config=False, sys_argv=argv)
    flags.DEFINE_string("workdir", None, "run folder", flag_values=fv)
    fv(argv)
    return holder.value
  except (OSError, KeyError, AttributeError, ValueError, flags.Error) as e:
    raise UserError(config_error(e, argv)) from None


def load_named_config(run: sweep.Run):
  """`load_config`, its UserError naming the point (the worker's and a SLURM task's line)."""
  try:
    return load_config(run)
  except UserError as e:
    raise UserError(f"{e} (point {run.name})") from None


def config_error(e: BaseException, argv) -> str:
  """What a config that did not load says, as gp_jax.main says it: the innermost UserError of e's chain (absl
  re-raises what get_config raised with a traceback in its message), else the --config.KEY of `argv` (the point's
  flags) that the config lacks, else e's own words in one line."""
  chain, seen, cause = [], set(), e
  while cause is not None and id(cause) not in seen:
    seen.add(id(cause))
    chain.append(cause)
    cause = cause.__cause__ or cause.__context__
  user = [x for x in chain if isinstance(x, UserError)]
  if user:
    return str(user[-1])
  try:
    unknown = check_override_keys(list(argv))
  except Exception:  # pylint: disable=broad-except
    unknown = None
  return unknown or " ".join(f"{type(e).__name__}: {e}".split())


def resume_step(workdir: str) -> int:
  """The latest finalised checkpoint step in WORKDIR/ckpt (-1: none), as Orbax decides: a save that never
  finished (a local `<step>.orbax-checkpoint-tmp-*` folder, a gs:// `<step>/` without commit_success.txt) is
  skipped."""
  ckpt = storage.path(workdir) / "ckpt"
  if not ckpt.exists():
    return -1
  from gp_jax import checkpoint as ckpt_lib  # pylint: disable=g-import-not-at-top

  return max(ckpt_lib.finalised_steps(ckpt), default=-1)


def config_matches(run: sweep.Run, config) -> tuple[bool, str]:
  """Whether the point's workdir holds no run or a run of this config (gp_jax.workdir.config_changes)."""
  saved = sweep.read_json(sweep.join(run.workdir, "config.json"))
  if saved is None or config is None or config.get("allow_config_change", False):
    return True, ""
  defaults = json.loads(base_config.get_config().to_json_best_effort())
  changes = wd.config_changes(saved, json.loads(config.to_json_best_effort(sort_keys=True)), defaults)
  return not changes, "; ".join(changes)


class Chooser:
  """Process 0's side: picks and leases the next point."""

  def __init__(self, runs: list[sweep.Run], root: str, name: str):
    self.runs, self.root, self.name = runs, root, name
    self.skip: set[str] = set()  # points this worker gave up on (failed here, config mismatch)
    self.lease = None

  def choose(self) -> int:
    waiting = False
    for i, run in enumerate(self.runs):
      if run.name in self.skip or sweep.run_status(run.workdir)[0] == sweep.FINISHED:
        continue
      lease = lease_lib.Lease(lease_lib.lease_dir(run.workdir, root=self.root),
                              owner=f"{self.name}@{lease_lib.owner_label()}", extra={"point": run.name})
      if not lease.try_acquire():
        waiting = True
        continue
      storage.forget_listings(run.workdir)  # its last holder may have written since this process last looked
      if sweep.run_status(run.workdir)[0] == sweep.FINISHED:  # finished by its last holder meanwhile
        lease.release(outcome="already finished")
        continue

      def lost(_, point=run.name):
        _print(f"{self.name}: lease of {point} taken over; stopping this worker")
        os._exit(EXIT_LOST)  # another worker runs this point now; never write beside it

      lease.on_lost = lost
      lease.start_heartbeat()  # from now: reading the resume step and the config can take a while
      self.lease = lease
      return i
    return WAIT if waiting else NONE_LEFT

  def all_finished(self) -> bool:
    return all(sweep.run_status(r.workdir)[0] == sweep.FINISHED for r in self.runs)


def broadcast(values: list[int], multi: bool) -> list[int]:
  if not multi:
    return values
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  return [int(v) for v in multihost_utils.broadcast_one_to_all(np.asarray(values, np.int64))]


def runner(spec: str):
  module, _, fn = spec.partition(":")
  return getattr(importlib.import_module(module), fn)


def train_point(config, workdir: str) -> dict:
  from gp_jax import train  # pylint: disable=g-import-not-at-top

  return train.train_and_evaluate(config, workdir)


@user_errors_exit_2
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog=prog("worker"), description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiment file, optionally with ':arg'")
  parser.add_argument("--workdir", required=True, help="sweep root (local or gs://); leases in ROOT/_launch/")
  parser.add_argument("--name", default="", help="this worker's name in leases and logs (default host:pid)")
  parser.add_argument("--only", default="", help="only the points whose folder name matches this regex")
  parser.add_argument("--multihost", action="store_true", help="jax.distributed.initialize() first (a group of "
                      "several processes: every host of a slice, or --coordinator_address/...)")
  parser.add_argument("--coordinator_address", default="", help="with --multihost off TPU: host:port of process 0 "
                      "(default: jax.distributed finds the slice by itself)")
  parser.add_argument("--num_processes", type=int, default=None, help="with --coordinator_address: processes in "
                      "the group")
  parser.add_argument("--process_id", type=int, default=None, help="with --coordinator_address: this process's "
                      "index (0 chooses the points)")
  parser.add_argument("--poll_s", type=float, default=None, help="wait between looks while every free point is "
                      "leased by another live worker (default: the lease heartbeat)")
  parser.add_argument("--runner", default=TRAIN_POINT, help="module:function(config, workdir) -> summary dict (tests "
                      "use a stand-in)")
  parser.add_argument("extra", nargs="*", help="flags for every point, after '--'")
  args = parser.parse_args(argv)
  if args.poll_s is not None and not args.poll_s > 0:
    parser.error(f"--poll_s={args.poll_s}: expected seconds > 0")
  only = sweep.only_pattern(args.only)  # a bad regex is a usage error, before jax.distributed starts
  runtime.quicken_imports()

  multi = args.multihost
  if multi:
    import jax  # pylint: disable=g-import-not-at-top

    if args.coordinator_address:
      jax.distributed.initialize(args.coordinator_address, num_processes=args.num_processes,
                                 process_id=args.process_id)
    else:
      jax.distributed.initialize()
    multi = jax.process_count() > 1
    is_main = jax.process_index() == 0
  else:
    is_main = True
  if args.runner == TRAIN_POINT:
    runtime.configure()

  runs = sweep.expand(args.config, args.workdir, extra=args.extra)
  runs = [r for r in runs if only is None or only.search(r.name)]  # none left: "nothing left", exit 0
  configs = [load_named_config(run) for run in runs]  # every one before anything is written under the root (a lease)
  name = args.name or "worker"
  chooser = Chooser(runs, args.workdir, name) if is_main else None
  run_point = runner(args.runner)
  poll = args.poll_s if args.poll_s is not None else lease_lib.heartbeat_s()
  _print(f"{name}: {len(runs)} points under {args.workdir}")
  while True:
    if is_main:
      choice = chooser.choose()
      step, ok, why = -1, 1, ""
      if choice >= 0:
        step = resume_step(runs[choice].workdir)
        matched, why = config_matches(runs[choice], configs[choice])  # reads it only: the one loaded above
        ok = int(matched)
      values = [choice, step, ok]
    else:
      values = [0, 0, 0]
    choice, step, ok = broadcast(values, multi)
    if choice == NONE_LEFT:
      done = chooser.all_finished() if is_main else True
      done = bool(broadcast([int(done)], multi)[0])
      _print(f"{name}: nothing left ({'every point finished' if done else 'some points are not finished'})")
      return EXIT_DONE if done else EXIT_INCOMPLETE
    if choice == WAIT:
      time.sleep(poll)
      continue
    run = runs[choice]
    if not ok:
      if is_main:
        _print(f"{name}: {run.name}: the workdir holds a run of another config ({why}); skipping it")
        chooser.skip.add(run.name)
        chooser.lease.release(outcome="config mismatch")
      continue
    lease = chooser.lease if is_main else None
    _print(f"{name}: {run.name}: {'resuming from step ' + str(step) if step >= 0 else 'starting'} "
           f"(lease epoch {lease.epoch if lease else '-'})")
    config = load_named_config(run)  # afresh: it is changed below and the trainer may change it too
    if multi and config is not None and "multihost" in config:
      config.multihost = True
    try:
      summary = run_point(config, run.workdir) or {}
    except Exception as e:  # pylint: disable=broad-except
      _print(f"{name}: {run.name}: failed: {type(e).__name__}: {e}")
      if multi:
        raise  # the group cannot agree on what happened; the supervisor restarts it
      summary = {"status": sweep.FAILED}
    status = summary.get("status", sweep.FAILED)
    _print(f"{name}: {run.name}: {status}")
    if lease is not None:
      lease.release(outcome=status)
      chooser.lease = None
      if status != sweep.FINISHED:
        chooser.skip.add(run.name)
    if status == sweep.PREEMPTED:
      return EXIT_PREEMPTED


if __name__ == "__main__":
  sys.exit(main())
