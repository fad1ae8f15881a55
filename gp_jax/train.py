"""Training and evaluation: `train_and_evaluate(config, workdir)`.

Reads top to bottom as phases: run setup (distributed, workdir, mesh, checks), data (the splits and the training
iterator), state (model, optimizer; started as gp_jax/resume.py decides), the loop (dispatch step N, then look at
step N-1; dev evaluation keeps the best parameters), final evaluation and results.json (gp_jax/final.py). Only
main.py and tests import this module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable

import jax
import numpy as np
from jax.experimental import multihost_utils
from tqdm.auto import tqdm

from gp_jax import aot
from gp_jax import feed as feed_lib
from gp_jax import checkpoint as ckpt_lib
from gp_jax import factory, reporting, resume, runtime, storage, tasks, workdir as wd
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.data import batching
from gp_jax.evaluate import Evaluator
from gp_jax.final import dev_history, final_evaluation, write_results
from gp_jax.optim import make_optimizer
from gp_jax.steps import make_train_step, make_train_steps
from gp_jax.tasks.base import flat_result

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
class RunContext:
  """Where a run writes and how it is laid out; `spec` (`factory.run_spec`) is resolved by `train_and_evaluate` inside
  its error handling (a config the target cannot run still writes results.json)."""

  config: object
  workdir: object  # epath.Path
  is_main: bool
  mesh: object
  mirror: storage.LocalMirror | None
  config_json: str
  t_start: float
  spec: factory.RunSpec | None = None


def setup_run(config, workdir) -> RunContext:
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
  runtime.start_compile_clock()
  runtime.mark_run_start()
  cache = runtime.configure_compilation_cache(config.get("compilation_cache", "auto"))
  log.info("Compilation cache: %s", cache or "off")
  mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp)
  log.info("Mesh %s over %d devices (%s)", dict(mesh.shape), jax.device_count(), jax.devices()[0].platform)
  batch_ways = mesh.size
  for name in ("batch_size", "eval_batch_size"):
    if config[name] % batch_ways or config[name] % jax.process_count():
      raise ValueError(f"{name}={config[name]} must be divisible by the {batch_ways} data-parallel devices "
                       f"(mesh {dict(mesh.shape)}) and by the {jax.process_count()} processes")
  resume.check_workdir(config, root)
  log.info("Precision: %s", factory.precision(config).describe())
  config_json = config.to_json_best_effort(sort_keys=True)
  return RunContext(config, root, is_main, mesh, mirror, config_json, t_start)


def build_training(run: RunContext, train_it: batching.BatchIterator, tokenizer, types) -> state_lib.Training:
  """Model, optimizer and train state, started as `resume` decides (checkpoint, init_from or fresh)."""
  spec, task = run.spec, tasks.of(run.spec)
  ckpts = resume.open_checkpoints(run.workdir, keep=spec.keep_checkpoints)
  setup, params = state_lib.init_model(run.config, tokenizer, types, run.mesh, load_weights=not ckpts.resuming,
                                       encoder_config=resume.encoder_config(ckpts, run.workdir),
                                       labels=task.split_labels(train_it.prepared))
  n_params = state_lib.param_count(params)
  log.info("Model: %s encoder + %s head, %d parameters, dtype %s", spec.encoder, spec.head, n_params,
           spec.precision.dtype)
  if run.is_main:
    wd.save_run_files(run.workdir, config_json=run.config_json, types=types, tokenizer=tokenizer,
                      encoder_config=setup.encoder_config)
    task.save_labels(run.workdir, setup.labels)
  total_steps = spec.num_train_steps or int(math.ceil(spec.num_epochs * train_it.steps_per_epoch))
  tx, lr_schedule = make_optimizer(spec.optimizer, total_steps, params)
  start_step, state = resume.initial_state(ckpts, setup, tx, params, train_it, seed=spec.seed,
                                           init_from=spec.init_from, config=run.config)
  return state_lib.Training(setup, state, tx, lr_schedule, train_it, start_step, total_steps, ckpts.mngr,
                            ckpts.best_mngr, n_params)


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


class Diverged(FloatingPointError):
  """The loss or the gradient became non-finite (`check_finite`)."""


def check_finite(step: int, metrics, mngr) -> None:
  """Raises Diverged when a step of the call that ended at `step` made the loss or the gradient non-finite
  (metrics of one step, or stacked [k] for a k-step call)."""
  finite = np.asarray(metrics["finite"]).reshape(-1)
  if finite.all():
    return
  i = int(np.argmin(finite))
  at = lambda name: float(np.asarray(metrics[name]).reshape(-1)[i])  # noqa: E731
  mngr.wait_until_finished()
  last = mngr.latest_step()
  kept = f"Last good checkpoint: step {last}" if last is not None else "No checkpoint was saved before it"
  raise Diverged(f"training diverged at step {step - finite.shape[0] + 1 + i}: loss {at('loss')}, gradient norm "
                 f"{at('grad_norm')}; stopping. {kept} in {mngr.directory}")


@dataclasses.dataclass
class Calls:
  """The train step's programs: one step per call, and k steps per call (`steps.make_train_steps`)."""

  single: aot.Dispatch
  multi: aot.Dispatch

  def __call__(self, state, fed: feed_lib.Fed):
    return (self.single if fed.group.size == 1 else self.multi)(state, fed.batch)


def compile_ahead(run: RunContext, ts: state_lib.Training, splits, evaluator: Evaluator, fns, groups) -> Calls:
  """Every program the run will execute compiled before its first step, concurrently: the train step for each
  (group size, bucket) the plan holds, the eval step per bucket of dev and test. Returns the train calls."""
  spec = run.spec
  single, multi = fns
  shapes = sorted({(g.size, g.length) for g in groups})
  train = [aot.train_program(single if n == 1 else multi, ts.setup, ts.tx, batch=spec.batch_size, length=L,
                             steps=n) for n, L in shapes]
  eval_splits = [splits[k] for k in ("dev", "test") if k in splits]
  lengths = aot.eval_lengths(eval_splits, batch_size=spec.eval_batch_size, buckets=spec.buckets)
  evals = [aot.eval_program(evaluator.decoder.fn(evaluator.decoder.size), ts.setup, batch=spec.eval_batch_size,
                            length=L, hits=evaluator.decoder.size) for L in lengths]
  platform = spec.platform  # the target the setup and its spec were resolved for
  for p in train + evals:
    aot.resolve(p, ts.setup, platform)
  if run.is_main:
    record = aot.resolved_record(train + evals, ts.setup, platform)
    storage.write_json(run.workdir / "resolved.json", record, indent=1)
    log.info("Resolved (resolved.json): %s, %s; %s", record["dtype"], factory.dropout_masks(record["dropout_bits"]),
             "; ".join(f"{label}: attention {c['attention']}, loss {c['loss']}" for label, c in
                       record["programs"].items()))
  aot.compile_for_run(train + evals)
  calls = Calls(aot.Dispatch(single, "train"), aot.Dispatch(multi, "train"))
  calls.single.adopt([p for p in train if p.steps == 1])
  calls.multi.adopt([p for p in train if p.steps > 1])
  evaluator.decoder.adopt(evals)
  return calls


class Pace:
  """Steady training pace per length bucket: the intervals between consecutive dispatches, leaving out each bucket's
  first step and any interval that held an evaluation or a checkpoint. The host reads metrics every
  `log_every_steps`, so over many steps the intervals follow the slower of host and device."""

  def __init__(self):
    self.by_length: dict[int, list] = {}
    self.last = None

  def dispatched(self, length: int, tokens: int, size: int = 1) -> None:
    now = time.perf_counter()
    row = self.by_length.setdefault(length, [0, 0.0, 0, False])
    if self.last is not None and row[3]:
      row[0], row[1], row[2] = row[0] + size, row[1] + now - self.last, row[2] + tokens
    row[3] = True
    self.last = now

  def interrupted(self) -> None:
    self.last = None

  def lines(self) -> list[str]:
    return [f"train pace L{L}: {n} steps, {1e3 * s / n:.2f} ms/step, {tokens / s:.0f} tokens/s"
            for L, (n, s, tokens, _) in sorted(self.by_length.items()) if n and s > 0]


class Loop:
  """The training loop's state between calls: the train state, the best dev F1 and patience, the step log, pace and
  progress, and how the loop ended (`train_loop` drives it, one call of up to k steps at a time)."""

  def __init__(self, run: RunContext, ts: state_lib.Training, splits, evaluator: Evaluator, writer, hooks):
    self.run, self.ts, self.splits, self.evaluator, self.writer, self.hooks = run, ts, splits, evaluator, writer, hooks
    spec = run.spec
    self.eval_every = spec.eval_every_steps or ts.train_it.steps_per_epoch
    self.k = feed_lib.steps_per_execution(spec.steps_per_execution, spec.platform)
    self.fns = tuple(make(ts.setup, ts.tx, loss_kind=spec.loss_kind, step_transform=hooks.step_transform)
                     for make in (make_train_step, make_train_steps))
    log.info("Training %d steps (%d per epoch, global batch %d), eval every %d, checkpoint every %d, up to %d steps "
             "per call", ts.total_steps, ts.train_it.steps_per_epoch, spec.batch_size, self.eval_every,
             spec.checkpoint_every_steps, self.k)
    best_step = ts.best_mngr.best_step()
    self.best_f1 = float(ts.best_mngr.metrics(best_step)["dev_f1"]) if best_step is not None else -1.0
    self.patience = EarlyStop(spec.early_stop_patience, ts.train_it.steps_per_epoch, best_step)
    self.bar = None
    if run.is_main and run.config.progress_bar and reporting.is_tty():
      self.bar = tqdm(total=ts.total_steps, initial=ts.start_step, desc="train", dynamic_ncols=True)
    self.steps = reporting.StepLog(ts, writer, spec.log_every_steps, self.bar,
                                   check=lambda step, metrics: check_finite(step, metrics, ts.mngr))
    self.state, self.pace = ts.state, Pace()
    self.preempted = self.stopped_early = False
    self.stop_signal, self.n_calls, self.progress = None, 0, None
    # A resumed run that had stopped early starts at its end.
    self.first = ts.total_steps if self.patience.exhausted(ts.start_step) else ts.start_step
    self.groups = feed_lib.plan(ts.train_it.upcoming_lengths(ts.total_steps - self.first), start=self.first, k=self.k,
                                every=(self.eval_every, spec.checkpoint_every_steps, ts.train_it.steps_per_epoch),
                                total=ts.total_steps)

  def save(self, step: int) -> None:
    t0 = time.perf_counter()
    ckpt_lib.save(self.ts.mngr, step, state=self.state, data_state=self.ts.train_it.get_state(),
                  config_json=self.run.config_json)
    log.info("checkpoint at step %d: %.2f s", step, time.perf_counter() - t0)

  def call(self, calls: Calls, fed: feed_lib.Fed, preemption) -> bool:
    """One call of `fed.group.size` steps, then what falls due at its end; True when the loop stops."""
    ts, spec, mngr = self.ts, self.run.spec, self.ts.mngr
    self.state, metrics = calls(self.state, fed)
    self.n_calls += 1
    ts.train_it.skip(fed.group.size)
    ts.train_it.add_span_overflow(fed.span_overflow)
    self.steps.count(fed.tokens, fed.examples)
    self.pace.dispatched(fed.group.length, fed.tokens, fed.group.size)
    done = fed.group.end
    self.steps.dispatched(done, metrics, size=fed.group.size)
    if self.n_calls == 1:
      jax.block_until_ready(metrics)
      log.info(runtime.first_step_line())
    if self.progress is not None:
      self.progress.update(done)
    last = done == ts.total_steps
    if done % self.eval_every == 0 or last:
      check_finite(done, metrics, mngr)
      last = self.evaluate(done) or last
      self.writer.sync()
    if done % spec.checkpoint_every_steps == 0 or last:
      check_finite(done, metrics, mngr)
      self.save(done)
      self.pace.interrupted()
      if self.hooks.after_checkpoint is not None:
        mngr.wait_until_finished()
        self.hooks.after_checkpoint(done)
    if self.stopped_early:
      return True
    if preemption.should_stop(done):  # once per call; all processes agree (runtime.Preemption)
      self.preempt(done, metrics, preemption)
      return True
    return False

  def evaluate(self, done: int) -> bool:
    """Dev P/R/F1 at `done`, the parameters saved to best/ when F1 beats the best so far; True when early stopping
    ends the run here."""
    if "dev" not in self.splits:
      return False
    t_eval, t0 = time.time(), time.perf_counter()
    params = state_lib.eval_params(self.state)
    result, _ = self.evaluator.evaluate(params, self.splits["dev"], desc=f"dev@{done}")
    log.info("dev@%d evaluation: %.2f s", done, time.perf_counter() - t0)
    self.writer.write(done, "dev", flat_result(result))
    log.info("step %d dev P %.4f R %.4f F1 %.4f", done, result["precision"], result["recall"], result["f1"])
    self.steps.last_dev = f1 = result["f1"]
    if f1 > self.best_f1:  # best/ keeps the parameters of the best dev F1
      ckpt_lib.save_params(self.ts.best_mngr, done, params=params, config_json=self.run.config_json, dev_f1=f1)
      self.best_f1, self.patience.best_step = f1, done
    self.steps.pause(time.time() - t_eval)
    self.pace.interrupted()
    if self.patience.exhausted(done) and done != self.ts.total_steps:
      log.info("Early stop at step %d (epoch %.2f): dev F1 has not improved for %s epochs since step %d", done,
               done / self.ts.train_it.steps_per_epoch, self.patience.epochs, self.patience.best_step)
      self.stopped_early = True
    return self.stopped_early

  def preempt(self, done: int, metrics, preemption) -> None:
    mngr = self.ts.mngr
    self.stop_signal = preemption.signal_name or "SIGTERM"  # several processes: the coordination service's notice
    log.warning("%s at step %d: saving its checkpoint, then stopping%s", self.stop_signal, done,
                " (Ctrl-C again stops at once, without it)" if self.stop_signal == "SIGINT" else "")
    check_finite(done, metrics, mngr)
    if mngr.latest_step() != done:
      self.save(done)
    mngr.wait_until_finished()
    log.warning("%s: saved checkpoint at step %d in %s; exiting", self.stop_signal, done, mngr.directory)
    self.preempted = True

  def nothing_left(self, done_steps: int) -> str:
    """What the steps line adds when this call of the run had no step to train (a finished or early-stopped run)."""
    if self.n_calls:
      return ""
    if self.first != self.ts.start_step:
      return (f": nothing left to train (stopped early at step {done_steps}: dev F1 had not improved for "
              f"{self.patience.epochs} epochs since step {self.patience.best_step})")
    return ": nothing left to train" if done_steps >= self.ts.total_steps else ""

  def finish(self) -> dict:
    """Flushes logs and checkpoints; {steps, preempted, train_tokens_per_s, ...}."""
    ts = self.ts
    self.steps.flush()
    for line in self.pace.lines():
      log.info(line)
    if self.bar is not None:
      self.bar.close()
    ts.mngr.wait_until_finished()
    ts.best_mngr.wait_until_finished()
    ts.state = self.state
    done_steps = int(jax.device_get(self.state["step"]))
    log.info("%d steps in %d calls%s", max(0, done_steps - self.first), self.n_calls, self.nothing_left(done_steps))
    return {"steps": done_steps, "epochs": done_steps / ts.train_it.steps_per_epoch, "preempted": self.preempted,
            **({"signal": self.stop_signal} if self.preempted else {}),
            "stopped_early": self.stopped_early or self.first != ts.start_step,
            "train_tokens_per_s": self.steps.tokens_per_s, "span_overflow": ts.train_it.span_overflow,
            "steps_per_execution": self.k, "train_calls": self.n_calls}


def train_loop(run: RunContext, ts: state_lib.Training, splits, evaluator: Evaluator, writer, hooks: TrainHooks) -> dict:
  """Steps from ts.start_step to ts.total_steps, in calls of up to k same-bucket steps (`feed`); returns {steps,
  preempted, train_tokens_per_s, ...}."""
  loop = Loop(run, ts, splits, evaluator, writer, hooks)
  calls = compile_ahead(run, ts, splits, evaluator, loop.fns, loop.groups)
  batches = feed_lib.Feed(ts.train_it, loop.groups, run.mesh)
  if run.is_main and loop.bar is None:  # without a bar, the log says how far and how fast
    loop.progress = reporting.Progress(ts.total_steps, start=loop.first,
                                       every_s=float(run.config.get("progress_log_seconds", 30.0)))
  loop.steps.start()
  try:
    with runtime.Preemption() as preemption:
      for fed in batches:
        if loop.call(calls, fed, preemption):
          break
  finally:
    batches.close()
  return loop.finish()


# ----------------------------------------------------------------------------- entry


def load_data(run: RunContext, config, summary: dict):
  """Splits, tokenizer, types, training batches; split stats (a tagger's unrepresentable spans) into `summary`."""
  tokenizer = resume.saved_tokenizer(run.workdir, init_from=run.spec.init_from, encoder=run.spec.encoder)
  splits, tokenizer, types = factory.prepare_data(config, tokenizer=tokenizer)
  train_it = factory.train_batches(run.spec, splits["train"])
  summary["split_stats"] = {k: v.all_stats() for k, v in splits.items()}
  scheme = run.spec.tag_scheme
  if scheme:
    # One tag layer: nested gold spans it cannot hold stay in the gold set (scored as misses) and are counted.
    summary["unrepresentable"] = {k: batching.count_unrepresentable(v, scheme=scheme) for k, v in splits.items()}
    log.info("Gold spans a single %s tag layer cannot hold (nested/crossing): %s", scheme,
             summary["unrepresentable"])
  if jax.process_count() > 1:  # every process has read the tokenizer before process 0 rewrites it in the workdir
    multihost_utils.sync_global_devices("gp_jax.train: data prepared")
  return splits, tokenizer, types, train_it


def model_fields(run: RunContext, ts: state_lib.Training) -> dict:
  """What results.json records of the model and the training tricks (EMA, adversarial), which are logged."""
  adversarial = run.spec.adversarial
  if ts.setup.ema_decay:
    log.info("EMA of the parameters (decay %g): evaluation and best/ use the EMA weights", ts.setup.ema_decay)
  if adversarial:
    log.info("Adversarial training: %s", adversarial)
  return {"parameters": ts.n_params, "head_kind": "tagger" if run.spec.tag_scheme else "span",
          **tasks.of(run.spec).run_fields(), "ema_decay": ts.setup.ema_decay,
          "eval_weights": "ema" if ts.setup.ema_decay else "params",
          "adversarial": dataclasses.asdict(adversarial) if adversarial else None}


def train_and_evaluate(config, workdir, *, hooks: TrainHooks | None = None) -> dict:
  """Trains, evaluates on dev, keeps the best parameters by dev F1, evaluates them on test.

  Returns a summary dict, also written to workdir/results.json with "status": finished, preempted (SIGTERM or
  Ctrl-C, named in "signal": in the loop a checkpoint is saved at that step, elsewhere the run stops at once; rerun
  to resume) or failed (with "error").
  """
  hooks = hooks or TrainHooks()
  run = setup_run(config, workdir)
  writer = reporting.MetricWriter(run.mirror)
  summary = {"workdir": str(run.workdir), "status": "failed"}

  def stopped_at_once(signal_name):  # also runtime.stop_now's callback: the process may end right after it
    summary.update(status="preempted", preempted=True, signal=signal_name, stopped_at_once=True)
    write_results(run, summary)

  with runtime.on_stop(stopped_at_once):  # Ctrl-C outside the loop's steps (gp_jax.main)
    try:
      run = dataclasses.replace(run, spec=factory.run_spec(config))  # what the trainer reads from here on
      for line in reporting.config_lines(run.config_json, run.spec):
        log.info(line)
      splits, tokenizer, types, train_it = load_data(run, config, summary)
      ts = build_training(run, train_it, tokenizer, types)
      summary.update(model_fields(run, ts))
      evaluator = Evaluator(ts.setup, batch_size=run.spec.eval_batch_size, progress=run.is_main)
      summary.update(train_loop(run, ts, splits, evaluator, writer, hooks))
      summary["dev_history"] = dev_history(run, ts.train_it.steps_per_epoch)
      summary["train_minutes"] = (time.time() - run.t_start) / 60
      if summary["preempted"]:
        summary["status"] = "preempted"
      else:
        summary.update(final_evaluation(run, ts, splits, evaluator, writer, summary["steps"]))
        summary["status"] = "finished"
    except BaseException as e:
      if isinstance(e, KeyboardInterrupt):  # a user's Ctrl-C where no handler took it: no failure
        stopped_at_once("SIGINT")
      else:
        summary["error"] = f"{type(e).__name__}: {e}"
        write_results(run, summary)
      writer.close()
      raise
    write_results(run, summary)
    f1 = {k: round(float(summary[k]["f1"]), 4) for k in ("dev", "test") if k in summary}
    log.info("Done (%s) in %.1f minutes%s", summary["status"], summary["wall_minutes"], f": {f1}" if f1 else "")
    writer.close()  # after the last log line, so a gs:// train.log holds it
    return summary
