"""Training and evaluation: `train_and_evaluate(config, workdir)`.

Reads top to bottom: setup, data, tokenizer, mesh, init (jit with out_shardings), resume, the loop
(dispatch step N, then look at step N-1), dev evaluation with best-checkpoint keeping, test.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import math
import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from gp_jax import checkpoint as ckpt_lib
from gp_jax import sharding as shd
from gp_jax.data import pipeline
from gp_jax.data.sources import load_records
from gp_jax.metrics import span_prf
from gp_jax.models.ner import build_model, build_tokenizer
from gp_jax.ops import gather_hits, span_mask, sparse_zlpr_loss, zlpr_loss

log = logging.getLogger("gp_jax.train")

HOST_ONLY_FIELDS = ("example_index", "window_start")


# ----------------------------------------------------------------------------- pure steps


def model_batch(batch: dict) -> dict:
  """Pipeline batch -> flat dict of the arrays the model and loss read."""
  out = {k: v for k, v in batch.items() if k not in HOST_ONLY_FIELDS and k != "features"}
  out.update(batch["features"])
  return out


def compute_loss(logits_BHLL, batch, *, loss_kind: str, max_span_width):
  mask_B1LL = span_mask(batch["span_mask"], max_span_width=max_span_width)
  if loss_kind == "sparse_zlpr":
    return sparse_zlpr_loss(logits_BHLL, span_ids=batch["span_ids"], mask=mask_B1LL)
  if loss_kind == "zlpr":
    B, H, L, _ = logits_BHLL.shape
    ids = batch["span_ids"]
    labels = jnp.zeros((B, H, L * L), jnp.int32)
    labels = labels.at[jnp.arange(B)[:, None, None], jnp.arange(H)[None, :, None], jnp.where(ids >= 0, ids, L * L)].set(
        1, mode="drop")
    return zlpr_loss(logits_BHLL, labels=labels.reshape(B, H, L, L), mask=mask_B1LL)
  raise ValueError(f"loss.kind must be 'sparse_zlpr' or 'zlpr', got {loss_kind!r}")


def train_step(state, batch, *, graphdef, rest, tx, loss_kind, max_span_width, nan_at_step=0):
  """One optimizer step; `state` = {params, opt_state, step, rng}. Pure: jit it."""
  dropout_key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])

  rest = jax.tree.map(jnp.asarray, rest)  # fresh variables owned by this trace
  seeded = nnx.merge(graphdef, nnx.State(state["params"]), rest)
  nnx.reseed(seeded, dropout=dropout_key)
  rest = nnx.split(seeded, nnx.Param, ...)[2]

  def loss_fn(params):
    # copy=True: fresh Variables in this trace (the RNG counters dropout advances were made outside it).
    model = nnx.merge(graphdef, nnx.State(params), rest, copy=True)
    model.train()
    logits = model(batch)
    return compute_loss(logits, batch, loss_kind=loss_kind, max_span_width=max_span_width)

  loss, grads = jax.value_and_grad(loss_fn)(state["params"])
  updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  if nan_at_step:  # tests: a divergence at this step poisons the loss and the parameters
    poison = state["step"] + 1 == nan_at_step
    loss = jnp.where(poison, jnp.nan, loss)
    params = jax.tree.map(lambda p: jnp.where(poison, jnp.nan, p), params)
  new_state = dict(state, params=params, opt_state=opt_state, step=state["step"] + 1)
  metrics = {"loss": loss, "grad_norm": optax.global_norm(grads)}
  return new_state, metrics


def eval_step(params, batch, *, graphdef, rest, max_span_width, size: int, hit_sharding=None):
  """Logits -> hits on device; returns (count, [size, 4] (window, start, end, type), scores [size]).

  `hit_sharding`: a replicated sharding of the mesh. `jnp.nonzero` on a batch-sharded mask partitions very
  badly (seconds per batch on 8 CPU devices); gathering the boolean mask first makes it a local op.
  """
  model = nnx.merge(graphdef, nnx.State(params), rest)
  model.eval()
  logits = model(batch)
  mask = span_mask(batch["span_mask"], max_span_width=max_span_width)
  hit = (logits > 0) & mask
  if hit_sharding is not None:
    hit = jax.lax.with_sharding_constraint(hit, hit_sharding)
  count, coords, scores = gather_hits(hit, logits, size=size)
  b, h, i, j = coords.T
  return count, jnp.stack([batch["window_index"][b], i, j, h], axis=-1), scores


# ----------------------------------------------------------------------------- setup helpers


def maybe_initialize_distributed(config) -> None:
  if not config.multihost or jax.distributed.is_initialized():
    return
  if config.coordinator_address:
    jax.distributed.initialize(config.coordinator_address, num_processes=config.num_processes,
                               process_id=config.process_id)
  else:
    jax.distributed.initialize()
  log.info("Distributed: process %d of %d, %d local / %d global devices", jax.process_index(),
           jax.process_count(), jax.local_device_count(), jax.device_count())


def make_schedule(opt_cfg, peak: float, total_steps: int):
  warmup = min(int(opt_cfg.warmup_steps), max(total_steps - 1, 0))
  decay_steps = max(total_steps - warmup, 1)
  if opt_cfg.decay == "linear":
    after = optax.linear_schedule(peak, 0.0, decay_steps)
  elif opt_cfg.decay == "cosine":
    after = optax.cosine_decay_schedule(peak, decay_steps)
  elif opt_cfg.decay == "constant":
    after = optax.constant_schedule(peak)
  else:
    raise ValueError(f"optimizer.decay must be linear, cosine or constant, got {opt_cfg.decay!r}")
  if warmup == 0:
    return after
  return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), after], [warmup])


def make_optimizer(opt_cfg, total_steps: int, params):
  """AdamW with a separate head learning rate; decay on matrices only; global-norm clipping."""
  enc_sched = make_schedule(opt_cfg, opt_cfg.lr, total_steps)
  head_sched = make_schedule(opt_cfg, opt_cfg.head_lr or opt_cfg.lr, total_steps)
  decay_mask = lambda p: jax.tree.map(lambda x: x.ndim >= 2, p)  # noqa: E731

  def adamw(sched):
    return optax.adamw(sched, b1=opt_cfg.b1, b2=opt_cfg.b2, eps=opt_cfg.eps, weight_decay=opt_cfg.weight_decay,
                       mask=decay_mask)

  labels = {k: jax.tree.map(lambda _, k=k: "head" if k == "head" else "encoder", v) for k, v in params.items()}
  tx = optax.multi_transform({"encoder": adamw(enc_sched), "head": adamw(head_sched)}, labels)
  if opt_cfg.clip_norm:
    tx = optax.chain(optax.clip_by_global_norm(opt_cfg.clip_norm), tx)
  return tx, enc_sched


@dataclasses.dataclass
class Setup:
  """Everything built from a config that training, evaluation and predict share."""

  config: object
  types: list
  tokenizer: object
  mesh: object
  graphdef: object
  rest: object
  abstract_params: dict
  param_shardings: dict


def init_model(config, tokenizer, types, mesh, *, load_weights=True):
  """Returns (Setup, params): parameters created directly with their shardings."""
  num_types = len(types)
  seed = int(config.seed)
  abstract_model = nnx.eval_shape(lambda: build_model(config, tokenizer, num_types, seed=seed, load_weights=False))
  graphdef, abs_params, abs_rest = nnx.split(abstract_model, nnx.Param, ...)
  abs_params = nnx.to_pure_dict(abs_params)
  p_shard = shd.tree_shardings(mesh, abs_params)
  rest_shard = jax.tree.map(lambda _: shd.replicated(mesh), abs_rest)

  def create():
    model = build_model(config, tokenizer, num_types, seed=seed, load_weights=False)
    _, params, rest = nnx.split(model, nnx.Param, ...)
    return nnx.to_pure_dict(params), rest

  if config.model.encoder == "bert" and load_weights:
    # Only the RNG state comes from `create` (XLA drops the unused random init); weights from disk.
    rest = jax.jit(lambda: create()[1], out_shardings=rest_shard)()
    model = build_model(config, tokenizer, num_types, seed=seed, load_weights=True)
    params = jax.device_put(nnx.to_pure_dict(nnx.state(model, nnx.Param)), p_shard)
  else:
    params, rest = jax.jit(create, out_shardings=(p_shard, rest_shard))()
  setup = Setup(config, list(types), tokenizer, mesh, graphdef, rest, abs_params, p_shard)
  return setup, params


def state_shardings(setup: Setup, tx):
  """Shardings of the train state {params, opt_state, step, rng}."""
  repl = shd.replicated(setup.mesh)
  opt_shard = shd.tree_shardings(setup.mesh, jax.eval_shape(tx.init, setup.abstract_params))
  return {"params": setup.param_shardings, "opt_state": opt_shard, "step": repl, "rng": repl}


def abstract_state(setup: Setup, tx):
  """ShapeDtypeStructs (with shardings) of the train state, the target of a checkpoint restore."""
  shapes = {
      "params": setup.abstract_params,
      "opt_state": jax.eval_shape(tx.init, setup.abstract_params),
      "step": jax.ShapeDtypeStruct((), jnp.int32),
      "rng": jax.eval_shape(lambda: jax.random.key_data(jax.random.key(0))),
  }
  return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes,
                      state_shardings(setup, tx))


def make_eval_fn(setup: Setup):
  cache = {}

  def run(params, batch, size):
    if size not in cache:
      fn = functools.partial(eval_step, graphdef=setup.graphdef, rest=setup.rest,
                             max_span_width=setup.config.data.max_span_width or None, size=size,
                             hit_sharding=shd.replicated(setup.mesh))
      cache[size] = jax.jit(fn, out_shardings=shd.replicated(setup.mesh))
    return cache[size](params, batch)

  return run


def predict_hits(setup: Setup, eval_fn, params, prepared, *, batch_size: int, buckets, desc: str = "eval",
                 progress: bool = False):
  """Runs the model over every window of `prepared`; returns hit columns for `pipeline.merge_predictions`."""
  from tqdm.auto import tqdm

  batches = pipeline.eval_batches(prepared, batch_size=batch_size, buckets=buckets,
                                  process_index=jax.process_index(), process_count=jax.process_count())
  cols = {"window": [], "start": [], "end": [], "type": [], "score": []}
  size = max(64, batch_size * 32)
  for batch in tqdm(batches, desc=desc, disable=not progress, leave=False):
    gb = shd.global_batch(model_batch(batch), setup.mesh)
    count, coords, scores = eval_fn(params, gb, size)
    count = int(count)
    if count > size:
      size = 1 << int(count - 1).bit_length()
      log.info("%s: %d hits in one batch, growing the hit buffer to %d", desc, count, size)
      count, coords, scores = eval_fn(params, gb, size)
      count = int(count)
    coords, scores = np.asarray(coords)[:count], np.asarray(scores)[:count]
    for n, key in enumerate(("window", "start", "end", "type")):
      cols[key].append(coords[:, n])
    cols["score"].append(scores)
  return {k: (np.concatenate(v) if v else np.zeros((0,), np.float32 if k == "score" else np.int32)) for k, v in cols.items()}


def evaluate(setup: Setup, eval_fn, params, prepared, *, desc="eval", progress=False):
  cfg = setup.config
  hits = predict_hits(setup, eval_fn, params, prepared, batch_size=cfg.eval_batch_size, buckets=cfg.data.buckets,
                      desc=desc, progress=progress)
  merged = pipeline.merge_predictions(prepared, hits)
  result = span_prf(pipeline.prediction_spans(merged), pipeline.gold_spans(prepared))
  return result, merged


# ----------------------------------------------------------------------------- logging


class MetricWriter:
  """JSON lines + TensorBoard (tensorboardX, no TensorFlow); process 0 only."""

  def __init__(self, workdir: str, enabled: bool):
    self.enabled = enabled
    self.tb = None
    if enabled:
      from tensorboardX import SummaryWriter

      self.jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
      self.tb = SummaryWriter(os.path.join(workdir, "tb"))

  def write(self, step: int, split: str, values: dict):
    if not self.enabled:
      return
    flat = {k: float(v) for k, v in values.items() if isinstance(v, (int, float, np.floating, np.integer))}
    self.jsonl.write(json.dumps({"step": step, "split": split, **flat}) + "\n")
    self.jsonl.flush()
    for k, v in flat.items():
      self.tb.add_scalar(f"{split}/{k}", v, step)
    self.tb.flush()

  def close(self):
    if self.enabled:
      self.jsonl.close()
      self.tb.close()


def _setup_logging(workdir: str, is_main: bool):
  root = logging.getLogger()
  if not any(isinstance(h, logging.StreamHandler) for h in root.handlers):
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
  root.setLevel(logging.INFO if is_main else logging.WARNING)
  for h in [h for h in root.handlers if getattr(h, "_gp_jax_train_log", False)]:  # an earlier run in this process
    root.removeHandler(h)
    h.close()
  if is_main:
    fh = logging.FileHandler(os.path.join(workdir, "train.log"))
    fh._gp_jax_train_log = True
    fh.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(fh)
  for noisy in ("absl", "orbax", "jax._src"):
    logging.getLogger(noisy).setLevel(logging.WARNING)


class _Preemption:
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
    from jax.experimental import multihost_utils

    flags = multihost_utils.process_allgather(np.asarray(int(self.requested), np.int32))
    return bool(np.max(flags))

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


# ----------------------------------------------------------------------------- main entry


def prepare_data(config, workdir, *, log_stats=True):
  train_recs, dev_recs, test_recs, types = load_records(config.data, seed=config.seed)
  tokenizer = build_tokenizer(config, [r["text"] for r in train_recs], workdir)
  kw = dict(types=types, max_len=config.data.max_len, stride=config.data.stride or None,
            max_span_width=config.data.max_span_width or None)
  splits = {"train": pipeline.prepare_split(train_recs, tokenizer, name="train", **kw)}
  if dev_recs:
    splits["dev"] = pipeline.prepare_split(dev_recs, tokenizer, name="dev", **kw)
  if test_recs and any(r["entities"] for r in test_recs):
    splits["test"] = pipeline.prepare_split(test_recs, tokenizer, name="test", **kw)
  elif test_recs:
    log.info("Test split has no labels: skipping test evaluation")
  return splits, tokenizer, types


def train_and_evaluate(config, workdir: str) -> dict:
  """Trains, evaluates on dev, keeps the best checkpoint by dev F1, evaluates it on test.

  Returns a summary dict (also written to workdir/results.json).
  """
  maybe_initialize_distributed(config)
  os.makedirs(workdir, exist_ok=True)
  is_main = jax.process_index() == 0
  _setup_logging(workdir, is_main)
  t_start = time.time()
  config_json = config.to_json_best_effort(sort_keys=True)

  splits, tokenizer, types = prepare_data(config, workdir)
  if jax.process_count() > 1:
    # Every process has read (or built) the tokenizer before process 0 (re)writes it into the shared workdir.
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("gp_jax.train: data prepared")
  if is_main:
    tokenizer.save(os.path.join(workdir, "tokenizer"))
    with open(os.path.join(workdir, "types.json"), "w") as f:
      json.dump(types, f)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      f.write(config_json)

  mesh = shd.make_mesh(config.mesh.data, config.mesh.fsdp)
  log.info("Mesh %s over %d devices (%s)", dict(mesh.shape), jax.device_count(), jax.devices()[0].platform)
  setup, params = init_model(config, tokenizer, types, mesh)
  n_params = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params))
  log.info("Model: %s encoder + %s head, %d parameters, dtype %s", config.model.encoder, config.model.head, n_params,
           config.model.dtype)

  train_it = pipeline.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets,
                                    seed=config.seed, process_index=jax.process_index(),
                                    process_count=jax.process_count())
  steps_per_epoch = train_it.steps_per_epoch
  total_steps = int(config.num_train_steps) or int(math.ceil(config.num_epochs * steps_per_epoch))
  eval_every = int(config.eval_every_steps) or steps_per_epoch
  tx, lr_sched = make_optimizer(config.optimizer, total_steps, params)

  repl = shd.replicated(mesh)
  state_shard = state_shardings(setup, tx)
  opt_state = jax.jit(tx.init, out_shardings=state_shard["opt_state"])(params)
  rng = jax.random.key_data(jax.random.key(config.seed))
  state = {"params": params, "opt_state": opt_state, "step": jnp.zeros((), jnp.int32), "rng": rng}
  state = jax.device_put(state, state_shard)

  # Resume order: workdir checkpoint, then init_from, then fresh.
  mngr = ckpt_lib.make_manager(os.path.join(workdir, "ckpt"), keep=config.keep_checkpoints)
  best_mngr = ckpt_lib.make_manager(os.path.join(workdir, "best"), keep=1, best=True)
  target = abstract_state(setup, tx)
  restored = ckpt_lib.restore(mngr, target)
  if restored is not None:
    start_step, state, data_state = restored
    train_it.set_state(data_state)
    log.info("Resumed from %s at step %d", mngr.directory, start_step)
  elif config.init_from:
    src = ckpt_lib.make_manager(ckpt_lib.find_checkpoint_dir(config.init_from), keep=1)
    _, src_state, _ = ckpt_lib.restore(src, target)
    state = dict(state, params=src_state["params"])
    start_step = 0
    log.info("Initialised parameters from %s", config.init_from)
  else:
    start_step = 0
  start_step = int(start_step)

  step_fn = jax.jit(
      functools.partial(train_step, graphdef=setup.graphdef, rest=setup.rest, tx=tx, loss_kind=config.loss.kind,
                        max_span_width=config.data.max_span_width or None, nan_at_step=config.debug.nan_at_step),
      in_shardings=(state_shard, None),
      out_shardings=(state_shard, repl),
      donate_argnums=0,
  )
  eval_fn = make_eval_fn(setup)
  writer = MetricWriter(workdir, is_main)
  log.info("Training %d steps (%d per epoch, global batch %d), eval every %d, checkpoint every %d", total_steps,
           steps_per_epoch, config.batch_size, eval_every, config.checkpoint_every_steps)

  from tqdm.auto import tqdm

  # The bar counts dispatched steps; it pauses at log steps while the device catches up.
  bar = tqdm(total=total_steps, initial=start_step, disable=not (is_main and config.progress_bar), desc="train",
             dynamic_ncols=True, mininterval=1.0 if sys.stderr.isatty() else 30.0)
  best_step = best_mngr.best_step()
  best_f1 = float(best_mngr.metrics(best_step)["dev_f1"]) if best_step is not None else -1.0
  last_dev = None
  tokens = examples = 0
  t_log = time.time()
  pending = None
  preempted = False

  def save(step, *, wait=False):
    ckpt_lib.save(mngr, step, state=state, data_state=train_it.get_state(), config_json=config_json)
    if wait:
      mngr.wait_until_finished()

  def check_finite(step, metrics):
    loss = float(metrics["loss"])
    if not math.isfinite(loss):
      mngr.wait_until_finished()
      raise FloatingPointError(
          f"loss is {loss} at step {step}; stopping. Last good checkpoint: step {mngr.latest_step()} in "
          f"{mngr.directory}")
    return loss

  with _Preemption() as preemption:
    for step in range(start_step, total_steps):
      batch = next(train_it)
      tokens += int(batch["attention_mask"].sum())
      examples += int((batch["example_index"] >= 0).sum())
      state, metrics = step_fn(state, shd.global_batch(model_batch(batch), mesh))
      done = step + 1
      bar.update(1)
      # Look at the previous step only now: the host never waits on the step just dispatched.
      if pending is not None and pending[0] % config.log_every_steps == 0:
        p_step, p_metrics = pending
        loss = check_finite(p_step, p_metrics)
        dt = max(time.time() - t_log, 1e-9)
        # Multi-host: this process saw 1/process_count of the tokens.
        rates = {"tokens_per_s": tokens * jax.process_count() / dt, "examples_per_s": examples * jax.process_count() / dt}
        writer.write(p_step, "train", {"loss": loss, "grad_norm": float(p_metrics["grad_norm"]),
                                       "lr": float(lr_sched(p_step)), "epoch": p_step / steps_per_epoch, **rates})
        log.info("step %d train loss %.4f", p_step, loss)
        bar.set_postfix(loss=f"{loss:.4f}", dev_f1=f"{last_dev:.4f}" if last_dev is not None else "-",
                        tok_s=f"{rates['tokens_per_s']:.0f}")
        tokens = examples = 0
        t_log = time.time()
      pending = (done, metrics)

      if done % eval_every == 0 or done == total_steps:
        check_finite(done, metrics)
        if "dev" in splits:
          result, _ = evaluate(setup, eval_fn, state["params"], splits["dev"], desc="dev")
          last_dev = result["f1"]
          writer.write(done, "dev", _flat_result(result))
          log.info("step %d dev P %.4f R %.4f F1 %.4f", done, result["precision"], result["recall"], result["f1"])
          if result["f1"] > best_f1:
            best_f1 = result["f1"]
            ckpt_lib.save(best_mngr, done, state=state, data_state=train_it.get_state(), config_json=config_json,
                          metrics={"dev_f1": result["f1"]})
      if done % config.checkpoint_every_steps == 0 or done == total_steps:
        check_finite(done, metrics)
        save(done)
        if config.debug.sigkill_after_checkpoint_step and done == config.debug.sigkill_after_checkpoint_step:
          mngr.wait_until_finished()
          os.kill(os.getpid(), signal.SIGKILL)
      if preemption.should_stop(done, config.log_every_steps):
        check_finite(done, metrics)
        if mngr.latest_step() != done:
          save(done)
        mngr.wait_until_finished()
        log.warning("SIGTERM: saved checkpoint at step %d in %s; exiting", done, mngr.directory)
        preempted = True
        break
  if pending is not None and pending[0] % config.log_every_steps != 0 and not preempted:
    writer.write(pending[0], "train", {"loss": check_finite(*pending), "lr": float(lr_sched(pending[0]))})
  bar.close()
  mngr.wait_until_finished()
  best_mngr.wait_until_finished()

  summary = {"workdir": os.path.abspath(workdir), "steps": int(jax.device_get(state["step"])), "preempted": preempted,
             "train_minutes": (time.time() - t_start) / 60, "parameters": n_params,
             "split_stats": {k: dataclasses.asdict(v.stats) for k, v in splits.items()}}
  if not preempted:
    final_params = state["params"]
    if best_mngr.latest_step() is not None:
      best_step = best_mngr.best_step()
      _, best_state, _ = ckpt_lib.restore(best_mngr, target, best_step)
      final_params = best_state["params"]
      summary["best_step"] = int(best_step)
      summary["best_dev_f1"] = best_f1
    for split in ("dev", "test"):
      if split in splits:
        result, _ = evaluate(setup, eval_fn, final_params, splits[split], desc=split)
        summary[split] = _flat_result(result)
        summary[split]["per_type"] = result["per_type"]
        writer.write(summary["steps"], f"final_{split}", _flat_result(result))
        log.info("final %s (best checkpoint): P %.4f R %.4f F1 %.4f", split, result["precision"], result["recall"],
                 result["f1"])
  summary["wall_minutes"] = (time.time() - t_start) / 60
  if is_main:
    with open(os.path.join(workdir, "results.json"), "w") as f:
      json.dump(summary, f, indent=1, default=str)
  writer.close()
  log.info("Done in %.1f minutes: %s", summary["wall_minutes"],
           {k: summary[k]["f1"] for k in ("dev", "test") if k in summary})
  return summary


def _flat_result(result: dict) -> dict:
  return {k: result[k] for k in ("precision", "recall", "f1", "tp", "pred", "gold")}

