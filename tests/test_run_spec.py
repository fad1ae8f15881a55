"""The run spec (`factory.RunSpec`): resolved once from the config; the setup carries it, not the ConfigDict."""

from __future__ import annotations

import ast
import dataclasses
import pathlib

import pytest

from gp_jax import factory
from gp_jax import optim
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import steps
from gp_jax.errors import UserError
from tests import helpers_train as ht

GP_JAX = pathlib.Path(__file__).resolve().parents[1] / "gp_jax"
SPEC_READERS = ("state.py", "steps.py", "evaluate.py")


def _config_reads(tree: ast.AST) -> list[str]:
  """`config.x` and `y.config.x` reads: an attribute taken of something named `config`."""
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Attribute):
      base = node.value
      named = (isinstance(base, ast.Name) and base.id == "config") or (isinstance(base, ast.Attribute)
                                                                      and base.attr == "config")
      if named:
        out.append(f"line {node.lineno}: {ast.unparse(node)}")
  return out


@pytest.mark.parametrize("name", SPEC_READERS)
def test_spec_readers_never_read_a_config(name):
  """`state`, `steps` and `evaluate` read `setup.spec` / `run.spec`; the config only passes through to `factory`."""
  tree = ast.parse((GP_JAX / name).read_text(encoding="utf-8"))
  assert _config_reads(tree) == []
  imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
  imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
  assert not any(m.split(".")[0] == "ml_collections" for m in imported)


def test_the_check_finds_config_reads():
  assert sorted(_config_reads(ast.parse("a = setup.config.loss.kind\nb = config.seed\nc = run.config"))) == [
      "line 1: setup.config.loss", "line 2: config.seed"]


def test_setup_carries_the_spec_not_the_config():
  config = ht.tiny_config(**{"optimizer.ema_decay": 0.5, "optimizer.ema_warmup": True, "loss.block_size": 8,
                             "adversarial.kind": "fgm", "adversarial.epsilon": 0.5})
  tokenizer, types, _ = ht.train_batches(config, 1)
  setup, _ = state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1))
  assert not hasattr(setup, "config")
  assert setup.spec == factory.run_spec(config)
  assert (setup.block_size, setup.ema_decay, setup.spec.ema_warmup) == (8, 0.5, True)
  assert setup.spec.adversarial == steps.Adversarial("fgm", 0.5, 3, 0.3)
  with pytest.raises(dataclasses.FrozenInstanceError):
    setup.spec.seed = 1  # type: ignore[misc]


def test_optimizer_spec_reads_like_the_group():
  config = ht.tiny_config(**{"optimizer.update_impl": "optax"})
  spec = factory.OptimizerSpec.from_config(config.optimizer)
  for name in ("lr", "head_lr", "warmup_steps", "decay", "weight_decay", "clip_norm", "b1", "b2", "eps", "update_impl"):
    assert spec.get(name) == config.optimizer[name] == getattr(spec, name)
  assert spec.get("absent", 7) == 7
  assert optim.resolve_update(spec, "cpu") == optim.resolve_update(config.optimizer, "cpu")


def test_spec_is_resolved_for_the_target_platform():
  config = ht.tiny_config(**{"model.dtype": "auto"})
  assert factory.run_spec(config, "cpu").precision.dtype == "float32"
  tpu = factory.run_spec(config, "tpu")
  assert (tpu.platform, tpu.precision.dtype) == ("tpu", "bfloat16")


def test_buckets_past_max_len_are_refused_in_one_line_that_names_the_fix():
  config = ht.tiny_config(**{"data.max_len": 48, "data.buckets": (16, 32, 64)})
  with pytest.raises(UserError) as e:
    factory.run_spec(config, "cpu")
  assert str(e.value) == ("data.buckets=(16, 32, 64) must lie in [1, data.max_len=48]: pass "
                          "--config.data.buckets='(16, 32)' or a larger data.max_len")
  config.data.buckets = (16, 32, 48)
  assert factory.run_spec(config, "cpu").buckets == (16, 32, 48)
  config.data.buckets = ()
  assert factory.run_spec(config, "cpu").buckets == ()


@pytest.mark.parametrize("key, value, says", [
    ("batch_size", -3, "batch_size=-3: expected a positive integer"),
    ("eval_batch_size", 0, "eval_batch_size=0: expected a positive integer"),
    ("log_every_steps", 0, "log_every_steps=0: expected a positive integer"),
    ("checkpoint_every_steps", 0, "checkpoint_every_steps=0: expected a positive integer"),
    ("keep_checkpoints", 0, "keep_checkpoints=0: expected a positive integer"),
    ("steps_per_execution", -1, "steps_per_execution=-1: expected an integer >= 0"),
    ("model.head_size", 0, "model.head_size=0: expected a positive integer"),
    ("eval_every_steps", -1, "eval_every_steps=-1: expected an integer >= 0"),
    ("loss.block_size", -4, "loss.block_size=-4: expected an integer >= 0"),
    ("early_stop_patience", -1, "early_stop_patience=-1: expected an integer >= 0")])
def test_counts_out_of_range_are_refused_in_one_line(key, value, says):
  """Each was a traceback from deep in the run (a modulo by zero, a batch check, a shape error)."""
  with pytest.raises(UserError, match=f"^{says.replace('.', '[.]')}$"):
    factory.run_spec(ht.tiny_config(**{key: value}), "cpu")
  assert factory.run_spec(ht.tiny_config(), "cpu").eval_every_steps == 1000  # TINY's own counts pass


def test_early_stop_patience_is_kept_as_the_config_gives_it():
  """It stopped a run at step 15 when negative; the log line said "2.0 epochs" of the config's 2."""
  spec = factory.run_spec(ht.tiny_config(early_stop_patience=2), "cpu")
  assert f"{spec.early_stop_patience}" == "2"
  assert factory.run_spec(ht.tiny_config(), "cpu").early_stop_patience == 0


@pytest.mark.parametrize("key, value", [("dropout", 1.5), ("embed_dropout", -0.1), ("attention_dropout", 1.0)])
def test_dropout_rates_outside_zero_one_are_refused(key, value):
  """model.dropout=1.5 trained to the end before (a rate above 1 is no dropout any layer can draw)."""
  with pytest.raises(UserError, match=rf"^model\.{key}={value}: expected a rate in \[0, 1\)"):
    factory.run_spec(ht.tiny_config(**{f"model.{key}": value}), "cpu")
  assert factory.run_spec(ht.tiny_config(**{"model.attention_dropout": -1.0}), "cpu")  # -1: the default tie


@pytest.mark.parametrize("key, value", [("lr", -1.0), ("lr", float("nan")), ("head_lr", float("inf"))])
def test_learning_rates_negative_or_not_finite_are_refused(key, value):
  with pytest.raises(UserError, match=rf"^optimizer\.{key}={value}: expected a finite learning rate >= 0"):
    factory.run_spec(ht.tiny_config(**{f"optimizer.{key}": value}), "cpu")
  assert factory.run_spec(ht.tiny_config(**{"optimizer.lr": 0.0}), "cpu")  # 0: a frozen model (init_from checks)


def test_unknown_choices_and_a_mesh_past_the_devices_are_user_errors():
  """Their messages named the key already; raised as ValueError they reached the user as tracebacks."""
  with pytest.raises(UserError, match="model.dtype must be one of"):
    factory.run_spec(ht.tiny_config(**{"model.dtype": "float8"}), "cpu")
  with pytest.raises(UserError, match=r"optimizer.decay must be one of \('linear', 'cosine', 'constant'\)"):
    optim.make_schedule(ht.tiny_config(**{"optimizer.decay": "step"}).optimizer, 1e-3, 10)
  with pytest.raises(UserError, match=r"mesh data=3 x fsdp=1 does not match 8 devices"):
    shd.make_mesh(3, 1, devices=[object()] * 8)
  with pytest.raises(UserError, match=r"model.encoder must be one of \('scratch', 'bert'\)"):
    factory.build_tokenizer(ht.tiny_config(**{"model.encoder": "lstm"}), ["ab"])


# Each value below reached the user as a traceback mid-run (attention, tag scheme), trained on as if it were the
# default (loss.implementation, model.kernels) or failed only after data and compile (head, loss kind): a dry run
# (`launch.points.config_problem`) let every one through.
BAD_CHOICES = [("model.head", "nosuchhead", None), ("model.head", "eficient", "efficient"),
               ("model.encoder", "lstm", None), ("model.attention", "flash", None),
               ("model.dropout_bits", "philox", None), ("loss.kind", "bce", None),
               ("loss.implementation", "triton", None), ("optimizer.decay", "step", None),
               ("optimizer.update_impl", "adam", None), ("adversarial.kind", "fgsm", "fgm"),
               ("data.name", "msra2", "msra"), ("model.block", "relu", None)]


@pytest.mark.parametrize("key, value, close", BAD_CHOICES)
def test_a_name_outside_a_keys_choices_is_refused_before_the_run(key, value, close):
  hint = rf" \(did you mean '{close}'\?\)" if close else ""
  with pytest.raises(UserError, match=rf"^{key.replace('.', '[.]')}='{value}': expected one of [^\n]+{hint}$"):
    factory.run_spec(ht.tiny_config(**{key: value}), "cpu")


def test_every_listed_choice_passes_the_check():
  config = ht.tiny_config()
  for key, names in factory.choices(config).items():
    for name in names:
      factory.check_choices(ht.tiny_config(**{key: name}))
  bert = ht.tiny_config(**{"model.encoder": "bert", "model.kernels": "fused"})
  with pytest.raises(UserError, match="^model[.]kernels='cutlass': expected one of auto, fused, reference$"):
    factory.check_choices(ht.tiny_config(**{"model.encoder": "bert", "model.kernels": "cutlass"}))
  factory.check_choices(bert)
  assert set(factory.choices(config)["model.head"]) == {"standard", "efficient", "crf", "softmax"}
  assert {"jsonl", "conll", "synthetic", "msra", "phee"} <= set(factory.choices(config)["data.name"])


@pytest.mark.parametrize("scheme, ok", [("BIO", True), ("iob2", True), ("BIOES", True), ("BMES", False),
                                        ("IOB1", False), ("nosuch", False)])
def test_a_tagger_takes_bio_or_bioes_only(scheme, ok):
  config = ht.tiny_config(**{"model.head": "crf", "model.tag_scheme": scheme})
  if ok:
    factory.check_choices(config)
  else:
    with pytest.raises(UserError, match=f"^model[.]tag_scheme='{scheme}': the tagger heads take BIO or BIOES"):
      factory.check_choices(config)
  factory.check_choices(ht.tiny_config(**{"model.tag_scheme": "nosuch"}))  # a span head never reads it
