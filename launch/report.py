"""Collects results.json of every run under a folder into a markdown table.

  python -m launch.report runs/msra_ablation
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def collect(root: str) -> list[dict]:
  rows = []
  for dirpath, _, files in sorted(os.walk(root)):
    if "results.json" not in files:
      continue
    with open(os.path.join(dirpath, "results.json")) as f:
      r = json.load(f)
    cfg = {}
    if os.path.exists(os.path.join(dirpath, "config.json")):
      with open(os.path.join(dirpath, "config.json")) as f:
        cfg = json.load(f)
    model = cfg.get("model", {})
    rows.append({
        "run": os.path.relpath(dirpath, root),
        "encoder": model.get("encoder", "?"),
        "head": model.get("head", "?"),
        "rope": model.get("use_rope", "?"),
        "steps": r.get("steps"),
        "dev_f1": r.get("dev", {}).get("f1"),
        "test_f1": r.get("test", {}).get("f1"),
        "minutes": r.get("wall_minutes"),
    })
  return rows


def markdown_table(rows: list[dict]) -> str:
  if not rows:
    return "(no finished runs)"
  cols = list(rows[0])
  fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else str(v)  # noqa: E731
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  lines += ["| " + " | ".join(fmt(r[c]) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("root", help="folder holding run workdirs")
  args = parser.parse_args(argv)
  print(markdown_table(collect(args.root)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
