"""What a cell of runs is and how the report names and flags it: the keys that show it, the variant that keeps
cells shown alike apart, one run per seed, its name, and why its numbers may not be a result (`cell_flags`)."""

from __future__ import annotations

import json
import math

from .. import sweep
from .runs import NO_ROPE, PLAIN, POINTER_TASKS, config_defaults
from .splits import ROLES, split_label

GROUP_KEYS = ("dataset", "encoder", "head", "rope")  # and pointer_rope, max_len, trick when needed (group_keys)

def group_keys(rows: list[dict]) -> tuple[str, ...]:
  """GROUP_KEYS, plus "pointer_rope" when some finished run is a pointer task (runs.POINTER_TASKS: relations,
  events; model.pointer_rope; "n/a" for entity runs), plus "max_len" when finished runs of one dataset differ in it
  (e.g. length arms of a study), plus "trick" when some finished run used training tricks (EMA, FGM, PGD:
  experiments/tricks.py)."""
  lengths: dict[str, set] = {}
  tricks, tasks = set(), set()
  for row in rows:
    if row["status"] == sweep.FINISHED:
      lengths.setdefault(row["dataset"], set()).add(row.get("max_len"))
      tricks.add(row.get("trick", PLAIN))
      tasks.add(row.get("task"))
  return (GROUP_KEYS + (("pointer_rope",) if tasks & set(POINTER_TASKS) else ())
          + (("max_len",) if any(len(v) > 1 for v in lengths.values()) else ())
          + (("trick",) if tricks - {PLAIN} else ()))


def js_key(value) -> str:
  """A value as canonical JSON: how configs and seeds are compared."""
  return json.dumps(value, sort_keys=True, default=str)


def _show(value) -> str:
  return value if isinstance(value, str) else str(value) if isinstance(value, (bool, int, float)) else js_key(value)


def variant_keys(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
  """Resolved config keys (runs.resolved_config) in which runs shown alike by `keys` (dataset, encoder, head, ...)
  differ: the keys that keep such runs in different cells, e.g. tune_threshold between two sweeps."""
  alike: dict[tuple, list[dict]] = {}
  for row in rows:
    alike.setdefault(tuple(str(row.get(k)) for k in keys), []).append(row.get("config") or {})
  out = set()
  for configs in alike.values():
    for k in set().union(*configs) if len(configs) > 1 else ():
      if len({js_key(c.get(k)) for c in configs}) > 1:
        out.add(k)
  return sorted(out)


def cell_keys(rows: list[dict]) -> tuple[tuple[str, ...], list[str]]:
  """(keys, variant keys) of the cells of these runs: `group_keys(rows)`, and the `variant_keys` of the finished
  runs whose F1 is a number (`nonfinite_f1`) under them; stats.summarize's cells and contrasts' lost runs alike."""
  keys = group_keys(rows)
  usable = [row for row in rows if row["status"] == sweep.FINISHED and not nonfinite_f1(row["results"])]
  return keys, variant_keys(usable, keys)


def variant_label(row: dict, keys: list[str]) -> str:
  """"key=value, ..." for each of `keys` where the run's resolved config is not today's default ("" if none)."""
  config, defaults = row.get("config") or {}, config_defaults(row.get("encoder"))
  return ", ".join(f"{k}={_show(config.get(k))}" for k in keys if js_key(config.get(k)) != js_key(defaults.get(k)))


def one_per_seed(runs: list[dict]) -> tuple[list[dict], list[dict]]:
  """(kept, dropped): the first run of each seed in the order given (DIRs as given, then by path); a later run of a
  seed already kept is dropped (the same resolved config and seed run twice). Runs without a seed are all kept."""
  kept, dropped, seen = [], [], set()
  for run in runs:
    seed = None if run["seed"] is None else js_key(run["seed"])
    (dropped if seed in seen else kept).append(run)
    seen |= {seed} - {None}
  return kept, dropped


def cell_name(g: dict) -> str:
  """A cell as the report names it: head, RoPE, then the pointer RoPE (relation runs), tricks, max_len and variant
  that tell it apart."""
  parts = [g["head"] if g["rope"] == NO_ROPE else f"{g['head']}, {rope_name(g['rope'])}"]
  parts += [pointer_name(g["pointer_rope"])] if g.get("pointer_rope", NO_ROPE) != NO_ROPE else []
  parts += [g["trick"]] if g.get("trick", PLAIN) != PLAIN else []
  parts += [f"max_len {g['max_len']}"] if "max_len" in g else []
  return ", ".join(parts) + (f" [{g['variant']}]" if g.get("variant") else "")


def zero_f1(results: dict | None, split: str) -> bool:
  """Whether a run scored F1 0 on `split` (no gold entity found): a failed training, not a result to compare."""
  f1 = ((results or {}).get(split) or {}).get("f1")
  return f1 is not None and finite(f1) and float(f1) == 0.0


def finite(value) -> bool:
  """Whether `value` is a finite number (NaN and inf, which JSON lets a diverged run write, are not)."""
  try:
    return math.isfinite(float(value))
  except (TypeError, ValueError):
    return False


def nonfinite_f1(results: dict | None, splits=ROLES) -> list[str]:
  """The splits whose F1 in results.json is there but not a finite number (a diverged run): its seed is left out of
  its cell (stats.summarize) and flagged (`cell_flags`)."""
  f1s = [((results or {}).get(split) or {}).get("f1") for split in splits]
  return [split for split, f1 in zip(splits, f1s) if f1 is not None and not finite(f1)]


def seeds_text(seeds) -> str:
  """"seed 3" / "seeds 0, 1"; an unknown seed (no config.json) is "?"."""
  seeds = ["?" if s is None else str(s) for s in seeds]
  return f"seed{'s' * (len(seeds) != 1)} {', '.join(seeds)}"


def duplicate_text(g: dict) -> list[str]:
  """Per seed run more than once in the cell: which runs, which one counts."""
  out = []
  for kept in g["members"]:
    again = [d["run"] for d in g.get("dropped", ())
             if kept["seed"] is not None and js_key(d["seed"]) == js_key(kept["seed"])]
    if again:
      out.append(f"seed {kept['seed']} run {1 + len(again)} times ({'; '.join([kept['run'], *again])}): only "
                 f"{kept['run']} counted")
  return out


def cell_flags(g: dict, members: list[dict] | None = None, splits=("dev", "test")) -> list[str]:
  """Why a cell's numbers are not a result, one phrase each: seeds run twice (`duplicate_text`), runs of it that
  failed, runs left out for an F1 that is not a number (`nonfinite_f1`), and seeds that scored F1 0 on one of
  `splits` (of `members`, default all of the cell's counted runs; seeds run twice only then; splits named as the
  cell's config says, `splits.split_label`). [] for a sound cell."""
  whole, members = members is None, g["members"] if members is None else members
  out = []
  for split in splits:
    zero = [m["seed"] for m in members if zero_f1(m["results"], split)]
    if zero:
      out.append(f"{split_label(g.get('config'), split)} F1 0 in {len(zero)} of {len(members)} seeds "
                 f"({', '.join(map(str, zero))})")
  if g.get("failed"):
    out.append(f"{len(g['failed'])} run{'s' * (len(g['failed']) != 1)} failed "
               f"({seeds_text(r['seed'] for r in g['failed'])})")
  if g.get("nonfinite"):
    bad = g["nonfinite"]
    which = " / ".join(dict.fromkeys(split_label(g.get("config"), s) for r in bad for s in r["splits"]))
    out.append(f"{which} F1 not a number in {len(bad)} run{'s' * (len(bad) != 1)} ({seeds_text(r['seed'] for r in bad)}"
               f": {'; '.join(r['run'] for r in bad)}), left out of the cell")
  return out + (duplicate_text(g) if whole else [])


def rope_name(rope: str, what: str = "RoPE") -> str:
  """"RoPE", "no RoPE"; a value neither True nor False (missing: "?") is not taken for False."""
  return {"True": what, "False": f"no {what}", "?": f"{what} unknown"}.get(rope, f"{what}={rope}")


def pointer_name(pointer_rope: str) -> str:
  return rope_name(pointer_rope, "pointer RoPE")


def setting_order(value: str) -> tuple:
  """"True", "False", "n/a", then any other value: the order of RoPE and pointer RoPE settings."""
  order = ("True", "False", NO_ROPE)
  return (order.index(value) if value in order else len(order), value)
