"""What a test-suite run compiles: every XLA compile of every Python process of a venv (program, CPU-s, platform, the
test running, the compilation-cache key) and every persistent-cache hit, one JSON line each, then a summary.

  python -m benchmarks.compile_census install .venv census/     # a .pth hook in that venv's site-packages
  GP_JAX_TEST_JIT_CACHE=fresh .venv/bin/python -m pytest -n auto ...   # the run to count (nothing else)
  python -m benchmarks.compile_census uninstall .venv           # always: the hook costs every process a file write
  python -m benchmarks.compile_census report census/ [--top=30]

A compile is timed around jax's `backend_compile_and_load` (XLA only: not tracing or lowering); the test is
$PYTEST_CURRENT_TEST, which child processes inherit. Each record is appended as it happens, so processes that
die by a signal or leave through `os._exit` (the tests' zygote children) still count.
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import sys
import sysconfig

from benchmarks import common

HOOK_MODULE = "gp_jax_compile_census"
HOOK = '''import importlib.abc, importlib.util, json, os, sys, threading, time
OUT = {out!r}


def _log(record):
  record.update(pid=os.getpid(), test=os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0])
  try:
    with open(os.path.join(OUT, f"{{os.getpid()}}.jsonl"), "a") as f:
      f.write(json.dumps(record) + "\\n")
  except OSError:
    pass


def _patch(compiler):
  compile_and_load, write, hit = (compiler.backend_compile_and_load, compiler._compile_and_write_cache,
                                  compiler.log_persistent_cache_hit)
  key = threading.local()  # programs of a point compile in threads (aot.compile_all)

  def backend_compile_and_load(backend, module, *args, **kwargs):
    cpu = time.process_time()
    try:
      return compile_and_load(backend, module, *args, **kwargs)
    finally:
      _log({{"program": str(module.operation.attributes["sym_name"]).strip('"'), "platform": backend.platform,
             "cpu": time.process_time() - cpu, "key": getattr(key, "key", None)}})

  def _compile_and_write_cache(*args, **kwargs):
    key.key = kwargs.get("cache_key", args[-1] if args else None)
    try:
      return write(*args, **kwargs)
    finally:
      key.key = None

  def log_persistent_cache_hit(module_name, cache_key):
    _log({{"hit": module_name, "key": cache_key}})
    return hit(module_name, cache_key)

  compiler.backend_compile_and_load = backend_compile_and_load
  compiler._compile_and_write_cache = _compile_and_write_cache
  compiler.log_persistent_cache_hit = log_persistent_cache_hit


class _Finder(importlib.abc.MetaPathFinder):
  busy = False

  def find_spec(self, name, path, target=None):
    if name != "jax._src.compiler" or self.busy:
      return None
    self.busy = True
    try:
      spec = importlib.util.find_spec(name)
    finally:
      self.busy = False
    load = spec.loader.exec_module

    def exec_module(module):
      load(module)
      _patch(module)

    spec.loader.exec_module = exec_module
    return spec


sys.meta_path.insert(0, _Finder())
'''


def site_packages(venv: str) -> pathlib.Path:
  paths = sysconfig.get_paths(vars={"base": venv, "platbase": venv})
  return pathlib.Path(paths["purelib"])


def install(venv: str, out: str) -> None:
  site, folder = site_packages(venv), pathlib.Path(out).resolve()
  folder.mkdir(parents=True, exist_ok=True)
  (site / f"{HOOK_MODULE}.py").write_text(HOOK.format(out=str(folder)), encoding="utf-8")
  (site / f"zz_{HOOK_MODULE}.pth").write_text(f"import {HOOK_MODULE}\n", encoding="utf-8")
  print(f"every Python process of {venv} now logs its compiles to {folder}/; remove the hook with: "
        f"python -m benchmarks.compile_census uninstall {venv}")


def uninstall(venv: str) -> None:
  site = site_packages(venv)
  for name in (f"zz_{HOOK_MODULE}.pth", f"{HOOK_MODULE}.py"):
    (site / name).unlink(missing_ok=True)


def report(folder: str, top: int = 30) -> str:
  rows = [r for process_rows in common.jsonl_records(folder).values() for r in process_rows]
  compiles, hits = [r for r in rows if "program" in r], [r for r in rows if "hit" in r]
  if not compiles:
    return f"no compiles recorded in {folder}"
  out = [f"{len(compiles)} compiles, {sum(r['cpu'] for r in compiles):.1f} CPU-s, in "
         f"{len({r['pid'] for r in rows})} processes; {len(hits)} persistent-cache hits"]

  def table(title, key_of, rows_):
    cpu, count = collections.Counter(), collections.Counter()
    for r in rows_:
      cpu[key_of(r)] += r["cpu"]
      count[key_of(r)] += 1
    out.extend(["", f"| {title} | compiles | CPU-s |", "|---|---|---|"])
    out.extend(f"| {k or '(outside a test)'} | {count[k]} | {v:.1f} |" for k, v in cpu.most_common(top))

  table("platform", lambda r: r["platform"], compiles)
  host = [r for r in compiles if r["platform"] == "cpu"]
  table("file (XLA:CPU)", lambda r: r["test"].split("::")[0], host)
  table("program (XLA:CPU)", lambda r: r["program"], host)
  keys = collections.Counter(r["key"] for r in host if r["key"])
  again = [r for r in host if r["key"] and keys[r["key"]] > 1]
  uncached = [r for r in host if not r["key"]]
  out += ["", f"XLA:CPU programs compiled more than once under one cache key: {len({r['key'] for r in again})} "
          f"({sum(r['cpu'] for r in again):.1f} CPU-s in all); compiled with the cache off: {len(uncached)} "
          f"({sum(r['cpu'] for r in uncached):.1f} CPU-s)"]
  return "\n".join(out)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = ap.add_subparsers(dest="command", required=True)
  p = sub.add_parser("install", help="add the hook to VENV; records go to OUT")
  p.add_argument("venv")
  p.add_argument("out")
  sub.add_parser("uninstall", help="remove the hook from VENV").add_argument("venv")
  p = sub.add_parser("report", help="summarise the records in FOLDER")
  p.add_argument("folder")
  p.add_argument("--top", type=int, default=30)
  args = ap.parse_args(argv)
  if args.command == "install":
    install(args.venv, args.out)
  elif args.command == "uninstall":
    uninstall(args.venv)
  else:
    print(report(args.folder, args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main())
