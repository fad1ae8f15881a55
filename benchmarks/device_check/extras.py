"""Stage extras: dropout bits (hash against threefry) on the 2-layer step; a blocked against an unblocked step
loop."""

from __future__ import annotations

from benchmarks import common
from benchmarks.device_check.base import Recorder
from benchmarks.device_check.variants import project_step

# Deferred import below: jax, in the stage's child only.


def stage_extras(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["extras"]
  fns = {}
  for bits in ("threefry", "hash"):  # model.dropout_bits ($GP_JAX_DROPOUT_BITS, when set, overrides both)
    step, dbatch, _, _ = project_step(s["hf"], batch=s["B"], seq=s["L"], attention_dropout=0.1, dropout_bits=bits)
    step.step(dbatch)
    fns[bits] = (step, dbatch)
  rounds = common.alternate({b: (lambda st=st, db=db: st.step(db)) for b, (st, db) in fns.items()}, rounds=3,
                            calls=s["steps"])
  rec.set("dropout_bits", {"threefry_ms": rounds.spread("threefry").median * 1e3,
                           "hash_ms": rounds.spread("hash").median * 1e3,
                           "threefry_over_hash": rounds.ratio("threefry", "hash").fmt(),
                           "note": "2-layer BERT step, attention dropout 0.1, 3 alternating rounds; "
                                   + rounds.watch.readout()})
  step, dbatch = fns["threefry"]
  n = s["steps"]

  def unblocked():
    metrics = None
    for _ in range(n):
      step.state, metrics = step.step_fn(step.state, dbatch)
    jax.block_until_ready((step.state, metrics))

  blocked = lambda: [step.step(dbatch) for _ in range(n)]  # noqa: E731
  loops = common.alternate({"blocked": blocked, "unblocked": unblocked}, rounds=3, calls=1)
  rec.set("step_loop", {"blocked_ms_per_step": loops.spread("blocked").median * 1e3 / n,
                        "unblocked_ms_per_step": loops.spread("unblocked").median * 1e3 / n,
                        "blocked_over_unblocked": loops.ratio("blocked", "unblocked").fmt(),
                        "note": f"{n} steps per loop; blocked waits for every step's result, unblocked only for the "
                                "last"})
