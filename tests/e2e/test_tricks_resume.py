"""A run with EMA and FGM both on, SIGKILLed mid-run and restarted, ends bit-exact with an uninterrupted one
(parameters, optimizer state, EMA, RNG, step) and evaluates the same."""

import json
import os

import numpy as np

from tests import helpers_train as ht
from tests.e2e.test_resume import RESUME, TIMEOUT

TRICKS = {**RESUME, "optimizer.ema_decay": 0.9, "adversarial.kind": "fgm", "adversarial.epsilon": 0.5}


def test_sigkill_then_restart_with_ema_and_fgm_is_bit_exact(tmp_path):
  env = ht.subprocess_env(devices=1)
  ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
  ht.killed_beside_reference(ref_dir, run_dir, kill_step=8, env=env, timeout=TIMEOUT, **TRICKS)
  assert ht.restore_state(run_dir)[0] == 8
  resumed = ht.run_main(run_dir, env=env, timeout=TIMEOUT, **TRICKS)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  assert "Resumed from" in resumed.stdout and "at step 8" in resumed.stdout, resumed.stdout[-4000:]

  (step_r, got), (step_ref, want) = ht.restore_state(run_dir), ht.restore_state(ref_dir)
  got, want = ht.flat(got), ht.flat(want)
  assert step_r == step_ref == 12 and got.keys() == want.keys()
  assert any(k.startswith("['ema']") for k in want)
  differ = [k for k in want if not np.array_equal(got[k], want[k])]
  assert not differ, f"{len(differ)} of {len(want)} state arrays differ after resuming, e.g. {differ[:3]}"
  with open(os.path.join(run_dir, "results.json")) as f, open(os.path.join(ref_dir, "results.json")) as g:
    got_r, want_r = json.load(f), json.load(g)
  assert got_r["dev"] == want_r["dev"] and got_r["eval_weights"] == "ema"
  assert got_r["adversarial"] == {"kind": "fgm", "epsilon": 0.5, "steps": 3, "alpha": 0.3}
