"""experiments/su2022.py: Su's settings for every dataset x head x RoPE, its sweep, his optimizer, the CRF's
1000x transition learning rate, and a refused config ending gp_jax.main with one line and exit 2."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from gp_jax import optim
from gp_jax.errors import UserError
from launch import sweep
from tests import helpers_train as ht
from tests import zygote

su2022 = sweep.load_module(os.path.join(ht.REPO, "experiments", "su2022.py"))


@pytest.mark.parametrize("dataset", ["people_daily", "cluener2020", "cmeee"])
def test_every_dataset_head_and_rope_builds(dataset):
  for head in ("standard", "efficient", "crf"):
    for rope in (True, False):
      c = su2022.get_config(f"dataset={dataset},head={head},rope={rope}")
      assert (c.data.name, c.model.head, c.model.use_rope) == (dataset, head, rope)
      assert c.model.encoder == "bert" and c.model.pretrained == "google-bert/bert-base-chinese"
      assert (c.data.max_len, c.batch_size, c.num_epochs, c.model.head_size) == (256, 16, 10.0, 64)
      assert c.data.truncate is False and c.eval_every_steps == 0 and c.early_stop_patience == 0
      assert c.data.test_split == ("test" if dataset == "people_daily" else "")  # CLUENER/CMeEE test unlabelled
  c = su2022.get_config(f"dataset={dataset},pretrained=/models/bert,epochs=2,quick")
  assert c.model.pretrained == "/models/bert" and c.num_train_steps == 16 and c.data.max_len == 64


def test_sweep_is_head_x_rope_for_span_heads_x_three_seeds():
  points = su2022.get_sweep("dataset=cmeee")
  assert len(points) == 15 and len({tuple(sorted(p.items())) for p in points}) == 15
  want = {(h, r, s) for s in (0, 1, 2) for h in ("standard", "efficient") for r in (True, False)}
  want |= {("crf", None, s) for s in (0, 1, 2)}
  assert {(p["config.model.head"], p.get("config.model.use_rope"), p["config.seed"]) for p in points} == want
  assert [p["config.seed"] for p in points] == sorted(p["config.seed"] for p in points)  # seed-major


def test_refused_configs_are_user_errors():
  with pytest.raises(UserError, match="dataset must be one of people_daily, cluener2020, cmeee, got 'msra'"):
    su2022.get_config("dataset=msra")
  with pytest.raises(UserError, match="head must be one of"):
    su2022.get_config("head=softmax")
  with pytest.raises(UserError, match="unknown config arg 'pretrain'"):
    su2022.get_config("pretrain=x")


def _params(crf=True):
  head = {"dense": {"kernel": jnp.ones((4, 5)), "bias": jnp.zeros(5)}}
  if crf:
    head.update(transitions=jnp.zeros((5, 5)), start=jnp.zeros(5), end=jnp.zeros(5))
  return {"encoder": {"w": jnp.ones((3, 4))}, "head": head}


def _updates(opt_cfg, grads, steps=3):
  params = jax.tree.map(jnp.ones_like, grads)
  tx, sched = optim.make_optimizer(opt_cfg, 1000, params)
  state = tx.init(params)
  out = []
  for _ in range(steps):
    updates, state = tx.update(grads, state, params)
    out.append(updates)
  return out, sched


def test_su_optimizer_is_plain_adam_at_a_constant_rate():
  c = su2022.get_config("head=standard").optimizer
  assert (c.lr, c.head_lr, c.warmup_steps, c.decay, c.weight_decay, c.clip_norm, c.b1, c.b2, c.eps) == (
      2e-5, 0.0, 0, "constant", 0.0, 0.0, 0.9, 0.999, 1e-6)
  rng = np.random.default_rng(0)
  grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape) * 50, jnp.float32), _params(crf=False))
  got, sched = _updates(c, grads)
  assert [float(sched(s)) for s in (0, 1, 500, 999)] == [pytest.approx(2e-5)] * 4
  # Identical to optax.adam(2e-5, eps=1e-6): no clipping of these large gradients, no decay.
  want_tx = optax.adam(2e-5, b1=0.9, b2=0.999, eps=1e-6)
  state = want_tx.init(grads)
  for g in got:
    want, state = want_tx.update(grads, state, grads)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=0), g, want)


def test_crf_transitions_learn_at_the_multiplier():
  c = su2022.get_config("head=crf").optimizer
  assert c.crf_lr_multiplier == 1000.0
  assert optim.param_labels(_params(), crf_multiplier=True)["head"] == {
      "dense": {"kernel": "head", "bias": "head"}, "transitions": "crf", "start": "head", "end": "head"}
  rng = np.random.default_rng(1)
  grads = jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), _params())
  fast, _ = _updates(c, grads)
  c.crf_lr_multiplier = 1.0
  plain, _ = _updates(c, grads)
  for f, p in zip(fast, plain):
    np.testing.assert_allclose(f["head"]["transitions"], 1000.0 * p["head"]["transitions"], rtol=1e-5)
    for path in (("head", "dense", "kernel"), ("head", "start"), ("encoder", "w")):
      a, b = f, p
      for k in path:
        a, b = a[k], b[k]
      np.testing.assert_array_equal(a, b)
  # A span head has no transitions: the multiplier changes nothing.
  params = {"encoder": {"w": jnp.ones(2)}, "head": {"q": jnp.ones(2)}}
  c.crf_lr_multiplier = 1000.0
  tx, _ = optim.make_optimizer(c, 10, params)
  updates, _ = tx.update(params, tx.init(params), params)
  assert optim.param_labels(params, crf_multiplier=True) == {"encoder": {"w": "encoder"}, "head": {"q": "head"}}


@pytest.mark.e2e  # runs python -m gp_jax.main
def test_main_refused_config_is_one_line_and_exit_2(tmp_path):
  out = zygote.run([sys.executable, "-m", "gp_jax.main", "--config=experiments/su2022.py:dataset=msra",
                    f"--workdir={tmp_path / 'w'}"], cwd=ht.REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                   text=True, timeout=120, env=ht.subprocess_env(devices=1))
  assert out.returncode == 2, out.stderr[-2000:]
  assert out.stderr.strip().splitlines() == [
      "error: experiments/su2022.py: dataset must be one of people_daily, cluener2020, cmeee, got 'msra'"]
  assert not os.path.exists(tmp_path / "w")
