"""Statistics over runs: groups of finished runs with mean +- sample std per metric, F1 by entity length pooled
over seeds."""

from __future__ import annotations

import statistics

from launch import sweep

GROUP_KEYS = ("dataset", "encoder", "head", "rope")
# (column, getter on results.json); F1/P/R are fractions in results.json and shown in %.
METRICS = (
    ("dev F1", lambda r: r.get("dev", {}).get("f1")),
    ("dev P", lambda r: r.get("dev", {}).get("precision")),
    ("dev R", lambda r: r.get("dev", {}).get("recall")),
    ("test F1", lambda r: r.get("test", {}).get("f1")),
    ("test P", lambda r: r.get("test", {}).get("precision")),
    ("test R", lambda r: r.get("test", {}).get("recall")),
    ("tokens/s", lambda r: r.get("train_tokens_per_s")),
    ("params", lambda r: r.get("parameters")),
)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
  """(mean, sample std); std None when fewer than 2 values, both None when there are none."""
  if not values:
    return None, None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarize(rows: list[dict]) -> list[dict]:
  """Finished runs grouped by GROUP_KEYS: {key fields, head_kind, n, runs, members, metrics: {column: (mean, std,
  count)}, epochs: [per seed], stopped_early: [per seed, None = unknown]}."""
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    if row["status"] == sweep.FINISHED:
      groups.setdefault(tuple(str(row[k]) for k in GROUP_KEYS), []).append(row)
  out = []
  for key in sorted(groups):
    members = groups[key]
    metrics = {}
    for col, get in METRICS:
      values = [float(v) for v in (get(m["results"]) for m in members) if v is not None]
      metrics[col] = (*mean_std(values), len(values))
    out.append({**dict(zip(GROUP_KEYS, key)), "head_kind": members[0]["head_kind"], "n": len(members),
                "runs": [m["run"] for m in members], "members": members, "metrics": metrics,
                "epochs": [m["epochs"] for m in members if m["epochs"] is not None],
                "stopped_early": [m["stopped_early"] for m in members]})
  return out


def length_buckets(rows: list[dict]) -> tuple[str, ...]:
  """Bucket labels of these runs in order (first seen first, should runs disagree)."""
  out = []
  for row in rows:
    out += [b for b in row["length_buckets"] if b not in out]
  return tuple(out)


def pooled_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, float | None]:
  """F1 per length bucket from tp/pred/gold summed over the runs (None where pred + gold is 0)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
    tp = pred = gold = 0
    for row in group_rows:
      cell = (row["results"].get(split) or {}).get("by_length", {}).get(b)
      if cell:
        tp, pred, gold = tp + cell["tp"], pred + cell["pred"], gold + cell["gold"]
    out[b] = 2 * tp / (pred + gold) if pred + gold else None
  return out
