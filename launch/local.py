"""Runs every point of an experiment's sweep on this machine, one after another.

  python -m launch.local --config=experiments/msra_scratch.py --workdir=runs/msra_ablation [--dry_run]
  python -m launch.local --config=experiments/msra_scratch.py:quick --workdir=runs/q -- --config.seed=1

A run whose workdir already has results.json is skipped (re-running resumes unfinished ones).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from launch import report, sweep


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="experiment file, optionally with ':arg'")
  parser.add_argument("--workdir", required=True, help="root folder; one sub-folder per sweep point")
  parser.add_argument("--dry_run", action="store_true", help="print the commands only")
  parser.add_argument("extra", nargs="*", help="extra flags passed to every run (after --)")
  args = parser.parse_args(argv)
  runs = sweep.expand(args.config, args.workdir, extra=args.extra)
  failed = []
  for n, run in enumerate(runs, 1):
    print(f"[{n}/{len(runs)}] {run.name}: {run.command}", flush=True)
    if args.dry_run:
      continue
    if os.path.exists(os.path.join(run.workdir, "results.json")):
      print("  done already (results.json exists), skipping", flush=True)
      continue
    if subprocess.run(run.argv).returncode != 0:
      failed.append(run.name)
  if not args.dry_run:
    print(report.markdown_table(report.collect(args.workdir)))
  if failed:
    print(f"{len(failed)} run(s) failed: {', '.join(failed)}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
