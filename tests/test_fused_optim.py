"""optim's fused update against optax's (the formulation every run used before it): same state layout, same parameters
and moments after a few updates, with and without clipping, weight decay and per-group learning rates; its global
norm against a NumPy sum of squares; "auto" is optax's update, bit for bit, on CPU; a sharded state stays sharded;
and the train step with the fused encoder kernels and update forced on CPU against the reference step."""

import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from gp_jax import optim
from gp_jax import sharding as shd


def _opt_cfg(kind: str, update: str = "auto"):
  """Su's plain Adam (constant rate, no clip, no decay, CRF multiplier) or the base AdamW (warmup + linear decay,
  clip 1.0, decay 0.01, head rate)."""
  c = ml_collections.ConfigDict(dict(lr=2e-5, head_lr=0.0, warmup_steps=0, decay="constant", weight_decay=0.0,
                                     clip_norm=0.0, b1=0.9, b2=0.999, eps=1e-6, crf_lr_multiplier=1000.0,
                                     update_impl=update))
  if kind == "base":
    c.update(dict(lr=5e-3, head_lr=1e-2, warmup_steps=2, decay="linear", weight_decay=0.01, clip_norm=1.0, b2=0.98,
                  eps=1e-8, crf_lr_multiplier=1.0))
  return c


def _params(rng):
  normal = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
  return {"encoder": {"layer": {"kernel": normal(24, 8), "bias": normal(8)}, "norm": {"scale": normal(8),
                                                                                        "bias": normal(8)},
                      "table": normal(40, 8)},
          "head": {"dense": {"kernel": normal(8, 6), "bias": normal(6)}, "transitions": normal(3, 3),
                   "start": normal(3)}}


@functools.lru_cache(maxsize=None)
def _optimizer(kind: str, update: str):
  """(tx, jitted tx.apply), built once per kind and update: both gradient scales run one compiled update."""
  tx, _ = optim.make_optimizer(_opt_cfg(kind, update), 20, _params(np.random.default_rng(0)))
  return tx, jax.jit(tx.apply)


@functools.lru_cache(maxsize=None)  # the base optax run is the reference of two tests
def _run(kind: str, update: str, grad_scale: float, steps: int = 4):
  rng = np.random.default_rng(0)
  params = _params(rng)
  grads = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * grad_scale, jnp.float32), params)
           for _ in range(steps)]
  tx, apply = _optimizer(kind, update)
  state = tx.init(params)
  norms = []
  for g in grads:
    params, state, norm = apply(g, state, params)
    norms.append(float(norm))
  return params, state, norms, grads


@pytest.mark.parametrize("kind", ["su", "base"])
@pytest.mark.parametrize("grad_scale", [0.01, 30.0])  # base: below and above the clip norm
def test_fused_update_matches_optax(kind, grad_scale):
  p_ref, s_ref, n_ref, grads = _run(kind, "optax", grad_scale)
  p_new, s_new, n_new, _ = _run(kind, "fused", grad_scale)
  assert jax.tree.structure(s_new) == jax.tree.structure(s_ref)  # the checkpoint layout is optax's
  for a, b in zip(jax.tree.leaves(s_ref), jax.tree.leaves(s_new)):
    assert a.shape == b.shape and a.dtype == b.dtype
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-6, atol=1e-7)
  for a, b in zip(jax.tree.leaves(p_ref), jax.tree.leaves(p_new)):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-6, atol=1e-7)
  want = [np.sqrt(sum(np.sum(np.square(np.asarray(x, np.float64))) for x in jax.tree.leaves(g))) for g in grads]
  np.testing.assert_allclose(n_new, want, rtol=1e-5)
  np.testing.assert_allclose(n_ref, want, rtol=1e-5)


def test_auto_is_optax_bit_for_bit_on_cpu():
  p_ref, s_ref, n_ref, _ = _run("base", "optax", 30.0)
  p_auto, s_auto, n_auto, _ = _run("base", "auto", 30.0)
  assert n_auto == n_ref
  for a, b in zip(jax.tree.leaves((p_ref, s_ref)), jax.tree.leaves((p_auto, s_auto))):
    np.testing.assert_array_equal(np.asarray(b), np.asarray(a))


def test_global_norm_is_the_sum_of_squares():
  rng = np.random.default_rng(1)
  tree = {"a": rng.normal(size=(5, 7)), "b": rng.normal(size=(7,)), "c": rng.normal(size=()), "d": rng.normal(
      size=(2, 3, 4)), "e": rng.normal(size=(5, 7)), "f": rng.normal(size=(1,))}
  want = np.sqrt(sum(np.sum(np.square(x)) for x in tree.values()))
  got = jax.jit(optim.global_norm)(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), tree))
  np.testing.assert_allclose(float(got), want, rtol=1e-6)
  assert float(optim.global_norm({})) == 0.0


def test_update_names_resolve_per_platform():
  c = _opt_cfg("su")
  assert [optim.resolve_update(c, p) for p in ("cpu", "cuda", "tpu")] == ["optax", "fused", "optax"]
  c.update_impl = "fused"
  assert optim.resolve_update(c, "cpu") == "fused"
  del c["update_impl"]
  assert optim.resolve_update(c, "cuda") == "fused"  # configs written before the key: auto
  c["update"] = "optax"
  assert optim.resolve_update(c, "cuda") == "optax"  # workdirs written before the rename
  del c["update"]
  c.update_impl = "grouped"
  with pytest.raises(ValueError, match="optimizer.update_impl must be one of"):
    optim.make_optimizer(c, 10, {"w": jnp.zeros(3)})


def test_fused_update_under_fsdp_keeps_shardings_and_values():
  """A 2 x 4 (data x fsdp) mesh: sharded matrices stay sharded (only their row sums of squares move), the values are
  optax's."""
  mesh = shd.make_mesh(2, 4)
  rng = np.random.default_rng(2)
  params = {"encoder": {"kernel": jnp.asarray(rng.normal(size=(64, 32)), jnp.float32),
                        "wide": jnp.asarray(rng.normal(size=(16, 128)), jnp.float32),
                        "bias": jnp.asarray(rng.normal(size=(32,)), jnp.float32),
                        "long": jnp.asarray(rng.normal(size=(2048,)), jnp.float32)}}
  grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
  shardings = shd.tree_shardings(mesh, params)
  assert shardings["encoder"]["long"].spec == P("fsdp") and shardings["encoder"]["bias"].spec == P()
  out = {}
  for update in ("optax", "fused"):
    tx, _ = optim.make_optimizer(_opt_cfg("base", update), 20, params)
    state_shard = shd.tree_shardings(mesh, jax.eval_shape(tx.init, params))
    p, g = jax.device_put(params, shardings), jax.device_put(grads, shardings)
    state = jax.jit(tx.init, out_shardings=state_shard)(p)

    def apply(g, s, p, tx=tx):
      with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        return tx.apply(g, s, p)

    step = jax.jit(apply, in_shardings=(shardings, state_shard, shardings),
                   out_shardings=(shardings, state_shard, NamedSharding(mesh, P())))
    out[update] = step(g, state, p)
  for a, b in zip(jax.tree.leaves(out["optax"]), jax.tree.leaves(out["fused"])):
    assert a.sharding == b.sharding
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=2e-6, atol=1e-7)


# ----------------------------------------------------------------------------- the train step


def _bert_problem(dropout: float):
  """(config, types, tokenizer, batches, init kwargs) of a 1-layer BERT with the su2022 head and loss (a second
  layer runs the same fused kernels again: compile time, no new path)."""
  from benchmarks import inputs
  from gp_jax.evaluate import model_batch

  hf = dict(inputs.BERT_BASE, num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=48,
            vocab_size=1200)
  tokenizer, features = inputs.bert_inputs(hf)
  config, types = inputs.bert_config(3, 8)
  config.model.dropout = dropout
  config.optimizer.warmup_steps = 0
  config.optimizer.lr = 1e-3
  batches = [model_batch(inputs.synthetic_batch(batch=4, seq=16, num_types=3, features=features, min_len=6,
                                                num_prefix=1, num_suffix=1, seed=s)) for s in range(3)]
  return config, types, tokenizer, batches, dict(load_weights=False, encoder_config=hf)


def _steps(config, types, tokenizer, batches, init, *, fused: bool, monkeypatch):
  from gp_jax import state as state_lib
  from gp_jax import steps
  from gp_jax.models import bert

  monkeypatch.setattr(bert, "FUSED_ON", ("cpu", "cuda") if fused else ("cuda",))
  config.optimizer.update_impl = "fused" if fused else "optax"
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  setup, params = state_lib.init_model(config, tokenizer, types, mesh, **init)
  tx, _ = optim.make_optimizer(config.optimizer, 100, params)
  state = state_lib.init_train_state(setup, params, tx, seed=0)
  step = steps.make_train_step(setup, tx, loss_kind=config.loss.kind, donate=False)
  losses, norms = [], []
  for batch in batches:
    state, metrics = step(state, shd.global_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
    norms.append(float(metrics["grad_norm"]))
  return state, losses, norms


def test_fused_train_step_matches_the_reference_step_on_cpu(monkeypatch):
  """Dropout off (the masks' key words differ between the two), float32 on CPU: the same losses and gradient norms,
  parameters and moments within float32 rounding after three steps."""
  problem = _bert_problem(dropout=0.0)
  ref, ref_losses, ref_norms = _steps(*problem, fused=False, monkeypatch=monkeypatch)
  new, new_losses, new_norms = _steps(*problem, fused=True, monkeypatch=monkeypatch)
  assert all(np.isfinite(ref_losses))
  np.testing.assert_allclose(new_losses, ref_losses, rtol=1e-5)
  np.testing.assert_allclose(new_norms, ref_norms, rtol=1e-4)
  assert jax.tree.structure(new) == jax.tree.structure(ref)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ref["params"]), jax.tree.leaves(new["params"])):
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(b, a, rtol=0, atol=1e-5 * max(1.0, float(np.max(np.abs(a)))),
                               err_msg=jax.tree_util.keystr(path))


def test_fused_train_step_with_dropout_is_finite_and_repeatable(monkeypatch):
  problem = _bert_problem(dropout=0.1)
  _, a, _ = _steps(*problem, fused=True, monkeypatch=monkeypatch)
  _, b, _ = _steps(*problem, fused=True, monkeypatch=monkeypatch)
  _, ref, _ = _steps(*problem, fused=False, monkeypatch=monkeypatch)
  assert a == b and all(np.isfinite(a))
  np.testing.assert_allclose(a[0], ref[0], rtol=0.2)  # other masks, same model: a loss of the same size


def test_a_workdir_written_before_the_rename_resumes_and_keeps_its_choice():
  """optimizer.update was renamed update_impl (`--config.optimizer.update=...` clashed with ConfigDict.update)."""
  from gp_jax import workdir as wd  # pylint: disable=g-import-not-at-top
  from gp_jax.configs import base  # pylint: disable=g-import-not-at-top

  new = json.loads(base.get_config().to_json_best_effort())
  old = json.loads(json.dumps(new))
  old["optimizer"]["update"] = old["optimizer"].pop("update_impl")
  assert wd.config_changes(old, new, new) == []
  old["optimizer"]["update"] = "fused"
  assert wd.config_changes(old, new, new) == ["optimizer.update_impl: 'fused' -> 'auto'"]
  assert optim.resolve_update(ml_collections.ConfigDict(old["optimizer"]), "cpu") == "fused"
