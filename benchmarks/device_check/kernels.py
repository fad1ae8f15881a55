"""The trainer stage's fused-vs-reference check: the fused BERT step and AdamW update against the reference
formulation, each side in its own process (`--kernels_child`), same init, batch and dropout masks; the loss
trajectories against the bf16-vs-f32 gap, and the parameters after one step."""

from __future__ import annotations

import hashlib
import json
import math
import pathlib
import sys
import time
import traceback

import numpy as np

from benchmarks.device_check.base import Recorder, child_outcome, run_logged, skipped
from benchmarks.device_check.shapes import shapes
from benchmarks.device_check.variants import StepVariant, build_variant
from gp_jax import runtime

# Deferred import below: jax, in the children only.


# Largest loss difference between bf16 and f32 over the precision stage's 30 steps, one H100, 2026-11-26
# (docs/device/README.md): the bar for the fused step against the reference one.
BF16_F32_GAP = 0.011
# model.kernels and optimizer.update_impl of the two steps; both with threefry bits, which each dropout draws from the
# module's stream in the same order (fused hash bits draw every mask's key words at once, so their masks differ).
KERNEL_RUNS = {"fused": {"kernels": "fused", "update": "fused"},
               "reference": {"kernels": "reference", "update": "optax"}}


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
      rc, seconds, text = run_logged(f"fused_vs_reference {name}", cmd, env=child_env, timeout=timeout,
                                      log_path=scratch / f"kernels_{name}.out")
      got = json.loads(part.read_text()) if part.exists() else {}
      for path in (part, part.with_suffix(".tmp")):
        path.unlink(missing_ok=True)
      sides[name] = child_outcome(dict(got, rc=rc, seconds=round(seconds, 1)), rc, text, timeout)
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
