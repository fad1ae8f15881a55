"""benchmarks.suite_cpu: the summary sums each file's tests and ranks files and tests by CPU (own + children)."""

import json

from benchmarks import suite_cpu


def test_summary_sums_by_file_and_ranks_by_cpu(tmp_path):
  rows = {"gw0": [{"test": "tests/a.py::t1", "wall": 2.0, "own": 1.0, "children": 0.5},
                  {"test": "tests/b.py::t1", "wall": 9.0, "own": 0.1, "children": 6.0}],
          "gw1": [{"test": "tests/a.py::t2[x]", "wall": 1.0, "own": 0.25, "children": 0.0}]}
  for worker, records in rows.items():
    (tmp_path / f"{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  lines = suite_cpu.summary(str(tmp_path)).splitlines()
  assert lines[0] == "3 tests: wall summed 12 s, CPU 8 s (workers 1, children 6)"
  files = [line for line in lines if line.startswith("| tests/") and line.count("|") == 6]
  assert files == ["| tests/b.py | 1 | 9.0 | 0.1 | 6.0 |", "| tests/a.py | 2 | 3.0 | 1.2 | 0.5 |"]
  tests = [line.split(" |")[0] for line in lines if line.startswith("| tests/") and line.count("|") == 5]
  assert tests == ["| tests/b.py::t1", "| tests/a.py::t1", "| tests/a.py::t2[x]"]


def test_summary_of_an_empty_folder_says_so(tmp_path):
  assert suite_cpu.summary(str(tmp_path)) == f"no records in {tmp_path}"


def test_summary_gives_how_long_each_worker_idled_at_the_end(tmp_path):
  rows = {"gw0": [{"test": "tests/a.py::t1", "wall": 2.0, "own": 1.0, "children": 0.0, "end": 100.0},
                  {"test": "tests/a.py::t2", "wall": 2.0, "own": 1.0, "children": 0.0, "end": 130.5}],
          "gw1": [{"test": "tests/b.py::t1", "wall": 2.0, "own": 1.0, "children": 0.0, "end": 118.0}]}
  for worker, records in rows.items():
    (tmp_path / f"{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
  assert suite_cpu.summary(str(tmp_path)).splitlines()[1] == (
      "last test ended, before the last worker's: gw0 0.0 s, gw1 12.5 s")
