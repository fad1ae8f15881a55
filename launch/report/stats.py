"""Statistics over runs: cells of finished runs with mean +- sample std per metric and F1 by entity length pooled
over seeds. What a cell is and how it is named and flagged is cells.py's; the study's comparisons (which cells are
compared, paired by seed, in which Holm family, when a row is significant) are contrasts.py's, and the tests
themselves (t-interval, t-test, paired bootstrap, Holm, influence) paired.py's. Their names are kept here for the
report's callers."""

from __future__ import annotations

import statistics

from .. import sweep
from .cells import (GROUP_KEYS, cell_flags, cell_keys, cell_name, duplicate_text, finite, group_keys,  # noqa: F401
                    js_key, nonfinite_f1, one_per_seed, pointer_name, rope_name, seeds_text, setting_order,
                    variant_keys, variant_label, zero_f1)
from .contrasts import (ALPHA, HEAD_KEYS, LENGTH_KEYS, POINTER_ROPE_KEYS, ROPE_KEYS, TRICK_KEYS,  # noqa: F401
                        compare, significance, significant)
from .paired import (BOOTSTRAP_RESAMPLES, INFLUENCE_K, SHARE_TOPS, contrast_bootstrap, holm,  # noqa: F401
                     influence, mean_t_interval, micro_f1, paired_bootstrap, seed_t_test, t_cdf, t_quantile)
from .runs import NO_ROPE, PLAIN

# (column, getter on results.json); F1/P/R are fractions in results.json and shown in %.
METRICS = (
    ("dev F1", lambda r: (r.get("dev") or {}).get("f1")),
    ("dev P", lambda r: (r.get("dev") or {}).get("precision")),
    ("dev R", lambda r: (r.get("dev") or {}).get("recall")),
    ("test F1", lambda r: (r.get("test") or {}).get("f1")),
    ("test P", lambda r: (r.get("test") or {}).get("precision")),
    ("test R", lambda r: (r.get("test") or {}).get("recall")),
    ("tokens/s", lambda r: r.get("train_tokens_per_s")),
    ("params", lambda r: r.get("parameters")),
)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
  """(mean, sample std) of finite values (`summarize` leaves NaN and inf out before); std None when fewer than 2,
  both None when there are none."""
  if not values:
    return None, None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarize(rows: list[dict]) -> list[dict]:
  """Finished runs grouped into cells: one cell per resolved config but the seed (runs.resolved_config), shown by
  `group_keys(rows)` plus, when runs shown alike differ in other keys, a "variant" naming those keys (non-default
  values). Each: {key fields, [variant], config, head_kind, task, n (distinct seeds), runs, members (one run per
  seed, `one_per_seed`), dropped (later runs of a seed: never averaged, `cell_flags` names them), metrics: {column:
  (mean, std, count of finite values)}, epochs: [per seed], stopped_early and best_at_end: [per seed, None =
  unknown], failed: [{run, seed}] of the failed runs of the same resolved config, nonfinite: [{run, seed, splits}]
  of its finished runs whose dev or test F1 is not a number (`cells.nonfinite_f1`: a diverged run; left out of
  members, never averaged; `cell_flags` names both kinds; runs without a config.json are in no cell, nor runs of a
  config that none finished usably: `failed_cells`)}."""
  keys, vkeys = cell_keys(rows)
  finished = [row for row in rows if row["status"] == sweep.FINISHED]
  usable = [row for row in finished if not nonfinite_f1(row["results"])]
  groups: dict[tuple, list[dict]] = {}
  for row in usable:
    config = row.get("config") or {}
    shown = tuple(str(row.get(k)) for k in keys)
    groups.setdefault((shown, tuple(js_key(config.get(k)) for k in vkeys)), []).append(row)
  failed: dict[str, list[dict]] = {}
  for row in rows:
    if row["status"] == sweep.FAILED and row.get("config_known", True):
      failed.setdefault(js_key(row.get("config") or {}), []).append(row)
  diverged: dict[str, list[dict]] = {}
  for row in finished:
    if nonfinite_f1(row["results"]):
      diverged.setdefault(js_key(row.get("config") or {}), []).append(row)
  out = []
  for shown, variant in sorted(groups):
    members, dropped = one_per_seed(groups[(shown, variant)])
    metrics = {}
    for col, get in METRICS:
      values = [float(v) for v in (get(m["results"]) for m in members) if finite(v)]
      metrics[col] = (*mean_std(values), len(values))
    out.append({**dict(zip(keys, shown)), **({"variant": variant_label(members[0], vkeys)} if vkeys else {}),
                "config": members[0].get("config") or {}, "head_kind": members[0]["head_kind"],
                "task": members[0].get("task"), "n": len(members),
                "runs": [m["run"] for m in members], "members": members, "dropped": dropped, "metrics": metrics,
                "epochs": [m["epochs"] for m in members if m["epochs"] is not None],
                "stopped_early": [m["stopped_early"] for m in members],
                "best_at_end": [m["best_at_end"] for m in members],
                "failed": [{"run": r["run"], "seed": r["seed"]}
                           for r in failed.get(js_key(members[0].get("config") or {}), [])],
                "nonfinite": [{"run": r["run"], "seed": r["seed"], "splits": nonfinite_f1(r["results"])}
                              for r in diverged.get(js_key(members[0].get("config") or {}), [])]})
  return out


def failed_cells(rows: list[dict], summary: list[dict]) -> list[tuple[str, list[dict]]]:
  """Cells with no usable finished run but failed ones, or finished ones whose F1 is not a number (absent from
  `summary`): (dataset, encoder and `cell_name`, those runs), in run order; a failed run without a config.json is
  one entry of its own, named by its folder ("RUN (config unknown: no config.json)")."""
  known = {(True, js_key(g["config"])) for g in summary}
  out: dict[tuple, list[dict]] = {}
  for row in rows:
    unknown = not row.get("config_known", True)  # its config is only today's defaults: never a cell
    key = (False, row["run"]) if unknown else (True, js_key(row.get("config") or {}))
    lost = row["status"] == sweep.FAILED or (row["status"] == sweep.FINISHED and nonfinite_f1(row["results"]))
    if lost and key not in known:
      out.setdefault(key, []).append(row)
  shown = lambda r: {"head": r["head"], "rope": str(r["rope"]), "trick": r.get("trick", PLAIN),  # noqa: E731
                     "pointer_rope": r.get("pointer_rope", NO_ROPE)}
  return [(f"{runs[0]['dataset']}, {runs[0]['encoder']}, {cell_name(shown(runs[0]))}" if known_config else
           f"{runs[0]['run']} (config unknown: no config.json)", runs) for (known_config, _), runs in out.items()]


def length_buckets(rows: list[dict]) -> tuple[str, ...]:
  """Bucket labels of these runs in order (first seen first, should runs disagree)."""
  out = []
  for row in rows:
    out += [b for b in row["length_buckets"] if b not in out]
  return tuple(out)


def pooled_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, float | None]:
  """F1 per length bucket from tp/pred/gold summed over the runs (None where no gold entity has that length: a
  bucket of false spans only is not a score of 0)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
    tp = pred = gold = 0
    for row in group_rows:
      cell = (row["results"].get(split) or {}).get("by_length", {}).get(b)
      if cell:
        tp, pred, gold = tp + cell["tp"], pred + cell["pred"], gold + cell["gold"]
    out[b] = 2 * tp / (pred + gold) if gold else None
  return out


def gold_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, list[int]]:
  """Gold entities per length bucket, one count per run that has the bucket (runs of one split and tokenizer agree)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
    cells = [(row["results"].get(split) or {}).get("by_length", {}).get(b) for row in group_rows]
    out[b] = [int(c["gold"]) for c in cells if c]
  return out

