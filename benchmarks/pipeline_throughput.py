"""Throughput of prepare_split, train_batches and merge_predictions on synthetic Chinese-like text (or MSRA); with
--host_share, the host's share of a training step in the real trainer's loop at k = 1, 4, 16 steps per call.

  python -m benchmarks.pipeline_throughput --records 50000 --max_len 256 --batch_size 32
  python -m benchmarks.pipeline_throughput --tokenizer char        # gp_jax CharTokenizer (encode_batch)
  python -m benchmarks.pipeline_throughput --corpus msra           # gp_jax.data.load_split(corpus, split)
  python -m benchmarks.pipeline_throughput --host_share            # loop vs device ms/step, k1 k4 k16 alternating

--host_share: each (round, k) is a fresh process (`--host_share_child`) that runs `train.train_and_evaluate` in-process
on a random HF BertModel of BERT-base's structure (12 layers) but tiny width, written once into a temp folder, on
the synthetic task with dropout on, one bucket, evaluation and checkpoint only after the last step. Loop ms/step is
the trainer's own `train pace` line; device ms/step is the same compiled executable the loop ran, called afterwards
in a blocking loop on a device-resident batch; host = loop - device. In-process rather than `python -m gp_jax.main`
so that the device time is the very program the loop dispatched (same process, state and compile), while a process
per run keeps each k's heap, threads and jit caches its own.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pathlib
import re
import shutil
import statistics
import string
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import common
from experiments import synthetic
from gp_jax import runtime
from gp_jax.data import batching, load_split, merge, windows
from gp_jax.data.char_tokenizer import CharTokenizer
from gp_jax.data.types import Encoding

# Deferred imports below: safetensors and tokenizers, for --host_share's tiny BERT only; jax and
# gp_jax's feed and train (they import jax) in the --host_share child, after runtime.configure(), which may set
# JAX_PLATFORMS (read when jax is imported).

TYPES = ("PER", "LOC", "ORG")


class FastCharTokenizer:
  """One token per char, ids = code point mod vocab; optional [CLS]/[SEP] like BERT."""

  feature_names = ("input_ids",)
  pad_values = {"input_ids": 0}

  def __init__(self, vocab: int = 21128, specials: bool = False):
    self.vocab, self.specials = vocab, specials
    self.num_prefix = self.num_suffix = int(specials)

  def encode(self, text: str) -> Encoding:
    cp = np.frombuffer(text.encode("utf-32-le"), np.uint32)
    ids = (cp % (self.vocab - 3) + 3).astype(np.int32)
    start = np.arange(cp.shape[0], dtype=np.int32)
    return Encoding({"input_ids": ids}, np.stack([start, start + 1], 1))

  def add_special_tokens(self, features):
    if not self.specials:
      return dict(features)
    return {"input_ids": np.concatenate([[1], features["input_ids"], [2]]).astype(np.int32)}

  def save(self, directory: str) -> None:
    pass


def synthetic_records(n: int, seed: int) -> list[dict]:
  """Sentence lengths ~ MSRA (median ~40 chars, long tail), ~1.5 entities of 2-6 chars each."""
  rng = np.random.default_rng(seed)
  chars = np.array([chr(c) for c in range(0x4E00, 0x4E00 + 3000)])
  lens = np.clip(rng.lognormal(3.7, 0.6, n).astype(int), 1, 1500)
  out = []
  for i, length in enumerate(lens):
    text = "".join(chars[rng.integers(0, 3000, length)])
    ents = []
    for _ in range(rng.poisson(1.5)):
      w = int(rng.integers(2, 7))
      if w > length:
        continue
      a = int(rng.integers(0, length - w + 1))
      ents.append({"start": a, "end": a + w, "type": TYPES[int(rng.integers(0, 3))]})
    out.append({"id": str(i), "text": text, "entities": ents})
  return out


# ----------------------------------------------------------------------------- --host_share

HOST_RESULT = "host_share result: "  # the child's one line of JSON
CHARS = string.ascii_letters + string.digits + "[]_"  # every character of gp_jax.data.sources.synthetic_records
PACE_RE = re.compile(r"train pace L(\d+): (\d+) steps, ([\d.]+) ms/step")
CALLS_RE = re.compile(r"(\d+) steps in (\d+) calls")


def write_tiny_bert(directory: str, *, layers: int, hidden: int, heads: int, intermediate: int) -> None:
  """A random BERT saved as an HF folder (config.json, model.safetensors, a fast tokenizer), with a vocab of the
  synthetic task's characters and their ## forms, so `model.pretrained=DIR` opens it like any local checkpoint.
  Written by the device check's writer (safetensors and tokenizers): importing torch for it cost seconds a run."""
  from benchmarks.device_check.trainer import write_fake_bert  # noqa: PLC0415

  hf = {"vocab_size": None, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
        "intermediate_size": intermediate, "max_position_embeddings": 512}
  # BertTokenizer's default for a vocab.txt alone: lower case
  write_fake_bert(pathlib.Path(directory), [CHARS], hf=hf, lowercase=True, word_pieces=True)


def child_config(args, k: int):
  """experiments/synthetic.py as a BERT fine-tuning run (its optimizer groups), sized so one epoch covers every step
  (no epoch boundary splits a k-step call) and dev evaluation and the checkpoint come only after the last step."""
  c = synthetic.get_config("encoder=bert")
  c.model.pretrained = args.bert_dir
  c.model.dropout = 0.1  # hidden and attention dropout (model.attention_dropout=-1)
  c.data.synthetic_records = max(240, args.steps * args.batch_size)  # >= 1 window a record: an epoch >= steps
  c.data.max_len, c.data.buckets, c.data.max_eval_records = args.max_len, (), 16
  c.batch_size, c.eval_batch_size = args.batch_size, 16
  c.num_epochs, c.num_train_steps, c.steps_per_execution = 0.0, args.steps, k
  c.eval_every_steps = c.checkpoint_every_steps = args.steps
  c.log_every_steps = args.log_every
  c.progress_bar = False
  c.compilation_cache = args.cache_dir or "off"
  return c


@contextlib.contextmanager
def captured_calls(train, into: dict):
  """`train.compile_ahead` wrapped to keep what it returns (the loop's compiled train calls) and the run's state."""
  original = train.compile_ahead

  def keep(run, ts, *rest):
    calls = original(run, ts, *rest)
    into.update(run=run, ts=ts, calls=calls)
    return calls

  train.compile_ahead = keep
  try:
    yield into
  finally:
    train.compile_ahead = original


def device_ms_per_step(kept: dict, k: int, length: int, steps: int) -> tuple[float, float]:
  """The loop's compiled k-step call on one device-resident batch (stacked [k] when k > 1), blocking on each call:
  (ms per step, of which ms per step until the call returned: its dispatch), medians over 5 repeats of ~`steps`
  steps. The blocking figure holds each call's dispatch, which k amortises as it does in the loop."""
  import jax  # noqa: PLC0415
  from gp_jax import feed as feed_lib  # noqa: PLC0415

  ts, calls = kept["ts"], kept["calls"]
  feed = feed_lib.Feed(ts.train_it, [feed_lib.Group(0, k, length)], kept["run"].mesh)
  fed = next(iter(feed))
  feed.close()
  state, n = ts.state, max(2, steps // k)
  for _ in range(2):
    state, metrics = calls(state, fed)
    jax.block_until_ready(metrics)
  totals, dispatches = [], []
  for _ in range(5):
    dispatch, t0 = 0.0, time.perf_counter()
    for _ in range(n):
      t = time.perf_counter()
      state, metrics = calls(state, fed)
      dispatch += time.perf_counter() - t
      jax.block_until_ready(metrics)  # the executable's outputs are ready together: the state is done too
    totals.append(time.perf_counter() - t0)
    dispatches.append(dispatch)
  ts.state = state
  return 1e3 * statistics.median(totals) / (n * k), 1e3 * statistics.median(dispatches) / (n * k)


def host_share_child(args) -> None:
  """One trainer run at k = `--host_share_child`; prints HOST_RESULT + JSON."""
  runtime.configure()  # as gp_jax.main does, before JAX allocates anything
  import jax  # noqa: PLC0415
  from gp_jax import train  # noqa: PLC0415

  k = args.host_share_child
  workdir = tempfile.mkdtemp(prefix=f"host_share_k{k}_")
  try:
    with captured_calls(train, {}) as kept:
      summary = train.train_and_evaluate(child_config(args, k), workdir)
    with open(os.path.join(workdir, "train.log")) as f:
      text = f.read()
    pace, calls = PACE_RE.findall(text), CALLS_RE.search(text)
    if len(pace) != 1 or calls is None:
      raise RuntimeError(f"want one train pace line and a calls line in train.log, got {pace} {calls}")
    length, pace_steps, loop_ms = int(pace[0][0]), int(pace[0][1]), float(pace[0][2])
    device_ms, dispatch_ms = device_ms_per_step(kept, k, length, args.device_steps)
    state = kept["ts"].state
    out = {"k": k, "loop_ms": loop_ms, "device_ms": device_ms, "host_ms": loop_ms - device_ms,
           "dispatch_ms": dispatch_ms, "length": length,
           "pace_steps": pace_steps, "steps": int(calls.group(1)), "calls": int(calls.group(2)),
           "state_arrays": len(jax.tree.leaves(state)), "param_arrays": len(jax.tree.leaves(state["params"])),
           "parameters": summary["parameters"]}
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  print(HOST_RESULT + json.dumps(out), flush=True)


def child_env() -> dict:
  """This environment on one CPU device (a fake device count in XLA_FLAGS, as the test suite sets, is dropped)."""
  env = dict(os.environ)
  flags = re.sub(r"--xla_force_host_platform_device_count=\S+", "", env.get("XLA_FLAGS", "")).split()
  env["XLA_FLAGS"] = " ".join(flags)
  env["PYTHONUNBUFFERED"] = "1"
  return env


def run_child(args, k: int) -> dict:
  cmd = [sys.executable, "-m", "benchmarks.pipeline_throughput", f"--host_share_child={k}", f"--steps={args.steps}",
         f"--batch_size={args.batch_size}", f"--max_len={args.max_len}", f"--log_every={args.log_every}",
         f"--device_steps={args.device_steps}", f"--bert_dir={args.bert_dir}", f"--cache_dir={args.cache_dir}"]
  proc = subprocess.run(cmd, cwd=common.ROOT, env=child_env(), capture_output=True, text=True, check=False)
  line = next((ln for ln in proc.stdout.splitlines() if ln.startswith(HOST_RESULT)), None)
  if proc.returncode or line is None:
    raise RuntimeError(f"host_share k={k} failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
  return json.loads(line[len(HOST_RESULT):])


def host_share(args) -> None:
  """Alternating rounds of trainer runs, one process per (round, k); a line per k, then per round k1 against each kN:
  the loop's speed ratio, and the host's ms/step saved (a difference: host shares near 0 can be negative)."""
  ks = [int(x) for x in args.ks.split(",")]
  tmp = tempfile.mkdtemp(prefix="host_share_")
  try:
    args.bert_dir, args.cache_dir = os.path.join(tmp, "bert"), os.path.join(tmp, "jit_cache")
    write_tiny_bert(args.bert_dir, layers=args.layers, hidden=args.hidden, heads=args.heads,
                    intermediate=args.intermediate)
    runtime.configure_platforms()  # libtpu on a machine without a TPU: CPU, here and in the children (JAX_PLATFORMS)
    print(common.machine_line("pipeline_throughput --host_share"), flush=True)
    watch = common.LoadWatch()
    runs = common.in_rounds({f"k{k}": functools.partial(run_child, args, k) for k in ks}, args.rounds, watch)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
  first = runs[f"k{ks[0]}"][0]
  print(f"model: BERT structure, {args.layers} layers, hidden {args.hidden}, {args.heads} heads, intermediate "
        f"{args.intermediate}: {first['parameters']:,} parameters, {first['param_arrays']} parameter arrays, "
        f"{first['state_arrays']} state arrays | synthetic, B{args.batch_size} L{first['length']} (one bucket), "
        f"dropout 0.1, {args.steps} steps a run, log every {args.log_every} | {args.rounds} rounds alternating "
        + " ".join(f"k{k}" for k in ks))
  for k in ks:
    rs = runs[f"k{k}"]
    ms = lambda key: common.Spread([r[key] for r in rs]).fmt(".3f", "")  # noqa: E731
    counts = sorted({(r["steps"], r["calls"], r["pace_steps"]) for r in rs})
    calls = ", ".join(f"{n} steps in {m} calls (pace over {p})" for n, m, p in counts)
    print(f"k={k}: loop {ms('loop_ms')} ms/step | device {ms('device_ms')} ms/step | host {ms('host_ms')} ms/step | "
          f"dispatch {ms('dispatch_ms')} ms/step (inside device) | {calls}")
  if len(ks) > 1:  # per round, k1 against each other k of the same round
    k1, parts = ks[0], []
    for k in ks[1:]:
      pairs = list(zip(runs[f"k{k1}"], runs[f"k{k}"]))
      ratio = common.Spread([a["loop_ms"] / b["loop_ms"] for a, b in pairs]).fmt()
      saved = common.Spread([a["host_ms"] - b["host_ms"] for a, b in pairs]).fmt(".3f", " ms/step")
      parts.append(f"loop k{k1}/k{k} {ratio}, host k{k1}-k{k} {saved}")
    print("per round: " + ", ".join(parts) + f" | {watch.readout()}")


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--records", type=int, default=50000, help="synthetic sentences")
  ap.add_argument("--corpus", default=None, help="e.g. msra: use gp_jax.data.load_split(corpus, split)")
  ap.add_argument("--split", default="train", help="split of --corpus")
  ap.add_argument("--tokenizer", choices=("fast", "char"), default="fast",
                  help="fast: per-char code points (this file); char: gp_jax CharTokenizer built on the texts")
  ap.add_argument("--max_len", type=int, default=None,
                  help="tokens per window, specials included (default 256; --host_share: 32, the one bucket)")
  ap.add_argument("--stride", type=int, default=None, help="window stride in tokens (default: half a window)")
  ap.add_argument("--batch_size", type=int, default=None, help="rows per train batch (default 32; --host_share: 8)")
  ap.add_argument("--buckets", default="32,64,128,256", help="comma-separated, max_len is added")
  ap.add_argument("--epochs", type=float, default=1.0, help="train batches to time, in epochs")
  ap.add_argument("--specials", action="store_true", help="add [CLS]/[SEP] (BERT-like)")
  ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic records and batch order")
  hs = ap.add_argument_group("--host_share")
  hs.add_argument("--host_share", action="store_true", help="the host's share of a step in the trainer's loop")
  hs.add_argument("--ks", default="1,4,16", help="steps per call (steps_per_execution), one process each per round")
  hs.add_argument("--rounds", type=int, default=3, help="alternating rounds (k1 k4 k16, k1 k4 k16, ...)")
  hs.add_argument("--steps", type=int, default=512, help="train steps a run (a multiple of every k)")
  hs.add_argument("--log_every", type=int, default=100, help="log_every_steps (the base config's)")
  hs.add_argument("--device_steps", type=int, default=128, help="steps per repeat of the blocking device loop")
  hs.add_argument("--layers", type=int, default=12, help="BERT layers (BERT-base: 12)")
  hs.add_argument("--hidden", type=int, default=24, help="BERT hidden size")
  hs.add_argument("--heads", type=int, default=2, help="BERT attention heads")
  hs.add_argument("--intermediate", type=int, default=48, help="BERT feed-forward width")
  hs.add_argument("--host_share_child", type=int, default=0, help=argparse.SUPPRESS)  # k: one run (internal)
  hs.add_argument("--bert_dir", default="", help=argparse.SUPPRESS)
  hs.add_argument("--cache_dir", default="", help=argparse.SUPPRESS)
  args = ap.parse_args(argv)
  if args.host_share or args.host_share_child:
    args.max_len, args.batch_size = args.max_len or 32, args.batch_size or 8
    (host_share_child if args.host_share_child else host_share)(args)
    return
  args.max_len, args.batch_size = args.max_len or 256, args.batch_size or 32

  if args.corpus:
    records = list(load_split(args.corpus, args.split))
    types = tuple(sorted({e["type"] for r in records for e in r["entities"]}))
    source = f"{args.corpus}/{args.split}"
  else:
    records, types, source = synthetic_records(args.records, args.seed), TYPES, "synthetic"
  if args.tokenizer == "char":
    tok = CharTokenizer.build([r["text"] for r in records])  # not timed
    source += "+CharTokenizer"
  else:
    tok = FastCharTokenizer(specials=args.specials)
  buckets = tuple(int(b) for b in args.buckets.split(",") if int(b) <= args.max_len)

  print(common.machine_line("pipeline_throughput"))
  watch = common.LoadWatch()
  t0 = time.perf_counter()
  prepared = windows.prepare_split(records, tok, types=types, max_len=args.max_len, stride=args.stride,
                                   name=source)
  t_prep = time.perf_counter() - t0

  it = batching.train_batches(prepared, batch_size=args.batch_size, buckets=buckets, seed=args.seed)
  steps = max(1, int(args.epochs * it.steps_per_epoch))
  rows = tokens = cells = 0
  t0 = time.perf_counter()
  for _ in range(steps):
    b = next(it)
    rows += int((b["example_index"] >= 0).sum())
    tokens += int(b["attention_mask"].sum())
    cells += b["attention_mask"].size
  t_train = time.perf_counter() - t0

  # Merge: every window's gold targets as hits (about stride-overlap duplicates per span).
  hits = {"window": np.repeat(np.arange(prepared.num_windows), np.diff(prepared.span_ptr)),
          "start": prepared.spans_S3[:, 0], "end": prepared.spans_S3[:, 1], "type": prepared.spans_S3[:, 2],
          "score": np.ones(prepared.spans_S3.shape[0])}
  t0 = time.perf_counter()
  merge.merge_predictions(prepared, hits)
  t_merge = time.perf_counter() - t0

  s = prepared.stats
  print(f"{source}: {s.records} records {s.windows} windows {s.tokens} tokens | prepare_split {t_prep:.2f}s "
        f"= {s.records / t_prep:,.0f} records/s | train_batches {steps} steps {t_train:.2f}s = "
        f"{rows / t_train:,.0f} examples/s {tokens / t_train:,.0f} tokens/s | padding "
        f"{1 - tokens / max(cells, 1):.1%} (max_len={args.max_len}, B={args.batch_size}, buckets={buckets}) | "
        f"merge_predictions {hits['window'].shape[0]} hits {t_merge:.2f}s | {watch.readout()}")


if __name__ == "__main__":
  main()
