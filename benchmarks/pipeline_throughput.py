"""Throughput of prepare_split, train_batches and merge_predictions on synthetic Chinese-like text (or MSRA).

  python -m benchmarks.pipeline_throughput --records 50000 --max_len 256 --batch_size 32
  python -m benchmarks.pipeline_throughput --tokenizer char        # gp_jax CharTokenizer (encode_batch)
  python -m benchmarks.pipeline_throughput --corpus msra           # gp_jax.data.load_split(corpus, split)
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from benchmarks import common
from gp_jax.data import batching, merge, windows
from gp_jax.data.types import Encoding

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


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--records", type=int, default=50000, help="synthetic sentences")
  ap.add_argument("--corpus", default=None, help="e.g. msra: use gp_jax.data.load_split(corpus, split)")
  ap.add_argument("--split", default="train", help="split of --corpus")
  ap.add_argument("--tokenizer", choices=("fast", "char"), default="fast",
                  help="fast: per-char code points (this file); char: gp_jax CharTokenizer built on the texts")
  ap.add_argument("--max_len", type=int, default=256, help="tokens per window, specials included")
  ap.add_argument("--stride", type=int, default=None, help="window stride in tokens (default: half a window)")
  ap.add_argument("--batch_size", type=int, default=32, help="rows per train batch")
  ap.add_argument("--buckets", default="32,64,128,256", help="comma-separated, max_len is added")
  ap.add_argument("--epochs", type=float, default=1.0, help="train batches to time, in epochs")
  ap.add_argument("--specials", action="store_true", help="add [CLS]/[SEP] (BERT-like)")
  ap.add_argument("--seed", type=int, default=0, help="seed of the synthetic records and batch order")
  args = ap.parse_args(argv)

  if args.corpus:
    from gp_jax.data import load_split  # noqa: PLC0415 (optional: needs the corpus)
    records = list(load_split(args.corpus, args.split))
    types = tuple(sorted({e["type"] for r in records for e in r["entities"]}))
    source = f"{args.corpus}/{args.split}"
  else:
    records, types, source = synthetic_records(args.records, args.seed), TYPES, "synthetic"
  if args.tokenizer == "char":
    from gp_jax.data.char_tokenizer import CharTokenizer  # noqa: PLC0415
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
