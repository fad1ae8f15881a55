"""The points of a sweep as `launch.compile` builds them: the config each would train with, and which points share
one program."""

from __future__ import annotations

import dataclasses
import json

from launch import sweep, worker

STEPS = ("train", "eval")
SCRATCH_VOCAB = 6000  # stand-in: CJK corpora have 4-6k distinct chars (MSRA: 4734)
NUM_TYPES = 10  # stand-in for user files, whose types are known only once read
# Keys no step reads (the schedule is built for a fixed length): points differing only in these are built once.
NOT_IN_PROGRAM = ("seed", "num_epochs", "num_train_steps", "log_every_steps", "eval_every_steps",
                  "checkpoint_every_steps", "keep_checkpoints", "early_stop_patience", "progress_bar",
                  "compilation_cache", "init_from", "allow_config_change", "tune_threshold")


@dataclasses.dataclass
class Point:
  name: str  # the run folder `launch.sweep` gives it
  config: object  # the ConfigDict gp_jax.main builds for it


def sweep_points(config_spec: str, *, extra=(), points: str = "all") -> list[Point]:
  """The chosen points of `config_spec`'s sweep (one point when it has none), configs as `gp_jax.main` builds them."""
  runs = sweep.expand(config_spec, "compile", extra=list(extra))
  if points != "all":
    chosen = [int(i) for i in points.split(",") if i.strip()]
    bad = [i for i in chosen if not 0 <= i < len(runs)]
    if bad:
      raise ValueError(f"--points {bad} out of range: the sweep has {len(runs)} points (0 ... {len(runs) - 1})")
    runs = [runs[i] for i in chosen]
  return [Point(r.name, worker.load_config(r)) for r in runs]


def program_key(config) -> str:
  """The config without the keys no step reads: equal keys build equal steps."""
  flat = json.loads(config.to_json_best_effort(sort_keys=True))
  for k in NOT_IN_PROGRAM:
    flat.pop(k, None)
  return json.dumps(flat, sort_keys=True)
