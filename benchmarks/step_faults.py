"""Per-step wall time, page faults, system time and heap size of the MiniLM + GlobalPointer train step (as
`benchmarks.train_step` builds it): shows what malloc settings (`gp_jax.runtime`, `GP_JAX_MALLOC=0` for glibc's
own) do step by step. One line per step: ms, minor faults, user and system CPU seconds, VmRSS and VmData after it.

  python -m benchmarks.step_faults --shape 4x512 --steps 16
  GP_JAX_MALLOC=0 python -m benchmarks.step_faults --shape 4x512 --steps 16
"""

from __future__ import annotations

import argparse
import resource
import time

from benchmarks import common


def status_gb(field: str) -> float:
  with open("/proc/self/status") as f:
    line = next(l for l in f if l.startswith(field + ":"))
  return int(line.split()[1]) / 1e6  # kB -> GB


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--shape", default="4x512", help="BATCHxSEQ")
  p.add_argument("--steps", type=int, default=16, help="steps reported (after 2 warm-up steps)")
  args = p.parse_args(argv)
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  settings = runtime.configure()
  from benchmarks.inputs import minilm_step  # pylint: disable=g-import-not-at-top

  print(common.machine_line("step_faults"))
  print(f"runtime={settings}", flush=True)
  batch, seq = (int(x) for x in args.shape.split("x"))
  step, b = minilm_step(batch, seq)
  walls = []
  for i in range(args.steps):
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    step.step(b)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    walls.append(wall)
    print(f"step {i}: {wall * 1e3:.0f} ms, minor faults {r1.ru_minflt - r0.ru_minflt}, "
          f"user {r1.ru_utime - r0.ru_utime:.2f} s, sys {r1.ru_stime - r0.ru_stime:.2f} s, "
          f"VmRSS {status_gb('VmRSS'):.2f} GB, VmData {status_gb('VmData'):.2f} GB", flush=True)
  walls.sort()
  print(f"B{batch}xL{seq}: median {walls[len(walls) // 2] * 1e3:.0f} ms, max {walls[-1] * 1e3:.0f} ms "
        f"over {args.steps} steps")


if __name__ == "__main__":
  main()
