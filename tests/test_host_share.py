"""`benchmarks.pipeline_throughput --host_share` end to end at tiny settings: one round of k = 1 and 4 through the real
trainer (a process each), lines that parse, and k = 4 taking fewer calls than steps."""

import re

import pytest

from benchmarks import pipeline_throughput

pytestmark = pytest.mark.e2e  # trains (two trainer subprocesses on a random 1-layer BERT)

K_LINE = re.compile(r"^k=(\d+): loop (-?[\d.]+) ms/step \| device ([\d.]+) ms/step \| host (-?[\d.]+) ms/step \| "
                    r"dispatch [\d.]+ ms/step \(inside device\) \| (\d+) steps in (\d+) calls \(pace over (\d+)\)$",
                    re.M)


def test_host_share_parses_and_k4_takes_fewer_calls_than_steps(capsys):
  pipeline_throughput.main(["--host_share", "--ks=1,4", "--rounds=1", "--steps=16", "--layers=1",
                            "--device_steps=8"])
  out = capsys.readouterr().out
  assert re.search(r"^pipeline_throughput --host_share .* \| jax ", out, re.M), out
  arrays = re.search(r"(\d+) parameter arrays, (\d+) state arrays", out)
  assert arrays and int(arrays.group(2)) > 2 * int(arrays.group(1)) > 0, out  # params, AdamW's mu and nu, ...
  rows = {int(m.group(1)): m.groups() for m in K_LINE.finditer(out)}
  assert sorted(rows) == [1, 4], out
  for k, (_, loop, device, host, steps, calls, pace) in rows.items():
    assert float(device) > 0 and float(loop) > 0
    assert float(host) == pytest.approx(float(loop) - float(device), abs=2e-3)
    assert int(steps) == 16 and int(pace) == 16 - k  # pace leaves out the bucket's first call
  assert int(rows[1][5]) == 16 and int(rows[4][5]) == 4 < int(rows[4][4])
  assert re.search(r"^per round: loop k1/k4 [\d.]+x, host k1-k4 -?[\d.]+ ms/step \| load ", out, re.M), out
