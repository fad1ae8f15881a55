"""Shared helpers for the training tests: tiny configs, subprocess runs, checkpoint reading, one trained workdir, the
checks the relation and event e2e tests share."""

from __future__ import annotations

import io
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time

import numpy as np

from tests import zygote

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILE = os.path.join(REPO, "experiments", "synthetic.py")

# What results.json holds for an events split: train.py writes the task's `final_fields` of the split's score; PHEE-like
# classes add "phee" (the paper's EM / token F1). tests/e2e/test_events_train.py checks a trained run's file against it.
EVENT_RESULT_FIELDS = frozenset({"precision", "recall", "f1", "tp", "pred", "gold", "per_type", "per_record",
                                 "macro_f1", "level", "event_level", "ti", "tc", "ai", "ac", "by_events"})

# Overrides that make experiments/synthetic.py tiny: one bucket (one compile per jitted function), small evals.
TINY = {
    "data.synthetic_records": 240,
    "data.max_eval_records": 48,
    "data.max_len": 48,
    "data.buckets": (),
    "model.embed_dim": 16,
    "model.bigram_dim": 16,
    "model.hidden_size": 32,
    "model.num_layers": 2,
    "model.head_size": 16,
    "batch_size": 16,
    "eval_batch_size": 64,
    "optimizer.warmup_steps": 5,
    "log_every_steps": 1,
    "eval_every_steps": 1000,
    "checkpoint_every_steps": 1000,
    "progress_bar": False,
}


def tiny_config(**overrides):
  """experiments/synthetic.py with TINY and `overrides` (keys "a.b", or "a__b" as keyword arguments) applied."""
  if REPO not in sys.path:
    sys.path.insert(0, REPO)
  from experiments import synthetic

  c = synthetic.get_config()
  for key, value in {**TINY, **overrides}.items():
    parts = key.replace("__", ".").split(".")
    target = c
    for p in parts[:-1]:
      target = target[p]
    target[parts[-1]] = value
  return c


def flag_args(**overrides) -> list[str]:
  """TINY + overrides as `--config.KEY=VALUE` flags for `python -m gp_jax.main`."""
  out = []
  for key, value in {**TINY, **overrides}.items():
    if isinstance(value, tuple):
      value = "(" + ",".join(str(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    out.append(f"--config.{key.replace('__', '.')}={value}")
  return out


def jax_modules_imported_by(*modules: str) -> list[str]:
  """The jax, jaxlib and flax modules a fresh interpreter holds after importing `modules` (asserts it ran)."""
  script = (f"import json, sys; import {', '.join(modules)}; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'jaxlib', 'flax'))))")
  proc = subprocess.run([sys.executable, "-c", script],
                        cwd=REPO, env=subprocess_env(1), capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  return json.loads(proc.stdout)


def subprocess_env(devices: int = 8, *, jit_cache: bool = True, **extra) -> dict:
  """Environment for a child process with `devices` fake CPU devices."""
  from launch import local  # pylint: disable=g-import-not-at-top

  env = local.worker_env(devices)  # the suite's XLA flags (tests/conftest.py: cheap codegen), this device count
  env["JAX_PLATFORMS"] = "cpu"
  if not jit_cache:  # tests/conftest.py sets the run's persistent compilation cache
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    env["GP_JAX_COMPILATION_CACHE"] = "off"  # not the user's cache folder either (config compilation_cache=auto)
  env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
  env["PYTHONUNBUFFERED"] = "1"
  env.update({k: str(v) for k, v in extra.items()})
  return env


def train_in_child(runs: list[tuple[str, dict]], *, devices: int = 1, timeout: float = 300, env=None,
                   logs: bool = False) -> list:
  """Each (workdir, overrides) of `runs` trained with `train.train_and_evaluate(tiny_config(**overrides), workdir)`,
  in order, in one fresh process with `devices` CPU devices; returns their summaries (JSON, as results.json holds
  them: a later run in the same workdir does not hide an earlier one's); with `logs`, (summary, that run's log text)
  pairs.

  Why: the test process has 8 fake devices, so a run there splits a batch of 16 eight ways and all-reduces every
  gradient over 2 cores; one device takes half the CPU per step, more than the child's start-up for a run of tens
  of steps."""
  proc = zygote.run([sys.executable, "-m", "tests.helpers_train", repr(runs)], check=False, cwd=REPO,
                    env=env or subprocess_env(devices), timeout=timeout, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, text=True)
  assert proc.returncode == 0, proc.stdout[-4000:]
  summaries, texts, lines = [], [], []
  for line in proc.stdout.splitlines(keepends=True):
    if line.startswith(_SUMMARY):
      summaries.append(json.loads(line[len(_SUMMARY):]))
      texts.append("".join(lines))
      lines = []
    else:
      lines.append(line)
  assert len(summaries) == len(runs), proc.stdout[-4000:]
  return list(zip(summaries, texts)) if logs else summaries


_SUMMARY = "train_in_child summary: "


def _child_main(arg: str) -> None:
  """`python -m tests.helpers_train "[(workdir, overrides), ...]"`: the other side of `train_in_child`."""
  import ast

  from gp_jax import runtime, train

  runtime.configure()  # as gp_jax.main: a user's run's programs (threefry lowering), which the cache shares with it
  for workdir, overrides in ast.literal_eval(arg):
    summary = train.train_and_evaluate(tiny_config(**overrides), workdir)
    sys.stderr.flush()  # the run's log lines before its summary
    print(_SUMMARY + json.dumps(summary, default=str), flush=True)  # as results.json holds it
  # Every run has returned: its checkpoints and files are written. Skips the interpreter's teardown (jax's backends
  # and ~2,000 modules: about 1 s per process).
  logging.shutdown()
  os._exit(0)


def main_command(workdir: str, *, faults: dict | None = None, **overrides) -> list[str]:
  """`python -m gp_jax.main` with TINY + overrides; with `faults` ({flag: value}), tests/fault_main.py instead."""
  module = "tests.fault_main" if faults else "gp_jax.main"
  return [sys.executable, "-m", module, f"--config={CONFIG_FILE}", f"--workdir={workdir}",
          *[f"--{k}={v}" for k, v in (faults or {}).items()], *flag_args(**overrides)]


class LogWatcher:
  """Reads a process's merged stdout/stderr on a thread; `wait_for(text)` blocks until a line contains it."""

  def __init__(self, proc: subprocess.Popen):
    self.proc = proc
    self.lines: list[str] = []
    self._cond = threading.Condition()
    self._done = False
    self._thread = threading.Thread(target=self._read, daemon=True)
    self._thread.start()

  def _read(self):
    for line in self.proc.stdout:
      with self._cond:
        self.lines.append(line)
        self._cond.notify_all()
    with self._cond:
      self._done = True
      self._cond.notify_all()

  def wait_for(self, text: str, timeout: float) -> str | None:
    """The first line holding `text`, or None if the output ended or `timeout` passed first."""
    found = self._wait(lambda line: text in line, 0, timeout)
    return found[1] if found else None

  def wait_for_match(self, pattern: str, *, after: int = 0, timeout: float = 60.0) -> tuple[int, str]:
    """(index, line) of the first line at or after `after` matching the regex; AssertionError if none comes."""
    found = self._wait(lambda line: re.search(pattern, line), after, timeout)
    if found is None:
      raise AssertionError(f"no line matching {pattern!r}; output:\n{''.join(self.lines)[-4000:]}")
    return found

  def _wait(self, match, after: int, timeout: float) -> tuple[int, str] | None:
    end = time.monotonic() + timeout
    with self._cond:
      while True:
        for i in range(after, len(self.lines)):
          if match(self.lines[i]):
            return i, self.lines[i]
        after = max(after, len(self.lines))
        left = end - time.monotonic()
        if self._done or left <= 0:
          return None
        self._cond.wait(left)

  def text(self) -> str:
    self._thread.join(timeout=5)
    return "".join(self.lines)


def wait_all(procs: list[subprocess.Popen], timeout: float) -> list[int]:
  """Waits for every process to exit; once one fails (or `timeout` passes) the others are killed."""
  end = time.monotonic() + timeout
  pending = list(procs)
  while pending and time.monotonic() < end:
    p = pending[0]
    try:
      rc = p.wait(timeout=min(0.5, max(end - time.monotonic(), 0.01)))
    except subprocess.TimeoutExpired:
      pending.append(pending.pop(0))  # look at the next one
      continue
    pending.pop(0)
    if rc != 0:
      break
  for p in procs:
    if p.poll() is None:
      p.kill()
      p.wait()
  return [p.returncode for p in procs]


def exit_status(proc: subprocess.Popen, timeout: float) -> int:
  """`proc`'s exit status; a process still running after `timeout` is killed (and the wait raises)."""
  try:
    return proc.wait(timeout=timeout)
  finally:
    if proc.poll() is None:
      proc.kill()
      proc.wait()


def run_main(workdir: str, *, timeout: float = 180, env=None, faults=None, **overrides) -> subprocess.CompletedProcess:
  return zygote.run(main_command(workdir, faults=faults, **overrides), check=False, cwd=REPO,
                    env=env or subprocess_env(), timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    text=True)


def killed_beside_reference(ref_dir: str, run_dir: str, *, kill_step: int = 0, faults: dict | None = None, env,
                            cwd: str = REPO, timeout: float = 180, **overrides) -> subprocess.CompletedProcess:
  """One process (tests/fault_main.py) that trains an uninterrupted reference in `ref_dir`, then a run in `run_dir`
  that SIGKILLs itself once its checkpoint of `kill_step` is on disk (or as `faults`, tests/fault_main.py flags,
  say). Asserts the reference finished and the other was killed; returns the process.

  The reference shares the process, not the run: its own workdir, no fault armed while it trains; the killed run's
  programs are the reference's, compiled once."""
  import signal

  faults = {"reference_workdir": ref_dir, **(faults or {"sigkill_after_checkpoint_step": kill_step})}
  killed = zygote.run(main_command(run_dir, faults=faults, **overrides), check=False, cwd=cwd, env=env,
                      timeout=timeout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  assert f"reference run in {ref_dir}: finished at step" in killed.stdout, killed.stdout[-4000:]
  assert killed.returncode == -signal.SIGKILL, killed.stdout[-4000:]
  return killed


def restore_state(workdir: str, *, sub: str = "ckpt", step: int | None = None):
  """(step, state as numpy) of workdir/<sub>; best/ holds parameters only (`checkpoint.restore_numpy`)."""
  from gp_jax import checkpoint as ckpt_lib

  return ckpt_lib.restore_numpy(workdir, sub=sub, step=step)


def flat(tree) -> dict:
  import jax

  return {jax.tree_util.keystr(k): np.asarray(v) for k, v in jax.tree_util.tree_leaves_with_path(tree)}


def run_train_steps(config, tokenizer, types, batches, mesh):
  """init_model + make_optimizer + train_step jitted with the shardings train_and_evaluate uses, over `batches`.

  Returns (initial params, state after the first step, final state, losses); the first two as numpy.
  """
  import jax

  from gp_jax import sharding as shd
  from gp_jax import state as state_lib
  from gp_jax.optim import make_optimizer
  from gp_jax.steps import make_train_step

  setup, params = state_lib.init_model(config, tokenizer, types, mesh)
  init_params = jax.tree.map(np.asarray, params)
  tx, _ = make_optimizer(config.optimizer, 100, params)
  state = state_lib.init_train_state(setup, params, tx, seed=config.seed)
  step_fn = make_train_step(setup, tx, loss_kind=config.loss.kind)
  losses, after_first = [], None
  for batch in batches:
    state, metrics = step_fn(state, shd.global_batch(batch, mesh))
    losses.append(float(metrics["loss"]))
    after_first = after_first or jax.tree.map(np.asarray, state)
  return init_params, after_first, state, losses


def train_batches(config, n: int):
  """(tokenizer, types, the first `n` model batches of the config's training data)."""
  from gp_jax import factory
  from gp_jax.data import batching
  from gp_jax.evaluate import model_batch

  splits, tokenizer, types = factory.prepare_data(config)
  it = batching.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets,
                              seed=config.seed)
  return tokenizer, types, [model_batch(next(it)) for _ in range(n)]


# ----------------------------------------------------------------------------- one trained workdir per session

TRAINED_STEPS = 240
TRAINED_OVERRIDES = {"eval_every_steps": 80, "checkpoint_every_steps": 80, "log_every_steps": 20, "optimizer.lr": 1e-2}


def train_synthetic(workdir: str) -> dict:
  """Trains the tiny synthetic model (TRAINED_STEPS steps) in a one-device child (`train_in_child`); returns the
  summary. The session fixture `trained_workdir` (tests/conftest.py) runs it once per test process."""
  return train_in_child([(workdir, {"num_train_steps": TRAINED_STEPS, **TRAINED_OVERRIDES})])[0]


# ----------------------------------------------------------------------------- the pointer tasks' shared e2e checks


def train_losses(workdir: str) -> dict:
  """{step: train loss} from a workdir's metrics.jsonl."""
  out = {}
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    for line in f:
      m = json.loads(line)
      if m.get("split") == "train":
        out[m["step"]] = m["loss"]
  return out


def write_jsonl(path, records) -> str:
  """`records` one JSON object a line at `path`; returns the path as a string."""
  with open(path, "w", encoding="utf-8") as f:
    for r in records:
      f.write(json.dumps(r) + "\n")
  return str(path)


def pointer_rows(workdir: str, records: list[dict]) -> list[dict]:
  """gp_jax.predict's jsonl rows for `records` ({"id", "text"}) from a trained workdir, read back as dicts."""
  from gp_jax import predict

  out = io.StringIO()
  predict.write_jsonl(out, predict.predict_records(predict.Predictor(workdir), records))
  return [json.loads(line) for line in out.getvalue().splitlines()]


# The bit-exact checks' run (dropout on), the same for `assert_k_steps_per_call_equal_one` and
# `assert_sigkill_resume_bit_exact`: XLA bakes the batch, lengths and schedule into the step, so with one run a task's
# second check loads the first one's programs from the compilation cache instead of compiling its own. Evaluation on
# 8 records in batches of 8: at TINY's 64 rows a batch, the pointer heads' evaluation programs were most of the time.
BIT_EXACT_RUN = {"num_train_steps": 16, "batch_size": 16, "model.dropout": 0.1, "model.embed_dropout": 0.1,
                 "data.max_eval_records": 8, "eval_batch_size": 8, "data.buckets": (), "data.max_len": 64}


def assert_k_steps_per_call_equal_one(tmp_path, *, task: str, data: str, k: int = 4) -> None:
  """`task` on `data` (a synthetic source) trained with steps_per_execution=1 and =k (BIT_EXACT_RUN; one child
  process, one device): the same losses at every step and the same final state, to the last bit; the k run takes
  fewer calls."""
  steps = BIT_EXACT_RUN["num_train_steps"]
  run = {**BIT_EXACT_RUN, "checkpoint_every_steps": steps // 2, "eval_every_steps": steps // 2, "data.name": data}
  workdirs = {per_call: str(tmp_path / f"k{per_call}") for per_call in (1, k)}
  summaries = train_in_child([(workdirs[per_call], {"task": task, "steps_per_execution": per_call, **run})
                              for per_call in (1, k)])  # one device, both runs in one process
  out = {}
  for per_call, workdir, summary in zip((1, k), workdirs.values(), summaries):
    losses = train_losses(workdir)
    step, state = restore_state(workdir)
    out[per_call] = (summary["train_calls"], losses, step, flat(state))
  (calls1, l1, s1, st1), (calls_k, l_k, s_k, st_k) = out[1], out[k]
  assert calls1 == steps and calls_k < steps
  assert sorted(l1) == list(range(1, steps + 1)) and l1 == l_k
  assert s1 == s_k and st1.keys() == st_k.keys()
  assert all(np.array_equal(st1[name], st_k[name]) for name in st1)


def assert_sigkill_resume_bit_exact(tmp_path, *, kill_step: int = 8, timeout: float = 180, **run) -> None:
  """`python -m gp_jax.main` with TINY + BIT_EXACT_RUN + `run`, SIGKILLed once its checkpoint of `kill_step` is on
  disk and restarted, ends in the state and dev results of a run never killed (a 1-device process each)."""
  run = {**BIT_EXACT_RUN, "checkpoint_every_steps": 4, **run}
  steps = run["num_train_steps"]
  env = subprocess_env(devices=1)
  ref_dir, run_dir = str(tmp_path / "reference"), str(tmp_path / "killed")
  killed_beside_reference(ref_dir, run_dir, kill_step=kill_step, env=env, timeout=timeout, **run)
  assert restore_state(run_dir)[0] == kill_step
  resumed = run_main(run_dir, env=env, timeout=timeout, **run)
  assert resumed.returncode == 0, resumed.stdout[-4000:]
  (step_r, got), (step_ref, want) = [(s, flat(st)) for s, st in (restore_state(run_dir), restore_state(ref_dir))]
  assert step_r == step_ref == steps and got.keys() == want.keys()
  assert all(np.array_equal(got[k], want[k]) for k in want)
  with open(os.path.join(run_dir, "results.json")) as f, open(os.path.join(ref_dir, "results.json")) as g:
    assert json.load(f)["dev"] == json.load(g)["dev"]


def export_pointer_workdir(workdir: str, out, *, task: str) -> dict:
  """gp_jax.export of a relations or events workdir with hit buffers of 2: the manifest names the task and the three
  pointers' outputs, and the program returns (count, coords [S, 4], scores [S]) per pointer, nothing shaped by B or
  L (no dense scores). Returns the manifest."""
  import jax

  from gp_jax import export, tasks

  manifest = export.export_workdir(workdir, str(out), hit_buffer=2)
  assert manifest["task"] == task
  assert manifest["hit_buffers"] == [2, 2, 2] and manifest["outputs"] == list(tasks.host(task).OUTPUTS)
  exported = jax.export.deserialize(bytearray((out / "model.jax_export").read_bytes()))
  assert [len(a.shape) for a in exported.out_avals] == [0, 2, 1] * 3
  assert not any(str(d) in ("B", "L") for a in exported.out_avals for d in a.shape), exported.out_avals
  return manifest


def exported_rows(out, records: list[dict]) -> list[dict]:
  """`gp_jax.predict --exported=out` (flax, orbax, ml_collections unimportable) on `records` as jsonl: its rows."""
  from tests.e2e.test_export import _predict_cmd, _run

  proc = _run(_predict_cmd(f"--exported={out}", "--input_format=jsonl", blocked=True),
              stdin="".join(json.dumps(r) + "\n" for r in records))
  assert proc.returncode == 0, proc.stderr[-4000:]
  return [json.loads(line) for line in proc.stdout.splitlines()]


def assert_exported_buffers_grow(out, records: list[dict]) -> None:
  """The exported program's hit buffers of 2 overflow on `records` and grow (rows are whole only if they did)."""
  from gp_jax import serving

  p = serving.ExportedPredictor(str(out))
  p.predict([r["text"] for r in records])
  assert all(size > 2 for size in p.model.hit_buffers), p.model.hit_buffers


if __name__ == "__main__":
  _child_main(sys.argv[1])
