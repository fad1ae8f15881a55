"""Stage span_loss: the GlobalPointer span loss and its gradient, dense against XLA blockwise, at growing lengths:
time and the compiled program's memory."""

from __future__ import annotations

import time

import numpy as np

from benchmarks import common
from benchmarks.device_check.base import Recorder

# Deferred imports below: jax, flax and gp_jax.models, in the stage's child only.


def stage_span_loss(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from gp_jax.models import GlobalPointer  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["span"]
  H, D = s["H"], s["D"]
  head = GlobalPointer(D, H, head_size=64, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(head)
  for L in s["lengths"]:
    rng = np.random.default_rng(L)
    hidden = jnp.asarray(rng.standard_normal((1, L, D)), jnp.float32)
    mask = jnp.ones((1, L), jnp.int32)
    starts = rng.integers(0, L - 8, size=(1, H, 8))
    span_ids = jnp.asarray(starts * L + starts + rng.integers(0, 8, size=starts.shape), jnp.int32)
    for mode, block in (("dense", None), ("blockwise", s["block"])):
      key = f"L{L} {mode}"

      def loss_grad(params, hidden, mask, span_ids, block=block):
        return jax.value_and_grad(lambda p: nnx.merge(graphdef, p).span_loss(
            hidden, mask, span_ids=span_ids, block_size=block, implementation="xla"))(params)

      try:
        t0 = time.perf_counter()
        compiled = jax.jit(loss_grad).lower(params, hidden, mask, span_ids).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        mem_gib = None if mem is None else (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                            - mem.alias_size_in_bytes + mem.temp_size_in_bytes) / 2**30
        run = lambda: jax.block_until_ready(compiled(params, hidden, mask, span_ids))  # noqa: E731
        loss, _ = run()
        sec = common.median_seconds(run, s["iters"])
        rec.update("runs", key, {"status": "ok", "ms": sec * 1e3, "compile_s": compile_s, "program_gib": mem_gib,
                                 "loss": float(loss), "H": H, "D": D, "block": block})
      except Exception as e:  # pylint: disable=broad-except
        rec.update("runs", key, {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"})
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    rec.set("device_peak_gib", stats["peak_bytes_in_use"] / 2**30)
