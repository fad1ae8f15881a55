"""benchmarks.compile_census: the hook logs a compile with its cache key and a persistent-cache hit; the report sums
by platform, file and program and counts programs compiled again under one key; install and uninstall."""

import json
import os
import sys

import pytest

from benchmarks import compile_census


@pytest.fixture
def private_cache(tmp_path):
  from gp_jax import runtime

  runtime.configure_compilation_cache(str(tmp_path / "jit_cache"))
  yield
  runtime.configure_compilation_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])


def test_the_hook_logs_a_compile_then_a_cache_hit(tmp_path, monkeypatch, private_cache):  # pylint: disable=unused-argument
  import jax
  import jax.numpy as jnp
  from jax._src import compiler

  for name in ("backend_compile_and_load", "_compile_and_write_cache", "log_persistent_cache_hit"):
    monkeypatch.setattr(compiler, name, getattr(compiler, name))  # put back after the test
  namespace = {}
  exec(compile_census.HOOK.format(out=str(tmp_path)), namespace)  # pylint: disable=exec-used
  sys.meta_path.remove(next(f for f in sys.meta_path if isinstance(f, namespace["_Finder"])))
  namespace["_patch"](compiler)

  def probe():  # a new function each call: jax traces it anew, and its program's second compile reads the cache
    def census_probe(x):
      return x * 7.25 - 3.0
    return census_probe

  x = jnp.arange(5, dtype=jnp.float32)
  assert (jax.jit(probe())(x) == jax.jit(probe())(x)).all()
  rows = [json.loads(line) for line in (tmp_path / f"{os.getpid()}.jsonl").read_text().splitlines()]
  compiled = [r for r in rows if r.get("program") == "jit_census_probe"]
  assert len(compiled) == 1 and compiled[0]["platform"] == "cpu" and compiled[0]["cpu"] >= 0
  assert compiled[0]["key"].startswith("jit_census_probe-") and compiled[0]["test"].endswith(
      "::test_the_hook_logs_a_compile_then_a_cache_hit")
  assert [r["key"] for r in rows if r.get("hit") == "jit_census_probe"] == [compiled[0]["key"]]


def test_report_sums_and_counts_repeated_keys(tmp_path):
  rows = {1: [{"program": "jit_train_step", "platform": "cpu", "cpu": 1.5, "key": "a", "test": "tests/x.py::t"},
              {"program": "jit_train_step", "platform": "tpu", "cpu": 9.0, "key": None, "test": "tests/y.py::t"}],
          2: [{"program": "jit_train_step", "platform": "cpu", "cpu": 0.5, "key": "a", "test": "tests/z.py::t"},
              {"program": "jit_eval_step", "platform": "cpu", "cpu": 0.25, "key": None, "test": ""},
              {"hit": "jit_train_step", "key": "a", "test": "tests/x.py::u"}]}
  for pid, records in rows.items():
    (tmp_path / f"{pid}.jsonl").write_text("".join(json.dumps({**r, "pid": pid}) + "\n" for r in records))
  lines = compile_census.report(str(tmp_path)).splitlines()
  assert lines[0] == "4 compiles, 11.2 CPU-s, in 2 processes; 1 persistent-cache hits"
  assert lines[4:6] == ["| tpu | 1 | 9.0 |", "| cpu | 3 | 2.2 |"]
  assert "| tests/x.py | 1 | 1.5 |" in lines and "| (outside a test) | 1 | 0.2 |" in lines
  assert "| jit_train_step | 2 | 2.0 |" in lines
  assert lines[-1] == ("XLA:CPU programs compiled more than once under one cache key: 1 (2.0 CPU-s in all); compiled "
                       "with the cache off: 1 (0.2 CPU-s)")
  assert compile_census.report(str(tmp_path / "none")) == f"no compiles recorded in {tmp_path / 'none'}"


def test_install_then_uninstall_leave_the_venv_as_it_was(tmp_path, capsys):
  venv = tmp_path / "venv"
  site = compile_census.site_packages(str(venv))
  site.mkdir(parents=True)
  compile_census.install(str(venv), str(tmp_path / "out"))
  assert "uninstall" in capsys.readouterr().out and (tmp_path / "out").is_dir()
  assert (site / f"zz_{compile_census.HOOK_MODULE}.pth").read_text() == f"import {compile_census.HOOK_MODULE}\n"
  hook = (site / f"{compile_census.HOOK_MODULE}.py").read_text()
  assert repr(str(tmp_path / "out")) in hook
  compile(hook, "hook", "exec")
  compile_census.uninstall(str(venv))
  assert not list(site.iterdir())
