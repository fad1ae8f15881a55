"""Every program a run executes, built from the trainer's own steps and compiled before the first step.

A run's programs are its jitted steps at the shapes it will meet: the train step per length bucket the batch order
reaches, the eval step per bucket of the dev and test splits at the hit buffer `HitDecoder` starts with. They are
lowered one after another (tracing holds the GIL) and compiled together in a thread pool (XLA compiles outside the
GIL), and the trainer then calls the compiled executables (`Dispatch`): `jit(f).lower(...).compile()` does not fill
jit's own dispatch cache. The same machinery builds programs for another target (a TPU topology or a GPU target
config, `launch.compile`) from abstract shapes: nothing is allocated.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shlex
import threading
import time
import types as pytypes
from collections.abc import Callable, Iterable, Sequence
from concurrent import futures
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from gp_jax import factory, optim, tasks
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax import steps as steps_lib
from gp_jax.data import batching
from gp_jax.models import bert
from gp_jax.models.scratch import ScratchConfig
from gp_jax.ops import attention as attention_lib
from gp_jax.steps import Dispatch  # noqa: F401  the dispatcher of the programs built here

log = logging.getLogger("gp_jax.aot")

CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
CUDNN_MISSING = "cuDNN is not detected"
KERNEL_CALLS = {"tpu_custom_call": "splash", "__cudnn$fmha": "cudnn"}  # custom-call target prefix -> kernel
COMPILE_MEMORY_BYTES = 2 << 30  # host memory one compile may hold (a BERT-base train step on XLA:GPU: ~2 GiB)
THREADS_ENV = "GP_JAX_COMPILE_THREADS"


# ----------------------------------------------------------------------------- batches as shapes


def batch_structure(feature_names: Sequence[str], *, batch: int, length: int, tagger: bool = False,
                    targets: dict[str, tuple] | None = None) -> dict[str, jax.ShapeDtypeStruct]:
  """The model batch (`evaluate.model_batch` of `data.batching`'s format) of `batch` global rows at bucket `length`, as
  shapes. `targets`: a training batch's target shapes (the task's `target_shapes`); None: an eval batch (none)."""
  B, L = batch, length
  targets = targets or {}
  out = {"attention_mask": (B, L), "span_mask": (B, L), "positions": (B, L), **targets,
         "window_index": (B,), **{name: (B, L) for name in feature_names}}
  if tagger:
    out["tags"] = (B, L)
  return {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k, shape in out.items()}


def sharded(structure: dict, mesh) -> dict:
  """Shapes with the batch sharding `sharding.global_batch` gives the arrays."""
  return {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=shd.batch_sharding(mesh, len(v.shape)))
          for k, v in structure.items()}


def run_structure(setup, *, batch: int, length: int, train: bool) -> dict:
  """`batch_structure` of a setup's model and tokenizer, sharded over its mesh; training batches carry the task's
  targets (tagger heads: `tags` too), eval batches none."""
  tagger = train and setup.spec.tag_scheme is not None
  targets = (tasks.of(setup.spec).target_shapes(setup.labels, num_types=len(setup.types), batch=batch, length=length)
             if train else None)
  return sharded(batch_structure(setup.tokenizer.feature_names, batch=batch, length=length, tagger=tagger,
                                 targets=targets), setup.mesh)


# ----------------------------------------------------------------------------- programs


@dataclasses.dataclass
class Program:
  """One jitted step at one shape: what to lower, and what compiling it gave."""

  step: str  # "train" | "eval"
  length: int
  batch: int
  fn: Any  # the jitted function
  args: tuple  # abstract arguments
  hits: tuple = ()  # eval: the task's hit buffer sizes, one per buffer
  steps: int = 1  # train: optimizer steps per call (a stack of `steps` batches when > 1)
  options: dict = dataclasses.field(default_factory=dict)  # XLA options for this program (`compiler_options`)
  choices: dict = dataclasses.field(default_factory=dict)  # the kernels it resolves to, and why (`resolve`)
  lowered: Any = None
  compiled: Any = None
  seconds: float | None = None
  cache_hit: bool | None = None
  error: BaseException | None = None

  @property
  def shape(self) -> tuple:
    """([steps,] rows, length) of its batch argument: the key `steps.Dispatch` finds it by."""
    return ((self.steps,) if self.steps > 1 else ()) + (self.batch, self.length)

  @property
  def label(self) -> str:
    return steps_lib.shape_label(self.step, self.shape, self.hits)

  def line(self) -> str:
    if self.error is not None:
      return f"compiled ahead: {self.label}: failed ({type(self.error).__name__})"
    return f"compiled ahead: {self.label}: {self.seconds:.2f} s ({'cache hit' if self.cache_hit else 'cache miss'})"


def stacked(structure: dict, steps: int, mesh) -> dict:
  """`steps` batches of `structure` stacked on a leading axis, sharded as `sharding.global_stacked_batch` does."""
  return {k: jax.ShapeDtypeStruct((steps,) + v.shape, v.dtype,
                                  sharding=shd.stacked_batch_sharding(mesh, len(v.shape) + 1))
          for k, v in structure.items()}


def train_program(step_fn, setup, tx, *, batch: int, length: int, steps: int = 1) -> Program:
  """The train step at one bucket (`steps.make_train_step`, state donated), or with `steps` > 1 that many steps
  in one call over stacked batches (`steps.make_train_steps`)."""
  structure = run_structure(setup, batch=batch, length=length, train=True)
  if steps > 1:
    structure = stacked(structure, steps, setup.mesh)
  return Program("train", length, batch, step_fn, (state_lib.abstract_state(setup, tx), structure), steps=steps)


def eval_program(eval_fn, setup, *, batch: int, length: int, hits) -> Program:
  """The eval step (`steps.make_eval_step` at the hit buffer sizes `hits`, the task's tuple) at one bucket."""
  args = (state_lib.abstract_params(setup), run_structure(setup, batch=batch, length=length, train=False),
          jax.ShapeDtypeStruct((), jnp.float32))
  return Program("eval", length, batch, eval_fn, args, hits=hits)


# ----------------------------------------------------------------------------- XLA options per program


def user_xla_flags() -> set[str]:
  """Names of the XLA options set in XLA_FLAGS: they win over what the project sets per program."""
  names = set()
  for flag in shlex.split(os.environ.get("XLA_FLAGS", "")):
    m = re.match(r"--?([\w.]+)", flag)
    if m:
      names.add(m.group(1))
  return names


def compiler_options(program: Program) -> dict:
  """The program's own XLA options less those XLA_FLAGS sets (logged once each)."""
  if not program.options:
    return {}
  user = user_xla_flags()
  kept = {k: v for k, v in program.options.items() if k not in user}
  for k in sorted(set(program.options) - set(kept)):
    log.info("%s: XLA option %s from XLA_FLAGS wins over the project's %r", program.label, k, program.options[k])
  if kept:
    log.info("%s: XLA options %s", program.label, kept)
  return kept


# XLA:GPU's default command-buffer commands less CUDNN: XLA records cuDNN graphs with dropout into CUDA command
# buffers without a device ordinal and aborts (`CudnnGraph::PackOperands`); `compiler_options` takes no "-CUDNN".
COMMAND_BUFFER_WITHOUT_CUDNN = "FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL,DYNAMIC_SLICE_FUSION"


def attention_choice(spec, encoder_config, *, platform: str, length: int, train: bool) -> tuple[str, str]:
  """(implementation, why) of the self-attention a step holds on `platform` (`ops.attention.choose`) for a run spec
  (`factory.RunSpec`) resolved for that platform; "none" for a scratch encoder without attention blocks."""
  if spec.encoder == "scratch" and not spec.num_attn_layers:
    return "none", ""
  policy = _policy(spec, platform)
  heads, width = attention_shape(spec, encoder_config)
  return attention_lib.choose(policy.attention, platform=platform, dtype=jnp.dtype(factory.DTYPES[policy.dtype]),
                              length=length, head_dim=width // heads, dropout=train and policy.attention_dropout > 0)


def _policy(spec, platform: str) -> factory.Precision:
  """The spec's precision, which must be the one for `platform` (the setup was built for it)."""
  if spec.platform != platform:
    raise ValueError(f"the run spec was resolved for {spec.platform}, not {platform}: build the setup for {platform}")
  return spec.precision


def resolve(program: Program, setup, platform: str) -> Program:
  """Records what `program` resolves to on `platform` (attention and loss implementation, dropout bits) in
  `program.choices`, and sets the XLA options it needs: cuDNN attention with dropout kept out of command buffers.
  Reads `setup.spec`, resolved for `platform`."""
  spec = setup.spec
  policy = _policy(spec, platform)
  impl, why = attention_choice(spec, setup.encoder_config, platform=platform, length=program.length,
                               train=program.step == "train")
  dropout = program.step == "train" and policy.attention_dropout > 0
  if impl == "cudnn" and dropout:
    program.options = dict(program.options, xla_gpu_enable_command_buffer=COMMAND_BUFFER_WITHOUT_CUDNN)
  is_bert = spec.encoder == "bert"
  program.choices = {"attention": impl, "attention_why": why, "loss": spec.loss_implementation,
                     "dropout_bits": policy.dropout_bits if is_bert else "none (nnx.Dropout)",
                     "bert_kernels": bert_kernels(spec, platform) if is_bert else "none",
                     "optimizer_update": optim.resolve_update(spec.optimizer, platform),
                     **tasks.of(spec).resolved_choices(), "xla_options": dict(program.options)}
  return program


def bert_kernels(spec, platform: str) -> str:
  """How the BERT train step is written on `platform` (`models.bert.resolve_kernels`)."""
  return bert.resolve_kernels(bert.BertConfig(kernels=spec.kernels, target_platform=platform))


def resolved_record(programs: Sequence[Program], setup, platform: str) -> dict:
  """What a run resolved its `auto` choices to (workdir/resolved.json): precision, and per program its kernels."""
  policy = _policy(setup.spec, platform)
  return {"platform": platform, "dtype": policy.dtype, "attention_dropout": policy.attention_dropout,
          "dropout_bits": policy.dropout_bits if setup.spec.encoder == "bert" else "none (nnx.Dropout)",
          "programs": {p.label: p.choices for p in programs}}


# ----------------------------------------------------------------------------- compiling


_tls = threading.local()
_listening = {"on": False}
_listen_lock = threading.Lock()


def _count_cache_hit(name: str, **_) -> None:
  """A JAX monitoring listener: counts this thread's compilation cache hits."""
  if name == CACHE_HIT_EVENT:
    _tls.hits = getattr(_tls, "hits", 0) + 1


def _listen() -> None:
  with _listen_lock:
    if not _listening["on"]:
      jax.monitoring.register_event_listener(_count_cache_hit)
      _listening["on"] = True


def compile_threads(n_programs: int) -> int:
  """Threads for `n_programs` concurrent compiles: bounded by cores and by the memory each compile may hold;
  $GP_JAX_COMPILE_THREADS overrides."""
  if os.environ.get(THREADS_ENV, "").strip():
    return max(1, int(os.environ[THREADS_ENV]))
  bound = os.cpu_count() or 1
  try:
    with open("/proc/meminfo") as f:
      available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    bound = min(bound, max(1, available // COMPILE_MEMORY_BYTES))
  except (OSError, StopIteration, ValueError):
    pass
  return max(1, min(n_programs, bound))


def _compile_one(program: Program) -> Program:
  _tls.hits = 0
  t0 = time.perf_counter()
  try:
    program.compiled = program.lowered.compile(compiler_options=compiler_options(program) or None)
  except Exception as e:  # pylint: disable=broad-except
    program.error = e
  program.seconds = time.perf_counter() - t0
  program.cache_hit = _tls.hits > 0
  return program


@dataclasses.dataclass
class Report:
  programs: list
  wall: float
  summed: float
  threads: int

  def line(self) -> str:
    n = len(self.programs)
    return (f"compiled ahead: {n} program{'s' * (n != 1)} in {self.wall:.1f} s wall, {self.summed:.1f} s of compile "
            f"summed, {self.threads} thread{'s' * (self.threads != 1)}")


def lower(program: Program, lower_fn: Callable | None = None) -> Program:
  """`program.lowered` (serial: tracing holds the GIL); an error is kept on the program."""
  try:
    program.lowered = (lower_fn or (lambda p: p.fn.lower(*p.args)))(program)
  except Exception as e:  # pylint: disable=broad-except
    program.error = e
  return program


def compile_all(programs: Iterable[Program], *, threads: int | None = None, on_done: Callable | None = None,
                lower_fn: Callable | None = None) -> Report:
  """Lowers each program in turn, then compiles them concurrently; `on_done(program)` as each finishes (in the
  calling thread, in completion order). Errors stay on the programs (`Program.error`)."""
  _listen()
  programs = list(programs)
  t0 = time.perf_counter()
  for p in programs:
    if p.lowered is None and p.error is None:
      lower(p, lower_fn)
  todo = [p for p in programs if p.error is None and p.compiled is None]
  threads = threads or compile_threads(len(todo))
  if todo:
    with futures.ThreadPoolExecutor(max(1, min(threads, len(todo))), thread_name_prefix="compile") as pool:
      for done in futures.as_completed([pool.submit(_compile_one, p) for p in todo]):
        if on_done is not None:
          on_done(done.result())
  for p in programs:
    if p not in todo and on_done is not None:  # failed to lower
      on_done(p)
  return Report(programs, time.perf_counter() - t0, sum(p.seconds or 0.0 for p in todo), threads)


def compile_for_run(programs: Sequence[Program]) -> Report:
  """`compile_all` with a line per program and a total in the log; raises the first program's error."""
  report = compile_all(programs, on_done=lambda p: log.info(p.line()))
  log.info(report.line())
  for p in programs:
    if p.error is not None:
      raise p.error
  return report


# ----------------------------------------------------------------------------- a run's programs


def eval_lengths(prepared_splits: Iterable, *, batch_size: int, buckets) -> list[int]:
  """The buckets the eval batches of these splits take."""
  out = set()
  for p in prepared_splits:
    out.update(batching.eval_batches(p, batch_size=batch_size, buckets=buckets,
                                     process_index=jax.process_index(), process_count=jax.process_count()).lengths())
  return sorted(out)


# ----------------------------------------------------------------------------- other targets


def target_setup(config, tokenizer, types, mesh, platform: str, *, encoder_config=None, attention: str | None = None,
                 labels=()):
  """A `state.Setup` of the model built for `platform`, parameters abstract (nothing allocated but RNG state)."""
  config = config.copy_and_resolve_references()
  if attention:
    config.model.attention = attention

  def build():
    return factory.build_model(config, tokenizer, len(types), load_weights=False, encoder_config=encoder_config,
                               platform=platform, labels=labels)

  graphdef, abs_params, _ = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
  abs_params = nnx.to_pure_dict(abs_params)
  rest = jax.jit(lambda: nnx.split(build(), nnx.Param, ...)[2])()  # RNG streams only (XLA drops the init)
  return state_lib.Setup(factory.run_spec(config, platform), list(types), tokenizer, mesh, graphdef, rest, abs_params,
                         shd.tree_shardings(mesh, abs_params), encoder_config, tuple(labels))


def lower_or_xla_attention(lower_fn, make_setup, setup=None):
  """(lower_fn(setup), setup, False) with `make_setup(None)` (or the `setup` given); where that traces cuDNN attention
  on a machine without cuDNN, (lower_fn(xla setup), xla setup, True) with `make_setup("xla")`."""
  try:
    setup = setup or make_setup(None)
    return lower_fn(setup), setup, False
  except RuntimeError as e:
    if CUDNN_MISSING not in str(e):
      raise
  setup = make_setup("xla")
  return lower_fn(setup), setup, True


def kernel_calls(module_text: str) -> dict[str, int]:
  """{kernel name: custom calls executed once per step} in a lowered module's StableHLO text: a kernel inside a
  private function counts once per call of that function (layers share one), from @main down."""
  bodies = dict(re.findall(r"func\.func (?:public|private) @([\w$.\-]+)\((.*?)(?=\n  func\.func |\Z)", module_text,
                           re.S))

  def count(name: str, seen=()) -> dict[str, int]:
    out: dict[str, int] = {}
    body = bodies.get(name, "")
    for target in re.findall(r"stablehlo\.custom_call @([\w$.\-]+)", body):
      kernel = next((k for prefix, k in KERNEL_CALLS.items() if target.startswith(prefix)), None)
      if kernel:
        out[kernel] = out.get(kernel, 0) + 1
    for callee in re.findall(r"(?<![\w.])(?:func\.)?call @([\w$.\-]+)\(", body):
      if callee not in seen:
        for kernel, n in count(callee, seen + (name,)).items():
          out[kernel] = out.get(kernel, 0) + n
    return out

  return count("main")


def parse_mesh(spec: str) -> dict:
  """"data:8" or "data:4,fsdp:2" -> {"data": 8, "fsdp": 1} style sizes."""
  sizes = {"data": 1, "fsdp": 1}
  for part in filter(None, spec.split(",")):
    name, colon, n = part.strip().partition(":")
    if not colon or not n.strip().isdigit() or int(n) < 1:
      raise ValueError(f"--mesh {spec!r}: expected AXIS:N parts such as data:4,fsdp:2 (N >= 1), got {part!r}")
    if name not in sizes:
      raise ValueError(f"--mesh axes are data and fsdp, got {name!r}")
    sizes[name] = int(n)
  return sizes


def bert_tokenizer(hf: dict):
  """A stand-in for a BERT tokenizer of the HF config `hf`: what the model and batches read of one."""
  pad = hf.get("pad_token_id", 0)
  return pytypes.SimpleNamespace(vocab_size=hf["vocab_size"], pad_token_id=pad, num_prefix=1,
                                 feature_names=("input_ids", "token_type_ids"),
                                 pad_values={"input_ids": pad, "token_type_ids": 0})


def char_tokenizer(vocab: int, bigram_vocab: int):
  """A stand-in for the scratch encoder's char + bigram tokenizer of these vocabulary sizes."""
  return pytypes.SimpleNamespace(vocab_size=vocab, bigram_vocab_size=bigram_vocab, num_prefix=0,
                                 feature_names=("input_ids", "bigram_ids"), pad_values={"input_ids": 0, "bigram_ids": 0})


def attention_shape(spec, encoder_config: dict | None) -> tuple[int, int]:
  """(heads, width) of the encoder's self-attention (a scratch encoder's width from the run spec)."""
  if encoder_config is not None:
    return encoder_config["num_attention_heads"], encoder_config["hidden_size"]
  return ScratchConfig.num_heads, spec.hidden_size
