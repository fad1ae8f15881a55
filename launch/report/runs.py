"""Finds run folders and reads what a report needs from each: config, results, training length, dev history."""

from __future__ import annotations

import functools
import json
import math

from etils import epath

from gp_jax import tasks
from gp_jax.configs.base import get_config
from .. import sweep

# Deferred imports below: gp_jax's taggers and entity task, where an older results.json needs them. They import jax and
# Flax, slow to import, which a report of current files never needs (nor launch.tpu, which imports this module).

_RUN_FILES = ("config.json", "results.json")
MAX_DEPTH = 8
PLAIN = "plain"  # run without training tricks
SPAN, TAGGER = "span", "tagger"  # results.json head_kind
NO_ROPE = "n/a"  # tagger heads have no RoPE; their config's use_rope is ignored
# The tasks the report treats apart, names of the registry (`gp_jax.tasks.NAMES`, the one list of tasks; checked
# here, not copied): relations and events are GPLinker pointer tasks (model.pointer_rope is a setting of theirs:
# the task classes take it, tests/test_report_events.py checks this against the registry), events add the PHEE
# headline (report/events.py). Configs from before relations existed are entity runs.
ENTITIES, RELATIONS, EVENTS = "entities", "relations", "events"
POINTER_TASKS = (RELATIONS, EVENTS)
if not {ENTITIES, *POINTER_TASKS} <= set(tasks.NAMES):
  raise ImportError(f"launch.report names tasks {(ENTITIES, *POINTER_TASKS)}; gp_jax.tasks.NAMES is {tasks.NAMES}")
# Config keys that only say how a run logs, saves or is launched: they never make runs different cells.
BOOKKEEPING_KEYS = frozenset({"progress_bar", "log_every_steps", "checkpoint_every_steps", "keep_checkpoints",
                              "compilation_cache", "allow_config_change", "multihost", "coordinator_address",
                              "num_processes", "process_id", "steps_per_execution",
                              "progress_log_seconds"})


def find_runs(root) -> list[tuple[str, object]]:
  """(path relative to root, epath.Path) of every run folder under `root`, sorted; root itself may be one."""
  root = epath.Path(root)
  out = []

  def walk(path, rel, depth):
    try:
      children = list(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
      return
    if any(c.name in _RUN_FILES for c in children):
      out.append((rel or ".", path))
      return
    if depth < MAX_DEPTH:
      for c in sorted(children, key=lambda c: c.name):
        if c.is_dir():
          walk(c, f"{rel}/{c.name}" if rel else c.name, depth + 1)

  walk(root, "", 0)
  return sorted(out, key=lambda r: r[0])


def _metrics_lines(path) -> list[dict]:
  """Parsed lines of a run's metrics.jsonl ([] when absent; a line being written is skipped)."""
  try:
    text = (epath.Path(path) / "metrics.jsonl").read_text()
  except FileNotFoundError:
    return []
  out = []
  for line in text.splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return out


def last_metrics(path) -> tuple[int | None, float | None]:
  """(last logged step, last dev F1) from a run's metrics.jsonl; Nones when absent."""
  step = dev = None
  for rec in _metrics_lines(path):
    step = rec.get("step", step)
    if rec.get("split") == "dev" and "f1" in rec:
      dev = rec["f1"]
  return step, dev


def head_kind(head: str, results: dict | None) -> str:
  """"span" or "tagger": results.json's head_kind, else whether gp_jax's TAGGERS holds the head (older files)."""
  if results and results.get("head_kind"):
    return results["head_kind"]
  from gp_jax.models.taggers import TAGGERS  # pylint: disable=g-import-not-at-top

  return TAGGER if head in TAGGERS else SPAN


def length_buckets_of(results: dict | None) -> tuple[str, ...]:
  """By-length bucket labels in order: results.json's length_buckets, else the entity task's (older files)."""
  if results and results.get("length_buckets"):
    return tuple(results["length_buckets"])
  from gp_jax.tasks.entities import LENGTH_BUCKETS  # pylint: disable=g-import-not-at-top

  return tuple(label for label, *_ in LENGTH_BUCKETS)


def steps_per_epoch(config: dict, results: dict | None) -> float | None:
  """From results.json's steps/epochs, else ceil(train windows / global batch) as the batch iterator does."""
  results = results or {}
  if results.get("epochs") and results.get("steps"):
    return results["steps"] / results["epochs"]
  windows = ((results.get("split_stats") or {}).get("train") or {}).get("windows")
  batch = config.get("batch_size")
  return math.ceil(windows / batch) if windows and batch else None


def training_length(config: dict, results: dict | None, spe: float | None) -> tuple[float | None, bool | None]:
  """(epochs trained, stopped early); older files: steps / steps per epoch, and steps < the planned steps."""
  results = results or {}
  steps = results.get("steps")
  epochs = results.get("epochs")
  if epochs is None and steps is not None and spe:
    epochs = steps / spe
  stopped = results.get("stopped_early")
  if stopped is None and steps is not None:
    planned = config.get("num_train_steps") or (
        math.ceil(config["num_epochs"] * spe) if spe and config.get("num_epochs") else None)
    stopped = steps < planned if planned else None
  return epochs, stopped


def best_at_end(results: dict | None, history: list[dict]) -> bool | None:
  """Whether the chosen checkpoint is the last one evaluated (the run may still be improving); None if unknown."""
  best = (results or {}).get("best_step")
  last = max((h["step"] for h in history), default=(results or {}).get("steps"))
  return None if best is None or last is None else best >= last


def dev_history(path, results: dict | None, spe: float | None) -> tuple[list[dict], str | None]:
  """([{step, epoch (None if unknown), f1}] by step, source): results.json's dev_history, else metrics.jsonl."""
  if results and results.get("dev_history"):
    return [{"step": h["step"], "epoch": h.get("epoch"), "f1": h["f1"]} for h in results["dev_history"]], \
        "results.json"
  by_step = {}
  for rec in _metrics_lines(path):
    if rec.get("split") == "dev" and "f1" in rec and "step" in rec:
      by_step[rec["step"]] = rec["f1"]  # a resumed run logs a step again: the last value wins
  hist = [{"step": s, "epoch": s / spe if spe else None, "f1": by_step[s]} for s in sorted(by_step)]
  return hist, ("metrics.jsonl" if hist else None)


def trick_of(config: dict) -> str:
  """The training tricks a run used (experiments/tricks.py), from its config with flat keys (`flatten`): "plain",
  "ema", "fgm", "pgd", "fgm+ema", "pgd+ema". Configs from before the tricks existed are "plain"."""
  kind = config.get("adversarial.kind", "none")
  epsilon = config.get("adversarial.epsilon", 0.0)
  ema = float(config.get("optimizer.ema_decay", 0.0) or 0.0) > 0
  parts = ([kind] if kind not in ("none", None) and epsilon else []) + (["ema"] if ema else [])
  return "+".join(parts) or PLAIN


def flatten(tree: dict, prefix: str = "") -> dict:
  """{"model": {"head": "crf"}} -> {"model.head": "crf"}; values as JSON has them (tuples become lists)."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      out.update(flatten(v, f"{prefix}{k}."))
    else:
      out[f"{prefix}{k}"] = json.loads(json.dumps(v, default=str))
  return out


def resolved_dtype(name, results: dict | None = None):
  """`model.dtype` as the run computed in: "auto" is float32 on CPU, bfloat16 on GPU/TPU (gp_jax.factory). The
  platform comes from results.json ("compute_dtype" or "platform") when it says; runs that do not say are taken
  as CPU runs (every study in docs/study ran on CPU)."""
  if name != "auto":
    return name
  results = results or {}
  if results.get("compute_dtype"):
    return results["compute_dtype"]
  return "float32" if str(results.get("platform", "cpu")).lower() == "cpu" else "bfloat16"


@functools.lru_cache(maxsize=None)
def _defaults(encoder: str) -> tuple[tuple[str, object], ...]:
  flat = flatten(get_config(encoder=encoder).to_dict())
  flat["model.dtype"] = resolved_dtype(flat.get("model.dtype"))
  return tuple(flat.items())


def config_defaults(encoder) -> dict:
  """Today's defaults (gp_jax.configs.base.get_config, flat keys) for runs of `encoder` (bert has its own optimizer
  settings); model.dtype resolved as for a CPU run."""
  return dict(_defaults(str(encoder) if encoder in ("scratch", "bert") else "scratch"))


def resolved_config(config: dict, results: dict | None = None, kind: str = SPAN) -> dict:
  """The run's config with flat keys, a key an older config.json lacks at today's default, model.dtype=auto as
  what it resolved to, and without the seed, the bookkeeping keys (BOOKKEEPING_KEYS) and, for tagger heads, the
  use_rope they ignore, for entity runs the model.pointer_rope they ignore. Runs with equal resolved configs are
  seeds of one cell."""
  flat = {**config_defaults((config.get("model") or {}).get("encoder", "scratch")), **flatten(config)}
  flat["model.dtype"] = resolved_dtype(flat.get("model.dtype"), results)
  ignored = [*(["model.use_rope"] if kind == TAGGER else []),
             *(["model.pointer_rope"] if task_of(config, results) == ENTITIES else [])]
  for k in ("seed", *BOOKKEEPING_KEYS, *ignored):
    flat.pop(k, None)
  return flat


def study_of(root, rel: str) -> str:
  """The study (family of comparisons) a run belongs to: the root given on the command line, or for a folder of
  studies (runs in root/STUDY/...) the subfolder under the root."""
  root = str(root).rstrip("/")
  parts = rel.split("/")
  return f"{root}/{parts[0]}" if len(parts) > 1 else root


def _dict_or_none(value) -> dict | None:
  return value if isinstance(value, dict) else None


def task_of(config: dict, results: dict | None) -> str:
  """config.task (one of `gp_jax.tasks.NAMES`), else results.json's task, else "entities" (older configs)."""
  name = config.get("task") or (results or {}).get("task") or ENTITIES
  if name not in tasks.NAMES:
    raise ValueError(f"task={name!r}: not one of gp_jax.tasks.NAMES {tasks.NAMES}")
  return name


def collect(roots) -> list[dict]:
  """One dict per run folder: run, status, group key fields, task, pointer_rope (str of model.pointer_rope for
  the pointer tasks, POINTER_TASKS: relations and events; "n/a" otherwise), results (None if absent), training
  length, history, the resolved config (`resolved_config`), config_known and the study (`study_of`)."""
  if isinstance(roots, str):
    roots = [roots]
  rows = []
  for root in roots:
    for rel, path in find_runs(root):
      config = _dict_or_none(sweep.read_json(path / "config.json")) or {}
      results = _dict_or_none(sweep.read_json(path / "results.json"))
      # Shown keys as the resolved config has them: a key an older config.json lacks at its default, so that such a
      # run joins the cell of its resolved config. Without a config.json: "?" (never a cell, `stats.failed_cells`).
      shown = resolved_config(config, results, SPAN) if config else {}
      head = shown.get("model.head", "?")
      kind = head_kind(head, results)
      spe = steps_per_epoch(config, results)
      epochs, stopped = training_length(config, results, spe)
      history, source = dev_history(path, results, spe)
      # The cell's config: `shown` less the use_rope a tagger head ignores (resolved_config with kind); without a
      # config.json, today's defaults.
      resolved = shown if config else resolved_config(config, results, SPAN)
      if kind == TAGGER:
        resolved = {k: v for k, v in resolved.items() if k != "model.use_rope"}
      task = task_of(config, results)
      rows.append({
          "run": rel if len(roots) == 1 else f"{str(root).rstrip('/')}/{rel}",
          "status": sweep.status_of(results),
          "dataset": shown.get("data.name", "?"),
          "encoder": shown.get("model.encoder", "?"),
          "head": head,
          "rope": NO_ROPE if kind == TAGGER else shown.get("model.use_rope", "?"),
          "task": task,
          "pointer_rope": str(resolved.get("model.pointer_rope", False)) if task in POINTER_TASKS else NO_ROPE,
          "seed": config.get("seed"),
          "max_len": shown.get("data.max_len"),
          "trick": trick_of(shown),
          "results": results,
          "head_kind": kind,
          "length_buckets": length_buckets_of(results),
          "epochs": epochs,
          "stopped_early": stopped,
          "best_at_end": best_at_end(results, history),
          "history": history,
          "history_source": source,
          "config": resolved,
          "config_known": bool(config),  # False: no (readable) config.json, `config` is only today's defaults
          "study": study_of(root, rel),
      })
  return rows
