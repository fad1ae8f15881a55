"""Timing and memory harnesses; run each from the repo root as `python -m benchmarks.NAME` (never part of tests).

`benchmarks.common` holds the harness every script uses (timers, alternating rounds, load/steal readout, machine
line); `benchmarks.inputs` the synthetic batches and project train steps that several scripts share.
"""

import gp_jax  # noqa: F401  (jax-free: records when this process started for runtime.process_seconds)
