"""The sharded train step with the Pallas ZLPR kernel (loss.implementation=pallas, interpreted on 8 CPU devices)
matches the same step with the XLA blockwise op."""

import jax
import numpy as np
import pytest

from gp_jax import sharding as shd
from tests import helpers_train as ht


def config(implementation, head):
  # max_len 48 with block_size 16: three row blocks; optimizer.eps as in test_sharding (a linear update). One encoder
  # layer: the loss is what differs between the two steps, a deeper encoder only adds compile time.
  return ht.tiny_config(**{"loss.block_size": 16, "loss.implementation": implementation, "model.head": head,
                           "optimizer.warmup_steps": 0, "optimizer.eps": 1e-3, "batch_size": 8,
                           "model.num_layers": 1})


@pytest.mark.parametrize("head,data,fsdp", [("standard", 8, 1), ("efficient", 4, 2)])
def test_pallas_step_matches_xla_step(head, data, fsdp):
  assert jax.device_count() == 8
  mesh = shd.make_mesh(data, fsdp)
  tokenizer, types, batches = ht.train_batches(config("xla", head), 2)
  results = {}
  for implementation in ("xla", "pallas"):  # no jax.set_mesh: the trainer's step traces under its mesh itself
    results[implementation] = ht.run_train_steps(config(implementation, head), tokenizer, types, batches, mesh)
  (_, xla_first, _, xla_losses), (_, pallas_first, _, pallas_losses) = results["xla"], results["pallas"]
  np.testing.assert_allclose(pallas_losses, xla_losses, rtol=1e-5)
  want, got = ht.flat(xla_first["params"]), ht.flat(pallas_first["params"])
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_kernel_runs_under_shard_map_only_with_a_mesh():
  import jax.numpy as jnp
  from flax import nnx

  from gp_jax.models import GlobalPointer

  head = GlobalPointer(8, 2, head_size=4, rngs=nnx.Rngs(0))
  hidden_BLD, mask_BL = jnp.ones((8, 6, 8)), jnp.ones((8, 6), jnp.int32)
  ids_BHK = jnp.full((8, 2, 1), -1, jnp.int32)

  def jaxpr(implementation):
    return str(jax.make_jaxpr(lambda h: head.span_loss(h, mask_BL, span_ids=ids_BHK, block_size=4,
                                                       implementation=implementation))(hidden_BLD))

  with jax.set_mesh(shd.make_mesh(4, 2)):
    assert "shard_map" in jaxpr("pallas") and "pallas_call" in jaxpr("pallas")
    assert "shard_map" not in jaxpr("xla")
  assert "shard_map" not in jaxpr("pallas") and "pallas_call" in jaxpr("pallas")


@pytest.mark.parametrize("overrides", [{"loss.block_size": 0}, {"model.head": "crf"}, {"loss.kind": "zlpr"}])
def test_pallas_without_the_blockwise_span_loss_is_refused(overrides):
  from gp_jax import state as state_lib
  from gp_jax.errors import UserError

  tokenizer, types, _ = ht.train_batches(ht.tiny_config(), 1)
  config = ht.tiny_config(**{"loss.block_size": 16, "loss.implementation": "pallas", **overrides})
  with pytest.raises(UserError, match="loss.implementation=pallas"):
    state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1))


def test_auto_resolves_for_the_target_platform(monkeypatch):
  """`loss.implementation=auto` follows the platform the model is built for (a TPU export made on this CPU)."""
  from gp_jax import factory
  from gp_jax.ops import blockwise

  tokenizer, types, _ = ht.train_batches(ht.tiny_config(), 1)
  config = ht.tiny_config(**{"loss.block_size": 16})
  build = lambda platform: factory.build_model(config, tokenizer, len(types), platform=platform)  # noqa: E731
  assert build("cpu").loss_implementation == build("tpu").loss_implementation == "xla"
  monkeypatch.setattr(blockwise, "PALLAS_FASTER_ON", frozenset({"tpu"}))
  assert (build("cpu").loss_implementation, build("tpu").loss_implementation) == ("xla", "pallas")


def test_the_trainers_step_puts_the_kernel_under_shard_map():
  """`steps.make_train_step` traces under the setup's mesh (`steps.under_mesh`), so the head finds the batch axes
  without a `jax.set_mesh` around the training loop."""
  from gp_jax import state as state_lib
  from gp_jax import steps
  from gp_jax.optim import make_optimizer

  mesh = shd.make_mesh(8, 1)
  cfg = config("pallas", "standard")
  tokenizer, types, batches = ht.train_batches(cfg, 1)
  setup, params = state_lib.init_model(cfg, tokenizer, types, mesh)
  tx, _ = make_optimizer(cfg.optimizer, 100, params)
  state = state_lib.init_train_state(setup, params, tx, seed=0)
  step_fn = steps.make_train_step(setup, tx, loss_kind=cfg.loss.kind, donate=False)
  jaxpr = str(jax.make_jaxpr(step_fn)(state, shd.global_batch(batches[0], mesh)))
  assert "shard_map" in jaxpr and "pallas_call" in jaxpr
