"""Serving throughput: sentences/s of the ways to run a trained BERT + GlobalPointer model, from a batch of token
ids to every span with score > 0 on the host, in alternating rounds (`benchmarks.common.alternate`).

  python -m benchmarks.serving [--batches 1,32] [--lengths 64,128] [--rounds 5] [--calls 3]

The model: all-MiniLM-L6-v2 (PyPI wheel) + GlobalPointer (d = 64, the synthetic task's 3 types), trained for
`--train_steps` steps through `gp_jax.main`'s code path into a temporary workdir, then exported
(`python -m gp_jax.export`'s `export_workdir`). Sides, all on the same synthetic batches (B rows of L tokens,
rows of random length in [L/2, L]):
  predictor  the in-process `gp_jax.predict.Predictor` (jit; hits gathered on device, rows mapped on the host)
  exported   the StableHLO artifact through `gp_jax.serving.load_exported` (what `predict --exported` runs)
  torch      the PyTorch port (`benchmarks.torch_port.torch_global_pointer`: transformers BertModel + the ports'
             dense GP head), eager, `torch.no_grad()`, hits with `(logits > 0).nonzero()` (skipped without torch)
  onnx       not run while jax2onnx cannot be installed beside our pins (docs/serving.md); the line says so
Tokenisation, windows and merging are the same host code for every side and are left out. Each result line:
sentences/s per side (median over rounds of B / time per call) and each side's ratio to the predictor.
"""

from __future__ import annotations

import argparse
import tempfile

from benchmarks import common
from benchmarks.inputs import bert_inputs, encoder_source, synthetic_batch
from benchmarks.torch_port import torch_global_pointer
from experiments import synthetic
from gp_jax import runtime, serving, train

# Deferred imports below: torch (optional, the torch side only, seconds to import); gp_jax.export and gp_jax.predict
# in main only, as they define absl flags (--workdir, ...) when imported, which gp_jax.main defines too.


def trained_workdir(workdir: str, *, steps: int, max_len: int) -> None:
  c = synthetic.get_config("encoder=bert")
  c.model.pretrained, c.model.head_size, c.model.dropout = "minilm", 64, 0.1
  c.data.max_len, c.data.buckets, c.data.synthetic_records, c.data.max_eval_records = max_len, (max_len,), 200, 32
  c.num_train_steps, c.eval_batch_size, c.batch_size = steps, 32, 16
  train.train_and_evaluate(c, workdir)


def torch_side(batch, *, num_types: int):
  import torch  # pylint: disable=g-import-not-at-top

  hf, pretrained = encoder_source("minilm", 0)
  model, dev = torch_global_pointer(hf, pretrained, num_types=num_types, head_size=64)
  model.eval()
  ids = torch.from_numpy(batch["features"]["input_ids"]).long().to(dev)
  types = torch.from_numpy(batch["features"]["token_type_ids"]).long().to(dev)
  mask = torch.from_numpy(batch["attention_mask"]).long().to(dev)

  def call():
    with torch.no_grad():
      logits = model(ids, mask, types)
      hits = (logits > 0).nonzero()
      return hits.cpu().numpy(), logits[tuple(hits.T)].cpu().numpy()

  return call


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batches", default="1,32", help="comma list of batch sizes")
  p.add_argument("--lengths", default="64,128", help="comma list of sequence lengths (padded)")
  p.add_argument("--rounds", type=int, default=5, help="alternating rounds per shape")
  p.add_argument("--calls", type=int, default=3, help="timed calls per side and round (median)")
  p.add_argument("--train_steps", type=int, default=20, help="training steps before export")
  p.add_argument("--no-torch", action="store_true", help="leave the PyTorch port out")
  args = p.parse_args(argv)
  from gp_jax import export, predict  # pylint: disable=g-import-not-at-top

  runtime.configure()
  batches = [int(x) for x in args.batches.split(",")]
  lengths = [int(x) for x in args.lengths.split(",")]
  print(common.machine_line("serving"), flush=True)
  root = tempfile.mkdtemp(prefix="gp_jax_serving_")
  workdir, out = f"{root}/workdir", f"{root}/exported"
  trained_workdir(workdir, steps=args.train_steps, max_len=max(lengths))
  export.export_workdir(workdir, out)
  ours = predict.Predictor(workdir, batch_size=max(batches))
  exported = serving.load_exported(out)
  num_types = len(ours.types)
  hf, _ = encoder_source("minilm", 0)
  _, features = bert_inputs(hf)
  print("onnx: not run (jax2onnx pins orbax-checkpoint<0.11.37, below ours; docs/serving.md)", flush=True)
  for L in lengths:
    for B in batches:
      batch = synthetic_batch(batch=B, seq=L, num_types=num_types, num_prefix=1, num_suffix=1, features=features,
                              min_len=L // 2)
      inputs = predict.model_inputs(batch)
      fns = {"predictor": lambda b=batch: ours.window_hits(b), "exported": lambda x=inputs: exported(x)}
      if not args.no_torch:
        try:
          fns["torch"] = torch_side(batch, num_types=num_types)
        except ImportError as e:
          print(f"torch: not run ({e})", flush=True)
      for fn in fns.values():  # compile / warm up
        fn()
      rounds = common.alternate(fns, rounds=args.rounds, calls=args.calls)
      rate = {name: B / rounds.spread(name).median for name in fns}
      line = f"B{B}xL{L}: " + "; ".join(f"{name} {rate[name]:,.1f} sent/s" for name in fns)
      line += "; " + "; ".join(f"{name} / predictor {rounds.ratio('predictor', name).fmt()}"
                               for name in fns if name != "predictor")
      print(line + "; " + rounds.watch.readout(), flush=True)


if __name__ == "__main__":
  main()
