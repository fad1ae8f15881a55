"""Stage train_step: each of our variants first alone in its own process (an abort there loses only its row), then
the survivors and the PyTorch port in alternating rounds in the stage's process."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import time
import traceback

from benchmarks import common
from benchmarks.device_check.base import Recorder, child_outcome, on_gpu, run_logged, skipped, torch_reason
from benchmarks.device_check.shapes import shapes
from benchmarks.device_check.variants import (PLANTED, TRAIN_VARIANTS, StepVariant, TorchVariant, build_variant,
                                              train_batch, train_variants, variant_reason)
from gp_jax import runtime

# Deferred imports below: benchmarks.train_step (it imports jax) and torch, in the stage's child only.


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
  rc, seconds, text = run_logged(f"variant {key}", cmd, env=env, timeout=timeout, log_path=log_path)
  row = json.loads(part.read_text()) if part.exists() else {}
  for path in (part, part.with_suffix(".tmp"), log_path):
    path.unlink(missing_ok=True)
  row.update(label=v.label, rc=rc, seconds=round(seconds, 1), env=v.env or None)
  return child_outcome(row, rc, text, timeout)


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

    from benchmarks.torch_port import make_torch_step  # pylint: disable=g-import-not-at-top

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
