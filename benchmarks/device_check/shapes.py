"""The shapes each stage runs at: a lent GPU's (BERT-base, CLUENER) or --tiny's (the CPU, in the test suite)."""

from __future__ import annotations

# Deferred import below: benchmarks.inputs (it imports jax) only in a stage's child.

# Issue 56's order: what settles its targets first; what does not fit one call's budget is skipped and says so.
TRAINER_RUNS = ("cold", "anchor", "warm", "fused_vs_reference", "warm_k1", "other_head", "cold_cublas",
                "cold_no_autotune")
DEFAULT_RUNS = TRAINER_RUNS[:6]  # the last two only when asked for (--trainer_runs)


def shapes(tiny: bool) -> dict:
  from benchmarks import inputs  # pylint: disable=g-import-not-at-top

  tiny_bert = dict(inputs.BERT_BASE, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                   intermediate_size=64, vocab_size=1200)
  if tiny:
    one_layer = dict(tiny_bert, num_hidden_layers=1)  # the stages' machinery is what --tiny checks, not the model
    trainer = {"config": "experiments/synthetic.py:encoder=bert", "corpus": None, "lowercase": False, "min_run_s": 5,
               "hf": dict(one_layer, max_position_embeddings=128, vocab_size=None),
               # other_head: a third cold compile, ~30 s here
               "runs": ("cold", "anchor", "warm", "fused_vs_reference", "warm_k1"),
               # 24 steps before the first evaluation: fewer would leave a model whose hits overflow the eval's hit
               # buffer, and the bigger buffer's program compiles on first use
               "overrides": ["--config.num_train_steps=48", "--config.num_epochs=0", "--config.eval_every_steps=24",
                             "--config.data.buckets=(64,)",  # one bucket: two programs to compile, not four
                             "--config.checkpoint_every_steps=24", "--config.log_every_steps=8",
                             "--config.data.synthetic_records=200", "--config.data.max_eval_records=48",
                             "--config.eval_batch_size=16", "--config.progress_bar=True"],
               "env": {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}}  # CPU programs compile in under 1 s
    return {"peak_n": 256, "trainer": trainer, "attn": dict(B=3, lengths=(16, 12), heads=2, head_dim=8), "probe_L": 8,
            "precision": dict(hf=one_layer, B=2, L=16, steps=3), "train": dict(hf=one_layer, B=2, L=16, steps=2),
            "kernels": dict(hf=one_layer, B=2, L=16, steps=30, lr=1e-4, min_s=5, child_s=90),
            "span": dict(lengths=(32, 64), H=4, D=32, block=16, iters=2),
            "extras": dict(hf=one_layer, B=2, L=16, steps=2)}
  two_layer = dict(inputs.BERT_BASE, num_hidden_layers=2)
  trainer = {"config": "experiments/su2022.py:dataset=cluener2020,epochs=2", "corpus": "cluener2020", "lowercase": True,
             "min_run_s": 30, "hf": dict(inputs.BERT_BASE), "overrides": [], "env": {}, "runs": DEFAULT_RUNS}
  return {"peak_n": 8192, "trainer": trainer, "attn": dict(B=16, lengths=(256, 200), heads=12, head_dim=64),
          "probe_L": 64, "precision": dict(hf=two_layer, B=16, L=128, steps=30),
          # the precision stage's model, batch and learning rate: its bf16-vs-f32 gap is the bar (BF16_F32_GAP)
          "kernels": dict(hf=two_layer, B=16, L=128, steps=30, lr=1e-4, min_s=60, child_s=180),
          "train": dict(hf=dict(inputs.BERT_BASE), B=16, L=256, steps=10),
          "span": dict(lengths=(512, 2048, 8192), H=50, D=768, block=512, iters=5),
          "extras": dict(hf=two_layer, B=16, L=256, steps=10)}
