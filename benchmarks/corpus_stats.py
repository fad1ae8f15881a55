"""Per-corpus, per-split statistics: sizes, nesting, lengths, entities lost to truncation.

  python -m benchmarks.corpus_stats                      # all corpora, all splits
  python -m benchmarks.corpus_stats --corpora msra --max_lens 128 256 512 --json stats.json

Tokens are APPROXIMATED: one token per character for Chinese corpora, one per whitespace
word for English/German. A sentence keeps its first (max_len - reserve) tokens (reserve=2
for [CLS]/[SEP]); an entity is lost when it does not end within them. Real subword
tokenizers give more tokens for English/German, so the true losses there are higher.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import sys
import time

import numpy as np

from gp_jax.data import corpora

WORD = re.compile(r"\S+")


def token_ends(text: str, language: str) -> tuple[int, np.ndarray]:
  """-> (number of tokens, token index of each character), approximate (see module doc)."""
  if language == "zh":
    return len(text), np.arange(len(text))
  index = np.zeros(len(text), np.int64)
  n = 0
  for n, m in enumerate(WORD.finditer(text), 1):
    index[m.start():] = n - 1  # spaces after a word belong to it; only entity ends are looked up
  return n, index


def nested_pairs(entities) -> int:
  """Pairs of entities that overlap or where one contains the other (identical spans too)."""
  spans = sorted((e["start"], e["end"]) for e in entities)
  count = 0
  for i, (s1, e1) in enumerate(spans):
    for s2, _ in spans[i + 1:]:
      if s2 >= e1:
        break
      count += 1
  return count


def split_stats(records, language: str, max_lens, reserve: int) -> dict:
  chars, toks = [], []
  n_ents = n_nested = 0
  over = {m: 0 for m in max_lens}
  lost = {m: 0 for m in max_lens}
  for r in records:
    text, ents = r["text"], r["entities"]
    n_tok, tok_of = token_ends(text, language)
    chars.append(len(text))
    toks.append(n_tok)
    n_ents += len(ents)
    n_nested += nested_pairs(ents)
    for m in max_lens:
      budget = m - reserve
      if n_tok > budget:
        over[m] += 1
        lost[m] += sum(1 for e in ents if tok_of[e["end"] - 1] >= budget)
  chars, toks = np.asarray(chars or [0]), np.asarray(toks or [0])
  return {
      "sentences": len(records), "entities": n_ents, "nested_pairs": n_nested,
      "chars_mean": float(chars.mean()), "chars_p50": float(np.percentile(chars, 50)),
      "chars_p95": float(np.percentile(chars, 95)), "chars_max": int(chars.max()),
      "tokens_p95": float(np.percentile(toks, 95)), "tokens_max": int(toks.max()),
      "over": {str(m): over[m] for m in max_lens}, "lost": {str(m): lost[m] for m in max_lens},
  }


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--corpora", nargs="+", default=list(corpora.NAMES), choices=corpora.NAMES, help="corpora to scan")
  ap.add_argument("--splits", nargs="+", default=["train", "dev", "test"], help="splits (missing ones are skipped)")
  ap.add_argument("--max_lens", nargs="+", type=int, default=[128, 256], help="sequence lengths to test truncation at")
  ap.add_argument("--reserve", type=int, default=2, help="special tokens per sequence ([CLS], [SEP])")
  ap.add_argument("--data_dir", default=None, help="TFDS dir (default $GP_JAX_TFDS_DIR or ~/.cache/gp_jax/tfds)")
  ap.add_argument("--manual_root", default=None, help="raw data root with one folder per corpus "
                  "(default $GP_JAX_DATA or ../shared/data)")
  ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
  args = ap.parse_args(argv)
  logging.basicConfig(level=logging.WARNING)

  m1 = args.max_lens
  head = (f"{'corpus':<13}{'split':<6}{'lang':<5}{'sents':>7}{'ents':>7}{'nested':>7}"
          f"{'chars mean/p50/p95/max':>24}{'tok p95/max':>12}"
          + "".join(f"{f'>{m}: sents/ents lost':>22}" for m in m1))
  print(f"Token approximation: zh = characters, en/de = whitespace words; budget = max_len - {args.reserve}.")
  print("nested = pairs of entities that overlap or contain one another; 'ents lost' = entities not ending "
        "within the budget.")
  print(head)
  print("-" * len(head))
  out = {}
  for name in args.corpora:
    manual = os.path.join(args.manual_root, name) if args.manual_root else None
    for split in args.splits:
      t0 = time.time()
      try:
        records = corpora.load_split(name, split, manual_dir=manual, data_dir=args.data_dir)
      except ValueError as e:  # no such split (DataError is a ValueError too: say why)
        if "no split" not in str(e):
          print(f"{name:<13}{split:<6}unavailable: {e}")
        continue
      except (RuntimeError, OSError) as e:
        print(f"{name:<13}{split:<6}unavailable: {e}")
        continue
      lang = records.metadata.get("language", "")
      s = split_stats(list(records), lang, m1, args.reserve)
      s["seconds"] = round(time.time() - t0, 2)
      s["labelled"] = records.labelled
      out.setdefault(name, {})[split] = s
      ents = f"{s['entities']:>7}" if records.labelled else f"{'unlab.':>7}"
      lens = f"{s['chars_mean']:.0f}/{s['chars_p50']:.0f}/{s['chars_p95']:.0f}/{s['chars_max']}"
      toks = f"{s['tokens_p95']:.0f}/{s['tokens_max']}"
      cut = "".join(f"{s['over'][str(m)]}/{s['lost'][str(m)]}".rjust(22) for m in m1)
      print(f"{name:<13}{split:<6}{lang:<5}{s['sentences']:>7}{ents}{s['nested_pairs']:>7}{lens:>24}{toks:>12}{cut}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
