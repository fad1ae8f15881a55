"""Compile the trainer's train step on this machine's CPU and say what it cost: the tiny problems of
`benchmarks.lowering` (B2 L16 by default), the test suite's cheap XLA flags unless --full_xla.

  python -m benchmarks.compile_step --model=bert [--threefry_rolled_max=64]

One line (run it again for another sample: a process compiles a program once): lower and compile seconds, optimized
HLO lines, fusions and threefry rotations (shift-lefts).
`--threefry_rolled_max=0` unrolls every threefry draw (the lowering before small draws kept their loop).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.common import CHEAP_CODEGEN_XLA_FLAGS


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--model", choices=("bert", "scratch"), default="bert")
  ap.add_argument("--batch", type=int, default=2)
  ap.add_argument("--length", type=int, default=16)
  ap.add_argument("--threefry_rolled_max", type=int, default=None,
                  help="runtime.THREEFRY_ROLLED_MAX (default: its own)")
  ap.add_argument("--full_xla", action="store_true", help="XLA's default optimisation, not the suite's cheap flags")
  args = ap.parse_args(argv)
  flags = {"xla_force_host_platform_device_count": "1", **({} if args.full_xla else CHEAP_CODEGEN_XLA_FLAGS)}
  os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + [f"--{k}={v}" for k, v in flags.items()]
                                     ).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ["GP_JAX_COMPILATION_CACHE"] = "off"

  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  if args.threefry_rolled_max is not None:
    runtime.THREEFRY_ROLLED_MAX = args.threefry_rolled_max
  runtime.configure_threefry()
  from benchmarks import lowering  # pylint: disable=g-import-not-at-top
  from gp_jax import state as state_lib, steps  # pylint: disable=g-import-not-at-top
  from gp_jax.optim import make_optimizer  # pylint: disable=g-import-not-at-top

  problem = lowering.make_problem("bert-base" if args.model == "bert" else "scratch", batch=args.batch,
                                  length=args.length, mesh_sizes={"data": 1, "fsdp": 1}, tiny=True,
                                  attention_dropout=0.1)
  setup = lowering.target_setup(problem, "cpu")
  tx, _ = make_optimizer(setup.spec.optimizer, 10_000, setup.abstract_params)
  step = steps.make_train_step(setup, tx, loss_kind=setup.spec.loss_kind)
  t0 = time.perf_counter()
  lowered = step.lower(state_lib.abstract_state(setup, tx), lowering.abstract_batch(problem))
  t1 = time.perf_counter()
  hlo = lowered.compile().as_text()
  t2 = time.perf_counter()
  print(f"{args.model} B{args.batch} L{args.length} rolled_max {runtime.THREEFRY_ROLLED_MAX}: lower {t1 - t0:.2f} s, "
        f"compile {t2 - t1:.2f} s; optimized HLO {hlo.count(chr(10))} lines, {hlo.count(' fusion(')} fusions, "
        f"{hlo.count('shift-left(')} shift-lefts")
  return 0


if __name__ == "__main__":
  sys.exit(main())
