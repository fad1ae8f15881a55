"""Stage precision: the 2-layer BERT-base-width step, 30 steps on one fixed batch: f32 against bf16, XLA against
cuDNN attention, and a second f32 seed for the seed noise (loss and gradient-norm trajectories)."""

from __future__ import annotations

import traceback

from benchmarks.device_check.base import Recorder, cudnn_reason, skipped
from benchmarks.device_check.variants import project_step


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
