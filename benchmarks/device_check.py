"""One prepared device check: what a lent GPU must settle (bf16, cuDNN, speed), in one command under a time budget.

  python -m benchmarks.device_check --out=DIR [--budget_s=480] [--tiny] [--stages=versions,attention,...]

Stages, in this order, each in its own child process with its own time limit (its share of what is left of the
budget; time a stage does not use goes to the later ones). A child writes its results as it goes, so a stage cut
off by its limit still reports what it measured (status "timeout"). All children share one persistent
compilation cache (--cache_dir); the numerics stages (attention, precision) compile without XLA's GPU autotuning.
  versions    python, jax, jaxlib, CUDA plugin, cuDNN, driver, device; measured bf16, TF32 (jax's default f32
              matmul precision on the GPU) and strict f32 matmul peaks
  attention   first cuDNN's fused dropout, read off exactly (one-hot values): drop rate, and whether its masks differ
              between two steps (calls) and between layers (seeds), the condition for using it in training
              (`gp_jax.ops.attention.CUDNN_DROPOUT_VERIFIED`); then cuDNN vs XLA attention in bf16 against an f32
              XLA reference, values and gradients: B16, L 256 and 200, head dim 64, ragged right padding and one
              all-padding row (finite everywhere, compared on valid rows)
  precision   2-layer BERT (BERT-base width) + GP head, 30 steps on one fixed batch: f32 vs bf16, XLA vs cuDNN
              attention (attention dropout 0, hidden dropout 0.1), and a second f32 seed for the seed noise; loss
              and gradient-norm trajectories
  train_step  BERT-base + GP (H=10, d=64), B16 x L256, the trainer's step (`benchmarks.inputs.ProjectStep`):
              attention dropout 0.1 (the default; the fused cuDNN dropout too when stage attention found its masks
              varying), then 0; ms/step, MFU against the measured bf16 peak, compile seconds, seconds from process
              start to first step; then the PyTorch port under autocast bf16, eager and torch.compile, at the same
              dropouts (`benchmarks.train_step.make_torch_step`); alternating rounds of all if time is left
  span_loss   GlobalPointer span loss + gradient, dense vs XLA blockwise (tile 512), L 512 / 2048 / 8192, H 50, D 768:
              time and the compiled program's memory (arguments + outputs + temporaries)
  extras      dropout bits (hash vs threefry) on the 2-layer step; a blocked vs an unblocked step loop

DIR gets device_check.json (a section per stage with its status: ok, skipped (why), failed (error), timeout),
device_check.md (the same as tables) and device_check.log (the children's output). `--tiny`: every stage on tiny
shapes on the CPU (torch and cuDNN parts skipped with their reason); the test suite runs it.

On the lent GPU (docs/benchmarks.md: wheels from `benchmarks/device_wheels.sh`, installed offline):
  python -m benchmarks.device_check --out=$OUT --budget_s=480
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time
import traceback

STAGES = ("versions", "attention", "precision", "train_step", "span_loss", "extras")
SHARES = {"versions": 0.5, "attention": 1.0, "precision": 1.6, "train_step": 5.0, "span_loss": 0.8, "extras": 0.5}
# Stages that check numerics, not speed: their programs skip XLA's GPU autotuning (compiles took 20-45 s each with it
# on an H200, and cut both stages short on 2026-11-26).
NO_AUTOTUNE = ("attention", "precision")
RESULT = "device_check.json"
ROOT = pathlib.Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- results


class Recorder:
  """A stage's result dict, written to its file (atomically) at every `set`, so a killed stage leaves its data."""

  def __init__(self, path: pathlib.Path):
    self.path = path
    self.data = {"status": "running"}
    self.flush()

  def set(self, key: str, value) -> None:
    self.data[key] = value
    self.flush()

  def update(self, key: str, sub: str, value) -> None:
    self.data.setdefault(key, {})[sub] = value
    self.flush()

  def flush(self) -> None:
    tmp = self.path.with_suffix(".tmp")
    tmp.write_text(json.dumps(self.data, indent=1, default=str))
    os.replace(tmp, self.path)


def skipped(why: str) -> dict:
  return {"status": "skipped", "why": why}


def rel_err(a, b) -> float:
  import numpy as np  # pylint: disable=g-import-not-at-top

  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ----------------------------------------------------------------------------- shapes


def shapes(tiny: bool) -> dict:
  from benchmarks import inputs  # pylint: disable=g-import-not-at-top

  tiny_bert = dict(inputs.BERT_BASE, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                   intermediate_size=64, vocab_size=1200)
  if tiny:
    return {"peak_n": 256, "attn": dict(B=3, lengths=(16, 12), heads=2, head_dim=8), "probe_L": 8,
            "precision": dict(hf=tiny_bert, B=2, L=16, steps=3), "train": dict(hf=tiny_bert, B=2, L=16, steps=2),
            "span": dict(lengths=(32, 64), H=4, D=32, block=16, iters=2),
            "extras": dict(hf=tiny_bert, B=2, L=16, steps=2)}
  two_layer = dict(inputs.BERT_BASE, num_hidden_layers=2)
  return {"peak_n": 8192, "attn": dict(B=16, lengths=(256, 200), heads=12, head_dim=64), "probe_L": 64,
          "precision": dict(hf=two_layer, B=16, L=128, steps=30), "train": dict(hf=dict(inputs.BERT_BASE), B=16, L=256,
                                                                                 steps=10),
          "span": dict(lengths=(512, 2048, 8192), H=50, D=768, block=512, iters=5),
          "extras": dict(hf=two_layer, B=16, L=256, steps=10)}


def on_gpu() -> bool:
  import jax  # pylint: disable=g-import-not-at-top

  return jax.default_backend() == "gpu"


def cudnn_reason() -> str | None:
  """Why cuDNN attention cannot run here, or None."""
  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  if not on_gpu():
    import jax  # pylint: disable=g-import-not-at-top

    return f"cuDNN needs a CUDA GPU (backend {jax.default_backend()})"
  if not attention_lib.cudnn_detected():
    return "cuDNN is not detected by this jaxlib"
  return None


def torch_reason() -> str | None:
  """Why the PyTorch port cannot run on the GPU here, or None."""
  if not on_gpu():
    return "the PyTorch comparison runs on a GPU only"
  try:
    import torch  # pylint: disable=g-import-not-at-top
    import transformers  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError as e:
    return f"torch/transformers not importable ({e})"
  if not torch.cuda.is_available():
    return "torch sees no CUDA device"
  return None


# ----------------------------------------------------------------------------- stage a: versions


def _dist_version(*names: str) -> dict:
  from importlib import metadata  # pylint: disable=g-import-not-at-top

  out = {}
  for name in names:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return out


def stage_versions(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jaxlib  # pylint: disable=g-import-not-at-top

  from benchmarks.train_step import matmul_peak  # pylint: disable=g-import-not-at-top

  info = {"python": platform.python_version(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "backend": jax.default_backend(), "devices": [d.device_kind for d in jax.devices()],
          "packages": _dist_version("jax-cuda13-plugin", "jax-cuda13-pjrt", "jax-cuda12-plugin", "jax-cuda12-pjrt",
                                    "flax", "optax", "orbax-checkpoint", "torch", "transformers", "numpy")}
  try:
    from jax._src.lib import cuda_versions  # pylint: disable=g-import-not-at-top

    info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
  except (ImportError, AttributeError, RuntimeError) as e:
    info["cudnn"] = f"unknown ({type(e).__name__})"
  try:
    smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=20, check=True)
    info["nvidia_smi"] = smi.stdout.strip()
  except (OSError, subprocess.SubprocessError) as e:
    info["nvidia_smi"] = f"unavailable ({type(e).__name__})"
  rec.set("versions", info)
  n = ctx["shapes"]["peak_n"]
  peaks = {}
  for name, dtype, precision in (("bf16", "bfloat16", None), ("tf32", "float32", None),
                                 ("f32", "float32", "highest")):
    with jax.default_matmul_precision(precision) if precision else contextlib.nullcontext():
      got = matmul_peak(n, repeats=7, dtype=dtype)
    peaks[name] = {k: round(v, 1) for k, v in got.items()}
    rec.set("peaks_gflops", peaks)
  rec.set("peak_note", f"{n}^3 matmul, best of 7; tf32 = float32 at jax's default precision (TF32 on a GPU's "
                       "tensor cores; plain f32 on a CPU), f32 = precision highest")


# ----------------------------------------------------------------------------- stage b: attention


def _attention_inputs(B, L, H, K, seed):
  import numpy as np  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(seed)
  q, k, v, g = (rng.standard_normal((B, L, H, K)).astype(np.float32) for _ in range(4))
  lengths = rng.integers(1, L + 1, size=B)
  lengths[0], lengths[-1] = L, 0  # one full row, one all-padding row
  mask = np.arange(L)[None, :] < lengths[:, None]
  return q, k, v, g, lengths, mask


def _attention_grads(fn, q, k, v, g):
  """(output, (dq, dk, dv)) of `fn` with cotangent g, from one compiled program."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

  def loss(q, k, v):
    out = fn(q, k, v)
    return jnp.sum(out.astype(jnp.float32) * g), out

  (_, out), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
  return jax.device_get((out, grads))


def stage_attention(rec: Recorder, ctx: dict) -> None:
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["attn"]
  no_cudnn = cudnn_reason()
  if no_cudnn is not None:
    rec.set("dropout", skipped(no_cudnn))
  else:  # first: it decides whether training may use cuDNN's fused dropout
    try:
      rec.set("dropout", cudnn_dropout_probe(ctx["shapes"]["probe_L"]))
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.set("dropout", {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:400]}"})
  for L in s["lengths"]:
    q, k, v, g, lengths, mask = _attention_inputs(s["B"], L, s["heads"], s["head_dim"], seed=L)
    # No cotangent on padding queries: the model's loss never reads them (XLA's padding queries attend to the real
    # keys, cuDNN's output 0, so their cotangent would move dk and dv apart for no reason the model sees).
    g = g * mask[:, :, None, None]
    mask_j = jnp.asarray(mask)
    impls = {"xla_f32": (attention_lib.xla_attention, jnp.float32), "xla_bf16": (attention_lib.xla_attention,
                                                                                   jnp.bfloat16)}
    if no_cudnn is None:
      impls["cudnn_bf16"] = (attention_lib.cudnn_attention, jnp.bfloat16)
    results, errors = {}, {}
    for name, (fn, dtype) in impls.items():
      cast = lambda x, dtype=dtype: jnp.asarray(x, dtype)  # noqa: E731
      try:
        results[name] = _attention_grads(lambda q, k, v, fn=fn: fn(q, k, v, mask_BL=mask_j), cast(q), cast(k),
                                         cast(v), jnp.asarray(g))
      except Exception as e:  # pylint: disable=broad-except
        traceback.print_exc()
        errors[name] = {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"}
    valid_q = mask[:, :, None, None] & (lengths > 0)[:, None, None, None]  # query rows of non-empty examples
    ref_out, ref_grads = results["xla_f32"]
    row = {"B": s["B"], "L": L, "heads": s["heads"], "head_dim": s["head_dim"], "lengths": lengths.tolist()}
    row.update(errors)
    for name in results:
      if name == "xla_f32":
        continue
      out, grads = results[name]
      pick = lambda x: np.asarray(x, np.float32)[np.broadcast_to(valid_q, x.shape)]  # noqa: E731
      row[name] = {
          "finite": bool(np.isfinite(np.asarray(out, np.float32)).all()
                         and all(np.isfinite(np.asarray(x, np.float32)).all() for x in grads)),
          "out_rel_err": rel_err(pick(out), pick(ref_out)),
          **{f"d{n}_rel_err": rel_err(pick(gr), pick(rg)) for n, gr, rg in zip("qkv", grads, ref_grads)}}
    if no_cudnn is not None:
      row["cudnn_bf16"] = skipped(no_cudnn)
    rec.update("compare", f"L{L}", row)
  rec.set("compare_note", "relative L2 error against XLA attention in f32 on the query rows of non-empty examples "
                          "(dk, dv: the same rows' positions; no cotangent on padding queries, which the model "
                          "never reads); finite: outputs and gradients, all rows included")


def cudnn_dropout_probe(L: int, rate: float = 0.1) -> dict:
  """Reads cuDNN's dropout masks exactly: with v one-hot over key positions (head dim = L) the output row of query q
  is its kept, rescaled probabilities. Two calls of one program (two steps), and two layers in one program (the same
  static seed, then distinct seeds)."""
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top

  from gp_jax.ops import attention as attention_lib  # pylint: disable=g-import-not-at-top

  B, H = 2, 2
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((B, L, H, L)) * 0.5, jnp.bfloat16)
  k = jnp.asarray(rng.standard_normal((B, L, H, L)) * 0.5, jnp.bfloat16)
  v = jnp.asarray(np.broadcast_to(np.eye(L)[None, :, None, :], (B, L, H, L)), jnp.bfloat16)
  mask = jnp.ones((B, L), bool)
  drop = lambda q, k, v, seed: attention_lib.cudnn_attention(q, k, v, mask_BL=mask, dropout_rate=rate,  # noqa: E731
                                                             seed=seed)
  step = jax.jit(lambda q, k, v: drop(q, k, v, 0))
  kept_1, kept_2 = (np.asarray(step(q, k, v), np.float32) != 0 for _ in range(2))
  same_seed = jax.jit(lambda q, k, v: (drop(q, k, v, 0), drop(q, k, v, 0)))(q, k, v)
  two_seeds = jax.jit(lambda q, k, v: (drop(q, k, v, 0), drop(q, k, v, 1)))(q, k, v)
  differ = lambda pair: bool((np.asarray(pair[0], np.float32) != np.asarray(pair[1], np.float32)).any())  # noqa: E731
  probs = jax.nn.softmax(jnp.einsum("bqhk,bshk->bhqs", q.astype(jnp.float32), k.astype(jnp.float32)) / np.sqrt(L),
                         axis=-1)
  out = np.asarray(step(q, k, v), np.float32)
  kept = out != 0
  expected = np.swapaxes(np.asarray(probs), 1, 2) / (1 - rate)  # [B, q, H, s]
  result = {
      "rate": rate, "L": L, "drop_fraction": float(1 - kept_1.mean()),
      "steps_differ": bool((kept_1 != kept_2).any()),
      "layers_differ_same_seed": differ(same_seed), "layers_differ_distinct_seeds": differ(two_seeds),
      "kept_values_rel_err": rel_err(out[kept], expected[kept]),
  }
  result["usable_in_training"] = bool(result["steps_differ"] and result["layers_differ_distinct_seeds"]
                                      and abs(result["drop_fraction"] - rate) < 0.03)
  result["status"] = "ok"
  return result


# ----------------------------------------------------------------------------- the trainer's step


def project_step(hf: dict, *, batch: int, seq: int, dtype: str = "auto", attention: str = "auto",
                 attention_dropout: float = 0.1, seed: int = 0, lr: float | None = None):
  """-> (ProjectStep, device batch, FLOPs per step): BERT (`hf`) + GP (H=10, d=64), random init, synthetic batch."""
  from benchmarks.inputs import ProjectStep, bert_config, bert_inputs, synthetic_batch  # pylint: disable=g-import-not-at-top
  from benchmarks.train_step import bert_gp_train_flops  # pylint: disable=g-import-not-at-top

  config, types = bert_config(10, 64)
  config.batch_size = batch
  config.seed = seed
  config.model.dtype = dtype
  config.model.attention = attention
  config.model.attention_dropout = attention_dropout
  if lr is not None:
    config.optimizer.lr, config.optimizer.head_lr, config.optimizer.warmup_steps = lr, lr, 0
  tokenizer, features = bert_inputs(hf)
  step = ProjectStep(config, tokenizer, types, load_weights=False, encoder_config=hf)
  b = synthetic_batch(batch=batch, seq=seq, num_types=len(types), num_prefix=1, num_suffix=1, features=features,
                      min_len=seq // 2)
  flops = bert_gp_train_flops(hf, batch=batch, seq=seq, num_types=len(types), head_size=64)
  return step, step.device_batch(b), flops, b


# ----------------------------------------------------------------------------- stage c: precision


def stage_precision(rec: Recorder, ctx: dict) -> None:
  s = ctx["shapes"]["precision"]
  variants = [("f32 xla seed 0", "float32", "xla", 0), ("bf16 xla seed 0", "bfloat16", "xla", 0),
              ("bf16 cudnn seed 0", "bfloat16", "cudnn", 0), ("f32 xla seed 1", "float32", "xla", 1)]
  no_cudnn = cudnn_reason()
  traj = {}
  for name, dtype, attention, seed in variants:
    if attention == "cudnn" and no_cudnn is not None:
      rec.update("variants", name, skipped(no_cudnn))
      continue
    losses, norms = [], []
    try:
      step, dbatch, _, _ = project_step(s["hf"], batch=s["B"], seq=s["L"], dtype=dtype, attention=attention,
                                        attention_dropout=0.0, seed=seed, lr=1e-4)
      for _ in range(s["steps"]):
        m = step.step(dbatch)
        losses.append(float(m["loss"]))
        norms.append(float(m["grad_norm"]))
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.update("variants", name, {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}",
                                    "loss": losses})
      continue
    traj[name] = {"loss": losses, "grad_norm": norms}
    rec.update("variants", name, {"status": "ok", **traj[name]})
  base = traj.get("f32 xla seed 0")
  if base is None:
    return
  summary = {}
  for name, t in traj.items():
    if name == "f32 xla seed 0":
      continue
    summary[name] = {"max_abs_loss_diff": max(abs(a - b) for a, b in zip(t["loss"], base["loss"])),
                     "final_loss": t["loss"][-1],
                     "max_rel_grad_norm_diff": max(abs(a - b) / max(abs(b), 1e-12)
                                                   for a, b in zip(t["grad_norm"], base["grad_norm"]))}
  summary["f32 xla seed 0"] = {"final_loss": base["loss"][-1]}
  rec.set("summary", summary)
  noise = summary.get("f32 xla seed 1", {}).get("max_abs_loss_diff")
  if noise is not None:
    rec.set("within_seed_noise", {n: v["max_abs_loss_diff"] <= noise for n, v in summary.items()
                                  if "max_abs_loss_diff" in v and n != "f32 xla seed 1"})


# ----------------------------------------------------------------------------- stage d: train step


def stage_train_step(rec: Recorder, ctx: dict) -> None:
  from benchmarks import common  # pylint: disable=g-import-not-at-top
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["train"]
  peak = ((ctx.get("previous", {}).get("versions") or {}).get("peaks_gflops") or {}).get("bf16" if on_gpu() else
                                                                                          "f32", {}).get("jax")
  rec.set("shape", {"B": s["B"], "L": s["L"], "layers": s["hf"]["num_hidden_layers"],
                    "hidden": s["hf"]["hidden_size"], "types": 10, "head_size": 64, "peak_gflops": peak})
  probe = (ctx.get("previous", {}).get("attention") or {}).get("dropout") or {}
  variants = [("ours, attention dropout 0.1", 0.1, None), ("ours, attention dropout 0", 0.0, None)]
  if probe.get("status") == "ok":  # measured on the GPU: time the fused cuDNN dropout too
    variants.append(("ours, attention dropout 0.1, cuDNN fused dropout", 0.1, "1"))
  fns, first_line, host_batch, flops = {}, None, None, None
  for name, rate, cudnn_dropout in variants:
    env_before = os.environ.get("GP_JAX_CUDNN_DROPOUT")
    if cudnn_dropout:
      os.environ["GP_JAX_CUDNN_DROPOUT"] = cudnn_dropout
    try:
      compile_before, t0 = runtime.compile_seconds(), time.perf_counter()
      step, dbatch, flops, host_batch = project_step(s["hf"], batch=s["B"], seq=s["L"], attention_dropout=rate)
      init_s = time.perf_counter() - t0
      t1 = time.perf_counter()
      step.step(dbatch)
      first_s = time.perf_counter() - t1
      if first_line is None:
        first_line = runtime.first_step_line()
        rec.set("first_step", first_line)
      for _ in range(2):
        step.step(dbatch)
      sec = common.median_seconds(lambda step=step, dbatch=dbatch: step.step(dbatch), s["steps"])
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.update("variants", name, {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"})
      continue
    finally:
      if cudnn_dropout:
        if env_before is None:
          os.environ.pop("GP_JAX_CUDNN_DROPOUT", None)
        else:
          os.environ["GP_JAX_CUDNN_DROPOUT"] = env_before
    fns[name] = lambda step=step, dbatch=dbatch: step.step(dbatch)
    rec.update("variants", name, {
        "status": "ok", "ms_per_step": sec * 1e3, "tokens_per_s": s["B"] * s["L"] / sec,
        "mfu": flops / sec / (peak * 1e9) if peak else None, "gflop_per_step": flops / 1e9,
        "init_s": init_s, "first_step_s": first_s, "compile_s": runtime.compile_seconds() - compile_before})
  why = torch_reason() or (None if host_batch is not None else "no project step was built")
  if why is not None:
    rec.update("variants", "torch", skipped(why))
  else:
    import torch  # pylint: disable=g-import-not-at-top

    from benchmarks.train_step import make_torch_step  # pylint: disable=g-import-not-at-top

    torch.backends.cuda.matmul.allow_tf32 = True
    hf = dict(s["hf"], attn_implementation="sdpa")
    for rate in (0.1, 0.0):
      for compiled in (False, True):
        name = f"torch{'.compile' if compiled else ' eager'} autocast bf16, attention dropout {rate:g}"
        try:
          t1 = time.perf_counter()
          fn, attn = make_torch_step(hf, None, batch=host_batch, num_types=10, head_size=64, compiled=compiled,
                                     autocast=True, attention_dropout=rate)
          fn()
          first_s = time.perf_counter() - t1
          for _ in range(2):
            fn()
          sec = common.median_seconds(fn, s["steps"])
        except Exception as e:  # pylint: disable=broad-except
          rec.update("variants", name, {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"})
          continue
        fns[name] = fn
        rec.update("variants", name, {"status": "ok", "ms_per_step": sec * 1e3, "tokens_per_s": s["B"] * s["L"] / sec,
                                      "mfu": flops / sec / (peak * 1e9) if peak else None, "first_step_s": first_s,
                                      "attention": attn})
  if len(fns) > 1:
    rounds = common.alternate(fns, rounds=3, calls=max(3, s["steps"] // 2))
    base = next(iter(fns))
    rec.set("rounds", {name: {"ms_median": rounds.spread(name).median * 1e3,
                              "ms": [None if x is None else x * 1e3 for x in rounds.values[name]],
                              "vs_first": rounds.ratio(name, base).fmt()} for name in fns})
    rec.set("rounds_note", f"3 alternating rounds of every variant; vs_first: per-round time / {base!r}'s, "
                           "median [min..max]; " + rounds.watch.readout())


# ----------------------------------------------------------------------------- stage e: span loss


def stage_span_loss(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  import numpy as np  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

  from benchmarks import common  # pylint: disable=g-import-not-at-top
  from gp_jax.models import GlobalPointer  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["span"]
  H, D = s["H"], s["D"]
  head = GlobalPointer(D, H, head_size=64, rngs=nnx.Rngs(0))
  graphdef, params = nnx.split(head)
  for L in s["lengths"]:
    rng = np.random.default_rng(L)
    hidden = jnp.asarray(rng.standard_normal((1, L, D)), jnp.float32)
    mask = jnp.ones((1, L), jnp.int32)
    starts = rng.integers(0, L - 8, size=(1, H, 8))
    span_ids = jnp.asarray(starts * L + starts + rng.integers(0, 8, size=starts.shape), jnp.int32)
    for mode, block in (("dense", None), ("blockwise", s["block"])):
      key = f"L{L} {mode}"

      def loss_grad(params, hidden, mask, span_ids, block=block):
        return jax.value_and_grad(lambda p: nnx.merge(graphdef, p).span_loss(
            hidden, mask, span_ids=span_ids, block_size=block, implementation="xla"))(params)

      try:
        t0 = time.perf_counter()
        compiled = jax.jit(loss_grad).lower(params, hidden, mask, span_ids).compile()
        compile_s = time.perf_counter() - t0
        mem = compiled.memory_analysis()
        mem_gib = None if mem is None else (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                            - mem.alias_size_in_bytes + mem.temp_size_in_bytes) / 2**30
        run = lambda: jax.block_until_ready(compiled(params, hidden, mask, span_ids))  # noqa: E731
        loss, _ = run()
        sec = common.median_seconds(run, s["iters"])
        rec.update("runs", key, {"status": "ok", "ms": sec * 1e3, "compile_s": compile_s, "program_gib": mem_gib,
                                 "loss": float(loss), "H": H, "D": D, "block": block})
      except Exception as e:  # pylint: disable=broad-except
        rec.update("runs", key, {"status": "failed", "error": f"{type(e).__name__}: {str(e)[:300]}"})
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    rec.set("device_peak_gib", stats["peak_bytes_in_use"] / 2**30)


# ----------------------------------------------------------------------------- stage f: extras


def stage_extras(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top

  from benchmarks import common  # pylint: disable=g-import-not-at-top

  s = ctx["shapes"]["extras"]
  fns, before = {}, os.environ.get("GP_JAX_DROPOUT_BITS")
  try:
    for bits in ("threefry", "hash"):
      os.environ["GP_JAX_DROPOUT_BITS"] = bits  # read when the step is traced
      step, dbatch, _, _ = project_step(s["hf"], batch=s["B"], seq=s["L"], attention_dropout=0.1)
      step.step(dbatch)
      fns[bits] = (step, dbatch)
  finally:
    if before is None:
      os.environ.pop("GP_JAX_DROPOUT_BITS", None)
    else:
      os.environ["GP_JAX_DROPOUT_BITS"] = before
  rounds = common.alternate({b: (lambda st=st, db=db: st.step(db)) for b, (st, db) in fns.items()}, rounds=3,
                            calls=s["steps"])
  rec.set("dropout_bits", {"threefry_ms": rounds.spread("threefry").median * 1e3,
                           "hash_ms": rounds.spread("hash").median * 1e3,
                           "threefry_over_hash": rounds.ratio("threefry", "hash").fmt(),
                           "note": "2-layer BERT step, attention dropout 0.1, 3 alternating rounds; "
                                   + rounds.watch.readout()})
  step, dbatch = fns["threefry"]
  n = s["steps"]

  def unblocked():
    metrics = None
    for _ in range(n):
      step.state, metrics = step.step_fn(step.state, dbatch)
    jax.block_until_ready((step.state, metrics))

  blocked = lambda: [step.step(dbatch) for _ in range(n)]  # noqa: E731
  loops = common.alternate({"blocked": blocked, "unblocked": unblocked}, rounds=3, calls=1)
  rec.set("step_loop", {"blocked_ms_per_step": loops.spread("blocked").median * 1e3 / n,
                        "unblocked_ms_per_step": loops.spread("unblocked").median * 1e3 / n,
                        "blocked_over_unblocked": loops.ratio("blocked", "unblocked").fmt(),
                        "note": f"{n} steps per loop; blocked waits for every step's result, unblocked only for the "
                                "last"})


STAGE_FNS = {"versions": stage_versions, "attention": stage_attention, "precision": stage_precision,
             "train_step": stage_train_step, "span_loss": stage_span_loss, "extras": stage_extras}


# ----------------------------------------------------------------------------- child


def run_child(args) -> int:
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure()
  out = pathlib.Path(args.out)
  rec = Recorder(out / f"_stage_{args.stage}.json")
  prev_path = out / RESULT
  ctx = {"shapes": shapes(args.tiny), "tiny": args.tiny,
         "previous": json.loads(prev_path.read_text()).get("stages", {}) if prev_path.exists() else {}}
  try:
    STAGE_FNS[args.stage](rec, ctx)
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    rec.data.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
    rec.flush()
    return 1
  if rec.data.get("status") == "running":
    rec.data["status"] = "ok"
  rec.flush()
  return 0


# ----------------------------------------------------------------------------- parent


def stage_limits(remaining: float, todo: list[str]) -> float:
  """The next stage's limit: its share of what is left, against the shares of the stages still to run."""
  return remaining * SHARES[todo[0]] / sum(SHARES[s] for s in todo)


def child_env(args, stage: str) -> dict:
  env = dict(os.environ)
  env["JAX_COMPILATION_CACHE_DIR"] = args.cache_dir
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # torch shares the GPU in stage train_step
  env["PYTHONUNBUFFERED"] = "1"
  env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
  if args.tiny:
    env["JAX_PLATFORMS"] = "cpu"
  elif stage in NO_AUTOTUNE and "xla_gpu_autotune_level" not in env.get("XLA_FLAGS", ""):
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
  return env


def run_stage(args, stage: str, limit: float, log) -> dict:
  out = pathlib.Path(args.out)
  part = out / f"_stage_{stage}.json"
  part.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "benchmarks.device_check", f"--out={args.out}", f"--stage={stage}",
         f"--cache_dir={args.cache_dir}"] + (["--tiny"] if args.tiny else [])
  log.write(f"\n===== stage {stage} (limit {limit:.0f} s) {datetime.datetime.now(datetime.timezone.utc):%H:%M:%S} "
            "UTC =====\n")
  log.flush()
  t0 = time.time()
  proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=child_env(args, stage),
                          start_new_session=True)
  timed_out = False
  try:
    proc.wait(timeout=max(1.0, limit))
  except subprocess.TimeoutExpired:
    timed_out = True
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
  data = json.loads(part.read_text()) if part.exists() else {}
  part.unlink(missing_ok=True)
  if timed_out:
    data["status"] = "timeout"
    data["why"] = f"stopped at its limit of {limit:.0f} s; what it had measured is kept"
  elif proc.returncode and data.get("status") in (None, "running", "ok"):
    data["status"] = "failed"
    data.setdefault("error", f"exit {proc.returncode} (device_check.log)")
  data.setdefault("status", "failed")
  data["seconds"] = round(time.time() - t0, 1)
  data["limit_s"] = round(limit, 1)
  return data


def write_results(out: pathlib.Path, result: dict) -> None:
  (out / RESULT).write_text(json.dumps(result, indent=1, default=str))
  (out / "device_check.md").write_text(markdown(result))


def main(argv=None) -> int:
  p = argparse.ArgumentParser(prog="python -m benchmarks.device_check", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--out", required=True, help="folder for device_check.json, device_check.md, device_check.log")
  p.add_argument("--budget_s", type=float, default=480, help="seconds for all stages together (default 480)")
  p.add_argument("--tiny", action="store_true", help="tiny shapes on the CPU (the test suite's run)")
  p.add_argument("--stages", default=",".join(STAGES), help=f"comma list, in order, of {', '.join(STAGES)}")
  p.add_argument("--cache_dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gp_jax_device_check_cache"),
                 help="the persistent compilation cache all stages share")
  p.add_argument("--stage", default="", help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
  if args.stage:
    return run_child(args)
  todo = [s.strip() for s in args.stages.split(",") if s.strip()]
  unknown = [s for s in todo if s not in STAGES]
  if unknown:
    p.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
  os.makedirs(args.cache_dir, exist_ok=True)
  out = pathlib.Path(args.out)
  start = time.time()
  result = {"started_utc": f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S}",
            "command": "python -m benchmarks.device_check " + " ".join(argv if argv is not None else sys.argv[1:]),
            "host": platform.node(), "budget_s": args.budget_s, "tiny": args.tiny, "stages": {}}
  with open(out / "device_check.log", "a") as log:
    while todo:
      stage = todo[0]
      limit = stage_limits(args.budget_s - (time.time() - start), todo)
      result["stages"][stage] = run_stage(args, stage, limit, log)
      status = result["stages"][stage]["status"]
      print(f"device_check: {stage}: {status} ({result['stages'][stage]['seconds']:.0f} s of "
            f"{limit:.0f})", flush=True)
      result["elapsed_s"] = round(time.time() - start, 1)
      write_results(out, result)
      todo.pop(0)
  print(markdown(result))
  return 0 if all(s["status"] in ("ok", "skipped", "timeout") for s in result["stages"].values()) else 1


# ----------------------------------------------------------------------------- markdown


def _fmt(x, spec=".3g") -> str:
  if x is None:
    return "-"
  if isinstance(x, float):
    return format(x, spec)
  return str(x)


def markdown(result: dict) -> str:
  st = result["stages"]
  lines = [f"# Device check, {result['started_utc']} UTC", "",
           f"`{result['command']}` on {result['host']}; budget {result['budget_s']:g} s, used "
           f"{result.get('elapsed_s', 0):g} s{' (tiny shapes)' if result['tiny'] else ''}.", "",
           "| stage | status | seconds (limit) |", "|---|---|---|"]
  for name, s in st.items():
    note = s.get("why") or s.get("error") or ""
    lines.append(f"| {name} | {s['status']}{': ' + note if note else ''} | {s.get('seconds')} ({s.get('limit_s')}) |")
  v = st.get("versions", {})
  if v.get("versions"):
    info = v["versions"]
    lines += ["", "## Versions", "", f"python {info['python']}, jax {info['jax']}, jaxlib {info['jaxlib']}, backend "
              f"{info['backend']}, devices {', '.join(info['devices'])}, cuDNN {info.get('cudnn')}, nvidia-smi: "
              f"{info.get('nvidia_smi')}; {', '.join(f'{k} {x}' for k, x in info.get('packages', {}).items())}"]
  if v.get("peaks_gflops"):
    lines += ["", f"Matmul peaks, GFLOP/s ({v.get('peak_note', '')}):", "", "| dtype | jax | torch |", "|---|---|---|"]
    lines += [f"| {k} | {_fmt(x.get('jax'), '.0f')} | {_fmt(x.get('torch'), '.0f')} |" for k, x in
              v["peaks_gflops"].items()]
  a = st.get("attention", {})
  if a.get("compare"):
    lines += ["", "## Attention: bf16 against f32 XLA", "", a.get("compare_note", ""), "",
              "| L | impl | finite | out | dq | dk | dv |", "|---|---|---|---|---|---|---|"]
    for key, row in a["compare"].items():
      for impl in ("xla_bf16", "cudnn_bf16"):
        r = row.get(impl, {})
        if r.get("status") in ("skipped", "failed"):
          lines.append(f"| {row['L']} | {impl} | {r['status']}: {r.get('why') or r.get('error')} | | | | |")
        elif r:
          lines.append(f"| {row['L']} | {impl} | {r['finite']} | {_fmt(r['out_rel_err'])} | {_fmt(r['dq_rel_err'])} | "
                       f"{_fmt(r['dk_rel_err'])} | {_fmt(r['dv_rel_err'])} |")
  if a.get("dropout"):
    d = a["dropout"]
    lines += ["", "cuDNN fused dropout: " + (f"skipped ({d['why']})" if d.get("status") == "skipped" else
                                             ", ".join(f"{k} {_fmt(x)}" for k, x in d.items() if k != "status"))]
  pr = st.get("precision", {})
  if pr.get("summary"):
    lines += ["", "## Precision: 2-layer BERT + GP, trajectories against f32 XLA seed 0", "",
              "| variant | final loss | max abs loss diff | max rel grad-norm diff |", "|---|---|---|---|"]
    lines += [f"| {n} | {_fmt(x.get('final_loss'), '.4f')} | {_fmt(x.get('max_abs_loss_diff'))} | "
              f"{_fmt(x.get('max_rel_grad_norm_diff'))} |" for n, x in pr["summary"].items()]
    if pr.get("within_seed_noise"):
      lines += ["", "Within seed noise (max loss diff <= f32 seed 0 vs seed 1): " + ", ".join(
          f"{n}: {ok}" for n, ok in pr["within_seed_noise"].items())]
  t = st.get("train_step", {})
  if t.get("variants"):
    sh = t.get("shape", {})
    lines += ["", f"## Train step: BERT ({sh.get('layers')} layers, D={sh.get('hidden')}) + GP, B{sh.get('B')} x "
              f"L{sh.get('L')}", "", f"First step: {t.get('first_step', '-')}.", "",
              "| variant | ms/step | tokens/s | MFU | compile s | first step s |", "|---|---|---|---|---|---|"]
    for n, x in t["variants"].items():
      if x.get("status") != "ok":
        lines.append(f"| {n} | {x.get('status')}: {x.get('why') or x.get('error')} | | | | |")
        continue
      mfu = x.get("mfu")
      lines.append(f"| {n} | {_fmt(x['ms_per_step'], '.1f')} | {_fmt(x['tokens_per_s'], ',.0f')} | "
                   f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {_fmt(x.get('compile_s'), '.1f')} | "
                   f"{_fmt(x.get('first_step_s'), '.1f')} |")
    if t.get("rounds"):
      lines += ["", f"Alternating rounds ({t.get('rounds_note', '')}):", "", "| variant | ms/step (median) | vs first |",
                "|---|---|---|"]
      lines += [f"| {n} | {_fmt(x['ms_median'], '.1f')} | {x['vs_first']} |" for n, x in t["rounds"].items()]
  sl = st.get("span_loss", {})
  if sl.get("runs"):
    lines += ["", "## Span loss + gradient (GlobalPointer, B=1)", "", "| run | ms | program GiB | compile s |",
              "|---|---|---|---|"]
    for n, x in sl["runs"].items():
      if x.get("status") != "ok":
        lines.append(f"| {n} | {x.get('status')}: {x.get('error')} | | |")
      else:
        lines.append(f"| {n} (H={x['H']}, D={x['D']}) | {_fmt(x['ms'], '.2f')} | {_fmt(x['program_gib'], '.3f')} | "
                     f"{_fmt(x['compile_s'], '.1f')} |")
  ex = st.get("extras", {})
  for key in ("dropout_bits", "step_loop"):
    if ex.get(key):
      lines += ["", f"{key}: " + ", ".join(f"{k} {_fmt(x)}" for k, x in ex[key].items())]
  return "\n".join(lines) + "\n"


if __name__ == "__main__":
  sys.exit(main())
