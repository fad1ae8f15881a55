"""Train steps on data / fsdp meshes over 8 fake CPU devices match a single-device run."""

import jax
import numpy as np
import pytest

from gp_jax import sharding as shd
from tests import helpers_train as ht

# Adam's update g / (sqrt(v) + eps) with the default eps = 1e-8 is sign(g) * lr for every gradient entry: blind
# to a wrongly scaled gradient, and for the few entries whose gradient is ~0 it turns summation-order noise into
# ~1e-5 parameter differences. With eps = 1e-3 the update stays linear in small gradients: well conditioned.
# Parameters and moments are compared after the first step, losses of both (step 2 runs the step-1 parameters).
STEPS = 2
ATOL = 1e-7


@pytest.fixture(scope="module")
def problem():
  # Dropout on (its keys must not depend on the mesh); no warmup, so the first step really moves the parameters.
  # One encoder layer: a second is the same parameters and collectives again, and only adds compile time.
  config = ht.tiny_config(**{"model.dropout": 0.1, "model.embed_dropout": 0.1, "optimizer.warmup_steps": 0,
                             "optimizer.eps": 1e-3, "model.num_layers": 1})
  return (config, *ht.train_batches(config, STEPS))


@pytest.fixture(scope="module")
def reference(problem):
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  init_params, after_first, _, losses = ht.run_train_steps(*problem, mesh)
  moved = [k for k, v in ht.flat(after_first["params"]).items() if not np.allclose(v, ht.flat(init_params)[k])]
  assert len(moved) == len(ht.flat(init_params)), "every parameter should change in a step without warmup"
  assert losses[1] != losses[0]
  return after_first, losses


def _spec_axes(sharding):
  return {a for entry in sharding.spec if entry is not None for a in ((entry,) if isinstance(entry, str) else entry)}


@pytest.mark.parametrize("data,fsdp", [(8, 1), (4, 2)])
def test_step_matches_single_device(problem, reference, data, fsdp):
  assert jax.device_count() == 8
  mesh = shd.make_mesh(data, fsdp)
  ref_state, ref_losses = reference
  _, after_first, state, losses = ht.run_train_steps(*problem, mesh)

  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for part in ("params", "opt_state"):
    got, want = ht.flat(after_first[part]), ht.flat(ref_state[part])
    assert got.keys() == want.keys()
    for k in want:
      np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=ATOL, err_msg=f"{part}{k}")

  # The batch is split over every device; parameters are sharded over 'fsdp' only when fsdp > 1.
  params = jax.tree_util.tree_leaves_with_path(state["params"])
  fsdp_sharded = {jax.tree_util.keystr(p): x for p, x in params if "fsdp" in _spec_axes(x.sharding)}
  assert all(_spec_axes(x.sharding) <= {"fsdp"} for _, x in params)
  if fsdp == 1:
    assert not fsdp_sharded
  else:
    assert len(fsdp_sharded) >= 3, sorted(fsdp_sharded)
    for k, x in fsdp_sharded.items():
      # Each device holds half of the array along the sharded axis ...
      axis = [n for n, e in enumerate(x.sharding.spec) if e == "fsdp"][0]
      shard_shapes = {s.data.shape for s in x.addressable_shards}
      want_shape = tuple(d // fsdp if n == axis else d for n, d in enumerate(x.shape))
      assert shard_shapes == {want_shape}, (k, x.shape, shard_shapes)
    # ... and so do Adam's moments of those parameters.
    opt_fsdp = [x for x in jax.tree.leaves(state["opt_state"]) if "fsdp" in _spec_axes(x.sharding)]
    assert len(opt_fsdp) >= 2 * len(fsdp_sharded)
