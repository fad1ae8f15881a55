"""The precision policy (model.dtype=auto) and attention settings: resolution per target platform, the CPU step
unchanged, f32 where it matters under bf16, and workdirs from before these keys resuming without a config change."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from gp_jax import factory, resume
from gp_jax.configs import base
from tests import helpers_train as ht


@pytest.mark.parametrize("platform,expected", [("cpu", "float32"), ("cuda", "bfloat16"), ("gpu", "bfloat16"),
                                               ("tpu", "bfloat16")])
def test_auto_resolves_per_target(platform, expected):
  assert factory.resolve_dtype("auto", platform) == expected
  assert factory.resolve_dtype("float32", platform) == "float32"
  assert factory.resolve_dtype("bfloat16", platform) == "bfloat16"


def test_defaults_and_bad_values():
  c = base.get_config()
  assert (c.model.dtype, c.model.attention, c.model.attention_dropout) == ("auto", "auto", -1.0)
  assert factory.attention_dropout(c) == 0.0  # scratch: no attention dropout, as before
  b = base.get_config("encoder=bert")
  b.model.dropout = 0.3
  assert factory.attention_dropout(b) == 0.3  # bert: the old tie to model.dropout
  b.model.attention_dropout = 0.0
  assert factory.attention_dropout(b) == 0.0
  with pytest.raises(ValueError, match="model.dtype"):
    factory.resolve_dtype("float16", "cpu")
  with pytest.raises(ValueError, match="platform"):
    factory.target_platform("metal")


def test_readme_main_job_resolves_to_float32_xla_on_cpu():
  from benchmarks import inputs
  from gp_jax.ops import attention as attention_lib

  config = inputs.msra_config()
  policy = factory.precision(config, "cpu")
  assert (policy.platform, policy.dtype, policy.attention) == ("cpu", "float32", "auto")
  assert attention_lib.choose(policy.attention, platform="cpu", dtype=jnp.float32, length=128, head_dim=64,
                              dropout=False) == ("xla", "")
  assert factory.precision(config).platform == jax.default_backend()  # default: this machine


def _step_jaxpr(config, batch, tokenizer, types, **init_kwargs):
  """Jaxpr of the trainer's train step (`steps.train_step`) for `config` on one device."""
  from gp_jax import sharding as shd
  from gp_jax import state as state_lib
  from gp_jax import steps
  from gp_jax.optim import make_optimizer

  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  setup, params = state_lib.init_model(config, tokenizer, types, mesh, **init_kwargs)
  tx, _ = make_optimizer(config.optimizer, 100, params)
  state = state_lib.init_train_state(setup, params, tx, seed=0)
  fn = lambda s, b: steps.train_step(s, b, graphdef=setup.graphdef, rest=setup.rest, tx=tx,  # noqa: E731
                                     loss_kind=config.loss.kind)
  return str(jax.make_jaxpr(fn)(state, batch))


TINY_HF = dict(num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=48, vocab_size=1200)


def _tiny_problem(encoder):
  """(config, types, tokenizer, model batch, init_model kwargs) of a tiny model with attention dropout on."""
  from benchmarks import inputs
  from gp_jax.evaluate import model_batch

  if encoder == "bert":
    hf = dict(inputs.BERT_BASE, **TINY_HF)
    tokenizer, features = inputs.bert_inputs(hf)
    config, types = inputs.bert_config(2, 8)
    init, specials = dict(load_weights=False, encoder_config=hf), 1
  else:
    config, types = ht.tiny_config(**{"model.num_attn_layers": 1, "model.attention_dropout": 0.1}), ["A", "B"]
    tokenizer, features = inputs.msra_inputs(vocab=50, bigram_vocab=60)
    init, specials = {}, 0
  batch = model_batch(inputs.synthetic_batch(batch=2, seq=16, num_types=2, features=features, min_len=6,
                                             num_prefix=specials, num_suffix=specials))
  return config, types, tokenizer, batch, init


@pytest.mark.parametrize("encoder", ["scratch", "bert"])
def test_cpu_step_under_auto_is_the_explicit_float32_xla_step(encoder):
  """On CPU, dtype=auto + attention=auto trace to the same train step as float32 + xla (what every run before
  this policy used), attention dropout on."""
  config, types, tokenizer, batch, init = _tiny_problem(encoder)
  jaxprs = []
  for dtype, attention in (("auto", "auto"), ("float32", "xla")):
    config.model.dtype, config.model.attention = dtype, attention
    jaxprs.append(_step_jaxpr(config, batch, tokenizer, types, **init))
  assert "bf16" not in jaxprs[0] and "dot_general" in jaxprs[0]
  assert jaxprs[0] == jaxprs[1]


@pytest.mark.parametrize("encoder", ["scratch", "bert"])
def test_built_for_tpu_computes_in_bf16_with_f32_params_and_scores(encoder):
  """A model built for tpu (on this CPU): float32 parameters, bfloat16 activations, float32 span scores, finite
  loss and float32 gradients."""
  config, types, tokenizer, batch, init = _tiny_problem(encoder)
  kw = {k: v for k, v in init.items()}
  model = factory.build_model(config, tokenizer, len(types), platform="tpu", **kw)
  params = nnx.state(model, nnx.Param)
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
  model.eval()
  batch = jax.tree.map(jnp.asarray, batch)
  graphdef, params, rest = nnx.split(model, nnx.Param, ...)

  def loss(p):
    m = nnx.merge(graphdef, p, rest, copy=True)
    m.train()
    return m.loss(batch)

  @jax.jit  # one program: run op by op, the same model compiles each op on its own (several times slower)
  def run(p):
    m = nnx.merge(graphdef, p, rest, copy=True)
    return m.encode(batch), m(batch), jax.value_and_grad(loss)(p)

  encoded, scores, (value, grads) = run(params)
  assert encoded.dtype == jnp.bfloat16
  assert scores.dtype == jnp.float32  # span scores into decoding
  assert value.dtype == jnp.float32 and np.isfinite(float(value))
  assert {x.dtype for x in jax.tree.leaves(grads)} == {jnp.dtype(jnp.float32)}


# ----------------------------------------------------------------------------- resume


def _old_config_json(config) -> dict:
  """`config` as a workdir written before this policy saved it: dtype float32, and none of the keys added since
  (attention, the Pallas loss, EMA, adversarial training, the tuned threshold)."""
  d = json.loads(config.to_json_best_effort())
  d["model"]["dtype"] = "float32"
  del d["model"]["attention"], d["model"]["attention_dropout"], d["loss"]["implementation"]
  del d["optimizer"]["ema_decay"], d["optimizer"]["ema_warmup"], d["adversarial"], d["tune_threshold"]
  return d


def test_old_workdir_resumes_as_float32_without_allow_config_change(tmp_path):
  from gp_jax import train

  workdir = tmp_path / "old"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(_old_config_json(ht.tiny_config())))
  config = ht.tiny_config()  # today's defaults: dtype auto
  run = train.setup_run(config, str(workdir))
  assert config.model.dtype == "float32" and json.loads(run.config_json)["model"]["dtype"] == "float32"
  assert factory.precision(config, "tpu").dtype == "float32"  # stays float32 on any platform


def test_old_workdir_with_another_dtype_or_attention_needs_allow_config_change(tmp_path):
  from gp_jax import train

  workdir = tmp_path / "old"
  workdir.mkdir()
  (workdir / "config.json").write_text(json.dumps(_old_config_json(ht.tiny_config())))
  for key, value in (("dtype", "bfloat16"), ("attention", "xla"), ("attention_dropout", 0.2)):
    config = ht.tiny_config(**{f"model.{key}": value})
    with pytest.raises(ValueError, match=f"model.{key}"):
      train.setup_run(config, str(workdir))
  config = ht.tiny_config(**{"model.dtype": "bfloat16", "allow_config_change": True})
  train.setup_run(config, str(workdir))


def test_fresh_workdir_keeps_auto():
  config = ht.tiny_config()
  resume.adopt_workdir_dtype(config, None)
  assert config.model.dtype == "auto"
  resume.adopt_workdir_dtype(config, {"model": {"dtype": "auto"}})
  assert config.model.dtype == "auto"


def test_dropout_bits_resolve_per_platform_and_the_environment_overrides(monkeypatch):
  from gp_jax.errors import UserError

  monkeypatch.delenv(factory.DROPOUT_BITS_ENV, raising=False)
  c = base.get_config("encoder=bert")
  assert c.model.dropout_bits == "auto"
  assert [factory.precision(c, p).dropout_bits for p in ("cpu", "cuda", "tpu")] == ["hash", "hash", "threefry"]
  c.model.dropout_bits = "threefry"
  assert factory.precision(c, "cpu").dropout_bits == "threefry"
  monkeypatch.setenv(factory.DROPOUT_BITS_ENV, "hash")
  assert factory.precision(c, "cuda").dropout_bits == "hash"
  monkeypatch.setenv(factory.DROPOUT_BITS_ENV, "philox")
  with pytest.raises(UserError, match="must be one of auto, hash, threefry"):
    factory.precision(c, "cpu")
