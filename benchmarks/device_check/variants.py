"""The project's train step built as the trainer builds it (`project_step`, `build_variant`), and stage
train_step's rows: `TRAIN_VARIANTS`, each a way to build it (config overrides, environment) or the PyTorch port."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import time

from benchmarks.device_check.base import cudnn_reason, on_gpu, torch_reason
from gp_jax import runtime

# Deferred imports below: benchmarks.inputs, benchmarks.train_step and gp_jax's aot and factory (they import jax),
# in a stage's child only.


def train_batch(hf: dict, *, batch: int, seq: int) -> dict:
  """The synthetic host batch every train-step variant (ours and the PyTorch port's) steps on: GP types 10."""
  from benchmarks.inputs import bert_inputs, synthetic_batch  # pylint: disable=g-import-not-at-top

  _, features = bert_inputs(hf)
  return synthetic_batch(batch=batch, seq=seq, num_types=10, num_prefix=1, num_suffix=1, features=features,
                         min_len=seq // 2)


def project_step(hf: dict, *, batch: int, seq: int, dtype: str = "auto", attention: str = "auto",
                 attention_dropout: float = 0.1, dropout_bits: str = "auto", kernels: str = "auto",
                 update: str = "auto", seed: int = 0, lr: float | None = None):
  """-> (ProjectStep, device batch, FLOPs per step, host batch): BERT (`hf`) + GP (H=10, d=64), random init,
  synthetic batch; `dropout_bits`, `kernels`, `update`: `model.dropout_bits`, `model.kernels`, `optimizer.update_impl`
  (auto resolves per platform)."""
  from benchmarks.inputs import ProjectStep, bert_config, bert_inputs  # pylint: disable=g-import-not-at-top
  from benchmarks.train_step import bert_gp_train_flops  # pylint: disable=g-import-not-at-top

  config, types = bert_config(10, 64)
  config.batch_size = batch
  config.seed = seed
  config.model.dtype = dtype
  config.model.attention = attention
  config.model.attention_dropout = attention_dropout
  config.model.dropout_bits = dropout_bits
  config.model.kernels = kernels
  config.optimizer.update_impl = update
  if lr is not None:
    config.optimizer.lr, config.optimizer.head_lr, config.optimizer.warmup_steps = lr, lr, 0
  tokenizer, _ = bert_inputs(hf)
  step = ProjectStep(config, tokenizer, types, load_weights=False, encoder_config=hf)
  b = train_batch(hf, batch=batch, seq=seq)
  flops = bert_gp_train_flops(hf, batch=batch, seq=seq, num_types=len(types), head_size=64)
  return step, step.device_batch(b), flops, b


# Environment variables a process may change between variants: the project reads them when it traces a program.
# Any other (XLA_FLAGS: read once, when the backend starts) makes a variant's own process the only place it is timed.
IN_PROCESS_ENV = ("GP_JAX_CUDNN_DROPOUT", "GP_JAX_DROPOUT_BITS")


@dataclasses.dataclass(frozen=True)
class StepVariant:
  """The project's train step built one way: `model` is `project_step`'s config overrides (attention, attention_dropout,
  dropout_bits, dtype), `env` is set while it is built and compiled, `needs` ("cudnn" or "gpu") skips it elsewhere,
  `default` puts it in a plain run (others by --train_variants)."""

  label: str
  model: dict
  env: dict = dataclasses.field(default_factory=dict)
  needs: str = ""
  default: bool = True
  plant: bool = False  # tests only (--plant_abort): its process aborts (SIGABRT, as cuDNN's did) before building
  length: int = 0  # another L than the stage's (the short-sentence step); 0: the stage's

  def child_only(self) -> str | None:
    """Why this variant is timed only in its own process (env the stage's process cannot change, or another length
    than the rounds'), or None."""
    fixed = sorted(k for k in self.env if k not in IN_PROCESS_ENV)
    if fixed:
      return f"timed in its own process only ({', '.join(fixed)} is read when the backend starts)"
    return "timed in its own process only (another length than the rounds')" if self.length else None

  def seq(self, s: dict) -> int:
    return min(self.length, s["L"]) if self.length else s["L"]


@dataclasses.dataclass(frozen=True)
class TorchVariant:
  """The PyTorch port under autocast bf16 (`benchmarks.torch_port.make_torch_step`), in the stage's process."""

  label: str
  compiled: bool
  attention_dropout: float
  default: bool = True


_XLA_DROP = {"attention": "xla", "attention_dropout": 0.1}
_CUDNN_DROP = {"attention": "cudnn", "attention_dropout": 0.1}
# Stage train_step's rows, in order: a key -> how to build it. cuDNN dropout variants go through `aot.resolve`, which
# keeps cuDNN out of command buffers (`aot.COMMAND_BUFFER_WITHOUT_CUDNN`) as the trainer does.
TRAIN_VARIANTS = {
    "xla_threefry": StepVariant("ours, attention dropout 0.1, XLA attention, threefry bits",
                                dict(_XLA_DROP, dropout_bits="threefry")),
    "xla_hash": StepVariant("ours, attention dropout 0.1, XLA attention, hash bits",
                            dict(_XLA_DROP, dropout_bits="hash")),
    "cudnn_dropout": StepVariant("ours, attention dropout 0.1, cuDNN fused dropout (GP_JAX_CUDNN_DROPOUT=1)",
                                 _CUDNN_DROP, env={"GP_JAX_CUDNN_DROPOUT": "1"}, needs="cudnn"),
    "xla_hash_reference": StepVariant("ours, attention dropout 0.1, XLA attention, hash bits, reference BERT step and "
                                      "optax update (the fused step's switches off)",
                                      dict(_XLA_DROP, dropout_bits="hash", kernels="reference", update="optax"),
                                      needs="gpu"),  # elsewhere auto is the reference already
    "xla_hash_L64": StepVariant("ours, attention dropout 0.1, XLA attention, hash bits, B16 x L64 (short sentences)",
                                dict(_XLA_DROP, dropout_bits="hash"), length=64),
    "no_dropout": StepVariant("ours, attention dropout 0, cuDNN attention",
                              {"attention": "cudnn", "attention_dropout": 0.0}, needs="cudnn"),
    "cudnn_dropout_no_cmdbuf": StepVariant("ours, attention dropout 0.1, cuDNN fused dropout, command buffers off",
                                           _CUDNN_DROP, env={"GP_JAX_CUDNN_DROPOUT": "1",
                                                             "XLA_FLAGS": "--xla_gpu_enable_command_buffer="},
                                           needs="cudnn", default=False),
    "torch_compile_0.1": TorchVariant("torch.compile autocast bf16, attention dropout 0.1", True, 0.1),
    "torch_compile_0": TorchVariant("torch.compile autocast bf16, attention dropout 0", True, 0.0),
    "torch_eager_0.1": TorchVariant("torch eager autocast bf16, attention dropout 0.1", False, 0.1, default=False),
    "torch_eager_0": TorchVariant("torch eager autocast bf16, attention dropout 0", False, 0.0, default=False),
}
PLANTED = {"planted_abort": StepVariant("planted abort (tests only)", _XLA_DROP, plant=True)}


def train_variants(names: str = "", plant: bool = False) -> dict:
  """The variants a run times: `names` (comma list of TRAIN_VARIANTS keys; empty: the default ones), the planted
  abort first when `plant`."""
  keys = [k.strip() for k in names.split(",") if k.strip()] or [k for k, v in TRAIN_VARIANTS.items() if v.default]
  unknown = [k for k in keys if k not in TRAIN_VARIANTS]
  if unknown:
    raise ValueError(f"unknown train_step variants {unknown}; known: {', '.join(TRAIN_VARIANTS)}")
  return {**(PLANTED if plant else {}), **{k: TRAIN_VARIANTS[k] for k in keys}}


def variant_reason(v) -> str | None:
  """Why variant `v` cannot run here, or None."""
  if isinstance(v, TorchVariant):
    return torch_reason()
  if v.needs == "cudnn":
    return cudnn_reason()
  if v.needs == "gpu" and not on_gpu():
    return "runs on a GPU only"
  return None


def build_variant(v: StepVariant, s: dict) -> tuple:
  """-> (ProjectStep stepping the program compiled as the trainer compiles it, device batch, facts): `aot.train_program`
  + `aot.resolve` (its per-program XLA options) + `aot.compile_all`, with the variant's in-process env set."""
  from gp_jax import aot, factory  # pylint: disable=g-import-not-at-top

  if v.plant:  # the tests' stand-in: the parent's handling of a dead child is what it checks, not where it died
    plant_abort()
  with runtime.environ({k: x for k, x in v.env.items() if k in IN_PROCESS_ENV}):
    compile_before, t0 = runtime.compile_seconds(), time.perf_counter()
    step, dbatch, flops, _ = project_step(s["hf"], batch=s["B"], seq=v.seq(s), **v.model)
    program = aot.resolve(aot.train_program(step.step_fn, step.setup, step.tx, batch=s["B"], length=v.seq(s)),
                          step.setup, factory.target_platform())
    aot.compile_all([program], threads=1)
  if program.error is not None:
    raise program.error
  step.step_fn = program.compiled  # the trainer calls the executable compiled ahead (`aot.Dispatch`)
  return step, dbatch, {"choices": program.choices, "gflop_per_step": flops / 1e9,
                        "build_s": time.perf_counter() - t0 - program.seconds, "compile_wall_s": program.seconds,
                        "compile_s": runtime.compile_seconds() - compile_before, "cache_hit": program.cache_hit}


def plant_abort() -> None:
  """The tests' stand-in for cuDNN's abort: SIGABRT before building the step (no model, no compile: the child's
  cost is its start-up), without a core file."""
  with contextlib.suppress(ValueError, OSError):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  print("planted abort: os.abort() before building the step (--plant_abort)", flush=True)
  os.abort()
