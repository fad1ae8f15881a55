"""Test setup: 8 fake CPU devices so sharding code runs on one machine; tests under tests/e2e/ get the `e2e`
marker, as do tests elsewhere that read the real corpora or start worker subprocesses (unit tests alone:
`pytest -m "not e2e"`)."""

import os

# Test programs are tiny, so compiling them costs more than running them: cheap codegen (no LLVM optimisation,
# no fusion emitters, one codegen thread) halves the suite's compile time; tests and their subprocesses inherit it.
# Flags already in XLA_FLAGS win.
TEST_XLA_FLAGS = {"xla_force_host_platform_device_count": "8", "xla_backend_optimization_level": "0",
                  "xla_llvm_disable_expensive_passes": "true", "xla_cpu_use_fusion_emitters": "false",
                  "xla_cpu_parallel_codegen_split_count": "1", "xla_cpu_enable_concurrency_optimized_scheduler": "false"}
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + [
    f"--{k}={v}" for k, v in TEST_XLA_FLAGS.items() if f"--{k}=" not in os.environ.get("XLA_FLAGS", "")]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the whole run: xdist workers and the subprocesses tests start inherit it,
# so a step compiled by one test is loaded, not recompiled, by the next that builds the same program.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  import atexit  # noqa: E402
  import shutil  # noqa: E402
  import tempfile  # noqa: E402

  os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="gp_jax_test_jit_cache_")
  atexit.register(shutil.rmtree, os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

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


# Modules run first, in this order. tests/test_slurm.py holds its one-node cluster (and a lock: one slurmd per host)
# for the whole module and submits every scenario its collected tests need at once: a share of its tests taken by
# another xdist worker would wait on the lock, then start a second cluster and run every scenario again. pytest-xdist's
# worksteal gives each worker a contiguous share of this order and steals from the end of a worker's queue, so the
# first module runs whole on the first worker.
FIRST = ("test_slurm.py",)


def pytest_collection_modifyitems(config, items):
  for item in items:
    if E2E_DIR in pathlib.Path(str(item.path)).parents:
      item.add_marker(pytest.mark.e2e)
  rank = {name: i for i, name in enumerate(FIRST)}
  items.sort(key=lambda item: rank.get(pathlib.Path(str(item.path)).name, len(FIRST)))  # stable: the rest as found


@pytest.fixture(scope="session")
def trained_workdir(tmp_path_factory) -> tuple[str, dict]:
  """(workdir, summary) of the tiny synthetic model, trained once per test process."""
  from tests import helpers_train  # pylint: disable=g-import-not-at-top

  workdir = str(tmp_path_factory.mktemp("trained"))
  return workdir, helpers_train.train_synthetic(workdir)


@pytest.fixture(scope="module")
def gcs_env():
  """A local GCS emulator (127.0.0.1) for the module; yields the environment that points clients at it."""
  from tests.helpers_gcs import emulator  # pylint: disable=g-import-not-at-top

  with emulator() as (_, env):
    yield env
