"""Prints (or runs) the gcloud commands that launch a sweep on a Cloud TPU VM pod slice.

Every host of the slice runs the same command; gp_jax.main calls jax.distributed.initialize() when
`--config.multihost=True` (TPU pods detect the coordinator themselves), and each host reads its own
rows of every global batch.

  python -m launch.tpu --tpu=my-v4-32 --zone=us-central2-b --config=experiments/msra_scratch.py \
      --workdir=gs://bucket/runs/msra [--repo_dir=~/gp_jax] [--run]
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys

from launch import sweep


def pod_commands(args) -> list[list[str]]:
  out = []
  for run in sweep.expand(args.config, args.workdir, extra=["--config.multihost=True", *args.extra], python="python3"):
    remote = f"cd {args.repo_dir} && {shlex.join(run.argv)}"
    out.append(["gcloud", "compute", "tpus", "tpu-vm", "ssh", args.tpu, f"--zone={args.zone}", "--worker=all",
                f"--command={remote}"])
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tpu", required=True, help="TPU VM name")
  parser.add_argument("--zone", required=True, help="its zone")
  parser.add_argument("--config", required=True, help="experiment file, optionally with ':arg'")
  parser.add_argument("--workdir", required=True, help="root folder for the runs (a gs:// path on pods)")
  parser.add_argument("--repo_dir", default="~/gp_jax", help="checkout of this repo on every host")
  parser.add_argument("--run", action="store_true", help="execute instead of printing")
  parser.add_argument("extra", nargs="*", help="extra flags for every run (after --)")
  args = parser.parse_args(argv)
  for cmd in pod_commands(args):
    print(shlex.join(cmd), flush=True)
    if args.run and subprocess.run(cmd).returncode != 0:
      return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
