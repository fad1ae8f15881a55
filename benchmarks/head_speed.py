"""Training and prediction speed of the span heads (GP, EGP) against the tagger baselines (CRF, softmax),
same encoder, same data, same process: the speed side of Su's GlobalPointer-vs-CRF table.

  python -m benchmarks.head_speed                                   # MSRA, scratch encoder (main job settings)
  python -m benchmarks.head_speed --config=experiments/head_comparison.py:dataset=germeval2014 --rounds=5

Each round times every head in turn on the same batches (`benchmarks.common.alternate`, so load drifts hit all
heads alike): train tokens/s over --steps training steps (`gp_jax.steps.make_train_step`, after one compile pass
over every bucket) and predict sentences/s over --predict_records records (Evaluator: device decode + window
merge). Ratios to CRF are per round; the median and the min..max over rounds are printed, with the load average
and CPU steal over the rounds.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys

import jax

from benchmarks import common
from benchmarks.inputs import ProjectStep
from gp_jax import sharding as shd
from gp_jax.data import batching
from gp_jax.evaluate import Evaluator, model_batch
from gp_jax.factory import prepare_data

TAGGERS = ("crf", "softmax")


def load_experiment(path: str):
  """The experiment file at `path` as a module (its repo on sys.path, so it can import `experiments.*`)."""
  spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(path))[0], path)
  if spec is None:
    raise FileNotFoundError(f"no experiment file {path!r}")
  repo = os.path.dirname(os.path.dirname(os.path.abspath(path)))
  if repo not in sys.path:
    sys.path.insert(0, repo)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def head_fns(config, tokenizer, types, mesh, head: str, batches, dev) -> dict:
  """{"train/HEAD": run every batch, "predict/HEAD": predict `dev`}, both compiled for every bucket."""
  c = config.copy_and_resolve_references()
  c.model.head = head
  ours = ProjectStep(c, tokenizer, types, mesh=mesh)
  ev = Evaluator(ours.setup, batch_size=config.eval_batch_size, progress=False)

  def train():
    for b in batches:
      ours.state, metrics = ours.step_fn(ours.state, b)
    jax.block_until_ready(metrics)

  def predict():
    ev.predict(ours.state["params"], dev)

  train()
  predict()
  return {f"train/{head}": train, f"predict/{head}": predict}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--config", default="experiments/head_comparison.py:dataset=msra", help="experiment[:arg]")
  p.add_argument("--heads", default="standard,efficient,crf,softmax", help="comma list of model.head values")
  p.add_argument("--steps", type=int, default=40, help="timed training steps per head and round")
  p.add_argument("--predict_records", type=int, default=1000, help="dev records predicted per head and round")
  p.add_argument("--rounds", type=int, default=3, help="alternating rounds over the heads")
  p.add_argument("--train_records", type=int, default=4000, help="training records to build batches from")
  args = p.parse_args(argv)

  path, _, arg = args.config.partition(":")
  config = load_experiment(path).get_config(arg or None)
  config.data.max_train_records = args.train_records
  config.data.max_eval_records = args.predict_records
  splits, tokenizer, types = prepare_data(config)
  dev = splits.get("dev") or splits.get("test")
  mesh = shd.make_mesh(1, 1, devices=jax.devices()[:1])
  heads = args.heads.split(",")
  batches = {}
  for tagged in (False, True):
    it = batching.train_batches(splits["train"], batch_size=config.batch_size, buckets=config.data.buckets, seed=0,
                                tag_scheme=config.model.tag_scheme if tagged else None)
    batches[tagged] = [shd.global_batch(model_batch(next(it)), mesh) for _ in range(args.steps)]
  tokens = sum(int(b["attention_mask"].sum()) for b in batches[False])

  print(common.machine_line("head_speed"))
  fns = {}
  for head in heads:
    fns.update(head_fns(config, tokenizer, types, mesh, head, batches[head in TAGGERS], dev))
  rounds = common.alternate(fns, rounds=args.rounds)

  print(f"config={args.config} B={config.batch_size} steps={args.steps} ({tokens} real tokens) "
        f"predict={dev.num_records} records rounds={args.rounds}; {rounds.watch.readout()}")
  print("| head | train tokens/s (median) | train / CRF (median, min..max) | predict sent/s (median) | "
        "predict / CRF (median, min..max) |")
  print("|---|---|---|---|---|")
  for head in heads:
    row = [head]
    for kind, count in (("train", tokens), ("predict", dev.num_records)):
      row.append(f"{count / rounds.spread(f'{kind}/{head}').median:,.0f}")
      row.append(rounds.ratio(f"{kind}/crf", f"{kind}/{head}").fmt() if "crf" in heads else "-")
    print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
  main()
