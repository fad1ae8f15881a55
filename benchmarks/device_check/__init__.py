"""One prepared device check: what a lent GPU must settle (bf16, cuDNN, speed), in one command under a time budget.

  python -m benchmarks.device_check --out=DIR [--budget_s=480] [--tiny] [--stages=versions,attention,...]

Stages, in this order, each in its own child process with its own time limit (its share of what is left of the
budget; time a stage does not use goes to the later ones). A child writes its results as it goes, so a stage cut
off by its limit still reports what it measured (status "timeout"). All children share one persistent
compilation cache (--cache_dir); the numerics stages (attention, precision) compile without XLA's GPU autotuning.
  versions    python, jax, jaxlib, CUDA plugin, cuDNN, driver, device; measured bf16, TF32 (jax's default f32
              matmul precision on the GPU) and strict f32 matmul peaks
  trainer     the real trainer as a user runs it, `python -m gp_jax.main --config=experiments/su2022.py:dataset=
              cluener2020,epochs=2` on a BERT-base-Chinese-shaped checkpoint with random weights (written here with
              transformers; CLUENER from --data_dir), in this order (--trainer_runs picks; what no longer fits the
              stage's limit is skipped, "no time left"): cold compilation cache, the PyTorch port (--anchor, its own
              script) on the same card, warm, fused vs reference, the warm run at one step per call (su2022 runs k per
              call), the efficient head. Per run, from its log: first step, each program compiled ahead (seconds,
              cache hit or miss), dev evaluations, steady ms/step by bucket, checkpoints, whole wall, dev F1.
              Fused vs reference: the 2-layer BERT-base-width step (precision's model, batch and lr) with
              model.kernels=fused and optimizer.update_impl=fused, then kernels=reference and update=optax, each in its
              own process (an abort loses its side only), same init and dropout masks, 30 steps: largest loss
              difference against the bf16-vs-f32 gap (BF16_F32_GAP: pass or fail), parameters after one step.
              A call of its own: `--stages=versions,trainer --budget_s=520` (docs/device/README.md)
  attention   first cuDNN's fused dropout, read off exactly (one-hot values): drop rate, and whether its masks differ
              between two steps (calls) and between layers (seeds), the condition for using it in training
              (`gp_jax.ops.attention.CUDNN_DROPOUT_VERIFIED`); then cuDNN vs XLA attention in bf16 against an f32
              XLA reference, values and gradients: B16, L 256 and 200, head dim 64, ragged right padding and one
              all-padding row (finite everywhere, compared on valid rows)
  precision   2-layer BERT (BERT-base width) + GP head, 30 steps on one fixed batch: f32 vs bf16, XLA vs cuDNN
              attention (attention dropout 0, hidden dropout 0.1), and a second f32 seed for the seed noise; loss
              and gradient-norm trajectories
  train_step  BERT-base + GP (H=10, d=64), B16 x L256, the trainer's step (`benchmarks.inputs.ProjectStep`) compiled
              as the trainer compiles it (`aot.train_program` / `resolve` / `compile_all`: cuDNN attention with dropout
              kept out of command buffers), one row per variant of `TRAIN_VARIANTS` (XLA attention with threefry or
              hash dropout bits, cuDNN fused dropout, attention dropout 0 on cuDNN; torch.compile): each of ours first
              alone in its own process (build, compile, a first step, a few timed: ms/step, MFU against the measured
              bf16 peak, compile seconds, seconds from process start to first step), so a variant whose process
              aborts (XLA's cuDNN dropout in a command buffer did: `Check failed`) or fails loses only its row
              (status aborted with its signal, or failed, and its last log lines) and the stage goes on; then the
              survivors and the PyTorch port under autocast bf16 (`benchmarks.torch_port.make_torch_step`) in
              alternating rounds in the stage's process (a variant whose env that process cannot change, XLA_FLAGS,
              is timed in its own process only). --train_variants picks the rows
  span_loss   GlobalPointer span loss + gradient, dense vs XLA blockwise (tile 512), L 512 / 2048 / 8192, H 50, D 768:
              time and the compiled program's memory (arguments + outputs + temporaries)
  extras      dropout bits (hash vs threefry) on the 2-layer step; a blocked vs an unblocked step loop

DIR gets device_check.json (a section per stage with its status: ok, skipped (why), failed (error), timeout; the
rows a stage lost on its way under "lost"), device_check.md (the same as tables) and device_check.log (the children's
output, the trainer runs' and the variants' too). `--tiny`: every stage on tiny shapes on the CPU (torch and cuDNN
parts skipped with their reason; the trainer on synthetic data with a 2-layer BERT, fused vs reference forced on
the CPU); the test suite runs it.

On the lent GPU (docs/device/README.md: wheels from `benchmarks/device_wheels.sh`, installed offline), in two calls
of at most 600 s:
  python -m benchmarks.device_check --out=$OUT --stages=versions,trainer --budget_s=520 --data_dir=.devcarry/data \
    --anchor=.devcarry/torch_cluener.py
  python -m benchmarks.device_check --out=$OUT --stages=versions,attention,precision,train_step,span_loss,extras \
    --budget_s=480

The package: one module per stage (versions, trainer with kernels for its fused-vs-reference check, attention,
precision, train_step, span_loss, extras), the train-step variants they build (variants), the shapes (shapes), the
result file and child processes they share (base), the tables (tables), and the parent that runs them (cli).
"""

from benchmarks.device_check.base import RESULT, Recorder
from benchmarks.device_check.cli import STAGES, main
from benchmarks.device_check.kernels import BF16_F32_GAP, KERNEL_RUNS, compare_params, kernels_verdict
from benchmarks.device_check.shapes import TRAINER_RUNS, shapes
from benchmarks.device_check.tables import markdown
from benchmarks.device_check.trainer import parse_anchor_log, parse_trainer_log
from benchmarks.device_check.variants import (TRAIN_VARIANTS, StepVariant, TorchVariant, project_step, train_batch,
                                              train_variants)

__all__ = ["BF16_F32_GAP", "KERNEL_RUNS", "RESULT", "STAGES", "TRAINER_RUNS", "TRAIN_VARIANTS", "Recorder",
           "StepVariant", "TorchVariant", "compare_params", "kernels_verdict", "main", "markdown", "parse_anchor_log",
           "parse_trainer_log", "project_step", "shapes", "train_batch", "train_variants"]
