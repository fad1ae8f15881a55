"""Stage trainer: `python -m gp_jax.main` as a user runs it (cold and warm compilation cache, one step per call,
another head), the PyTorch anchor on the same card, and the fused-vs-reference check (kernels.py); what each run
spends, read from its own log."""

from __future__ import annotations

import ast
import collections
import contextlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

from benchmarks.device_check.base import Recorder, log_lines, run_logged, skipped
from benchmarks.device_check.kernels import fused_vs_reference
from gp_jax.data import corpora
from gp_jax.data.sources import synthetic_records

# Deferred imports below: numpy, safetensors, tokenizers (write_fake_bert) only when a fake checkpoint is written.


TRAINER_LABELS = {"cold": "cold", "warm": "warm", "warm_k1": "warm, one step per call (steps_per_execution=1)",
                  "other_head": "other head (efficient), after warm", "anchor": "torch anchor (eager)",
                  "fused_vs_reference": "fused vs reference step",
                  "cold_cublas": "cold, Triton GEMM fusions off (cuBLAS GEMMs)",
                  "cold_no_autotune": "cold, no GPU autotuning (xla_gpu_autotune_level=0)"}
# The cold runs that ask what XLA:GPU's autotuning of Triton GEMM fusions costs and buys: each its own empty
# compilation cache (and autotune folder), XLA_FLAGS added to the run's environment.
COLD_VARIANTS = {"cold_cublas": "--xla_gpu_enable_triton_gemm=false", "cold_no_autotune": "--xla_gpu_autotune_level=0"}
ANCHOR_EPOCHS = 2  # the trainer's epochs=2
_N = r"([\d.,]+|nan|inf)"
TRAINER_PATTERNS = {
    "program": re.compile(r"compiled ahead: (train|eval) L(\d+) B(\d+)(?: hits (\d+))?(?: x(\d+))?: " + _N +
                          r" s \(cache (hit|miss)\)"),
    "ahead": re.compile(r"compiled ahead: (\d+) programs? in " + _N + r" s wall, " + _N + r" s of compile summed, "
                        r"(\d+) threads?"),
    "program_failed": re.compile(r"compiled ahead: (train|eval) L(\d+) B(\d+)(?: hits (\d+))?(?: x(\d+))?: failed "
                                 r"\((\w+)\)"),
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
# The trainer's first lines of each start-up phase, in order: the phase before a marker ends at its line's time.
STARTUP_MARKERS = (("imports", re.compile(r"Compilation cache: ")), ("data", re.compile(r"\] Data \S+: ")),
                   ("tokenizer", re.compile(r"\] Tokenizer ")), ("windows", re.compile(r"prepare_split dev")),
                   ("model", re.compile(r"\] Model: ")), ("compile", re.compile(r"compiled ahead: \d+ programs? in")),
                   ("first_step", re.compile(r"first step after ")))
LOG_TIME = re.compile(r"^[IWE]\d{4} (\d\d):(\d\d):(\d\d(?:\.\d+)?) ")
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


def parse_trainer_log(text: str) -> dict:
  """What the trainer's log says about its own time: compiles, first step, evaluations, pace, checkpoints; None (or
  empty) for every line it did not print."""
  out = {"backend": None, "programs": [], "compile_programs": None, "compile_wall_s": None, "compile_summed_s": None,
         "compile_threads": None, "first_step_s": None, "first_step_compile_s": None, "evals": [], "pace": {},
         "checkpoints": [], "steps": None, "calls": None, "done_status": None, "done_minutes": None, "done": None,
         "compiled_on_use": [], "hit_growths": []}
  progress_evals = []
  for line in log_lines(text):
    if m := TRAINER_PATTERNS["program"].search(line):
      out["programs"].append({"step": m[1], "L": int(m[2]), "B": int(m[3]), "hits": m[4] and int(m[4]),
                              "steps": int(m[5] or 1), "s": _num(m[6]), "cache": m[7]})
    elif m := TRAINER_PATTERNS["program_failed"].search(line):
      out["programs"].append({"step": m[1], "L": int(m[2]), "B": int(m[3]), "hits": m[4] and int(m[4]),
                              "steps": int(m[5] or 1), "s": None, "cache": f"failed ({m[6]})"})
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
  out["startup"] = startup_phases(text, out["first_step_s"])
  if not out["evals"]:  # a trainer without the evaluation line: reporting.progress's end-of-evaluation line
    out["evals"] = progress_evals
  out["eval_first_s"] = out["evals"][0]["s"] if out["evals"] else None
  out["eval_second_s"] = out["evals"][1]["s"] if len(out["evals"]) > 1 else None
  out["cache_hits"] = sum(p["cache"] == "hit" for p in out["programs"])
  out["cache_misses"] = sum(p["cache"] == "miss" for p in out["programs"])
  return out


def startup_phases(text: str, first_step_s: float | None) -> dict:
  """Seconds from process start to the first step by phase, from the log lines' times (`STARTUP_MARKERS`): imports
  (to the first line), data, tokenizer, windows, model (checkpoint and init), compile (ahead), first_step (the
  first call). {} without a first step or a timed line for each marker."""
  times = {}
  for line in log_lines(text):
    m = LOG_TIME.match(line)
    for name, pattern in STARTUP_MARKERS:
      if m and name not in times and pattern.search(line):
        times[name] = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
  if first_step_s is None or len(times) != len(STARTUP_MARKERS):
    return {}
  ordered = [times[name] for name, _ in STARTUP_MARKERS]
  for i in range(1, len(ordered)):
    ordered[i] += 86400 * (ordered[i] < ordered[i - 1])  # past midnight
  before = ordered[-1] - first_step_s
  out = {}
  for (name, _), at in zip(STARTUP_MARKERS, ordered):
    out[name], before = round(at - before, 2), at
  return out


def parse_anchor_log(text: str) -> dict:
  """torch_cluener.py's lines: setup, first step, per-epoch train and evaluation seconds with dev F1, whole wall."""
  out = {"setup_s": None, "first_step_s": None, "epochs": [], "done_s": None}
  for line in log_lines(text):
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


# BertConfig's defaults (transformers 5) that config.json carries beside the architecture fields `hf` gives.
BERT_CONFIG_DEFAULTS = {
    "add_cross_attention": False, "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1,
    "bos_token_id": None, "classifier_dropout": None, "dtype": "float32", "eos_token_id": None, "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1, "initializer_range": 0.02, "is_decoder": False, "layer_norm_eps": 1e-12,
    "model_type": "bert", "pad_token_id": 0, "tie_word_embeddings": True, "type_vocab_size": 2, "use_cache": True}


def write_fake_bert(folder: pathlib.Path, texts, *, hf: dict, lowercase: bool, word_pieces: bool) -> dict:
  """A BERT folder (config.json, model.safetensors, fast tokenizer) with random weights and a char vocabulary of
  `texts` by frequency, laid out as transformers saves a hub checkpoint; reused when its spec matches. Written with
  safetensors and tokenizers alone: importing torch and transformers for it cost seconds a run."""
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
  shutil.rmtree(folder, ignore_errors=True)
  folder.mkdir(parents=True)
  (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
  tokenizer = _bert_tokenizer(vocab, lowercase=lowercase)
  tokenizer.save(str(folder / "tokenizer.json"))
  if tokenizer.get_vocab_size() != len(vocab):
    raise RuntimeError(f"{folder}: the tokenizer lost rows of its vocabulary ({len(vocab)} in vocab.txt)")
  special = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]",
             "unk_token": "[UNK]"}
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"backend": "tokenizers", "do_lower_case": lowercase, "model_max_length": int(1e30), "strip_accents": None,
       "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer", **special}, indent=2, sort_keys=True))
  config = {**BERT_CONFIG_DEFAULTS, **hf}
  (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
  _save_random_bert(folder / "model.safetensors", config)
  (folder / "fake_bert.json").write_text(json.dumps(spec))
  return dict(spec, reused=False)


def _bert_tokenizer(vocab: list[str], *, lowercase: bool):
  """BertTokenizerFast's tokenizers pipeline over `vocab`: what its save_pretrained writes as tokenizer.json."""
  # pylint: disable-next=g-import-not-at-top
  from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

  tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]",
                                   max_input_chars_per_word=100))
  tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True, strip_accents=None,
                                              lowercase=lowercase)
  tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  cls, sep = ("[CLS]", vocab.index("[CLS]")), ("[SEP]", vocab.index("[SEP]"))
  tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
                                                     special_tokens=[cls, sep])
  tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
  tok.add_special_tokens(vocab[:5])
  return tok


def _save_random_bert(path: pathlib.Path, c: dict) -> None:
  """BertModel's weights as transformers initialises them (normal(0, initializer_range) matrices, the padding row
  zero, LayerNorm 1 and 0, zero biases), under its names, in model.safetensors."""
  import numpy as np  # pylint: disable=g-import-not-at-top
  from safetensors.numpy import save_file  # pylint: disable=g-import-not-at-top

  rng = np.random.default_rng(0)
  h, inner = c["hidden_size"], c["intermediate_size"]
  out = {}

  def normal(name, *shape):
    out[name] = rng.normal(0.0, c["initializer_range"], shape).astype(np.float32)

  def dense(name, n_out, n_in):  # torch Linear: [out, in]
    normal(f"{name}.weight", n_out, n_in)
    out[f"{name}.bias"] = np.zeros(n_out, np.float32)

  def layer_norm(name):
    out[f"{name}.weight"], out[f"{name}.bias"] = np.ones(h, np.float32), np.zeros(h, np.float32)

  normal("embeddings.word_embeddings.weight", c["vocab_size"], h)
  out["embeddings.word_embeddings.weight"][c["pad_token_id"]] = 0.0
  normal("embeddings.position_embeddings.weight", c["max_position_embeddings"], h)
  normal("embeddings.token_type_embeddings.weight", c["type_vocab_size"], h)
  layer_norm("embeddings.LayerNorm")
  for i in range(c["num_hidden_layers"]):
    p = f"encoder.layer.{i}"
    for name in ("query", "key", "value"):
      dense(f"{p}.attention.self.{name}", h, h)
    dense(f"{p}.attention.output.dense", h, h)
    layer_norm(f"{p}.attention.output.LayerNorm")
    dense(f"{p}.intermediate.dense", inner, h)
    dense(f"{p}.output.dense", h, inner)
    layer_norm(f"{p}.output.LayerNorm")
  dense("pooler.dense", h, h)
  save_file(out, str(path), metadata={"format": "pt"})


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
  for name in dict.fromkeys(wanted):  # in the order asked (the default: TRAINER_RUNS's), each once
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
      rc, seconds, text = run_logged(name, cmd, env=env, timeout=left, log_path=scratch / f"{name}.out")
      rec.update("runs", name, {"status": _run_status(rc), "command": " ".join(cmd), "rc": rc,
                                "wall_s": round(seconds, 1), **parse_anchor_log(text),
                                **({"log_tail": text[-3000:]} if rc != 0 else {})})
      continue
    if left < s["min_run_s"]:
      rec.update("runs", name, skipped(f"no time left in the stage's limit ({left:.0f} s)"))
      continue
    run_cache, run_env, flags = cache, env, {}
    if name in COLD_VARIANTS:
      run_cache = scratch / f"jax_cache_{name}"
      flags = {"xla_flags": f"{env.get('XLA_FLAGS', '')} {COLD_VARIANTS[name]}".strip()}
      run_env = dict(env, XLA_FLAGS=flags["xla_flags"])
    if name == "cold" or name in COLD_VARIANTS:
      shutil.rmtree(run_cache, ignore_errors=True)
    workdir = scratch / f"workdir_{name}"
    shutil.rmtree(workdir, ignore_errors=True)
    cmd = [sys.executable, "-m", "gp_jax.main", f"--config={s['config']}", f"--workdir={workdir}",
           f"--config.model.pretrained={fake}", f"--config.compilation_cache={run_cache}", *s["overrides"],
           *extra.get(name, [])]
    rec.update("runs", name, {"status": "running", "command": " ".join(cmd), **flags})
    rc, seconds, text = run_logged(name, cmd, env=run_env, timeout=left, log_path=scratch / f"{name}.out")
    parsed = parse_trainer_log(text)
    results_path = workdir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    backend = backend or parsed["backend"]
    rec.update("runs", name, {"status": _run_status(rc), "command": " ".join(cmd), "rc": rc,
                              **flags,
                              "wall_s": round(seconds, 1), "wall_minutes": results.get("wall_minutes"),
                              "dev_f1": _f1(results, "dev"), "test_f1": _f1(results, "test"), **parsed,
                              **({"log_tail": text[-3000:]} if rc != 0 else {})})
    shutil.rmtree(workdir, ignore_errors=True)  # checkpoints: GBs at BERT-base


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
