"""Training and prediction speed of the span heads (GP, EGP) against the tagger baselines (CRF, softmax),
same encoder, same data, same process: the speed side of Su's GlobalPointer-vs-CRF table.

  python benchmarks/head_speed.py                                   # MSRA, scratch encoder (main job settings)
  python benchmarks/head_speed.py --config=experiments/head_comparison.py:dataset=germeval2014 --rounds=5

Each round times every head in turn on the same batches (alternating, so load drifts hit all heads alike):
train tokens/s over --steps training steps (jitted train_step, after one compile pass over every bucket) and
predict sentences/s over --predict_records records (Evaluator: device decode + window merge). Ratios to CRF
are per round; the median and the min-max spread over rounds are printed. Note the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402

from gp_jax import sharding as shd  # noqa: E402
from gp_jax import state as state_lib  # noqa: E402
from gp_jax import train  # noqa: E402
from gp_jax.data import batching  # noqa: E402
from gp_jax.evaluate import Evaluator, model_batch  # noqa: E402
from gp_jax.optim import make_optimizer  # noqa: E402
from launch import sweep  # noqa: E402


def build(config, tokenizer, types, mesh, head):
  c = config.copy_and_resolve_references()
  c.model.head = head
  setup, params = state_lib.init_model(c, tokenizer, types, mesh)
  tx, _ = make_optimizer(c.optimizer, 10_000, params)
  state = state_lib.init_train_state(setup, params, tx, seed=0)
  shard = state_lib.state_shardings(setup, tx)
  step = jax.jit(functools.partial(train.train_step, graphdef=setup.graphdef, rest=setup.rest, tx=tx,
                                   loss_kind=c.loss.kind, block_size=setup.block_size),
                 in_shardings=(shard, None), out_shardings=(shard, shd.replicated(mesh)), donate_argnums=0)
  return setup, state, step


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="experiments/head_comparison.py:dataset=msra", help="experiment[:arg]")
  p.add_argument("--heads", default="standard,efficient,crf,softmax")
  p.add_argument("--steps", type=int, default=40, help="timed training steps per head and round")
  p.add_argument("--predict_records", type=int, default=1000, help="dev records predicted per head and round")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--train_records", type=int, default=4000, help="training records to build batches from")
  args = p.parse_args()

  path, _, arg = args.config.partition(":")
  config = sweep.load_module(path).get_config(arg or None)
  config.data.max_train_records = args.train_records
  config.data.max_eval_records = args.predict_records
  splits, tokenizer, types = train.prepare_data(config)
  dev = splits.get("dev") or splits.get("test")
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  heads = args.heads.split(",")
  scheme = config.model.tag_scheme
  batches = {}
  for tagged in (False, True):
    it = batching.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets, seed=0,
                                tag_scheme=scheme if tagged else None)
    batches[tagged] = [shd.global_batch(model_batch(next(it)), mesh) for _ in range(args.steps)]
  tokens = sum(int(b["attention_mask"].sum()) for b in batches[False])

  runs = {}
  for head in heads:
    setup, state, step = build(config, tokenizer, types, mesh, head)
    ev = Evaluator(setup, batch_size=config.eval_batch_size, progress=False)
    for b in batches[head in ("crf", "softmax")]:  # compile every bucket
      state, m = step(state, b)
    jax.block_until_ready(m)
    ev.predict(state["params"], dev)
    runs[head] = [setup, state, step, ev]

  train_tps = {h: [] for h in heads}
  pred_sps = {h: [] for h in heads}
  load = os.getloadavg()[0]
  for _ in range(args.rounds):
    for head in heads:
      setup, state, step, ev = runs[head]
      t = time.perf_counter()
      for b in batches[head in ("crf", "softmax")]:
        state, m = step(state, b)
      jax.block_until_ready(m)
      train_tps[head].append(tokens / (time.perf_counter() - t))
      t = time.perf_counter()
      ev.predict(state["params"], dev)
      pred_sps[head].append(dev.num_records / (time.perf_counter() - t))
      runs[head][1] = state

  print(f"config={args.config} B={config.batch_size} steps={args.steps} ({tokens} real tokens) "
        f"predict={dev.num_records} records rounds={args.rounds} load1_start={load:.2f} "
        f"load1_end={os.getloadavg()[0]:.2f} devices={jax.devices()[0].platform}")
  print("| head | train tokens/s (median) | train / CRF (median, min-max) | predict sent/s (median) | "
        "predict / CRF (median, min-max) |")
  print("|---|---|---|---|---|")
  for head in heads:
    row = [head, f"{statistics.median(train_tps[head]):,.0f}"]
    if "crf" in heads:
      r = [a / b for a, b in zip(train_tps[head], train_tps["crf"])]
      row.append(f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
    else:
      row.append("-")
    row.append(f"{statistics.median(pred_sps[head]):,.0f}")
    if "crf" in heads:
      r = [a / b for a, b in zip(pred_sps[head], pred_sps["crf"])]
      row.append(f"{statistics.median(r):.2f}x ({min(r):.2f}-{max(r):.2f})")
    else:
      row.append("-")
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
  main()
