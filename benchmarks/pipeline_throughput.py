"""Throughput of prepare_split, train_batches and merge_predictions on synthetic Chinese-like text (or MSRA).

  python benchmarks/pipeline_throughput.py --records 50000 --max_len 256 --batch_size 32
  python benchmarks/pipeline_throughput.py --tokenizer char        # gp_jax CharTokenizer (encode_batch)
  python benchmarks/pipeline_throughput.py --corpus msra           # gp_jax.data.load_split(corpus, split)
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))  # run from a checkout
from gp_jax.data import batching, merge, windows  # noqa: E402
from gp_jax.data.types import Encoding  # noqa: E402

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


def main():
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--records", type=int, default=50000, help="synthetic sentences")
  ap.add_argument("--corpus", default=None, help="e.g. msra: use gp_jax.data.load_split(corpus, split)")
  ap.add_argument("--split", default="train")
  ap.add_argument("--tokenizer", choices=("fast", "char"), default="fast",
                  help="fast: per-char code points (this file); char: gp_jax CharTokenizer built on the texts")
  ap.add_argument("--max_len", type=int, default=256)
  ap.add_argument("--stride", type=int, default=None)
  ap.add_argument("--batch_size", type=int, default=32)
  ap.add_argument("--buckets", default="32,64,128,256", help="comma-separated, max_len is added")
  ap.add_argument("--epochs", type=float, default=1.0, help="train batches to time, in epochs")
  ap.add_argument("--specials", action="store_true", help="add [CLS]/[SEP] (BERT-like)")
  ap.add_argument("--seed", type=int, default=0)
  args = ap.parse_args()

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
        f"merge_predictions {hits['window'].shape[0]} hits {t_merge:.2f}s")


if __name__ == "__main__":
  main()
