"""Test setup: 8 fake CPU devices so sharding code runs on one machine; tests under tests/e2e/ get the `e2e`
marker (unit tests alone: `pytest -m "not e2e"`)."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


def shared_data_dir() -> pathlib.Path | None:
  """`$GP_JAX_SHARED_DATA`, else `../shared/data` beside the repo; None when absent."""
  env = os.environ.get("GP_JAX_SHARED_DATA")
  path = pathlib.Path(env) if env else pathlib.Path(__file__).resolve().parents[2] / "shared" / "data"
  return path if path.is_dir() else None


@pytest.fixture
def shared_data():
  path = shared_data_dir()
  if path is None:
    pytest.skip("real corpora not found: set GP_JAX_SHARED_DATA or place shared/data beside the repo")
  return path


E2E_DIR = pathlib.Path(__file__).resolve().parent / "e2e"


def pytest_collection_modifyitems(config, items):
  for item in items:
    if E2E_DIR in pathlib.Path(str(item.path)).parents:
      item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory) -> tuple[str, dict]:
  """(workdir, summary) of the tiny synthetic model, trained once per test process."""
  from tests import helpers_train  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp("trained"))
  return workdir, helpers_train.train_synthetic(workdir)
