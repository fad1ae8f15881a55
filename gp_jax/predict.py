"""Predicts entities with a trained workdir: one text per line in, one JSON line per text out.

  python -m gp_jax.predict --workdir=DIR [--input=FILE|-] [--output=FILE|-] [--batch_size=N]

DIR is local or gs://; it holds everything needed (config, types, tokenizer, encoder config,
parameters in best/), so the pretrained encoder's folder is never reopened. Output:
{"text": ..., "entities": [{"start", "end", "type", "text", "score"}]} with character offsets into
the input line (end exclusive). Texts longer than the model's max length go through sliding windows.
"""

from __future__ import annotations

import json
import sys

from absl import app, flags

from gp_jax import checkpoint as ckpt_lib
from gp_jax import factory
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import workdir as wd
from gp_jax.evaluate import Evaluator

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir, local or gs:// (config.json, types.json, "
                               "tokenizer/, best/ or ckpt/).")
_INPUT = flags.DEFINE_string("input", "-", "Text file with one text per line, or '-' for standard input.")
_OUTPUT = flags.DEFINE_string("output", "-", "Where to write JSON lines, or '-' for standard output.")
_BATCH = flags.DEFINE_integer("batch_size", 0, "Windows per batch (0 = the training config's eval_batch_size).")


class Predictor:
  """A trained model restored from a workdir: parameters only (best by dev F1, else the latest)."""

  def __init__(self, workdir: str, *, batch_size: int = 0):
    self.config = wd.load_config(workdir)
    self.types = wd.load_types(workdir)
    self.tokenizer = wd.load_tokenizer(workdir)
    mesh = shd.make_mesh(-1, 1)
    self.setup, _ = state_lib.init_model(self.config, self.tokenizer, self.types, mesh, load_weights=False,
                                         encoder_config=wd.load_encoder_config(workdir))
    mngr = ckpt_lib.make_manager(ckpt_lib.find_checkpoint_dir(workdir), keep=1)
    self.step, self.params = ckpt_lib.restore_params(mngr, state_lib.abstract_params(self.setup))
    batch_size = batch_size or self.config.eval_batch_size
    batch_size += -batch_size % mesh.size  # a multiple of the devices
    self.evaluator = Evaluator(self.setup, batch_size=batch_size, progress=False)

  def predict(self, texts: list[str]) -> list[list[dict]]:
    records = [{"id": str(n), "text": t, "entities": []} for n, t in enumerate(texts)]
    prepared = factory.prepare_split(self.config, records, self.tokenizer, self.types, name="predict")
    merged = self.evaluator.predict(self.params, prepared)
    return [[{"start": int(e["start"]), "end": int(e["end"]), "type": e["type"],
              "text": text[int(e["start"]):int(e["end"])], "score": round(float(e["score"]), 4)} for e in ents]
            for text, ents in zip(texts, merged)]


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
