"""Training and evaluation: `train_and_evaluate(config, workdir)`.

Reads top to bottom as phases: run setup (distributed, workdir, mesh, checks), data, state (model,
optimizer, resume), the loop (dispatch step N, then look at step N-1; dev evaluation keeps the best
parameters), final evaluation and results.json. Only main.py and tests import this module.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import signal
import time
from collections.abc import Callable

import jax
import numpy as np

from gp_jax import checkpoint as ckpt_lib
from gp_jax import reporting, storage, workdir as wd
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.configs import base as base_config
from gp_jax.data import batching, windows
from gp_jax.data.sources import load_records
from gp_jax.evaluate import LENGTH_BUCKETS, Evaluator, flat_result, model_batch
from gp_jax.models.ner import build_tokenizer
from gp_jax.models.taggers import TAGGERS
from gp_jax.optim import make_optimizer
from gp_jax.steps import make_train_step

log = logging.getLogger("gp_jax.train")


@dataclasses.dataclass
class TrainHooks:
  """Test-side fault injection; production runs pass none.

  step_transform(loss, grads, step) -> (loss, grads): traced inside the jitted step, before the update.
  after_checkpoint(step): called on the host once the resume checkpoint of `step` is on disk.
  """

  step_transform: Callable | None = None
  after_checkpoint: Callable[[int], None] | None = None


# ----------------------------------------------------------------------------- phases


@dataclasses.dataclass
class Run:
  """Where a run writes, and how it is laid out over devices and processes."""

  config: object
  workdir: object  # epath.Path
  is_main: bool
  mesh: object
  mirror: storage.LocalMirror | None
  config_json: str
  t_start: float


def setup_run(config, workdir) -> Run:
  """Distributed init, workdir, logging, mesh; the checks that would otherwise fail late."""
  t_start = time.time()
  if config.multihost and not jax.distributed.is_initialized():
    if config.coordinator_address:
      jax.distributed.initialize(config.coordinator_address, num_processes=config.num_processes,
                                 process_id=config.process_id)
    else:
      jax.distributed.initialize()
  root = storage.path(workdir)
  is_main = jax.process_index() == 0
  if is_main:
    root.mkdir(parents=True, exist_ok=True)
  mirror = storage.LocalMirror(root) if is_main else None
  reporting.setup_logging(mirror)
  if jax.process_count() > 1:
    log.info("Distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
             jax.process_count(), jax.local_device_count(), jax.device_count())
  mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp)
  log.info("Mesh %s over %d devices (%s)", dict(mesh.shape), jax.device_count(), jax.devices()[0].platform)
  batch_ways = mesh.size
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % batch_ways or config[name] % jax.process_count():
      raise ValueError(f"{name}={config[name]} must be divisible by the {batch_ways} data-parallel devices "
                       f"(mesh {dict(mesh.shape)}) and by the {jax.process_count()} processes")
  config_json = config.to_json_best_effort(sort_keys=True)
  saved = root / "config.json"
  if saved.exists() and not config.get("allow_config_change", False):
    defaults = json.loads(base_config.get_config().to_json_best_effort())
    changes = wd.config_changes(storage.read_json(saved), json.loads(config_json), defaults)
    if changes:
      raise ValueError(f"{root} holds a run of another config ({len(changes)} changed keys: {'; '.join(changes)}). "
                       "Use a new workdir, or --config.allow_config_change=True to resume anyway.")
  return Run(config, root, is_main, mesh, mirror, config_json, t_start)


def prepare_data(config, workdir=None):
  """(splits {train, dev?, test?} of PreparedSplit, tokenizer, types). The tokenizer saved in `workdir`
  wins over a new one, so a resumed run reads text exactly as before."""
  train_recs, dev_recs, test_recs, types = load_records(config.data, seed=config.seed)
  if workdir is not None and wd.has_tokenizer(workdir):
    tokenizer = wd.load_tokenizer(workdir)
  else:
    tokenizer = build_tokenizer(config, [r["text"] for r in train_recs])
  kw = dict(types=types, max_len=config.data.max_len, stride=config.data.stride or None,
            max_span_width=config.data.max_span_width or None)
  splits = {"train": windows.prepare_split(train_recs, tokenizer, name="train", **kw)}
  if dev_recs:
    splits["dev"] = windows.prepare_split(dev_recs, tokenizer, name="dev", **kw)
  if test_recs and any(r["entities"] for r in test_recs):
    splits["test"] = windows.prepare_split(test_recs, tokenizer, name="test", **kw)
  elif test_recs:
    log.info("Test split has no labels: skipping test evaluation")
  return splits, tokenizer, types


def tag_scheme(config) -> str | None:
  """The tag scheme when the head is a tagger baseline, else None."""
  return config.model.tag_scheme if config.model.head in TAGGERS else None


@dataclasses.dataclass
class TrainState:
  setup: state_lib.Setup
  state: dict
  tx: object
  lr_schedule: object
  train_it: batching.BatchIterator
  start_step: int
  total_steps: int
  mngr: object
  best_mngr: object
  n_params: int


def build_state(run: Run, splits, tokenizer, types) -> TrainState:
  """Model and optimizer state: resumed from workdir/ckpt, else init_from's parameters, else fresh."""
  config = run.config
  mngr = ckpt_lib.make_manager(run.workdir / "ckpt", keep=config.keep_checkpoints)
  best_mngr = ckpt_lib.make_manager(run.workdir / "best", keep=1, best=True)
  resuming = mngr.latest_step() is not None
  setup, params = state_lib.init_model(config, tokenizer, types, run.mesh, load_weights=not resuming,
                                       encoder_config=wd.load_encoder_config(run.workdir) if resuming else None)
  n_params = state_lib.param_count(params)
  log.info("Model: %s encoder + %s head, %d parameters, dtype %s", config.model.encoder, config.model.head, n_params,
           config.model.dtype)
  if run.is_main:
    wd.save_run_files(run.workdir, config_json=run.config_json, types=types, tokenizer=tokenizer,
                      encoder_config=setup.encoder_config)
  train_it = batching.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets,
                                    seed=config.seed, process_index=jax.process_index(),
                                    process_count=jax.process_count(), tag_scheme=tag_scheme(config))
  total_steps = int(config.num_train_steps) or int(math.ceil(config.num_epochs * train_it.steps_per_epoch))
  tx, lr_schedule = make_optimizer(config.optimizer, total_steps, params)
  state = state_lib.init_train_state(setup, params, tx, seed=config.seed)
  start_step = 0
  restored = ckpt_lib.restore(mngr, state_lib.abstract_state(setup, tx)) if resuming else None
  if restored is not None:
    start_step, state, data_state = restored
    train_it.set_state(data_state)
    log.info("Resumed from %s at step %d", mngr.directory, start_step)
  elif config.init_from:
    src = ckpt_lib.make_manager(ckpt_lib.find_checkpoint_dir(config.init_from), keep=1)
    src_step, src_params = ckpt_lib.restore_params(src, state_lib.abstract_params(setup))
    state = dict(state, params=src_params)
    log.info("Initialised parameters from %s (step %d)", src.directory, src_step)
  return TrainState(setup, state, tx, lr_schedule, train_it, int(start_step), total_steps, mngr, best_mngr, n_params)


@dataclasses.dataclass
class EarlyStop:
  """Stops training when dev F1 has not improved for `epochs` epochs (0 = never)."""

  epochs: float
  steps_per_epoch: int
  best_step: int | None

  def exhausted(self, step: int) -> bool:
    if not self.epochs or self.best_step is None:
      return False
    return (step - self.best_step) / self.steps_per_epoch >= self.epochs - 1e-9


class Preemption:
  """Turns SIGTERM into a flag the loop checks after each step.

  With several processes, only the signalled ones see the flag; they agree every `every` steps
  (a max over processes), so all of them save the same step and stop together.
  """

  def __init__(self):
    self.requested = False
    self._old = None

  def should_stop(self, step: int, every: int) -> bool:
    if jax.process_count() == 1:
      return self.requested
    if step % max(every, 1):
      return False
    from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

    return bool(np.max(multihost_utils.process_allgather(np.asarray(int(self.requested), np.int32))))

  def __enter__(self):
    def handler(signum, frame):
      self.requested = True

    try:
      self._old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
      self._old = None
    return self

  def __exit__(self, *exc):
    if self._old is not None:
      signal.signal(signal.SIGTERM, self._old)


class Diverged(FloatingPointError):
  pass


def check_finite(step: int, metrics, mngr) -> None:
  """Raises Diverged when step `step` made the loss or the gradient non-finite."""
  if not bool(metrics["finite"]):
    mngr.wait_until_finished()
    raise Diverged(f"training diverged at step {step}: loss {float(metrics['loss'])}, gradient norm "
                   f"{float(metrics['grad_norm'])}; stopping. Last good checkpoint: step "
                   f"{mngr.latest_step()} in {mngr.directory}")


class StepLog:
  """Train metrics every `log_every` steps, read one step late (the host never waits on the step just
  dispatched); tokens/s count training time only (`pause` takes evaluation time out)."""

  def __init__(self, ts: TrainState, writer, log_every: int, bar):
    self.ts, self.writer, self.log_every, self.bar = ts, writer, log_every, bar
    self.tokens = self.examples = 0
    self.run_tokens, self.run_seconds = 0, 0.0
    self.t_log = time.time()
    self.pending = self.logged = None
    self.last_dev = None

  def count(self, batch) -> None:
    self.tokens += int(batch["attention_mask"].sum())
    self.examples += int((batch["example_index"] >= 0).sum())

  def dispatched(self, step: int, metrics) -> None:
    if self.pending is not None and self.pending[0] % self.log_every == 0:
      self.write(*self.pending)
    self.pending = (step, metrics)
    if self.bar is not None:
      self.bar.update(1)

  def pause(self, seconds: float) -> None:
    self.t_log += seconds

  def flush(self) -> None:
    if self.pending is not None and self.pending[0] != self.logged:
      self.write(*self.pending)

  @property
  def tokens_per_s(self):
    return self.run_tokens / self.run_seconds if self.run_seconds else None

  def write(self, step: int, metrics) -> None:
    check_finite(step, metrics, self.ts.mngr)
    dt = max(time.time() - self.t_log, 1e-9)
    n = jax.process_count()  # this process saw 1/n of the tokens
    rates = {"tokens_per_s": self.tokens * n / dt, "examples_per_s": self.examples * n / dt}
    self.run_tokens, self.run_seconds = self.run_tokens + self.tokens * n, self.run_seconds + dt
    loss = float(metrics["loss"])
    self.writer.write(step, "train", {"loss": loss, "grad_norm": float(metrics["grad_norm"]),
                                      "lr": float(self.ts.lr_schedule(step)),
                                      "epoch": step / self.ts.train_it.steps_per_epoch, **rates})
    log.info("step %d train loss %.4f (%.0f tokens/s)", step, loss, rates["tokens_per_s"])
    if self.bar is not None:
      dev = f"{self.last_dev:.4f}" if self.last_dev is not None else "-"
      self.bar.set_postfix(loss=f"{loss:.4f}", dev_f1=dev)
    self.tokens = self.examples = 0
    self.t_log = time.time()
    self.logged = step


def evaluate_dev(run: Run, ts: TrainState, evaluator: Evaluator, writer, dev, params, step: int,
                 best_f1: float) -> float:
  """Dev P/R/F1 at `step`; saves the parameters to best/ when F1 beats `best_f1`. Returns the dev F1."""
  result, _ = evaluator.evaluate(params, dev, desc=f"dev@{step}")
  writer.write(step, "dev", flat_result(result))
  log.info("step %d dev P %.4f R %.4f F1 %.4f", step, result["precision"], result["recall"], result["f1"])
  if result["f1"] > best_f1:
    ckpt_lib.save_params(ts.best_mngr, step, params=params, config_json=run.config_json, dev_f1=result["f1"])
  return result["f1"]


def train_loop(run: Run, ts: TrainState, splits, evaluator: Evaluator, writer, hooks: TrainHooks) -> dict:
  """Steps from ts.start_step to ts.total_steps; returns {steps, preempted, train_tokens_per_s}."""
  config, mesh, mngr = run.config, run.mesh, ts.mngr
  eval_every = int(config.eval_every_steps) or ts.train_it.steps_per_epoch
  step_fn = make_train_step(ts.setup, ts.tx, loss_kind=config.loss.kind, step_transform=hooks.step_transform)
  log.info("Training %d steps (%d per epoch, global batch %d), eval every %d, checkpoint every %d", ts.total_steps,
           ts.train_it.steps_per_epoch, config.batch_size, eval_every, config.checkpoint_every_steps)
  best_step = ts.best_mngr.best_step()
  best_f1 = float(ts.best_mngr.metrics(best_step)["dev_f1"]) if best_step is not None else -1.0
  patience = EarlyStop(config.get("early_stop_patience", 0), ts.train_it.steps_per_epoch, best_step)
  bar = None
  if run.is_main and config.progress_bar and reporting.is_tty():
    from tqdm.auto import tqdm  # pylint: disable=g-import-not-at-top

    bar = tqdm(total=ts.total_steps, initial=ts.start_step, desc="train", dynamic_ncols=True)
  steps = StepLog(ts, writer, int(config.log_every_steps), bar)
  state = ts.state

  def save(step):
    ckpt_lib.save(mngr, step, state=state, data_state=ts.train_it.get_state(), config_json=run.config_json)

  preempted = stopped_early = False
  first = ts.total_steps if patience.exhausted(ts.start_step) else ts.start_step  # a resumed run that had stopped
  with Preemption() as preemption:
    for step in range(first, ts.total_steps):
      batch = next(ts.train_it)
      steps.count(batch)
      state, metrics = step_fn(state, shd.global_batch(model_batch(batch), mesh))
      done = step + 1
      steps.dispatched(done, metrics)
      last = done == ts.total_steps
      if done % eval_every == 0 or last:
        check_finite(done, metrics, mngr)
        if "dev" in splits:
          t_eval = time.time()
          steps.last_dev = evaluate_dev(run, ts, evaluator, writer, splits["dev"], state["params"], done,
                                        best_f1)
          if steps.last_dev > best_f1:
            best_f1, patience.best_step = steps.last_dev, done
          steps.pause(time.time() - t_eval)
          if patience.exhausted(done) and not last:
            log.info("Early stop at step %d (epoch %.2f): dev F1 has not improved for %s epochs since step %d",
                     done, done / ts.train_it.steps_per_epoch, patience.epochs, patience.best_step)
            last = stopped_early = True
        writer.sync()
      if done % config.checkpoint_every_steps == 0 or last:
        check_finite(done, metrics, mngr)
        save(done)
        if hooks.after_checkpoint is not None:
          mngr.wait_until_finished()
          hooks.after_checkpoint(done)
      if stopped_early:
        break
      if preemption.should_stop(done, steps.log_every):
        check_finite(done, metrics, mngr)
        if mngr.latest_step() != done:
          save(done)
        mngr.wait_until_finished()
        log.warning("SIGTERM: saved checkpoint at step %d in %s; exiting", done, mngr.directory)
        preempted = True
        break
  steps.flush()
  if bar is not None:
    bar.close()
  mngr.wait_until_finished()
  ts.best_mngr.wait_until_finished()
  ts.state = state
  done_steps = int(jax.device_get(state["step"]))
  return {"steps": done_steps, "epochs": done_steps / ts.train_it.steps_per_epoch, "preempted": preempted,
          "stopped_early": stopped_early or first != ts.start_step, "train_tokens_per_s": steps.tokens_per_s,
          "span_overflow": ts.train_it.span_overflow}


def final_evaluation(run: Run, ts: TrainState, splits, evaluator: Evaluator, writer, steps: int) -> dict:
  """Dev and test figures of the best parameters by dev F1 (the last ones when there is no dev split)."""
  out = {}
  if ts.best_mngr.latest_step() is None:  # no dev split: the final parameters are the ones to keep
    ckpt_lib.save_params(ts.best_mngr, steps, params=ts.state["params"], config_json=run.config_json, dev_f1=-1.0)
    ts.best_mngr.wait_until_finished()
  best_step, params = ckpt_lib.restore_params(ts.best_mngr, state_lib.abstract_params(ts.setup))
  out["best_step"] = int(best_step)
  if "dev" in splits:
    out["best_dev_f1"] = float(ts.best_mngr.metrics(best_step)["dev_f1"])
  for split in ("dev", "test"):
    if split in splits:
      result, _ = evaluator.evaluate(params, splits[split], desc=split)
      out[split] = dict(flat_result(result), per_type=result["per_type"], by_length=result["by_length"])
      writer.write(steps, f"final_{split}", flat_result(result))
      log.info("final %s (best checkpoint): P %.4f R %.4f F1 %.4f", split, result["precision"], result["recall"],
               result["f1"])
  return out


def dev_history(run: Run, steps_per_epoch: int) -> list[dict]:
  """Dev F1 by evaluation step, over every attempt of this run (metrics.jsonl; the last value of a step wins)."""
  if run.mirror is None:
    return []
  path = os.path.join(run.mirror.local, "metrics.jsonl")
  by_step = {}
  with open(path) as f:
    for line in f:
      m = json.loads(line)
      if m.get("split") == "dev":
        by_step[m["step"]] = {"step": m["step"], "epoch": m["step"] / steps_per_epoch, "f1": m["f1"]}
  return [by_step[k] for k in sorted(by_step)]


def write_results(run: Run, summary: dict) -> None:
  summary["wall_minutes"] = (time.time() - run.t_start) / 60
  if run.is_main:
    storage.write_json(run.workdir / "results.json", summary, indent=1, default=str)


# ----------------------------------------------------------------------------- entry


def train_and_evaluate(config, workdir, *, hooks: TrainHooks | None = None) -> dict:
  """Trains, evaluates on dev, keeps the best parameters by dev F1, evaluates them on test.

  Returns a summary dict, also written to workdir/results.json with "status": finished, preempted
  (SIGTERM: checkpoint saved, rerun to resume) or failed (with "error").
  """
  hooks = hooks or TrainHooks()
  run = setup_run(config, workdir)
  writer = reporting.MetricWriter(run.mirror)
  summary = {"workdir": str(run.workdir), "status": "failed"}
  try:
    # Data.
    splits, tokenizer, types = prepare_data(config, run.workdir)
    summary["split_stats"] = {k: dataclasses.asdict(v.stats) for k, v in splits.items()}
    if tag_scheme(config):
      # One tag layer: nested gold spans it cannot hold stay in the gold set (scored as misses) and are counted.
      summary["unrepresentable"] = {k: batching.count_unrepresentable(v, scheme=tag_scheme(config))
                                    for k, v in splits.items()}
      log.info("Gold spans a single %s tag layer cannot hold (nested/crossing): %s", tag_scheme(config),
               summary["unrepresentable"])
    if jax.process_count() > 1:
      from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

      # Every process has read (or built) the tokenizer before process 0 (re)writes it into the workdir.
      multihost_utils.sync_global_devices("gp_jax.train: data prepared")
    # State.
    ts = build_state(run, splits, tokenizer, types)
    summary["parameters"] = ts.n_params
    summary["head_kind"] = "tagger" if tag_scheme(config) else "span"
    summary["length_buckets"] = [label for label, *_ in LENGTH_BUCKETS]
    evaluator = Evaluator(ts.setup, batch_size=config.eval_batch_size, progress=run.is_main)
    # Loop.
    summary.update(train_loop(run, ts, splits, evaluator, writer, hooks))
    summary["dev_history"] = dev_history(run, ts.train_it.steps_per_epoch)
    summary["train_minutes"] = (time.time() - run.t_start) / 60
    # Final evaluation.
    if summary["preempted"]:
      summary["status"] = "preempted"
    else:
      summary.update(final_evaluation(run, ts, splits, evaluator, writer, summary["steps"]))
      summary["status"] = "finished"
  except BaseException as e:
    summary["error"] = f"{type(e).__name__}: {e}"
    write_results(run, summary)
    writer.close()
    raise
  write_results(run, summary)
  log.info("Done (%s) in %.1f minutes: %s", summary["status"], summary["wall_minutes"],
           {k: summary[k]["f1"] for k in ("dev", "test") if k in summary})
  writer.close()  # after the last log line, so a gs:// train.log holds it
  return summary
