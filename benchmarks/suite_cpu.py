"""Where the test suite's CPU goes: a pytest plugin that writes each test's wall time and CPU seconds (its worker's
own, and its reaped child processes') and a summary by file. On a 2-core machine the suite's wall time is its CPU
work over two cores, so the CPU columns, unlike `--durations`, hold under load.

  python -m pytest -n auto -p benchmarks.suite_cpu            # writes $GP_JAX_SUITE_CPU (default suite_cpu/)
  python -m benchmarks.suite_cpu suite_cpu/ [--top=40]       # by file, then the costliest tests

Children count when reaped (a SIGKILLed grandchild's CPU is its parent's to reap); daemons a test starts (slurmd,
the GCS emulator) count only if the test waits for them. Children forked by tests/zygote.py count when their zygote
reaps them, and each zygote's imports when it is ready.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import pathlib
import resource
import sys
import time

import pytest

from benchmarks import common

OUT_ENV = "GP_JAX_SUITE_CPU"
_out = None


def _cpu() -> tuple[float, float]:
  own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
  zygote = sys.modules.get("tests.zygote")  # its children are the zygote's to reap: it reports their CPU
  forked = zygote.cpu_seconds if zygote is not None else 0.0
  return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime + forked


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):  # pylint: disable=unused-argument
  global _out
  if _out is None:
    folder = pathlib.Path(os.environ.get(OUT_ENV, "suite_cpu"))
    folder.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    _out = open(folder / f"{worker}.jsonl", "a", encoding="utf-8")  # pylint: disable=consider-using-with
  t0, (own0, kids0) = time.perf_counter(), _cpu()
  yield
  own1, kids1 = _cpu()
  _out.write(json.dumps({"test": item.nodeid, "wall": time.perf_counter() - t0, "own": own1 - own0,
                         "children": kids1 - kids0, "end": time.time()}) + "\n")
  _out.flush()


def summary(folder: str, top: int = 40) -> str:
  by_worker = common.jsonl_records(folder)
  rows = [r for worker_rows in by_worker.values() for r in worker_rows]
  if not rows:
    return f"no records in {folder}"
  ends = {w: max((r.get("end", 0.0) for r in worker_rows), default=0.0) for w, worker_rows in by_worker.items()}
  by_file = collections.defaultdict(lambda: [0, 0.0, 0.0, 0.0])
  for r in rows:
    f = by_file[r["test"].split("::")[0]]
    f[0] += 1
    f[1] += r["wall"]
    f[2] += r["own"]
    f[3] += r["children"]
  cpu = lambda r: r["own"] + r["children"]  # noqa: E731
  lines = [f"{len(rows)} tests: wall summed {sum(r['wall'] for r in rows):.0f} s, CPU {sum(map(cpu, rows)):.0f} s "
           f"(workers {sum(r['own'] for r in rows):.0f}, children {sum(r['children'] for r in rows):.0f})"]
  if len(ends) > 1 and all(ends.values()):  # a worker that ran out of tests early idles to the run's end
    last = max(ends.values())
    lines.append("last test ended, before the last worker's: " +
                 ", ".join(f"{w} {last - t:.1f} s" for w, t in sorted(ends.items())))
  lines += ["", "| file | tests | wall s | CPU s own | CPU s children |", "|---|---|---|---|---|"]
  for name, (n, wall, own, kids) in sorted(by_file.items(), key=lambda kv: -(kv[1][2] + kv[1][3]))[:top]:
    lines.append(f"| {name} | {n} | {wall:.1f} | {own:.1f} | {kids:.1f} |")
  lines += ["", "| test | wall s | CPU s own | CPU s children |", "|---|---|---|---|"]
  for r in sorted(rows, key=lambda r: -cpu(r))[:top]:
    lines.append(f"| {r['test']} | {r['wall']:.1f} | {r['own']:.1f} | {r['children']:.1f} |")
  return "\n".join(lines)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("folder", nargs="?", default=os.environ.get(OUT_ENV, "suite_cpu"))
  ap.add_argument("--top", type=int, default=40)
  args = ap.parse_args(argv)
  print(summary(args.folder, args.top))
  return 0


if __name__ == "__main__":
  sys.exit(main())
