"""benchmarks.train_step's GPU-side pieces, exercised on CPU: the bf16 matmul peak, the torch port
(benchmarks.torch_port) under autocast with a set attention dropout, the host-input readout; the --dropout_bits block mode."""

import numpy as np
import pytest

from benchmarks import inputs
from benchmarks import torch_port
from benchmarks import train_step as ts

HF = dict(inputs.BERT_BASE, num_hidden_layers=1, hidden_size=32, num_attention_heads=4, intermediate_size=48,
          vocab_size=1200)


def test_bf16_matmul_peak_is_measured():
  peak = ts.matmul_peak(64, repeats=2, dtype="bfloat16")
  assert peak["jax"] > 0


def test_torch_step_under_autocast_with_attention_dropout(monkeypatch):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  built = []
  original = torch_port.torch_global_pointer
  monkeypatch.setattr(torch_port, "torch_global_pointer",
                      lambda *a, **k: built.append(original(*a, **k)) or built[-1])
  tokenizer, features = inputs.bert_inputs(HF)
  batch = inputs.synthetic_batch(batch=2, seq=16, num_types=3, features=features, num_prefix=1, num_suffix=1)
  step, attn_impl = torch_port.make_torch_step(dict(HF, attn_implementation="sdpa"), None, batch=batch,
                                               num_types=3, head_size=8, autocast=True, attention_dropout=0.25)
  assert attn_impl == "sdpa"
  assert all(np.isfinite([step() for _ in range(2)]))
  model = built[0][0]
  rates = {m.dropout.p for m in model.encoder.modules() if type(m).__name__.endswith("SelfAttention")}
  assert rates == {0.25}  # HF's 0.1 replaced in every layer


def test_host_input_readout():
  tokenizer, features = inputs.bert_inputs(HF)
  config, types = inputs.bert_config(3, 8)
  config.batch_size = 8
  ours = inputs.ProjectStep(config, tokenizer, types, load_weights=False, encoder_config=HF)
  batch = inputs.synthetic_batch(batch=8, seq=16, num_types=3, features=features, num_prefix=1, num_suffix=1)
  line = ts.host_input_readout(ours, batch, step_s=1.0, repeats=2)
  assert line.startswith("host input ") and "% of the step" in line


def test_dropout_bits_block_mode(capsys):
  """`--dropout_bits block` (the folded dropout_bits harness) prints one A/B line per shape."""
  ts.main(["--dropout_bits", "block", "--shapes", "2x16", "--pairs", "1", "--steps", "1", "--no-runtime"])
  out = capsys.readouterr().out
  assert "block B2xL16: threefry " in out and "; no dropout " in out and "threefry/hash " in out
