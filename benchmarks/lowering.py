"""Lower the jitted train and eval steps for TPU and GPU from this machine (no accelerator needed).

  python -m benchmarks.lowering --platforms=tpu,cuda [--model=bert-base|scratch] [--batch=16] [--length=256]
                                [--mesh=data:8]

For each platform, the model is built for that target (`factory.precision`: model.dtype=auto is bfloat16 on
cuda/tpu, model.attention=auto picks splash on tpu, cuDNN on cuda; `gp_jax.aot.target_setup`), on abstract shapes
(no weights: bert-base is BERT-base's shape, random; scratch is the MSRA main job's encoder with one self-attention
block added), and the trainer's own jitted steps (`steps.make_train_step`, `steps.make_eval_step`, state and batch
sharded over the mesh) go through `jax.export` for that platform. One line per platform and target, no log prefix:

  tpu train_step: lowered (bfloat16, splash, 36 custom calls)
  cuda train_step: lowered (bfloat16, xla: cuDNN is not detected on this machine, 0 custom calls)
  tpu eval_step: not lowered: REASON
  tpu loss: lowered (pallas, 3 tpu_custom_call)

The `loss` target is the span loss + gradient with the fused Pallas ZLPR kernel (`loss.implementation=pallas`,
`export_loss`) at the same batch and length: 3 Mosaic kernels on tpu (forward, dq and dk passes), refused on cuda
(no GPU body: it would run the Pallas interpreter), the interpreted kernel (no custom call) on cpu. A TPU export made
on a CPU machine holds the serialised Mosaic kernel; Mosaic compiles it (layout passes, VMEM checks) only on the TPU.

"custom calls" counts kernel calls in the exported module (Pallas/Mosaic `tpu_custom_call`, cuDNN attention);
sharding annotations are not counted. cuDNN attention cannot be traced without a GPU (jaxlib raises "cuDNN is
not detected"), so the cuda lines then lower with the XLA attention and say so. Exit status 0 when every line
lowered or gave a known reason, 1 on an unexpected error (its traceback on stderr).

Targets are functions `(Problem, platform) -> lines`, listed in TARGETS; add one there to lower something else.
`--attention-dropout` defaults to 0: the fused kernels have no probability dropout, so with BERT's 0.1 the train
step takes the XLA path (`gp_jax.ops.attention`). Lowering does not compile: see docs/tpu.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import re
import sys
import traceback

import jax
import jax.numpy as jnp

from benchmarks import inputs
from gp_jax import aot, evaluate, factory, runtime, steps, tasks
from gp_jax import sharding as shd
from gp_jax import state as state_lib
from gp_jax.ops import blockwise, blockwise_zlpr_loss
from gp_jax.optim import make_optimizer

TINY_BERT = dict(num_hidden_layers=1, hidden_size=128, num_attention_heads=2, intermediate_size=256, vocab_size=1000)
NUM_TYPES = 10


@dataclasses.dataclass
class Problem:
  """What every target lowers: the config, tokenizer stand-in, types, mesh and one abstract batch."""

  config: object
  tokenizer: object
  types: list
  mesh: object
  batch: dict  # numpy batch in the model's format (evaluate.model_batch)
  encoder_config: dict | None
  attention_dropout: float


def make_problem(model: str, *, batch: int, length: int, mesh_sizes: dict, tiny: bool = False,
                 attention_dropout: float = 0.0) -> Problem:
  mesh = shd.make_mesh(mesh_sizes["data"], mesh_sizes["fsdp"])
  if model == "bert-base":
    hf = dict(inputs.BERT_BASE, **(TINY_BERT if tiny else {}))
    tokenizer, features = inputs.bert_inputs(hf)
    config, types = inputs.bert_config(NUM_TYPES, 64)
    prefix = 1
  else:
    hf = None
    config = inputs.msra_config()
    tokenizer, features = inputs.msra_inputs()
    types = list(inputs.MSRA_TYPES)
    if tiny:
      config.model.hidden_size, config.model.num_layers = 64, 2
    config.model.num_attn_layers = config.model.num_attn_layers or 1  # so the attention kernel is exercised
    prefix = 0
  config.batch_size = batch
  config.model.dtype, config.model.attention = "auto", "auto"
  config.model.attention_dropout = attention_dropout
  np_batch = inputs.synthetic_batch(batch=batch, seq=length, num_types=len(types), features=features,
                                    num_prefix=prefix, num_suffix=prefix, min_len=max(2, length // 2))
  return Problem(config, tokenizer, types, mesh, evaluate.model_batch(np_batch), hf, attention_dropout)


def target_setup(problem: Problem, platform: str, *, attention: str | None = None):
  """`aot.target_setup` of the problem's model for `platform`."""
  return aot.target_setup(problem.config, problem.tokenizer, problem.types, problem.mesh, platform,
                          encoder_config=problem.encoder_config, attention=attention)


def abstract_batch(problem: Problem):
  """The problem's batch as shapes with the trainer's batch sharding (`aot.sharded`)."""
  return aot.sharded(problem.batch, problem.mesh)


def lower_train_step(setup, problem: Problem, platform: str):
  tx, _ = make_optimizer(setup.spec.optimizer, 10_000, setup.abstract_params)
  step = steps.make_train_step(setup, tx, loss_kind=setup.spec.loss_kind)
  return jax.export.export(step, platforms=[platform])(state_lib.abstract_state(setup, tx), abstract_batch(problem))


def lower_eval_step(setup, problem: Problem, platform: str):
  step = steps.make_eval_step(setup, size=tasks.of(setup.spec).initial_hits(problem.batch["span_mask"].shape[0]))
  threshold = jax.ShapeDtypeStruct((), jnp.float32)
  return jax.export.export(step, platforms=[platform])(state_lib.abstract_params(setup), abstract_batch(problem),
                                                       threshold)


def attention_label(problem: Problem, setup, platform: str, *, train: bool, calls: dict, why: str = "") -> str:
  """The attention the module holds: the kernel found in it, else "xla" and why (`aot.attention_choice`)."""
  if calls:
    return ", ".join(sorted(calls))
  if not why:
    _, why = aot.attention_choice(setup.spec, problem.encoder_config, platform=platform,
                                  length=problem.batch["span_mask"].shape[1], train=train)
  return "xla" + (f": {why}" if why else "")


def step_target(name: str, lower, *, train: bool):
  """A target lowering one of the trainer's jitted steps; on cuda without cuDNN, again with the XLA attention."""

  def target(problem: Problem, platform: str) -> list[str]:
    dtype = factory.precision(problem.config, platform).dtype
    exported, setup, without_cudnn = aot.lower_or_xla_attention(
        lambda s: lower(s, problem, platform), lambda attention: target_setup(problem, platform, attention=attention))
    why = f"{aot.CUDNN_MISSING} on this machine" if without_cudnn else ""
    calls = aot.kernel_calls(exported.mlir_module())
    label = attention_label(problem, setup, platform, train=train, calls=calls, why=why)
    return [f"{platform} {name}: lowered ({dtype}, {label}, {sum(calls.values())} custom calls)"]

  target.__name__ = name
  return target


# Kernel calls of the Pallas ZLPR loss in the StableHLO text of a module, by platform.
LOSS_CUSTOM_CALLS = {"tpu": "tpu_custom_call"}  # no Mosaic GPU body yet: cuda runs the interpreted kernel


def export_loss(platform: str, *, head="efficient", B=2, L=300, H=3, d=64, K=4, block_size=128, max_span_width=None):
  """`jax.export.Exported` of the Pallas ZLPR loss + gradient w.r.t. q, k (and the biases of the efficient head:
  bf16 q, k of one shared head, float32 start/end biases; standard: float32 q, k of H heads) for `platform`."""
  efficient = head == "efficient"

  def loss_and_grad(span_ids_BHK, mask_BL, q_BLHD, k_BLHD, *biases):
    def loss(q, k, sb=None, eb=None):
      return blockwise_zlpr_loss(q, k, span_ids=span_ids_BHK, attention_mask=mask_BL, start_bias_BHL=sb,
                                 end_bias_BHL=eb, max_span_width=max_span_width, block_size=block_size,
                                 implementation="pallas")

    return jax.value_and_grad(loss, tuple(range(2 + len(biases))))(q_BLHD, k_BLHD, *biases)

  qk = ((B, L, 1, d), jnp.bfloat16) if efficient else ((B, L, H, d), jnp.float32)
  shapes = [((B, H, K), jnp.int32), ((B, L), jnp.int32), qk, qk] + [((B, H, L), jnp.float32)] * (2 * efficient)
  args = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in shapes]
  return jax.export.export(jax.jit(loss_and_grad), platforms=[platform])(*args)


def loss_lines(platforms=("tpu",), **kwargs) -> list[str]:
  """One line per platform: `tpu loss: lowered (pallas, 3 tpu_custom_call)` or `... : not lowered: REASON`.

  The loss + gradient holds three kernels: the forward and the backward's dq and dk passes. A GPU target is refused
  (`blockwise.pallas_refusal`: no GPU body)."""
  lines = []
  for platform in platforms:
    refusal = blockwise.pallas_refusal(platform)
    if refusal:
      lines.append(f"{platform} loss: not lowered: refused: {refusal}")
      continue
    try:
      text = export_loss(platform, **kwargs).mlir_module()
    except Exception as e:  # pylint: disable=broad-except
      reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
      lines.append(f"{platform} loss: not lowered: {type(e).__name__}: {reason[:200]}")
      continue
    call = LOSS_CUSTOM_CALLS.get(platform)
    if call is None:
      lines.append(f"{platform} loss: lowered (pallas, interpreted: no custom call)")
    else:
      n = len(re.findall(rf'custom_call @{call}\b|call_target_name = "{call}"', text))
      lines.append(f"{platform} loss: lowered (pallas, {n} {call})")
  return lines


def loss_target(problem: Problem, platform: str) -> list[str]:
  """The span loss + gradient with the fused Pallas ZLPR kernel (`loss.implementation=pallas`) at the problem's
  batch and length, NUM_TYPES types, Efficient GlobalPointer (bf16 q/k): `loss_lines`."""
  B, L = problem.batch["attention_mask"].shape
  line, = loss_lines((platform,), B=B, L=L, H=NUM_TYPES)
  if ": not lowered: " in line:
    raise RuntimeError(line.split(": not lowered: ", 1)[1])
  return [line]


loss_target.__name__ = "loss"
TARGETS = [step_target("train_step", lower_train_step, train=True),
           step_target("eval_step", lower_eval_step, train=False), loss_target]
# user-input errors and refusals (gp_jax.ops.blockwise.PALLAS_GPU_REFUSED), reported as reasons
KNOWN = ("exceeds the", "is not a multiple of", "must be divisible", "has no GPU kernel")


def run(problem: Problem, platforms, targets=None) -> tuple[list[str], bool]:
  """-> (lines, ok); ok is False after an unexpected error (traceback on stderr)."""
  lines, ok = [], True
  for platform in platforms:
    for target in targets or TARGETS:
      try:
        lines += target(problem, platform)
      except Exception as e:  # pylint: disable=broad-except
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        lines.append(f"{platform} {target.__name__}: not lowered: {type(e).__name__}: {reason}")
        if not any(k in str(e) for k in KNOWN):
          ok = False
          traceback.print_exc(file=sys.stderr)
      print(lines[-1], flush=True)
  return lines, ok


def force_host_devices(n: int) -> None:
  """Enough fake CPU devices for the mesh (read when JAX starts its CPU backend)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if "--xla_force_host_platform_device_count" not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--platforms", default="tpu,cuda", help="comma list of cpu, cuda, rocm, tpu")
  p.add_argument("--model", choices=("bert-base", "scratch"), default="bert-base")
  p.add_argument("--batch", type=int, default=16, help="global batch")
  p.add_argument("--length", type=int, default=256, help="padded length L")
  p.add_argument("--mesh", default="data:8", help="mesh axis sizes, e.g. data:8 or data:4,fsdp:2")
  p.add_argument("--attention-dropout", type=float, default=0.0, help="model.attention_dropout (see above)")
  p.add_argument("--tiny", action="store_true", help="a 2-layer shrink of the model (tests)")
  p.add_argument("--targets", default=",".join(t.__name__ for t in TARGETS),
                 help="comma list of what to lower: train_step, eval_step, loss (the Pallas ZLPR loss + gradient)")
  args = p.parse_args(argv)
  # libtpu without a TPU is not started, and nothing is said about it; not `runtime.configure()`: the tests call
  # this main in their own process, whose settings (malloc, threefry lowering) it would change.
  runtime.configure_start_up()
  by_name = {t.__name__: t for t in TARGETS}
  unknown = [t for t in args.targets.split(",") if t not in by_name]
  if unknown:
    p.error(f"unknown --targets {unknown}; known: {', '.join(by_name)}")
  mesh_sizes = aot.parse_mesh(args.mesh)
  force_host_devices(math.prod(mesh_sizes.values()))
  problem = make_problem(args.model, batch=args.batch, length=args.length, mesh_sizes=mesh_sizes, tiny=args.tiny,
                         attention_dropout=args.attention_dropout)
  _, ok = run(problem, [s.strip() for s in args.platforms.split(",") if s.strip()],
              targets=[by_name[t] for t in args.targets.split(",")])
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
