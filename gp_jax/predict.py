"""Predicts entities with a trained workdir: one text per line in, one JSON line per text out.

  python -m gp_jax.predict --workdir=DIR [--input=FILE|-] [--output=FILE|-]

Output: {"text": ..., "entities": [{"start", "end", "type", "text", "score"}]} with character offsets
into the input line (end exclusive). Texts longer than the model's max length go through sliding windows.
"""

from __future__ import annotations

import json
import os
import sys

import ml_collections
from absl import app, flags

from gp_jax import checkpoint as ckpt_lib
from gp_jax import sharding as shd
from gp_jax import train
from gp_jax.data import pipeline
from gp_jax.data.tokenize import load_tokenizer

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (config.json, tokenizer/, best/ or ckpt/).")
_INPUT = flags.DEFINE_string("input", "-", "Text file with one text per line, or '-' for standard input.")
_OUTPUT = flags.DEFINE_string("output", "-", "Where to write JSON lines, or '-' for standard output.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Windows per batch (0 = the training config's eval_batch_size).")


class Predictor:
  """A trained model restored from a workdir (best checkpoint by dev F1, else the latest)."""

  def __init__(self, workdir: str, *, batch_size: int = 0):
    with open(os.path.join(workdir, "config.json")) as f:
      self.config = ml_collections.ConfigDict(json.load(f))
    with open(os.path.join(workdir, "types.json")) as f:
      self.types = json.load(f)
    self.tokenizer = load_tokenizer(os.path.join(workdir, "tokenizer"))
    self.batch_size = batch_size or self.config.eval_batch_size
    mesh = shd.make_mesh(-1, 1)
    self.setup, params = train.init_model(self.config, self.tokenizer, self.types, mesh, load_weights=False)
    tx, _ = train.make_optimizer(self.config.optimizer, 1, params)
    target = train.abstract_state(self.setup, tx)
    directory = ckpt_lib.find_checkpoint_dir(workdir)
    mngr = ckpt_lib.make_manager(directory, keep=1)
    step, state, _ = ckpt_lib.restore(mngr, target)
    self.step, self.params = step, state["params"]
    self.eval_fn = train.make_eval_fn(self.setup)

  def predict(self, texts: list[str]) -> list[list[dict]]:
    records = [{"id": str(n), "text": t, "entities": []} for n, t in enumerate(texts)]
    prepared = pipeline.prepare_split(records, self.tokenizer, types=self.types, max_len=self.config.data.max_len,
                                      stride=self.config.data.stride or None,
                                      max_span_width=self.config.data.max_span_width or None, name="predict")
    hits = train.predict_hits(self.setup, self.eval_fn, self.params, prepared, batch_size=self.batch_size,
                              buckets=self.config.data.buckets, desc="predict")
    merged = pipeline.merge_predictions(prepared, hits)
    out = []
    for text, ents in zip(texts, merged):
      out.append([{"start": int(e["start"]), "end": int(e["end"]), "type": e["type"],
                   "text": text[int(e["start"]):int(e["end"])], "score": round(float(e["score"]), 4)} for e in ents])
    return out


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if not _WORKDIR.value:
    raise app.UsageError("--workdir is required")
  src = sys.stdin if _INPUT.value == "-" else open(_INPUT.value, encoding="utf-8")
  texts = [line.rstrip("\n").rstrip("\r") for line in src]
  predictor = Predictor(_WORKDIR.value, batch_size=_BATCH.value)
  results = predictor.predict(texts)
  dst = sys.stdout if _OUTPUT.value == "-" else open(_OUTPUT.value, "w", encoding="utf-8")
  for text, ents in zip(texts, results):
    dst.write(json.dumps({"text": text, "entities": ents}, ensure_ascii=False) + "\n")
  dst.flush()


if __name__ == "__main__":
  app.run(main)
