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
              survivors and the PyTorch port under autocast bf16 (`benchmarks.train_step.make_torch_step`) in
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
"""

from __future__ import annotations

import argparse
import ast
import collections
import contextlib
import dataclasses
import datetime
import hashlib
import json
import math
import os
import pathlib
import platform
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
import traceback
from importlib import metadata

import numpy as np

from benchmarks import common
from gp_jax import jax_private, runtime
from gp_jax.data import corpora
from gp_jax.data.sources import synthetic_records

# Deferred imports below: jax and whatever imports it (jaxlib, flax, gp_jax's ops, models, aot and factory,
# benchmarks.inputs and benchmarks.train_step) only in a stage's child, after the parent set that child's environment
# (child_env: JAX_PLATFORMS, XLA_FLAGS, XLA_PYTHON_CLIENT_PREALLOCATE) and runtime.configure() ran; the parent stays
# free of jax. torch and transformers: optional (the PyTorch anchor and the torch rows only) and slow to import.

STAGES = ("versions", "trainer", "attention", "precision", "train_step", "span_loss", "extras")
SHARES = {"versions": 0.5, "trainer": 7.0, "attention": 1.0, "precision": 1.6, "train_step": 5.0, "span_loss": 0.8,
          "extras": 0.5}
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
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


# ----------------------------------------------------------------------------- shapes


def shapes(tiny: bool) -> dict:
  from benchmarks import inputs  # pylint: disable=g-import-not-at-top

  tiny_bert = dict(inputs.BERT_BASE, num_hidden_layers=2, hidden_size=32, num_attention_heads=2,
                   intermediate_size=64, vocab_size=1200)
  if tiny:
    trainer = {"config": "experiments/synthetic.py:encoder=bert", "corpus": None, "lowercase": False, "min_run_s": 5,
               "hf": dict(tiny_bert, max_position_embeddings=128, vocab_size=None),
               # other_head: a third cold compile, ~30 s here
               "runs": ("cold", "anchor", "warm", "fused_vs_reference", "warm_k1"),
               # 24 steps before the first evaluation: fewer would leave a model whose hits overflow the eval's hit
               # buffer, and the bigger buffer's program compiles on first use
               "overrides": ["--config.num_train_steps=48", "--config.num_epochs=0", "--config.eval_every_steps=24",
                             "--config.checkpoint_every_steps=24", "--config.log_every_steps=8",
                             "--config.data.synthetic_records=200", "--config.data.max_eval_records=48",
                             "--config.eval_batch_size=16", "--config.progress_bar=True"],
               "env": {"JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}}  # CPU programs compile in under 1 s
    return {"peak_n": 256, "trainer": trainer, "attn": dict(B=3, lengths=(16, 12), heads=2, head_dim=8), "probe_L": 8,
            "precision": dict(hf=tiny_bert, B=2, L=16, steps=3), "train": dict(hf=tiny_bert, B=2, L=16, steps=2),
            "kernels": dict(hf=tiny_bert, B=2, L=16, steps=30, lr=1e-4, min_s=5, child_s=90),
            "span": dict(lengths=(32, 64), H=4, D=32, block=16, iters=2),
            "extras": dict(hf=tiny_bert, B=2, L=16, steps=2)}
  two_layer = dict(inputs.BERT_BASE, num_hidden_layers=2)
  trainer = {"config": "experiments/su2022.py:dataset=cluener2020,epochs=2", "corpus": "cluener2020", "lowercase": True,
             "min_run_s": 30, "hf": dict(inputs.BERT_BASE), "overrides": [], "env": {}, "runs": TRAINER_RUNS}
  return {"peak_n": 8192, "trainer": trainer, "attn": dict(B=16, lengths=(256, 200), heads=12, head_dim=64),
          "probe_L": 64, "precision": dict(hf=two_layer, B=16, L=128, steps=30),
          # the precision stage's model, batch and learning rate: its bf16-vs-f32 gap is the bar (BF16_F32_GAP)
          "kernels": dict(hf=two_layer, B=16, L=128, steps=30, lr=1e-4, min_s=60, child_s=180),
          "train": dict(hf=dict(inputs.BERT_BASE), B=16, L=256, steps=10),
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
    cuda_versions = jax_private.cuda_versions()
    info["cudnn"] = cuda_versions.cudnn_get_version() if cuda_versions is not None else None
  except (AttributeError, RuntimeError) as e:
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


# ----------------------------------------------------------------------------- stage: trainer


# Issue 56's order: what settles its targets first; what does not fit one call's budget is skipped and says so.
TRAINER_RUNS = ("cold", "anchor", "warm", "fused_vs_reference", "warm_k1", "other_head")
TRAINER_LABELS = {"cold": "cold", "warm": "warm", "warm_k1": "warm, one step per call (steps_per_execution=1)",
                  "other_head": "other head (efficient), after warm", "anchor": "torch anchor (eager)",
                  "fused_vs_reference": "fused vs reference step"}
# Largest loss difference between bf16 and f32 over the precision stage's 30 steps, one H100, 2026-11-26
# (docs/device/README.md): the bar for the fused step against the reference one.
BF16_F32_GAP = 0.011
# model.kernels and optimizer.update_impl of the two steps; both with threefry bits, which each dropout draws from the
# module's stream in the same order (fused hash bits draw every mask's key words at once, so their masks differ).
KERNEL_RUNS = {"fused": {"kernels": "fused", "update": "fused"},
               "reference": {"kernels": "reference", "update": "optax"}}
ANCHOR_EPOCHS = 2  # the trainer's epochs=2
_N = r"([\d.,]+|nan|inf)"
TRAINER_PATTERNS = {
    "program": re.compile(r"compiled ahead: (train|eval) L(\d+) B(\d+)(?: hits (\d+))?: " + _N + r" s \(cache "
                          r"(hit|miss)\)"),
    "ahead": re.compile(r"compiled ahead: (\d+) programs? in " + _N + r" s wall, " + _N + r" s of compile summed, "
                        r"(\d+) threads?"),
    "program_failed": re.compile(r"compiled ahead: (train|eval) L(\d+) B(\d+)(?: hits (\d+))?: failed \((\w+)\)"),
    "on_use": re.compile(r"(\S+): (.*) not compiled ahead; compiling on first use"),
    "hit_growth": re.compile(r"(\S+): (\d+) hits in one batch, growing the hit buffer to (\d+)"),
    "first_step": re.compile(r"first step after " + _N + r" s \(compile " + _N + r" s\)"),
    "eval": re.compile(r"dev@(\d+) evaluation: " + _N + " s"),
    "eval_progress": re.compile(r"dev@(\d+): (\d+)/(\d+) batches in " + _N + " s"),  # reporting.progress
    "pace": re.compile(r"train pace L(\d+): (\d+) steps, " + _N + " ms/step, " + _N + " tokens/s"),
    "checkpoint": re.compile(r"checkpoint at step (\d+): " + _N + " s"),
    "calls": re.compile(r"(\d+) steps in (\d+) calls"),
    "done": re.compile(r"Done \((\w+)\) in " + _N + r" minutes(?:: (\{.*\}))?"),
    "backend": re.compile(r"Mesh .* over (\d+) devices \((\w+)\)"),
}
ANCHOR_PATTERNS = {
    "setup": re.compile(r"setup " + _N + r" s, (\d+) train, (\d+) dev, (\d+) types"),
    "first_step": re.compile(r"first step after " + _N + " s"),
    "epoch": re.compile(r"epoch (\d+): train " + _N + r" s \((\d+) steps\), dev " + _N + r" s, span F1 " + _N
                        + r", loss (\S+)"),
    "done": re.compile(r"done in " + _N + " s"),
}


def _num(s: str) -> float:
  try:
    return float(s.replace(",", ""))
  except ValueError:
    return float("nan")


def _lines(text: str) -> list[str]:
  return re.split(r"[\r\n]+", text)


def parse_trainer_log(text: str) -> dict:
  """What the trainer's log says about its own time: compiles, first step, evaluations, pace, checkpoints; None (or
  empty) for every line it did not print."""
  out = {"backend": None, "programs": [], "compile_programs": None, "compile_wall_s": None, "compile_summed_s": None,
         "compile_threads": None, "first_step_s": None, "first_step_compile_s": None, "evals": [], "pace": {},
         "checkpoints": [], "steps": None, "calls": None, "done_status": None, "done_minutes": None, "done": None,
         "compiled_on_use": [], "hit_growths": []}
  progress_evals = []
  for line in _lines(text):
    if m := TRAINER_PATTERNS["program"].search(line):
      out["programs"].append({"step": m[1], "L": int(m[2]), "B": int(m[3]), "hits": m[4] and int(m[4]),
                              "s": _num(m[5]), "cache": m[6]})
    elif m := TRAINER_PATTERNS["program_failed"].search(line):
      out["programs"].append({"step": m[1], "L": int(m[2]), "B": int(m[3]), "hits": m[4] and int(m[4]), "s": None,
                              "cache": f"failed ({m[5]})"})
    elif m := TRAINER_PATTERNS["on_use"].search(line):
      out["compiled_on_use"].append(f"{m[1]}: {m[2]}")
    elif m := TRAINER_PATTERNS["hit_growth"].search(line):
      out["hit_growths"].append({"at": m[1], "hits": int(m[2]), "size": int(m[3])})
    elif m := TRAINER_PATTERNS["ahead"].search(line):
      out.update(compile_programs=int(m[1]), compile_wall_s=_num(m[2]), compile_summed_s=_num(m[3]),
                 compile_threads=int(m[4]))
    elif (m := TRAINER_PATTERNS["first_step"].search(line)) and out["first_step_s"] is None:
      out.update(first_step_s=_num(m[1]), first_step_compile_s=_num(m[2]))
    elif m := TRAINER_PATTERNS["eval"].search(line):
      out["evals"].append({"step": int(m[1]), "s": _num(m[2])})
    elif (m := TRAINER_PATTERNS["eval_progress"].search(line)) and m[2] == m[3]:
      progress_evals.append({"step": int(m[1]), "s": _num(m[4])})
    elif m := TRAINER_PATTERNS["pace"].search(line):
      out["pace"][m[1]] = {"steps": int(m[2]), "ms_per_step": _num(m[3]), "tokens_per_s": _num(m[4])}
    elif m := TRAINER_PATTERNS["checkpoint"].search(line):
      out["checkpoints"].append({"step": int(m[1]), "s": _num(m[2])})
    elif m := TRAINER_PATTERNS["calls"].search(line):
      out.update(steps=int(m[1]), calls=int(m[2]))
    elif m := TRAINER_PATTERNS["done"].search(line):
      out.update(done_status=m[1], done_minutes=_num(m[2]))
      with contextlib.suppress(ValueError, SyntaxError):
        out["done"] = ast.literal_eval(m[3]) if m[3] else None
    elif (m := TRAINER_PATTERNS["backend"].search(line)) and out["backend"] is None:
      out["backend"] = m[2]
  if not out["evals"]:  # a trainer without the evaluation line: reporting.progress's end-of-evaluation line
    out["evals"] = progress_evals
  out["eval_first_s"] = out["evals"][0]["s"] if out["evals"] else None
  out["eval_second_s"] = out["evals"][1]["s"] if len(out["evals"]) > 1 else None
  out["cache_hits"] = sum(p["cache"] == "hit" for p in out["programs"])
  out["cache_misses"] = sum(p["cache"] == "miss" for p in out["programs"])
  return out


def parse_anchor_log(text: str) -> dict:
  """torch_cluener.py's lines: setup, first step, per-epoch train and evaluation seconds with dev F1, whole wall."""
  out = {"setup_s": None, "first_step_s": None, "epochs": [], "done_s": None}
  for line in _lines(text):
    if m := ANCHOR_PATTERNS["setup"].search(line):
      out["setup_s"] = _num(m[1])
    elif (m := ANCHOR_PATTERNS["first_step"].search(line)) and out["first_step_s"] is None:
      out["first_step_s"] = _num(m[1])
    elif m := ANCHOR_PATTERNS["epoch"].search(line):
      out["epochs"].append({"epoch": int(m[1]), "train_s": _num(m[2]), "steps": int(m[3]), "eval_s": _num(m[4]),
                            "f1": _num(m[5]), "loss": _num(m[6])})
    elif m := ANCHOR_PATTERNS["done"].search(line):
      out["done_s"] = _num(m[1])
  ep = out["epochs"]
  out.update(eval_first_s=ep[0]["eval_s"] if ep else None, eval_second_s=ep[1]["eval_s"] if len(ep) > 1 else None,
             dev_f1=ep[-1]["f1"] if ep else None)
  return out


def write_fake_bert(folder: pathlib.Path, texts, *, hf: dict, lowercase: bool, word_pieces: bool) -> dict:
  """A BERT folder (config.json, model.safetensors, fast tokenizer) with random weights and a char vocabulary of
  `texts` by frequency, written with transformers as a hub checkpoint would be; reused when its spec matches."""
  chars = collections.Counter()
  for text in texts:
    chars.update(text.lower() if lowercase else text)
  vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [c for c, _ in chars.most_common() if not c.isspace()]
  if word_pieces:  # words of several chars (latin text) need their continuation pieces
    vocab += ["##" + c for c in vocab[5:]]
  hf = dict(hf, vocab_size=hf.get("vocab_size") or len(vocab))
  vocab = vocab[:hf["vocab_size"]]
  spec = {"hf": hf, "lowercase": lowercase, "vocab_rows": len(vocab), "vocab_head": "".join(vocab[5:200])}
  if (folder / "fake_bert.json").exists() and json.loads((folder / "fake_bert.json").read_text()) == spec:
    return dict(spec, reused=True)
  import torch  # pylint: disable=g-import-not-at-top
  from transformers import BertConfig, BertModel, BertTokenizerFast  # pylint: disable=g-import-not-at-top

  shutil.rmtree(folder, ignore_errors=True)
  folder.mkdir(parents=True)
  (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  # Positional: transformers 4 calls it vocab_file, 5 vocab (and drops an unknown vocab_file, leaving 5 rows).
  BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=lowercase).save_pretrained(folder)
  if len(BertTokenizerFast.from_pretrained(folder)) != len(vocab):
    raise RuntimeError(f"{folder}: the saved tokenizer lost its vocabulary ({len(vocab)} rows in vocab.txt)")
  torch.manual_seed(0)
  BertModel(BertConfig(**{k: v for k, v in hf.items() if k != "model_type"})).save_pretrained(folder)
  (folder / "fake_bert.json").write_text(json.dumps(spec))
  return dict(spec, reused=False)


def _run_logged(name: str, cmd: list[str], *, env: dict, timeout: float, log_path: pathlib.Path) -> tuple:
  """(exit code or None on timeout, seconds, output): `cmd` from the repo root, its output in `log_path` and also in
  the stage's log."""
  t0 = time.time()
  with open(log_path, "w") as f:
    proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    try:
      rc = proc.wait(timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
      proc.kill()
      proc.wait()
      rc = None
  seconds = time.time() - t0
  text = log_path.read_text(errors="replace")
  print(f"----- {name}: {' '.join(cmd)} (exit {rc}, {seconds:.1f} s) -----\n{text}\n----- end {name} -----", flush=True)
  return rc, seconds, text


def _f1(results: dict, split: str) -> float | None:
  got = results.get(split)
  return got.get("f1") if isinstance(got, dict) else None


def _run_status(rc) -> str:
  return "timeout" if rc is None else "ok" if rc == 0 else "failed"


def stage_trainer(rec: Recorder, ctx: dict) -> None:
  """`python -m gp_jax.main` as a user runs it: cold compilation cache, the PyTorch anchor on the same card, warm,
  the fused step against the reference one, one step per call, another head; what each run spends, from its own
  log."""
  s, args = ctx["shapes"]["trainer"], ctx["args"]
  wanted = [r.strip() for r in args.trainer_runs.split(",") if r.strip()] or list(s["runs"])
  scratch = pathlib.Path(args.scratch_dir)
  scratch.mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, GP_JAX_TFDS_DIR=str(scratch / "tfds"))
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # the runs name their cache folder
  env.update(s["env"])
  no_data = None  # why the trainer runs cannot run (the fused-vs-reference check needs no corpus)
  if ctx["tiny"]:
    texts, data_root = [r["text"] for r in synthetic_records(600, seed=0, prefix="train")], None
  else:
    data_root = pathlib.Path(args.data_dir) if args.data_dir else corpora.default_manual_dir(s["corpus"]).parent
    data_root = data_root.resolve()
    train_file = data_root / s["corpus"] / "train.json"
    if train_file.is_file():
      with train_file.open(encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
      env["GP_JAX_DATA"] = str(data_root)
    else:
      no_data = f"no {train_file} (--data_dir or $GP_JAX_DATA: a folder holding {s['corpus']}/)"
  rec.set("setup", {"config": s["config"], "overrides": s["overrides"], "scratch": str(scratch),
                    "data_dir": data_root and str(data_root), "runs": wanted,
                    "env": {k: env.get(k) for k in ("XLA_FLAGS", "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
                                                     "XLA_PYTHON_CLIENT_PREALLOCATE", "JAX_PLATFORMS")}})
  rec.set("steps_per_execution", {"note": "su2022 runs k steps per call (steps_per_execution=0: auto); warm_k1 "
                                  "is the warm run again at --config.steps_per_execution=1"})
  cache = scratch / "jax_cache"
  extra = {"cold": [], "warm": [], "warm_k1": ["--config.steps_per_execution=1"],
           "other_head": ["--config.model.head=efficient"]}
  fake, backend = scratch / "fake_bert", None
  for name in TRAINER_RUNS:
    if name not in wanted:
      continue
    left = ctx["deadline"] - time.time()
    if name == "fused_vs_reference":
      rec.update("runs", name, fused_vs_reference(rec, ctx, env, left))
      continue
    if no_data is not None:
      rec.update("runs", name, skipped(no_data))
      continue
    if "fake_bert" not in rec.data:  # the trainer's runs and the anchor read it
      t0 = time.perf_counter()
      spec = write_fake_bert(fake, texts, hf=s["hf"], lowercase=s["lowercase"], word_pieces=ctx["tiny"])
      rec.set("fake_bert", {"seconds": round(time.perf_counter() - t0, 1), "vocab_rows": spec["vocab_rows"],
                            "reused": spec["reused"], **{k: spec["hf"][k] for k in ("vocab_size", "num_hidden_layers",
                                                                                    "hidden_size")}})
      left = ctx["deadline"] - time.time()
    if name == "anchor":
      why = anchor_reason(args, tiny=ctx["tiny"], backend=backend)
      if why is None and left < s["min_run_s"]:
        why = f"no time left in the stage's limit ({left:.0f} s)"
      if why is not None:
        rec.update("runs", name, skipped(why))
        continue
      cmd = [sys.executable, str(pathlib.Path(args.anchor).resolve()), str(data_root / s["corpus"]), str(fake),
             str(ANCHOR_EPOCHS), "eager"]
      rec.update("runs", name, {"status": "running", "command": " ".join(cmd)})
      rc, seconds, text = _run_logged(name, cmd, env=env, timeout=left, log_path=scratch / f"{name}.out")
      rec.update("runs", name, {"status": _run_status(rc), "command": " ".join(cmd), "rc": rc,
                                "wall_s": round(seconds, 1), **parse_anchor_log(text),
                                **({"log_tail": text[-3000:]} if rc != 0 else {})})
      continue
    if left < s["min_run_s"]:
      rec.update("runs", name, skipped(f"no time left in the stage's limit ({left:.0f} s)"))
      continue
    if name == "cold":
      shutil.rmtree(cache, ignore_errors=True)
    workdir = scratch / f"workdir_{name}"
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [sys.executable, "-m", "gp_jax.main", f"--config={s['config']}", f"--workdir={workdir}",
           f"--config.model.pretrained={fake}", f"--config.compilation_cache={cache}", *s["overrides"], *extra[name]]
    rec.update("runs", name, {"status": "running", "command": " ".join(cmd)})
    rc, seconds, text = _run_logged(name, cmd, env=env, timeout=left, log_path=scratch / f"{name}.out")
    parsed = parse_trainer_log(text)
    results_path = workdir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    backend = backend or parsed["backend"]
    rec.update("runs", name, {"status": _run_status(rc), "command": " ".join(cmd), "rc": rc,
                              "wall_s": round(seconds, 1), "wall_minutes": results.get("wall_minutes"),
                              "dev_f1": _f1(results, "dev"), "test_f1": _f1(results, "test"), **parsed,
                              **({"log_tail": text[-3000:]} if rc != 0 else {})})
    shutil.rmtree(workdir, ignore_errors=True)  # checkpoints: GBs at BERT-base


# ----------------------------------------------------------------------------- trainer stage: fused vs reference


def kernels_variant(name: str, k: dict, plant: bool = False) -> StepVariant:
  """The step `name` of KERNEL_RUNS: the 2-layer model with attention dropout 0.1 on XLA attention (the path fused
  rewrites; cuDNN's dropout masks are its own) and threefry bits, seed 0, a constant learning rate."""
  return StepVariant(f"{name} step", dict(KERNEL_RUNS[name], attention="xla", attention_dropout=0.1,
                                          dropout_bits="threefry", seed=0, lr=k["lr"]), plant=plant)


def _flat_params(params) -> dict:
  import jax  # pylint: disable=g-import-not-at-top

  return {jax.tree_util.keystr(path): np.asarray(x, np.float32)
          for path, x in jax.tree_util.tree_leaves_with_path(jax.device_get(params))}


def _fingerprint(flat: dict) -> str:
  h = hashlib.sha256()
  for key in sorted(flat):
    h.update(key.encode())
    h.update(np.ascontiguousarray(flat[key]).tobytes())
  return h.hexdigest()[:16]


def kernels_files(scratch: pathlib.Path, name: str) -> dict:
  """Where child `name` leaves its parameters: after the first step; and, for the reference, at init."""
  files = {"step1": scratch / f"kernels_{name}_step1.npz"}
  if name == "reference":
    files["init"] = scratch / "kernels_init.npz"
  return files


def run_kernels_child(args) -> int:
  """One side of the fused-vs-reference check, in its own process: build and compile as the trainer does
  (`build_variant`), then `steps` steps on one fixed batch; losses and gradient norms in `_kernels_NAME.json` as they
  come, the parameters after the first step (and the reference's at init) in the scratch folder."""
  runtime.configure()
  name, k = args.kernels_child, shapes(args.tiny)["kernels"]
  rec = Recorder(pathlib.Path(args.out) / f"_kernels_{name}.json")
  files = kernels_files(pathlib.Path(args.scratch_dir), name)
  try:
    step, dbatch, facts = build_variant(kernels_variant(name, k, plant=args.plant_abort), k)
    params = _flat_params(step.state["params"])
    rec.data.update(facts, dtype=step.setup.spec.precision.dtype, init_fingerprint=_fingerprint(params),
                    loss=[], grad_norm=[])
    if "init" in files:
      np.savez(files["init"], **params)
    del params
    rec.flush()
    c = facts["choices"]
    print(f"kernels {name}: built, kernels {c['bert_kernels']}, update {c['optimizer_update']}, attention "
          f"{c['attention']}, dropout bits {c['dropout_bits']}, dtype {rec.data['dtype']}, compile "
          f"{facts['compile_wall_s']:.1f} s", flush=True)
    for i in range(k["steps"]):
      metrics = step.step(dbatch)
      rec.data["loss"].append(float(metrics["loss"]))
      rec.data["grad_norm"].append(float(metrics["grad_norm"]))
      if i == 0:
        np.savez(files["step1"], **_flat_params(step.state["params"]))
      rec.flush()
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    rec.data.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
    rec.flush()
    return 1
  print(f"kernels {name}: {k['steps']} steps, loss {rec.data['loss'][0]:.4f} -> {rec.data['loss'][-1]:.4f}",
        flush=True)
  rec.data["status"] = "ok"
  rec.flush()
  return 0


def compare_params(step1: dict, init: pathlib.Path | None = None) -> dict:
  """The fused step's parameters after one step against the reference's (`step1`: name -> .npz): largest absolute
  difference (and its leaf), the difference's L2 norm relative to the parameters' and to the reference step's update
  (from `init`, the parameters both started from)."""
  fused, ref = np.load(step1["fused"]), np.load(step1["reference"])
  start = np.load(init) if init is not None and init.exists() else None
  if set(fused.files) != set(ref.files):
    return {"error": f"different parameters: {sorted(set(fused.files) ^ set(ref.files))[:5]}"}
  max_abs, worst, diff2, ref2, update2 = 0.0, None, 0.0, 0.0, 0.0
  for key in sorted(ref.files):
    r = ref[key].astype(np.float64)
    d = fused[key].astype(np.float64) - r
    m = float(np.max(np.abs(d))) if d.size else 0.0
    if worst is None or m > max_abs:
      max_abs, worst = m, key
    diff2 += float(np.sum(d * d))
    ref2 += float(np.sum(r * r))
    if start is not None:
      update2 += float(np.sum((r - start[key]) ** 2))
  return {"leaves": len(ref.files), "max_abs": max_abs, "max_abs_leaf": worst,
          "rel_to_params": math.sqrt(diff2 / ref2) if ref2 else None,
          "rel_to_update": math.sqrt(diff2 / update2) if update2 else None}


def kernels_verdict(fused: dict, reference: dict, *, steps: int, gap: float = BF16_F32_GAP) -> dict:
  """The two trajectories against each other: largest loss difference over the steps (and where) against `gap`,
  largest relative gradient-norm difference; pass only when both ran every step, finite, from the same init."""
  lf, lr = fused.get("loss") or [], reference.get("loss") or []
  n = min(len(lf), len(lr))
  diffs = [abs(a - b) for a, b in zip(lf, lr)]
  out = {"steps_compared": n, "gap": gap,
         "same_init": fused.get("init_fingerprint") is not None
                      and fused.get("init_fingerprint") == reference.get("init_fingerprint"),
         "max_abs_loss_diff": max(diffs) if diffs else None,
         "at_step": 1 + int(np.argmax(diffs)) if diffs else None,
         "max_rel_grad_norm_diff": max((abs(a - b) / max(abs(b), 1e-12) for a, b in
                                        zip(fused.get("grad_norm") or [], reference.get("grad_norm") or [])),
                                       default=None)}
  finite = all(math.isfinite(x) for x in lf[:n] + lr[:n])
  whys = [why for bad, why in ((n < steps, f"{n} of {steps} steps on both"), (not finite, "a loss not finite"),
                               (not out["same_init"], "the two started from different parameters")) if bad]
  if not whys and out["max_abs_loss_diff"] > gap:
    whys.append(f"largest loss difference {out['max_abs_loss_diff']:.3g} (step {out['at_step']}) over the gap {gap}")
  out["pass"] = not whys
  out["verdict"] = ("pass: " + f"largest loss difference {out['max_abs_loss_diff']:.3g} (step {out['at_step']}) <= "
                    f"{gap}") if not whys else "fail: " + "; ".join(whys)
  return out


def fused_vs_reference(rec: Recorder, ctx: dict, env: dict, left: float) -> dict:
  """The fused BERT step and AdamW update against the reference formulation, each in its own process (one that
  aborts loses its side only): same model, init, batch and dropout masks, `steps` steps; the row it makes."""
  args, k = ctx["args"], ctx["shapes"]["kernels"]
  hf = k["hf"]
  row = {"status": "running", "gap": BF16_F32_GAP,
         "shape": {"layers": hf["num_hidden_layers"], "hidden": hf["hidden_size"], "heads": hf["num_attention_heads"],
                   "intermediate": hf["intermediate_size"], "vocab": hf["vocab_size"], "B": k["B"], "L": k["L"],
                   "steps": k["steps"], "lr": k["lr"]},
         "note": "each in its own process from the same init (seed 0) on one fixed synthetic batch; attention "
                 "dropout 0.1 on XLA attention and hidden dropout 0.1, threefry bits (the same masks on both); "
                 "dtype auto (bf16 on a GPU); compiled as the trainer compiles (aot.resolve), without GPU autotuning"}
  if left < k["min_s"]:
    return skipped(f"no time left in the stage's limit ({left:.0f} s)")
  scratch = pathlib.Path(args.scratch_dir)
  child_env = dict(env, JAX_COMPILATION_CACHE_DIR=args.cache_dir)
  child_env.pop(runtime.DROPOUT_BITS_ENV, None)  # it would override the threefry bits both sides need
  if ctx["tiny"]:  # JAX's rolled threefry lowering on the CPU: the same bits, less to compile than the unrolled one
    child_env.setdefault("GP_JAX_THREEFRY", "rolled")
  elif "xla_gpu_autotune_level" not in child_env.get("XLA_FLAGS", ""):
    child_env["XLA_FLAGS"] = (child_env.get("XLA_FLAGS", "") + " --xla_gpu_autotune_level=0").strip()
  sides = {}
  for i, name in enumerate(KERNEL_RUNS):
    files = kernels_files(scratch, name)
    for path in files.values():
      path.unlink(missing_ok=True)
    left = ctx["deadline"] - time.time()
    if left < k["min_s"] / 2:
      sides[name] = skipped(f"no time left in the stage's limit ({left:.0f} s)")
    else:
      timeout = min(k["child_s"], left / (len(KERNEL_RUNS) - i))
      part = pathlib.Path(args.out) / f"_kernels_{name}.json"
      part.unlink(missing_ok=True)
      cmd = [sys.executable, "-m", "benchmarks.device_check", f"--out={args.out}", "--stage=trainer",
             f"--kernels_child={name}", f"--scratch_dir={args.scratch_dir}", f"--cache_dir={args.cache_dir}"]
      cmd += (["--tiny"] if args.tiny else []) + (["--plant_abort"] if args.plant_abort else [])
      rc, seconds, text = _run_logged(f"fused_vs_reference {name}", cmd, env=child_env, timeout=timeout,
                                      log_path=scratch / f"kernels_{name}.out")
      got = json.loads(part.read_text()) if part.exists() else {}
      for path in (part, part.with_suffix(".tmp")):
        path.unlink(missing_ok=True)
      sides[name] = _child_outcome(dict(got, rc=rc, seconds=round(seconds, 1)), rc, text, timeout)
    rec.update("runs", "fused_vs_reference", dict(row, sides=sides))
  lost = {f"fused_vs_reference/{n}": x.get("signal") or x["status"] for n, x in sides.items()
          if x["status"] in ("aborted", "failed", "timeout")}
  if lost:
    rec.set("lost", dict(rec.data.get("lost", {}), **lost))
  files = {n: kernels_files(scratch, n) for n in KERNEL_RUNS}
  row["sides"] = sides
  if all(x["status"] == "ok" for x in sides.values()):
    row.update(status="ok", **kernels_verdict(sides["fused"], sides["reference"], steps=k["steps"]))
    row["params_after_one_step"] = compare_params({n: f["step1"] for n, f in files.items()},
                                                  files["reference"]["init"])
  else:
    row.update(status="failed", verdict="no comparison: " + ", ".join(
        f"{n} {x['status']}" + (f" ({x['signal']})" if x.get("signal") else "")
        for n, x in sides.items() if x["status"] != "ok"))
  for f in files.values():
    for path in f.values():
      path.unlink(missing_ok=True)
  return row


def anchor_reason(args, *, tiny: bool, backend: str | None) -> str | None:
  """Why the PyTorch anchor cannot run here, or None."""
  if not args.anchor:
    return "no --anchor given (the PyTorch port's script)"
  if tiny:
    return "the anchor runs on a GPU only (--tiny runs on the CPU)"
  if backend not in (None, "gpu"):  # None: no trainer run before it in this call; torch decides below
    return f"the anchor runs on a GPU only (the trainer ran on {backend})"
  if not pathlib.Path(args.anchor).is_file():
    return f"--anchor={args.anchor} is not a file"
  try:
    probe = subprocess.run([sys.executable, "-c", "import torch, transformers; print(torch.cuda.is_available())"],
                           capture_output=True, text=True, timeout=120, check=False)
  except subprocess.TimeoutExpired:
    return "importing torch took over 120 s"
  if probe.returncode:
    return f"torch/transformers not importable ({probe.stderr.strip().splitlines()[-1:]})"
  if probe.stdout.strip().splitlines()[-1:] != ["True"]:
    return "torch sees no CUDA device"
  return None


# ----------------------------------------------------------------------------- stage b: attention


def _attention_inputs(B, L, H, K, seed):
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

# Environment variables a process may change between variants: the project reads them when it traces a program.
# Any other (XLA_FLAGS: read once, when the backend starts) makes a variant's own process the only place it is timed.
IN_PROCESS_ENV = ("GP_JAX_CUDNN_DROPOUT", "GP_JAX_DROPOUT_BITS")
VARIANT_TAIL_LINES = 20


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
  plant: bool = False  # tests only (--plant_abort): its process aborts after building, as cuDNN's did
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
  """The PyTorch port under autocast bf16 (`benchmarks.train_step.make_torch_step`), in the stage's process."""

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

  with runtime.environ({k: x for k, x in v.env.items() if k in IN_PROCESS_ENV}):
    compile_before, t0 = runtime.compile_seconds(), time.perf_counter()
    step, dbatch, flops, _ = project_step(s["hf"], batch=s["B"], seq=v.seq(s), **v.model)
    if v.plant:  # before compiling: the tests' stand-in costs no compile
      plant_abort()
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
  """The tests' stand-in for cuDNN's abort: SIGABRT after building, without a core file."""
  with contextlib.suppress(ValueError, OSError):
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
  print("planted abort: os.abort() after building the step (--plant_abort)", flush=True)
  os.abort()


def run_variant_child(args) -> int:
  """One variant's survival run, in its own process: build, compile, a first step, a few more timed; results in
  `_variant_KEY.json` as they come, so whatever kills the process leaves what it had."""
  runtime.configure()
  v = {**(PLANTED if args.plant_abort else {}), **TRAIN_VARIANTS}[args.variant]
  s = shapes(args.tiny)["train"]
  rec = Recorder(pathlib.Path(args.out) / f"_variant_{args.variant}.json")
  try:
    step, dbatch, facts = build_variant(v, s)
    rec.data.update(facts)
    rec.flush()
    c = facts["choices"]
    print(f"variant {args.variant}: built, attention {c['attention']}, dropout bits {c['dropout_bits']}, XLA options "
          f"{c['xla_options'] or 'none'}, compile {facts['compile_wall_s']:.1f} s", flush=True)
    t1 = time.perf_counter()
    step.step(dbatch)
    rec.data.update(first_call_s=time.perf_counter() - t1, first_step_s=runtime.process_seconds(),
                    first_step=runtime.first_step_line())
    rec.flush()
    for _ in range(2):
      step.step(dbatch)
    sec = common.median_seconds(lambda: step.step(dbatch), s["steps"])
  except Exception as e:  # pylint: disable=broad-except
    traceback.print_exc()
    rec.data.update(status="failed", error=f"{type(e).__name__}: {str(e)[:500]}")
    rec.flush()
    return 1
  print(f"variant {args.variant}: {sec * 1e3:.2f} ms/step (median of {s['steps']})", flush=True)
  rec.data.update(status="ok", ms_per_step=sec * 1e3, tokens_per_s=s["B"] * v.seq(s) / sec, steps=s["steps"],
                  length=v.seq(s))
  rec.flush()
  return 0


def _signal_name(number: int) -> str:
  try:
    return signal.Signals(number).name
  except ValueError:
    return f"signal {number}"


def run_variant(args, key: str, v: StepVariant, timeout: float) -> dict:
  """Runs variant `key` in a child of this process (same process group, so the stage's limit kills it too) ->
  its row: what the child recorded, and for a child that died by a signal or exited nonzero, status aborted or failed,
  the signal or exit code and its last log lines."""
  out = pathlib.Path(args.out)
  part, log_path = out / f"_variant_{key}.json", out / f"_variant_{key}.log"
  part.unlink(missing_ok=True)
  cmd = [sys.executable, "-m", "benchmarks.device_check", f"--out={args.out}", "--stage=train_step",
         f"--variant={key}", f"--cache_dir={args.cache_dir}"]
  cmd += (["--tiny"] if args.tiny else []) + (["--plant_abort"] if args.plant_abort else [])
  env = dict(os.environ, **{k: x for k, x in v.env.items() if k != "XLA_FLAGS"})
  if "XLA_FLAGS" in v.env:
    env["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {v.env['XLA_FLAGS']}".strip()
  rc, seconds, text = _run_logged(f"variant {key}", cmd, env=env, timeout=timeout, log_path=log_path)
  row = json.loads(part.read_text()) if part.exists() else {}
  for path in (part, part.with_suffix(".tmp"), log_path):
    path.unlink(missing_ok=True)
  row.update(label=v.label, rc=rc, seconds=round(seconds, 1), env=v.env or None)
  return _child_outcome(row, rc, text, timeout)


def _child_outcome(row: dict, rc: int | None, text: str, timeout: float) -> dict:
  """`row`, what a child recorded, with how its process ended: timeout, aborted (the signal it died by) or failed
  (nonzero exit, or no "ok" recorded); any but ok with the last lines of its output."""
  if rc is None:
    row.update(status="timeout", why=f"stopped at its limit of {timeout:.0f} s")
  elif rc < 0:
    row.update(status="aborted", signal=_signal_name(-rc), why=f"its process died by {_signal_name(-rc)}")
  elif rc > 0 or row.get("status") != "ok":
    row["status"] = "failed"
    row.setdefault("error", f"exit {rc}")
  if row["status"] != "ok":
    row["log_tail"] = [line[:400] for line in _lines(text.rstrip())[-VARIANT_TAIL_LINES:]]
  return row


def _variant_timeout(left: float, todo: int, tiny: bool) -> float:
  """A variant child's limit: up to twice its share of what is left (the variants still to run and the rounds)."""
  return min(left, max(30.0 if tiny else 90.0, 2 * left / (todo + 1)))


def stage_train_step(rec: Recorder, ctx: dict) -> None:
  """Each of our variants first alone in its own process (an abort there loses only its row), then the survivors
  and the PyTorch port in alternating rounds in this one."""
  from benchmarks.train_step import bert_gp_train_flops  # pylint: disable=g-import-not-at-top

  s, args = ctx["shapes"]["train"], ctx["args"]
  peak = ((ctx.get("previous", {}).get("versions") or {}).get("peaks_gflops") or {}).get("bf16" if on_gpu() else
                                                                                          "f32", {}).get("jax")
  flops = bert_gp_train_flops(s["hf"], batch=s["B"], seq=s["L"], num_types=10, head_size=64)
  mfu = lambda ms: flops / (ms / 1e3) / (peak * 1e9) if peak and ms else None  # noqa: E731
  rec.set("shape", {"B": s["B"], "L": s["L"], "layers": s["hf"]["num_hidden_layers"],
                    "hidden": s["hf"]["hidden_size"], "types": 10, "head_size": 64, "peak_gflops": peak})
  probe = (ctx.get("previous", {}).get("attention") or {}).get("dropout")
  if probe:
    rec.set("cudnn_dropout_probe", {k: probe.get(k) for k in ("status", "usable_in_training", "why")
                                    if probe.get(k) is not None})
  table = train_variants(args.train_variants, args.plant_abort)
  ours = [(k, v) for k, v in table.items() if isinstance(v, StepVariant)]
  rows, survivors = {}, []
  for i, (key, v) in enumerate(ours):
    why = variant_reason(v)
    left = ctx["deadline"] - time.time()
    if why is None and left < (5 if ctx["tiny"] else 30):
      why = f"no time left in the stage's limit ({left:.0f} s)"
    if why is not None:
      rows[key] = {"label": v.label, **skipped(why)}
    else:
      rows[key] = run_variant(args, key, v, _variant_timeout(left, len(ours) - i, ctx["tiny"]))
      if rows[key]["status"] == "ok":
        rows[key]["mfu"] = None if v.length else mfu(rows[key]["ms_per_step"])
        rows[key]["timed"] = v.child_only() or "alone in its own process, then in the rounds"
        survivors.append(key)
        if "first_step" not in rec.data:
          rec.set("first_step", rows[key]["first_step"])
          rec.set("first_step_note", f"{v.label}, in its own process, timed from that process's start")
    rec.update("variants", key, rows[key])
  lost = {k: r.get("signal") or r["status"] for k, r in rows.items() if r["status"] in ("aborted", "failed", "timeout")}
  if lost:
    rec.set("lost", lost)
  torch_keys = [k for k, v in table.items() if isinstance(v, TorchVariant)]
  why = torch_reason() if torch_keys else None
  again = [k for k in survivors if not table[k].child_only()]
  if len(again) + (0 if why else len(torch_keys)) < 2:  # nothing to alternate with
    for key in again:
      rec.update("variants", key, dict(rows[key], timed="alone in its own process (no other variant to alternate "
                                       "with)"))
    again = []
  fns = {}
  for key in again:
    v = table[key]
    if ctx["deadline"] - time.time() < (5 if ctx["tiny"] else 30):
      rec.update("variants", key, dict(rows[key], timed="alone in its own process (no time left for the rounds)"))
      continue
    try:
      step, dbatch, _ = build_variant(v, s)
      for _ in range(2):
        step.step(dbatch)
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.update("variants", key, dict(rows[key], timed="alone only: building it again in the stage's process "
                                       f"failed ({type(e).__name__}: {str(e)[:300]})"))
      continue
    fns[key] = lambda step=step, dbatch=dbatch: step.step(dbatch)
  for key in torch_keys:
    v = table[key]
    if why is not None:
      rec.update("variants", key, {"label": v.label, **skipped(why)})
      continue
    import torch  # pylint: disable=g-import-not-at-top

    from benchmarks.train_step import make_torch_step  # pylint: disable=g-import-not-at-top

    torch.backends.cuda.matmul.allow_tf32 = True
    try:
      t1 = time.perf_counter()
      fn, attn = make_torch_step(dict(s["hf"], attn_implementation="sdpa"), None,
                                 batch=train_batch(s["hf"], batch=s["B"], seq=s["L"]), num_types=10, head_size=64,
                                 compiled=v.compiled, autocast=True, attention_dropout=v.attention_dropout)
      fn()
      first_s = time.perf_counter() - t1
      for _ in range(2):
        fn()
      sec = common.median_seconds(fn, s["steps"])
    except Exception as e:  # pylint: disable=broad-except
      traceback.print_exc()
      rec.update("variants", key, {"label": v.label, "status": "failed",
                                   "error": f"{type(e).__name__}: {str(e)[:300]}"})
      continue
    fns[key] = fn
    rec.update("variants", key, {"label": v.label, "status": "ok", "ms_per_step": sec * 1e3,
                                 "tokens_per_s": s["B"] * s["L"] / sec, "mfu": mfu(sec * 1e3), "first_step_s": first_s,
                                 "attention": attn, "timed": "in the stage's process, then in the rounds"})
  if len(fns) > 1:
    rounds = common.alternate(fns, rounds=3, calls=max(3, s["steps"] // 2))
    base = next(iter(fns))
    rec.set("rounds", {key: {"label": table[key].label, "ms_median": rounds.spread(key).median * 1e3,
                             "ms": [None if x is None else x * 1e3 for x in rounds.values[key]],
                             "vs_first": rounds.ratio(key, base).fmt()} for key in fns})
    rec.set("rounds_note", f"3 alternating rounds of every variant in one process; vs_first: per-round time / "
                           f"{table[base].label!r}'s, median [min..max]; " + rounds.watch.readout())


# ----------------------------------------------------------------------------- stage e: span loss


def stage_span_loss(rec: Recorder, ctx: dict) -> None:
  import jax  # pylint: disable=g-import-not-at-top
  import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
  from flax import nnx  # pylint: disable=g-import-not-at-top

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

  s = ctx["shapes"]["extras"]
  fns = {}
  for bits in ("threefry", "hash"):  # model.dropout_bits ($GP_JAX_DROPOUT_BITS, when set, overrides both)
    step, dbatch, _, _ = project_step(s["hf"], batch=s["B"], seq=s["L"], attention_dropout=0.1, dropout_bits=bits)
    step.step(dbatch)
    fns[bits] = (step, dbatch)
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


STAGE_FNS = {"versions": stage_versions, "trainer": stage_trainer, "attention": stage_attention,
             "precision": stage_precision, "train_step": stage_train_step, "span_loss": stage_span_loss,
             "extras": stage_extras}


# ----------------------------------------------------------------------------- child


def run_child(args) -> int:
  if args.variant:
    return run_variant_child(args)
  if args.kernels_child:
    return run_kernels_child(args)
  runtime.configure()
  start = time.time()
  out = pathlib.Path(args.out)
  rec = Recorder(out / f"_stage_{args.stage}.json")
  prev_path = out / RESULT
  margin = max(3.0, 0.03 * args.limit_s)  # to stop a subprocess and write its results before the parent's kill
  ctx = {"shapes": shapes(args.tiny), "tiny": args.tiny, "args": args,
         "deadline": start + args.limit_s - margin if args.limit_s else math.inf,
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
  if stage != "trainer":  # the trainer runs as a user's command does
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
         f"--cache_dir={args.cache_dir}", f"--limit_s={limit:.1f}", f"--data_dir={args.data_dir}",
         f"--anchor={args.anchor}", f"--trainer_runs={args.trainer_runs}", f"--scratch_dir={args.scratch_dir}",
         f"--train_variants={args.train_variants}"]
  cmd += (["--tiny"] if args.tiny else []) + (["--plant_abort"] if args.plant_abort else [])
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
    how = f"killed by {_signal_name(-proc.returncode)}" if proc.returncode < 0 else f"exit {proc.returncode}"
    data.setdefault("error", f"{how} (device_check.log)")
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
  p.add_argument("--data_dir", default=os.environ.get("GP_JAX_DATA", ""),
                 help="trainer: the folder holding cluener2020/ (default $GP_JAX_DATA, else gp_jax's default)")
  p.add_argument("--anchor", default="", help="trainer: the PyTorch port's script (torch_cluener.py); none: skipped")
  p.add_argument("--trainer_runs", default="", help=f"trainer: comma list of {', '.join(TRAINER_RUNS)} (run in "
                 "this order; default all, --tiny all but other_head)")
  p.add_argument("--scratch_dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "gp_jax_device_trainer"),
                 help="trainer: the fake BERT, the runs' compilation cache, workdirs and output (not under --out)")
  p.add_argument("--train_variants", default="", help="train_step: comma list of our and the PyTorch port's "
                 f"variants ({', '.join(TRAIN_VARIANTS)}; default those marked default in TRAIN_VARIANTS)")
  p.add_argument("--stage", default="", help=argparse.SUPPRESS)
  p.add_argument("--limit_s", type=float, default=0.0, help=argparse.SUPPRESS)
  p.add_argument("--variant", default="", help=argparse.SUPPRESS)  # a train_step variant's own process
  p.add_argument("--kernels_child", default="", choices=("", *KERNEL_RUNS), help=argparse.SUPPRESS)  # one side of
  # the trainer stage's fused-vs-reference check
  p.add_argument("--plant_abort", action="store_true", help=argparse.SUPPRESS)  # tests: a variant, and both
  # sides of the fused-vs-reference check, abort
  args = p.parse_args(argv)
  pathlib.Path(args.out).mkdir(parents=True, exist_ok=True)
  if args.stage:
    return run_child(args)
  todo = [s.strip() for s in args.stages.split(",") if s.strip()]
  unknown = [s for s in todo if s not in STAGES]
  if unknown:
    p.error(f"unknown stages {unknown}; known: {', '.join(STAGES)}")
  unknown = [r for r in args.trainer_runs.split(",") if r.strip() and r.strip() not in TRAINER_RUNS]
  if unknown:
    p.error(f"unknown trainer runs {unknown}; known: {', '.join(TRAINER_RUNS)}")
  try:
    train_variants(args.train_variants)
  except ValueError as e:
    p.error(str(e))
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


def trainer_markdown(t: dict) -> list[str]:
  """The trainer stage's table: one row per run."""
  if not t.get("runs"):
    return []
  setup, fake = t.get("setup", {}), t.get("fake_bert")
  fake = (f"Fake BERT ({fake.get('num_hidden_layers')} layers, D={fake.get('hidden_size')}, vocabulary "
          f"{fake.get('vocab_size')} rows, {fake.get('vocab_rows')} in vocab.txt; random weights). " if fake else "")
  lines = ["", f"## Trainer: `python -m gp_jax.main --config={setup.get('config')}` "
           f"{' '.join(setup.get('overrides', []))}", "",
           f"{fake}Seconds; compile: the compile-ahead line's wall / summed seconds, programs and cache hits / misses; "
           "steady: `train pace` ms/step by bucket. steps_per_execution: "
           f"{t.get('steps_per_execution', {}).get('note', '-')}.", "",
           "| run | status | first step (compile) | compile wall / summed | programs (hit / miss) | eval 1 / 2 | "
           "steady ms/step | checkpoint | whole wall | dev F1 |", "|---|---|---|---|---|---|---|---|---|---|"]
  for name, r in t["runs"].items():
    label = TRAINER_LABELS.get(name, name)
    if r.get("status") == "skipped":
      lines.append(f"| {label} | skipped: {r.get('why')} | | | | | | | | |")
      continue
    if name == "fused_vs_reference":
      lines.append(f"| {label} | {r.get('status')}: {r.get('verdict', '-')} (below) | | | | | | | | |")
      continue
    status = r.get("status", "-") + (f" (exit {r['rc']})" if r.get("rc") not in (0, None) else "")
    evals = f"{_fmt(r.get('eval_first_s'), '.2f')} / {_fmt(r.get('eval_second_s'), '.2f')}"
    if name == "anchor":
      epochs = " / ".join(f"{e['train_s']:.1f} s ({e['steps']})" for e in r.get("epochs", []))
      lines.append(f"| {label} | {status} | {_fmt(r.get('first_step_s'), '.1f')} | - | - | {evals} | "
                   f"epochs (steps): {epochs or '-'} | - | {_fmt(r.get('done_s') or r.get('wall_s'), '.1f')} | "
                   f"{_fmt(r.get('dev_f1'), '.4f')} |")
      continue
    first = (f"{_fmt(r.get('first_step_s'), '.1f')} ({_fmt(r.get('first_step_compile_s'), '.1f')})"
             if r.get("first_step_s") is not None else "-")
    compile_s = (f"{_fmt(r.get('compile_wall_s'), '.1f')} / {_fmt(r.get('compile_summed_s'), '.1f')}"
                 if r.get("compile_wall_s") is not None else "-")
    programs = (f"{len(r['programs'])} ({r.get('cache_hits')} / {r.get('cache_misses')})" if r.get("programs")
                else "-")
    pace = ", ".join(f"L{k} {_fmt(v['ms_per_step'], '.1f')}" for k, v in r.get("pace", {}).items()) or "-"
    ckpt = ", ".join(_fmt(c["s"], ".2f") for c in r.get("checkpoints", [])) or "-"
    lines.append(f"| {label} | {status} | {first} | {compile_s} | {programs} | {evals} | {pace} | {ckpt} | "
                 f"{_fmt(r.get('wall_s'), '.1f')} | {_fmt(r.get('dev_f1'), '.4f')} |")
  for name, r in t["runs"].items():
    notes = [f"compiled on first use: {'; '.join(r['compiled_on_use'])}"] if r.get("compiled_on_use") else []
    growths = ", ".join(f"{g['at']} {g['hits']} hits -> {g['size']}" for g in r.get("hit_growths", []))
    notes += [f"hit buffer grown: {growths}"] if growths else []
    notes += [f"{r['steps']} steps in {r['calls']} calls"] if r.get("calls") else []
    if notes:
      lines.append(f"- {TRAINER_LABELS.get(name, name)}: {'; '.join(notes)}")
  return lines + kernels_markdown(t["runs"].get("fused_vs_reference") or {})


def kernels_markdown(r: dict) -> list[str]:
  """The fused-vs-reference check: a row per side (an aborted one with its signal and last lines), the verdict
  against the bf16-vs-f32 gap, the parameters after one step."""
  if not r.get("sides"):
    return []
  sh = r.get("shape", {})
  lines = ["", f"## Fused vs reference step: {sh.get('layers')}-layer BERT (D={sh.get('hidden')}, {sh.get('heads')} "
           f"heads, FFN {sh.get('intermediate')}) + GP, B{sh.get('B')} x L{sh.get('L')}, {sh.get('steps')} steps, lr "
           f"{sh.get('lr')}", "", r.get("note", ""), "",
           "| step | status | kernels / update | attention, bits | dtype | compile s | loss first / last |",
           "|---|---|---|---|---|---|---|"]
  for name, x in r["sides"].items():
    if x.get("status") != "ok":
      how = f"**aborted ({x.get('signal')})**" if x.get("status") == "aborted" else (
          f"{x.get('status')}: {x.get('why') or x.get('error') or ''}")
      lines.append(f"| {name} | {how} | | | | | |")
      continue
    c, loss = x.get("choices") or {}, x.get("loss") or [None]
    lines.append(f"| {name} | ok | {c.get('bert_kernels')} / {c.get('optimizer_update')} | {c.get('attention')}, "
                 f"{c.get('dropout_bits')} | {x.get('dtype')} | {_fmt(x.get('compile_wall_s'), '.1f')} | "
                 f"{_fmt(loss[0], '.4f')} / {_fmt(loss[-1], '.4f')} |")
  for name, x in r["sides"].items():
    if x.get("log_tail"):
      tail = [line for line in x["log_tail"] if line.strip()][-3:]
      lines.append(f"- {name}: its last lines: " + " / ".join(f"`{line.strip()}`" for line in tail))
  lines += ["", f"**{r.get('verdict', '-')}** (the bar: bf16 against f32, {r.get('gap')}, one H100 on 2026-11-26)."]
  if r.get("max_abs_loss_diff") is not None:
    lines.append(f"Same init: {r.get('same_init')}; largest relative gradient-norm difference "
                 f"{_fmt(r.get('max_rel_grad_norm_diff'))}.")
  pa = r.get("params_after_one_step") or {}
  if pa.get("error"):
    lines.append(f"Parameters after one step: {pa['error']}.")
  elif pa:
    lines.append(f"Parameters after one step ({pa.get('leaves')} arrays): largest absolute difference "
                 f"{_fmt(pa.get('max_abs'))} (`{pa.get('max_abs_leaf')}`); difference relative to the parameters "
                 f"{_fmt(pa.get('rel_to_params'))}, to the reference step's update {_fmt(pa.get('rel_to_update'))} "
                 "(L2 norms).")
  return lines


def train_step_markdown(t: dict) -> list[str]:
  """Stage train_step's table, a row per variant (an aborted one with its signal), its lost rows' last log lines,
  and the alternating rounds."""
  if not t.get("variants"):
    return []
  sh = t.get("shape", {})
  lines = ["", f"## Train step: BERT ({sh.get('layers')} layers, D={sh.get('hidden')}) + GP, B{sh.get('B')} x "
           f"L{sh.get('L')}", "", f"First step: {t.get('first_step', '-')} ({t.get('first_step_note', '-')}). "
           "ms/step: ours alone in its own process (median after a first step and 2 more), torch in the stage's "
           "process; compile s: backend compile (0 on a persistent-cache hit) / wall.", "",
           "| variant | status | ms/step | tokens/s | MFU | compile s | first step s | attention, bits, XLA options |",
           "|---|---|---|---|---|---|---|---|"]
  for key, x in t["variants"].items():
    label = x.get("label", key)
    if x.get("status") != "ok":
      note = x.get("why") or x.get("error")
      status = (f"**aborted ({x.get('signal')})**" if x.get("status") == "aborted" else
                x.get("status", "-") + (f": {note}" if note else ""))
      lines.append(f"| {label} | {status} | | | | | | |")
      continue
    mfu = x.get("mfu")
    c = x.get("choices") or {}
    kernels = (f"{c.get('attention')}, {c.get('dropout_bits')}, {c.get('xla_options') or '-'}" if c
               else x.get("attention", "-"))
    compile_s = (f"{_fmt(x.get('compile_s'), '.1f')} / {_fmt(x.get('compile_wall_s'), '.1f')}"
                 if x.get("compile_wall_s") is not None else "-")
    lines.append(f"| {label} | ok | {_fmt(x['ms_per_step'], '.2f')} | {_fmt(x['tokens_per_s'], ',.0f')} | "
                 f"{'-' if mfu is None else f'{100 * mfu:.1f}%'} | {compile_s} | "
                 f"{_fmt(x.get('first_step_s'), '.1f')} | {kernels} |")
  for key, x in t["variants"].items():
    if x.get("log_tail"):
      tail = [line for line in x["log_tail"] if line.strip()][-3:]
      how = f"died by {x['signal']}" if x.get("signal") else f"{x.get('status')} ({x.get('error') or x.get('why')})"
      lines.append(f"- {x.get('label', key)}: {how}; its last lines: " + " / ".join(f"`{line.strip()}`"
                                                                                    for line in tail))
  lines += [f"- {x.get('label', key)}: {x['timed']}" for key, x in t["variants"].items()
            if x.get("status") == "ok" and not x.get("timed", "").endswith("then in the rounds")]
  if t.get("rounds"):
    lines += ["", f"Alternating rounds ({t.get('rounds_note', '')}):", "", "| variant | ms/step (median) | vs first |",
              "|---|---|---|"]
    lines += [f"| {x.get('label', n)} | {_fmt(x['ms_median'], '.2f')} | {x['vs_first']} |"
              for n, x in t["rounds"].items()]
  return lines


def markdown(result: dict) -> str:
  st = result["stages"]
  lines = [f"# Device check, {result['started_utc']} UTC", "",
           f"`{result['command']}` on {result['host']}; budget {result['budget_s']:g} s, used "
           f"{result.get('elapsed_s', 0):g} s{' (tiny shapes)' if result['tiny'] else ''}.", "",
           "| stage | status | seconds (limit) |", "|---|---|---|"]
  for name, s in st.items():
    note = s.get("why") or s.get("error") or ""
    if s.get("lost"):  # variants lost inside a stage that went on
      note = "; ".join([note] * bool(note) + [f"lost {k} ({x})" for k, x in s["lost"].items()])
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
  lines += trainer_markdown(st.get("trainer", {}))
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
  lines += train_step_markdown(st.get("train_step", {}))
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
