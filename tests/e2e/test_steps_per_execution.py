"""k train steps per call (`steps_per_execution`) through the real trainer: the same losses and parameters as one step
per call to the last bit (dropout on), bit-exact resume at k = 4, and every program compiled ahead."""

import re

import numpy as np
import pytest

from tests import helpers_train as ht

pytestmark = pytest.mark.e2e

# Two buckets, same-bucket runs of 4, dropout on; 12 rows a batch over 240 records -> 20 steps an epoch.
K_RUN = {"num_train_steps": 28, "checkpoint_every_steps": 8, "batch_size": 12, "model.dropout": 0.1,
         "model.embed_dropout": 0.1, "data.max_eval_records": 24, "data.buckets": (24,), "data.bucket_run": 4,
         "eval_every_steps": 10, "log_every_steps": 1}
TIMEOUT = 240


def _state(workdir):
  step, state = ht.restore_state(workdir)
  return step, ht.flat(state)


def _assert_same_state(a, b):
  (step_a, got), (step_b, want) = _state(a), _state(b)
  assert step_a == step_b
  assert got.keys() == want.keys()
  differ = [k for k in want if not np.array_equal(got[k], want[k])]
  assert not differ, f"{len(differ)} of {len(want)} state arrays differ, e.g. {differ[:3]}"


def test_four_steps_per_call_equal_one_per_call_to_the_last_bit(tmp_path):
  one, four = str(tmp_path / "k1"), str(tmp_path / "k4")
  # Both runs in one fresh one-device process, each with its own log.
  (_, out1), (_, out4) = ht.train_in_child([(one, dict(K_RUN, steps_per_execution=1)),
                                            (four, dict(K_RUN, steps_per_execution=4))], timeout=TIMEOUT, logs=True)
  assert re.search(r"28 steps in 28 calls", out1), out1[-4000:]
  calls = int(re.search(r"28 steps in (\d+) calls", out4).group(1))
  assert calls < 28 and re.search(r"compiled ahead: train L\d+ B12 x4: ", out4)
  l1, l4 = ht.train_losses(one), ht.train_losses(four)
  assert sorted(l1) == sorted(l4) == list(range(1, 29))
  assert [l1[s] for s in sorted(l1)] == [l4[s] for s in sorted(l4)]  # every step's loss, exactly
  _assert_same_state(one, four)
  for out in (out1, out4):
    total = re.search(r"compiled ahead: (\d+) programs in ([\d.]+) s wall, ([\d.]+) s of compile summed", out)
    assert total and int(total.group(1)) >= 2
    assert not re.search(r"train[^\n]*not compiled ahead", out)  # every train program was ready before step 1
    late = out.find("not compiled ahead")  # an eval program: only after a (data-dependent) hit-buffer growth
    assert late < 0 or 0 <= out.find("growing the hit buffer") < late


def test_sigkill_then_restart_is_bit_exact_at_four_steps_per_call(tmp_path):
  env = ht.subprocess_env(devices=1)
  ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
  run = dict(K_RUN, steps_per_execution=4)  # the k = 4 run of the test above: its programs, from the cache
  ht.killed_beside_reference(ref_dir, run_dir, kill_step=8, env=env, timeout=TIMEOUT, **run)
  resumed = ht.run_main(run_dir, env=env, timeout=TIMEOUT, **run)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert re.search(r"Resumed from \S+ at step 8\b", resumed.stdout)
  _assert_same_state(run_dir, ref_dir)
  got, want = ht.train_losses(run_dir), ht.train_losses(ref_dir)  # the killed attempt may not have written its last call's losses
  assert set(range(9, K_RUN["num_train_steps"] + 1)) <= set(got) and all(got[s] == want[s] for s in got)
