"""Config values as a user meets them in the log: the record caps say what they dropped (a negative cap is refused),
and the precision line names the dropout masks as resolved.json does. In-process, no training."""

import logging

import pytest

from gp_jax import aot, factory
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.data import sources
from gp_jax.errors import UserError
from tests import helpers_train as ht


@pytest.mark.parametrize("key", ["max_train_records", "max_eval_records"])
def test_a_negative_record_cap_is_refused_in_one_line(key):
  """It dropped records from the end (train[:-5]) without a word."""
  config = ht.tiny_config(**{f"data.{key}": -5})
  with pytest.raises(UserError, match=rf"^data\.{key}=-5: expected an integer >= 0 \(0 = every record; N = the "
                     r"first N\)$"):
    sources.load_records(config.data)


def test_the_data_line_says_what_each_cap_dropped(caplog):
  config = ht.tiny_config(**{"data.synthetic_records": 600, "data.max_train_records": 512,
                             "data.max_eval_records": 100})
  with caplog.at_level(logging.INFO, logger="gp_jax.data.sources"):
    train, dev, test, _ = sources.load_records(config.data)
  assert (len(train), len(dev), len(test)) == (512, 100, 100)
  line, = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Data synthetic")]
  assert line.endswith("; capped: train: first 512 of 600 (88 dropped by data.max_train_records), dev: first 100 of "
                       "150 (50 dropped by data.max_eval_records), test: first 100 of 150 (50 dropped by "
                       "data.max_eval_records)"), line


def test_caps_that_cut_nothing_say_nothing_and_zero_keeps_every_record(caplog):
  config = ht.tiny_config(**{"data.synthetic_records": 40, "data.max_train_records": 0,
                             "data.max_eval_records": 10})  # dev and test hold 10: the cap cuts nothing
  with caplog.at_level(logging.INFO, logger="gp_jax.data.sources"):
    train, dev, _, _ = sources.load_records(config.data)
  assert (len(train), len(dev)) == (40, 10)
  assert "capped" not in caplog.text


def test_precision_line_and_resolved_json_name_the_same_dropout_masks():
  """The scratch encoder's log said "dropout masks from hash bits", its resolved.json "none (nnx.Dropout)"."""
  config = ht.tiny_config()
  tokenizer, types, _ = ht.train_batches(config, 1)
  setup, _ = state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1), platform="cpu")
  record = aot.resolved_record([], setup, "cpu")
  policy = factory.precision(config, "cpu")
  assert policy.dropout_bits == record["dropout_bits"] == factory.NNX_DROPOUT
  assert policy.describe().endswith(factory.dropout_masks(record["dropout_bits"]))
  assert factory.dropout_masks(factory.NNX_DROPOUT) == "dropout masks: none (nnx.Dropout)"
  bert = ht.tiny_config(**{"model.encoder": "bert"})
  assert factory.precision(bert, "cpu").describe().endswith("dropout masks from hash bits")
