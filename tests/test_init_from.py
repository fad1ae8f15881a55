"""`init_from` as a user meets it (gp_jax/resume.py): a run of another model is refused in one line naming what
differs (it was an Orbax traceback), and a new workdir reads its text with init_from's tokenizer, the vocabulary
that run's embeddings were trained on (it built its own from this run's data). In-process: a source workdir is
written by hand (run files and a best/ checkpoint of freshly initialised parameters), nothing is trained."""

import logging
import shutil

import pytest

from gp_jax import checkpoint as ckpt_lib
from gp_jax import factory, resume
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import workdir as wd
from gp_jax.errors import UserError
from tests import helpers_train as ht


def _setup(config, tokenizer=None):
  _, tokenizer, types = factory.prepare_data(config, tokenizer=tokenizer)
  return state_lib.init_model(config, tokenizer, types, shd.make_mesh(-1, 1), platform="cpu")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A workdir as training leaves it: config.json, types.json, tokenizer/, best/ (one step)."""
  root = tmp_path_factory.mktemp("source")
  config = ht.tiny_config()
  setup, params = _setup(config)
  config_json = config.to_json_best_effort(sort_keys=True)
  wd.save_run_files(root, config_json=config_json, types=setup.types, tokenizer=setup.tokenizer, encoder_config=None)
  mngr = ckpt_lib.make_manager(root / "best", keep=1, best=True)
  ckpt_lib.save_params(mngr, 3, params=params, config_json=config_json, dev_f1=0.5)
  mngr.wait_until_finished()
  mngr.close()
  return root


def test_a_run_of_another_head_is_refused_naming_the_key(source):
  config = ht.tiny_config(**{"model.head": "efficient", "init_from": str(source)})
  setup, _ = _setup(config)
  with pytest.raises(UserError, match=r"^init_from=.*: that run's parameters do not fit this model \(model\.head "
                     r"'standard' -> 'efficient'\); give init_from a run of the same model, or train without it$"):
    resume.init_from_params(setup, str(source), config)


def test_other_sizes_and_types_are_named(source):
  config = ht.tiny_config(**{"model.hidden_size": 48, "data.name": "synthetic_distance"})
  setup, _ = _setup(config, tokenizer=resume.saved_tokenizer(source / "new", init_from=str(source),
                                                               encoder="scratch"))
  with pytest.raises(UserError, match=r"\(model\.hidden_size 32 -> 48; types 3 -> 1\)"):
    resume.init_from_params(setup, str(source / "best"), config)


def test_a_checkpoint_folder_without_its_run_names_the_parameters(source, tmp_path):
  """No config.json to compare: the checkpoint's own shapes say what differs (read before any array is)."""
  shutil.copytree(source / "best", tmp_path / "bare")
  config = ht.tiny_config(**{"model.head": "efficient"})
  setup, _ = _setup(config)
  with pytest.raises(UserError) as e:
    resume.init_from_params(setup, str(tmp_path / "bare"), config)
  assert "(parameters head.bias_dense.bias absent -> (6,); head.bias_dense.kernel absent -> (32, 6); " in str(e.value)
  assert "\n" not in str(e.value)


def test_no_checkpoint_or_no_folder_is_one_line(tmp_path):
  with pytest.raises(UserError, match=r"^init_from=.*nowhere: no such folder"):
    resume.saved_tokenizer(tmp_path / "new", init_from=str(tmp_path / "nowhere"), encoder="scratch")
  setup, _ = _setup(ht.tiny_config())
  with pytest.raises(UserError, match=r"^init_from: no Orbax checkpoint under"):
    resume.init_from_params(setup, str(tmp_path), ht.tiny_config())


def test_a_new_workdir_reads_its_data_with_init_froms_tokenizer(source, tmp_path, caplog):
  """Another corpus (the same three types) builds another vocabulary: the embedding rows would mean other
  characters (a shape error here; silently, when the sizes agree). init_from's tokenizer keeps them, and the
  parameters load."""
  config = ht.tiny_config(**{"data.name": "synthetic_relations", "init_from": str(source)})
  own = _setup(config)[0].tokenizer
  theirs = wd.load_tokenizer(source)
  assert own.vocab_size != theirs.vocab_size
  tokenizer = resume.saved_tokenizer(tmp_path, init_from=str(source), encoder="scratch")
  assert (tokenizer.vocab_size, tokenizer.bigram_vocab_size) == (theirs.vocab_size, theirs.bigram_vocab_size)
  setup, _ = _setup(config, tokenizer=tokenizer)
  with caplog.at_level(logging.INFO, logger="gp_jax.train"):
    params = resume.init_from_params(setup, str(source), config)
  assert ht.flat(params).keys() == ht.flat(setup.abstract_params).keys()
  assert "init_from's types ['BOX', 'NUM', 'CAP'] are not this run's ['LOC', 'ORG', 'PER']" in caplog.text
  # The workdir's own tokenizer (a resumed run) wins; another encoder's run lends none.
  wd.save_run_files(tmp_path, config_json=config.to_json_best_effort(), types=setup.types, tokenizer=own,
                    encoder_config=None)
  assert resume.saved_tokenizer(tmp_path, init_from=str(source), encoder="scratch").vocab_size == own.vocab_size
  assert resume.saved_tokenizer(tmp_path / "other", init_from=str(source), encoder="bert") is None
