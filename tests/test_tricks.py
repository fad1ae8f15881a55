"""Training tricks (issue 33): EMA of the parameters, FGM/PGD on the word-embedding output, the dev-tuned threshold.

References are NumPy: the EMA recurrence, r = epsilon * g / ||g|| and the PGD loop with its projection, where g
comes from a separate jax.grad of the model's loss w.r.t. the embedding delta, itself checked against a central
finite difference."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import steps
from gp_jax import threshold as threshold_lib
from gp_jax.optim import make_optimizer
from tests import helpers_train as ht

NO_DROPOUT = {"model.dropout": 0.0, "model.embed_dropout": 0.0}


def _config(**overrides):
  """The tiny config with one encoder layer: the tricks act on the parameters and the embedding output, a second
  layer only adds compile time."""
  return ht.tiny_config(**{"model.num_layers": 1, **overrides})


@pytest.fixture(scope="module")
def data():
  config = _config(**NO_DROPOUT)
  tokenizer, types, batches = ht.train_batches(config, 3)
  return tokenizer, types, batches


def _run(config, data, n: int, *, fsdp: int = 1, shardings: dict | None = None, states: list | None = None):
  """(initial params, [params after each step], final state, [metrics]) of `n` jitted steps, as numpy.
  `shardings`, when given, receives the final state's shardings; `states`, the state after each step."""
  tokenizer, types, batches = data
  mesh = shd.make_mesh(-1, fsdp)
  setup, params = state_lib.init_model(config, tokenizer, types, mesh)
  tx, _ = make_optimizer(config.optimizer, 100, params)
  state = state_lib.init_train_state(setup, params, tx, seed=config.seed)
  init = jax.tree.map(np.asarray, params)
  step_fn = steps.make_train_step(setup, tx, loss_kind=config.loss.kind, donate=False)
  after, metrics = [], []
  for batch in batches[:n]:
    state, m = step_fn(state, shd.global_batch(batch, mesh))
    after.append(jax.tree.map(np.asarray, state["params"]))
    if states is not None:
      states.append(jax.tree.map(np.asarray, state))
    metrics.append(jax.tree.map(np.asarray, m))
  if shardings is not None:
    shardings.update(jax.tree.map(lambda x: x.sharding, state))
  return init, after, jax.tree.map(np.asarray, state), metrics


@pytest.fixture(scope="module")
def plain(data):
  """The plain step (no EMA, no adversarial term) over three batches, built once for the tests that compare to it:
  (the `_run` tuple, [state after each step])."""
  states = []
  return _run(_config(), data, 3, states=states), states


def _assert_trees_equal(a, b):
  fa, fb = ht.flat(a), ht.flat(b)
  assert fa.keys() == fb.keys()
  differ = [k for k in fa if not np.array_equal(fa[k], fb[k])]
  assert not differ, differ[:3]


# ----------------------------------------------------------------------------- EMA


def test_ema_is_the_numpy_recurrence_and_leaves_training_alone(data, plain):
  decay = 0.8  # strong, so three steps move the EMA far from both the start and the parameters
  init, after, state, _ = _run(_config(**{"optimizer.ema_decay": decay}), data, 3)
  want = {k: v.astype(np.float64) for k, v in ht.flat(init).items()}
  for params in after:
    want = {k: decay * want[k] + (1 - decay) * v for k, v in ht.flat(params).items()}
  got = ht.flat(state["ema"])
  assert got.keys() == want.keys()
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)
  moved = ht.flat(after[-1])
  assert any(not np.allclose(got[k], moved[k]) for k in got)

  # EMA off: no state entry, and the parameters, optimizer state, step and RNG are exactly the EMA run's.
  (_, _, plain_state, _), _ = plain
  assert "ema" not in plain_state
  _assert_trees_equal({k: v for k, v in state.items() if k != "ema"}, plain_state)


def test_ema_warmup_is_the_tf_num_updates_recurrence(data):
  decay = 0.999  # without warm-up three steps would leave the EMA at ~99.7% of the initial parameters
  init, after, state, _ = _run(_config(**{"optimizer.ema_decay": decay, "optimizer.ema_warmup": True}),
                               data, 3)
  want = {k: v.astype(np.float64) for k, v in ht.flat(init).items()}
  for t, params in enumerate(after):
    d = min(decay, (1 + t) / (10 + t))
    want = {k: d * want[k] + (1 - d) * v for k, v in ht.flat(params).items()}
  got = ht.flat(state["ema"])
  for k in want:
    np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_ema_decay_out_of_range_is_refused(data):
  tokenizer, types, _ = data
  with pytest.raises(ValueError, match="ema_decay"):  # when the run spec is resolved, before anything is built
    state_lib.init_model(_config(**{"optimizer.ema_decay": 1.0}), tokenizer, types, shd.make_mesh(-1, 1))


# ----------------------------------------------------------------------------- adversarial


def _model_loss(data, config):
  """(params, loss(params, embed_delta), delta_grad, zeros delta) of the tiny model on the first batch."""
  tokenizer, types, batches = data
  setup, params = state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1))
  batch = jax.tree.map(jnp.asarray, batches[0])

  def loss(p, delta):
    model = nnx.merge(setup.graphdef, nnx.State(p), setup.rest, copy=True)
    model.train()
    return model.loss(dict(batch, embed_delta=delta), loss_kind=config.loss.kind)

  width = nnx.merge(setup.graphdef, nnx.State(params), setup.rest).encoder.embed_width
  zeros = jnp.zeros(batch["attention_mask"].shape + (width,), jnp.float32)
  return params, jax.jit(loss), jax.jit(jax.grad(loss, argnums=1)), zeros


@pytest.fixture(scope="module")
def model_loss(data):
  """`_model_loss` of the tiny model without dropout, compiled once for the tests that use that config."""
  return _model_loss(data, _config(**NO_DROPOUT))


def _np_unit(g, scale):
  g = np.asarray(g, np.float64)
  return scale * g / np.sqrt(np.sum(g * g))


def test_fgm_perturbation_is_epsilon_g_over_its_norm(model_loss):
  params, loss, delta_grad, zeros = model_loss
  g = np.asarray(delta_grad(params, zeros), np.float64)
  assert np.sqrt(np.sum(g * g)) > 0
  # g is the loss's gradient w.r.t. the embedding output: the slope along g / ||g|| is ||g||.
  h, u = 1e-2, _np_unit(g, 1.0).astype(np.float32)
  slope = (float(loss(params, h * u)) - float(loss(params, -h * u))) / (2 * h)
  np.testing.assert_allclose(slope, np.sqrt(np.sum(g * g)), rtol=2e-2)

  eps = 0.7
  clean, adv_loss, grads, r = steps.adversarial_grads(loss, params, zeros, steps.Adversarial("fgm", eps))
  want_r = _np_unit(g, eps)
  np.testing.assert_allclose(np.asarray(r), want_r, rtol=1e-5, atol=1e-8)
  np.testing.assert_allclose(np.sqrt(np.sum(np.asarray(r, np.float64) ** 2)), eps, rtol=1e-5)
  r32 = want_r.astype(np.float32)
  np.testing.assert_allclose(float(clean), float(loss(params, zeros)), rtol=1e-6)
  np.testing.assert_allclose(float(adv_loss), float(loss(params, r32)), rtol=1e-5)
  assert float(adv_loss) > float(clean)  # an ascent direction
  want = jax.jit(lambda p: jax.tree.map(jnp.add, jax.grad(loss)(p, zeros), jax.grad(loss)(p, r32)))(params)
  for k, v in ht.flat(want).items():
    np.testing.assert_allclose(ht.flat(grads)[k], v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_pgd_perturbation_is_the_projected_numpy_loop(model_loss):
  params, loss, delta_grad, zeros = model_loss
  eps, alpha, k = 0.5, 0.3, 3
  _, _, _, r = steps.adversarial_grads(loss, params, zeros, steps.Adversarial("pgd", eps, steps=k, alpha=alpha))
  want = np.zeros(zeros.shape)
  projected = 0
  for t in range(k):
    g = delta_grad(params, jnp.asarray(want, jnp.float32))  # at r_0 = 0: the clean gradient
    want = want + _np_unit(g, alpha)
    norm = np.sqrt(np.sum(want * want))
    if norm > eps:
      want, projected = eps * want / norm, projected + 1
  assert projected >= 1  # the test covers the projection
  np.testing.assert_allclose(np.asarray(r), want, rtol=1e-4, atol=1e-7)


def test_adversarial_step_is_clean_plus_adversarial_in_one_update(data, model_loss):
  """The jitted step with FGM: loss = L(0) + L(r), parameters = one optax update with the summed gradients. The
  reference is the plain config's model (the adversarial settings do not change the model or its initial values)."""
  config = _config(**NO_DROPOUT, **{"adversarial.kind": "fgm", "adversarial.epsilon": 0.7})
  params, loss, delta_grad, zeros = model_loss
  r = _np_unit(delta_grad(params, zeros), 0.7).astype(np.float32)
  tx, _ = make_optimizer(config.optimizer, 100, params)

  @jax.jit  # one program: op by op, the optimizer's update compiles each op of each leaf on its own
  def one_update(params, r):
    grads = jax.tree.map(jnp.add, jax.grad(loss)(params, zeros), jax.grad(loss)(params, r))
    updates, _ = tx.update(grads, tx.init(params), params)
    return optax.apply_updates(params, updates)

  want = one_update(params, r)

  _, after, _, metrics = _run(config, data, 1)
  np.testing.assert_allclose(metrics[0]["loss"], float(loss(params, zeros)) + float(loss(params, r)), rtol=1e-5)
  np.testing.assert_allclose(metrics[0]["adv_loss"], float(loss(params, r)), rtol=1e-5)
  for k, v in ht.flat(want).items():
    np.testing.assert_allclose(ht.flat(after[0])[k], v, rtol=1e-5, atol=1e-6, err_msg=k)


def test_ema_and_fgm_under_fsdp_shard_like_the_parameters(data):
  """On a data x fsdp mesh the EMA has the parameters' shardings and the step computes what one device does."""
  config = _config(**NO_DROPOUT, **{"optimizer.ema_decay": 0.9, "adversarial.kind": "fgm"})
  shardings = {}
  _, _, sharded, _ = _run(config, data, 2, fsdp=2, shardings=shardings)
  assert jax.tree.structure(shardings["ema"]) == jax.tree.structure(shardings["params"])
  assert jax.tree.leaves(shardings["ema"]) == jax.tree.leaves(shardings["params"])
  assert any("fsdp" in str(s.spec) for s in jax.tree.leaves(shardings["ema"]))
  _, _, single, _ = _run(config, data, 2)
  for k, v in ht.flat(single).items():
    np.testing.assert_allclose(ht.flat(sharded)[k], v, rtol=1e-4, atol=1e-6, err_msg=k)


def test_epsilon_zero_is_exactly_the_plain_step(data, plain, model_loss):
  """Contract: epsilon = 0 (or kind = none) skips the adversarial term, so the step is the plain one bit for bit;
  and a zero `embed_delta` leaves the loss bit for bit as it is without one."""
  assert steps.Adversarial.from_config(_config(**{"adversarial.kind": "fgm", "adversarial.epsilon": 0.0})) is None
  _, plain_states = plain
  for kind in ("fgm", "pgd"):
    _, _, zero, _ = _run(_config(**{"adversarial.kind": kind, "adversarial.epsilon": 0.0}), data, 2)
    _assert_trees_equal(zero, plain_states[1])
  params, loss, _, zeros = model_loss
  tokenizer, types, batches = data
  config = _config(**NO_DROPOUT)
  setup, _ = state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1))
  plain_loss = jax.jit(lambda p, b: nnx.merge(setup.graphdef, nnx.State(p), setup.rest).loss(b))
  assert float(loss(params, zeros)) == float(plain_loss(params, jax.tree.map(jnp.asarray, batches[0])))


def test_adversarial_config_is_checked():
  with pytest.raises(ValueError, match="adversarial.kind"):
    steps.Adversarial.from_config(_config(**{"adversarial.kind": "fgsm"}))
  with pytest.raises(ValueError, match="alpha"):
    steps.Adversarial.from_config(_config(**{"adversarial.kind": "pgd", "adversarial.alpha": 0.0}))
  assert steps.Adversarial.from_config(_config()) is None


def test_scratch_delta_enters_at_the_embedding_output(data):
  """The delta is added to concat(char, bigram) embeddings, before dropout and the input projection."""
  tokenizer, types, batches = data
  setup, params = state_lib.init_model(_config(), tokenizer, types, shd.make_mesh(-1, 1))
  enc = nnx.merge(setup.graphdef, nnx.State(params), setup.rest).encoder
  enc.eval()
  b = batches[0]
  ids, bigrams, mask = (jnp.asarray(b[k]) for k in ("input_ids", "bigram_ids", "attention_mask"))
  delta = jax.random.normal(jax.random.key(0), ids.shape + (enc.embed_width,))

  @nnx.jit  # one program: op by op, every op compiles on its own
  def outputs(enc, delta):
    x = enc.in_proj(jnp.concatenate([enc.embed(ids), enc.bigram_embed(bigrams)], -1) + delta)
    mask_BL1 = mask[..., None].astype(jnp.float32)
    for conv in enc.convs:
      x = conv(x, mask_BL1)
    want = enc.final_norm(x) * mask_BL1
    return want, enc(ids, mask, bigrams, embed_delta=delta), enc(ids, mask, bigrams)

  want, got, without = outputs(enc, delta)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(got), np.asarray(without), atol=1e-3)


def test_bert_delta_enters_before_position_type_and_layernorm():
  from gp_jax.models.bert import Bert, BertConfig

  cfg = BertConfig(vocab_size=50, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                   max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0)
  bert = nnx.jit(lambda: Bert(cfg, rngs=nnx.Rngs(0)))()  # init as one program (op by op compiles every op)
  bert.eval()
  ids = jax.random.randint(jax.random.key(1), (2, 6), 1, 50)
  mask = jnp.ones((2, 6), jnp.int32)
  delta = jax.random.normal(jax.random.key(2), (2, 6, 16))

  @nnx.jit  # one program: op by op, every op compiles on its own
  def outputs(bert, delta):
    x = bert.embeddings_norm(bert.word_embeddings(ids) + delta + bert.position_embeddings(bert.position_ids(ids))
                             + bert.token_type_embeddings(jnp.zeros_like(ids)))
    return bert.layers[0](x, mask.astype(bool)), bert(ids, mask, embed_delta=delta)

  want, got = outputs(bert, delta)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
  assert not np.allclose(np.asarray(got), np.asarray(outputs(bert, jnp.zeros_like(delta))[1]), atol=1e-3)


# ----------------------------------------------------------------------------- threshold


def test_choose_takes_the_best_f1_and_the_value_nearest_zero_among_ties():
  grid = (-0.2, -0.1, 0.0, 0.1, 0.2)
  assert threshold_lib.choose(grid, [0.5, 0.6, 0.55, 0.6, 0.1]) == -0.1
  assert threshold_lib.choose(grid, [0.5, 0.6, 0.6, 0.6, 0.1]) == 0.0
  assert threshold_lib.choose(grid, [0.1, 0.2, 0.3, 0.4, 0.5]) == 0.2
  assert 0.0 in threshold_lib.GRID and len(threshold_lib.GRID) == 41


@pytest.mark.e2e  # trains (train.train_and_evaluate)
def test_tuned_threshold_and_ema_weights_in_a_run(tmp_path):
  """A run with EMA and tune_threshold: best/ holds the EMA weights; the scan's F1 at 0 and at the chosen value
  equal real decodes at those thresholds; threshold.json is what `tuned_threshold` returns while best/ holds
  that step."""
  from gp_jax import checkpoint as ckpt_lib

  steps_n = 40
  overrides = {"num_train_steps": steps_n, "eval_every_steps": steps_n, "checkpoint_every_steps": steps_n,
               "tune_threshold": True, "optimizer.lr": 1e-2, "optimizer.ema_decay": 0.9}
  summary, = ht.train_in_child([(str(tmp_path), overrides)])
  assert summary["status"] == "finished" and summary["eval_weights"] == "ema" and summary["ema_decay"] == 0.9
  _, best = ht.restore_state(str(tmp_path), sub="best")
  _, state = ht.restore_state(str(tmp_path))
  _assert_trees_equal(best, state["ema"])
  assert not all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(best), jax.tree.leaves(state["params"])))

  th = summary["threshold"]
  grid = list(threshold_lib.GRID)
  curve = th["dev_f1_by_threshold"]
  assert len(curve) == len(grid) and th["value"] in grid
  assert curve[grid.index(0.0)] == th["dev_f1_at_0"] == summary["dev"]["f1"]
  assert curve[grid.index(th["value"])] == th["dev_f1"] == summary["dev_tuned"]["f1"] == max(curve)
  assert th["test_f1_at_0"] == summary["test"]["f1"] and th["test_f1"] == summary["test_tuned"]["f1"]
  with open(os.path.join(tmp_path, "results.json")) as f:
    assert json.load(f)["threshold"]["value"] == th["value"]
  assert threshold_lib.tuned_threshold(str(tmp_path)) == th["value"]
  # predict and export take it as their default; an explicit threshold wins.
  from gp_jax import export, predict

  assert predict.Predictor(str(tmp_path)).threshold == th["value"]
  assert predict.Predictor(str(tmp_path), threshold=0.25).threshold == 0.25
  assert export.export_workdir(str(tmp_path), str(tmp_path / "exported"))["threshold"] == th["value"]

  # best/ moves to another step: the saved threshold is stale.
  mngr = ckpt_lib.make_manager(os.path.join(tmp_path, "best"), keep=1, best=True)
  ckpt_lib.save_params(mngr, steps_n + 1, params=best, config_json=(tmp_path / "config.json").read_text(), dev_f1=1.0)
  mngr.wait_until_finished()
  mngr.close()
  assert threshold_lib.tuned_threshold(str(tmp_path)) is None
  assert threshold_lib.tuned_threshold(str(tmp_path / "nowhere")) is None


@pytest.mark.e2e  # trains (train.train_and_evaluate)
def test_tune_threshold_does_not_apply_to_taggers(tmp_path):
  from gp_jax import train

  config = ht.tiny_config(num_train_steps=4, tune_threshold=True, **{"model.head": "softmax"})
  summary = train.train_and_evaluate(config, str(tmp_path))
  assert summary["threshold"]["applies"] is False and "tagger" in summary["threshold"]["why"]
  assert "dev_tuned" not in summary and threshold_lib.tuned_threshold(str(tmp_path)) is None
