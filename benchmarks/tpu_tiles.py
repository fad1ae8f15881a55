"""The largest tile of the Pallas ZLPR kernel that compiles for one chip of each TPU generation, and its compiled cost.

Compiles (no TPU needed: libtpu beside jax, `jax.experimental.topologies`) the loss + gradient w.r.t. q and k of
`blockwise_zlpr_loss(..., implementation="pallas")` at B 1, `--length`, `--types`, d 64, bf16 q/k, per generation
and head (per-type q/k, or one shared q/k head with start/end biases), trying tiles 1024, 512, 256, 128 and keeping
the first that compiles; prints one line per attempt (compile seconds, GFLOP and GB from `cost_analysis()`, or the
error's first line). `pallas_zlpr.TPU_MAX_TILE` holds the result (docs/benchmarks/span_head.md). Needs the `aot`
extra (libtpu); another process holding libtpu is allowed (ALLOW_MULTIPLE_LIBTPU_LOAD).

  python -m benchmarks.tpu_tiles [--generations v4,v5e,v5p,v6e] [--heads per_type,shared] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import time

TOPOLOGIES = {"v4": "v4:1x1x1", "v5e": "v5e:1x1", "v5p": "v5p:1x1x1", "v6e": "v6e:1x1"}
TILES = (1024, 512, 256, 128)


def try_tile(devices, *, head: str, tile: int, B: int, L: int, H: int, d: int = 64) -> dict:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from jax.sharding import NamedSharding, PartitionSpec as P  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import blockwise_zlpr_loss  # pylint: disable=g-import-not-at-top

  one = NamedSharding(jax.sharding.Mesh(np.array(devices[:1]), ("x",)), P())
  sds = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=one)  # noqa: E731
  Hq = 1 if head == "shared" else H
  args = [sds((B, L, Hq, d), jnp.bfloat16)] * 2 + [sds((B, H, L), jnp.int32), sds((B, L), jnp.int32)]
  if head == "shared":
    args += [sds((B, H, L), jnp.float32)] * 2

  def loss_grad(q, k, ids, mask, sb=None, eb=None):
    return jax.value_and_grad(lambda q, k: blockwise_zlpr_loss(
        q, k, span_ids=ids, attention_mask=mask, start_bias_BHL=sb, end_bias_BHL=eb, block_size=tile,
        implementation="pallas"), argnums=(0, 1))(q, k)

  start = time.perf_counter()
  try:
    compiled = jax.jit(loss_grad).lower(*args).compile()
  except Exception as e:  # pylint: disable=broad-except
    return {"ok": False, "s": round(time.perf_counter() - start, 1),
            "error": f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"}
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return {"ok": True, "s": round(time.perf_counter() - start, 1), "gflop": round(cost.get("flops", 0) / 1e9, 2),
          "gbytes": round(cost.get("bytes accessed", 0) / 1e9, 3)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--generations", default=",".join(TOPOLOGIES))
  p.add_argument("--heads", default="per_type,shared")
  p.add_argument("--length", type=int, default=4096)
  p.add_argument("--types", type=int, default=50)
  p.add_argument("--json", default="", help="also write the attempts here")
  args = p.parse_args(argv)
  os.environ["JAX_PLATFORMS"] = "cpu"
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top

  out = {}
  for gen in args.generations.split(","):
    topo = topologies.get_topology_desc(platform="tpu", topology_name=TOPOLOGIES[gen], chip_config_name="default",
                                        chips_per_host_bounds=(1, 1, 1), num_slices=1)
    for head in args.heads.split(","):
      for tile in TILES:
        row = try_tile(topo.devices, head=head, tile=tile, B=1, L=args.length, H=args.types)
        out[f"{gen} {head} {tile}"] = row
        print(gen, head, tile, row, flush=True)
        if row["ok"]:
          break
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)


if __name__ == "__main__":
  main()
