"""The points of a sweep as `launch.compile` builds them: the config each would train with, and which points share
one program; and the config check of the launchers' dry runs (`config_problem`)."""

from __future__ import annotations

import dataclasses
import json

from gp_jax import runtime, storage
from gp_jax.errors import UserError

from . import sweep, worker

STEPS = ("train", "eval")
SCRATCH_VOCAB = 6000  # stand-in: CJK corpora have 4-6k distinct chars (MSRA: 4734)
NUM_TYPES = 10  # stand-in for user files, whose types are known only once read
# Keys no step reads (the schedule is built for a fixed length): points differing only in these are built once.
NOT_IN_PROGRAM = ("seed", "num_epochs", "num_train_steps", "log_every_steps", "eval_every_steps",
                  "checkpoint_every_steps", "keep_checkpoints", "early_stop_patience", "progress_bar",
                  "compilation_cache", "init_from", "allow_config_change", "tune_threshold",
                  "progress_log_seconds")


@dataclasses.dataclass
class Point:
  name: str  # the run folder `launch.sweep` gives it
  config: object  # the ConfigDict gp_jax.main builds for it


def sweep_points(config_spec: str, *, extra=(), points: str = "all") -> list[Point]:
  """The chosen points of `config_spec`'s sweep (one point when it has none), configs as `gp_jax.main` builds them;
  UserError, in one line, for a config that does not build."""
  return build_points(preview_runs(config_spec, extra=extra), points)


def preview_runs(config_spec: str, *, extra=()) -> list[sweep.Run]:
  """Every point of `config_spec`'s sweep as a Run without a run folder (`sweep.expand`'s preview: a flag that
  overrides a swept key is the caller's to report, from the runs' overrides)."""
  return sweep.expand(config_spec, "compile", extra=list(extra), preview=True)


def build_points(runs: list[sweep.Run], points: str = "all") -> list[Point]:
  """The runs `points` chooses ("all", or comma-separated indices) with their configs; UserError, in one line naming
  the point, for an index out of range or a config that does not build."""
  if points != "all":
    chosen = [int(i) for i in points.split(",") if i.strip()]
    bad = [i for i in chosen if not 0 <= i < len(runs)]
    if bad:
      raise UserError(f"--points {bad} out of range: the sweep has {len(runs)} points (0 ... {len(runs) - 1})")
    runs = [runs[i] for i in chosen]
  out = []
  for r in runs:
    try:
      out.append(Point(r.name, worker.load_config(r)))
    except Exception as e:  # pylint: disable=broad-except
      raise UserError(f"{r.name}: {_build_error(e, r)}") from e
  return out


def program_key(config) -> str:
  """The config without the keys no step reads: equal keys build equal steps."""
  flat = json.loads(config.to_json_best_effort(sort_keys=True))
  for k in NOT_IN_PROGRAM:
    flat.pop(k, None)
  return json.dumps(flat, sort_keys=True)


# ----------------------------------------------------------------------------- dry runs: would the point start?


def _one_line(e: BaseException) -> str:
  """An exception as one line: its message's first line, with its type unless it is a UserError."""
  text = (str(e).strip().splitlines() or [""])[0]
  return text if isinstance(e, UserError) else f"{type(e).__name__}: {text}"


def _build_error(e: BaseException, run: sweep.Run) -> str:
  """What a failed config build says, as gp_jax.main says it (`worker.config_error`: load_config's UserError carries
  it already), in one line, without the point's name."""
  return (worker.config_error(e, ["worker", *run.argv[3:]]).strip().splitlines() or [""])[0]


def config_problem(run: sweep.Run, *, platform: str | None = None, workdir: bool = True) -> str | None:
  """Why the point `run` would stop before its first step, in one line; None when it would start. Checked as the
  run would meet it: the config `python -m gp_jax.main` builds from the point's flags (the experiment's get_config,
  the --config.k=v overrides), the run spec the trainer resolves from it for `platform` (gp_jax.factory.run_spec;
  default this machine's backend) and, with `workdir`, the config.json of a run the workdir already holds
  (gp_jax.resume.check_workdir: a changed config is refused). Imports jax (the run spec)."""
  try:
    config = worker.load_config(run)
  except Exception as e:  # pylint: disable=broad-except
    return _build_error(e, run)
  if config is None or not hasattr(config, "model"):
    return f"get_config returned {type(config).__name__}, not a ConfigDict of gp_jax.configs.base's fields"
  if platform is None:
    runtime.configure_platforms()  # as the run would: no TPU backend probed where libtpu sits on a CPU machine
  from gp_jax import factory, resume  # pylint: disable=g-import-not-at-top

  try:
    factory.run_spec(config, platform)
    root = storage.path(run.workdir)
    if workdir and (root / "config.json").exists():
      resume.check_workdir(config, root)
  except Exception as e:  # pylint: disable=broad-except
    return _one_line(e)
  return None


def check_points(runs: list[sweep.Run], *, platform: str | None = None, workdir: bool = True,
                 out=print) -> list[tuple[str, str]]:
  """`config_problem` of every run; each bad one as an `error: POINT: WHY` line through `out`. Returns (name, why)
  of the bad ones."""
  bad = []
  for run in runs:
    why = config_problem(run, platform=platform, workdir=workdir)
    if why is not None:
      bad.append((run.name, why))
      out(f"error: {run.name}: {why}")
  return bad
