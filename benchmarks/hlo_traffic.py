"""Kernels and memory traffic of one compiled step, from its optimised HLO text (`launch.compile --hlo_dir=DIR`).

  python -m benchmarks.hlo_traffic FILE [--bandwidth_tbs=3.35] [--top=12] [--match=REGEX]

Reads the entry computation: every instruction there that runs on the device (a fusion, a library call, a scatter,
a copy; not parameters, tuples, bitcasts or constants) is one kernel; a called computation (a fusion's body) is part
of its caller's kernel, never counted on its own. A while loop is no kernel: its body's kernels count once per trip
(nested loops multiply), trip counts read from the while's `known_trip_count` (XLA:GPU's and XLA:CPU's optimised
HLO has it); a loop without one is named on a `while loops: N, not counted` line and its body left out of every
total. The loop condition's kernels (a scalar compare per trip) are not counted. A kernel's traffic is the bytes of
its operands and results as shaped: an upper bound (nothing is assumed to stay in cache, a gather reads less than its
table), and the sum over kernels, at --bandwidth_tbs (H100 SXM 3.35, H200 4.8), is a time no step can beat unless the
compiler is free to keep data on chip. Matmul FLOPs are not counted. Prints the kernel count, the while loops and
their trip counts, traffic by kernel family (the name XLA gives, its numeric suffix dropped), the largest kernels
(`xN`: runs N times, MB over all runs), and every scatter with its element type; --match sums the kernels whose result
shape matches a regular expression (e.g. '16,12,256,256' for attention's B x H x L x L tensors). Made for XLA:GPU
programs; on a TPU program an asynchronous op's start and done count as two kernels, each with the op's bytes. No
device needed; docs/benchmarks.md, "Compiling for a GPU here", has what it showed for the BERT-base step.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import re
import sys

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
               "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8}
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "opt-barrier", "after-all",
             "add-dependency", "partition-id", "replica-id"}
_ARRAY = re.compile(r"\b([a-z]\w*)\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*?)\)(.*)$")
_TRIPS = re.compile(r'"known_trip_count"\s*:\s*\{\s*"n"\s*:\s*"?(\d+)')


@dataclasses.dataclass
class Kernel:
  name: str
  op: str  # fusion, custom-call, scatter, ...
  shape: str  # result shape as printed
  bytes: int  # operands + results, one run
  scatter_dtype: str = ""  # element type of a scatter's result (also inside a fusion)
  runs: int = 1  # times one step runs it: the product of the trip counts of the while loops around it


@dataclasses.dataclass
class Loop:
  name: str  # the while instruction
  trips: int | None  # known_trip_count; None: unknown, body not counted
  runs: int = 1  # times one step runs the loop (trip counts of the loops around it)
  outer: str = ""  # the while loop it is in


def shape_bytes(shape: str) -> int:
  total = 0
  for dtype, dims in _ARRAY.findall(shape):
    if dtype in DTYPE_BYTES:
      n = 1
      for d in filter(None, dims.split(",")):
        n *= int(d)
      total += n * DTYPE_BYTES[dtype]
  return total


def computations(text: str) -> dict[str, str]:
  """{name: body} of every computation in an HLO module's text; the entry one under "ENTRY"."""
  out = {}
  for m in re.finditer(r"^(ENTRY )?%([\w.\-]+) [^\n]*\{\n(.*?)^\}", text, re.S | re.M):
    out["ENTRY" if m.group(1) else m.group(2)] = m.group(3)
  if "ENTRY" not in out:
    raise ValueError("no ENTRY computation: not an HLO module's text")
  return out


def kernels(text: str) -> tuple[list[Kernel], list[Loop]]:
  """(the kernels one run of the entry computation launches, in order, while bodies' kernels inline; its while
  loops, nested ones included)."""
  comps = computations(text)
  found, loops = [], []

  def walk(comp: str, runs: int, outer: str) -> None:
    shapes: dict[str, str] = {}
    for line in comps.get(comp, "").splitlines():
      m = _INSTRUCTION.match(line)
      if not m:
        continue
      name, shape, op, args, rest = m.groups()
      shapes[name] = shape
      if op in NO_KERNEL:
        continue
      if op == "while":
        trips = _TRIPS.search(rest)
        body = re.search(r"\bbody=%([\w.\-]+)", rest)
        loops.append(Loop(name, int(trips.group(1)) if trips else None, runs, outer))
        if trips and body:
          walk(body.group(1), runs * int(trips.group(1)), name)
        continue
      operands = re.findall(r"%([\w.\-]+)", args)
      moved = shape_bytes(shape) + sum(shape_bytes(shapes.get(a, "")) for a in operands)
      called = re.search(r"calls=%([\w.\-]+)", rest)
      inner = comps.get(called.group(1), "") if called else ""
      if op == "scatter":
        scatter = _ARRAY.search(shape).group(1)
      else:
        hit = re.search(r"= (\w+)\[[\d,]*\]\{[\d,]*\} scatter\(", inner)
        scatter = hit.group(1) if hit else ""
      found.append(Kernel(name, op, shape, moved, scatter, runs))

  walk("ENTRY", 1, "")
  return found, loops


def loop_lines(loops: list[Loop]) -> list[str]:
  """The report's lines on while loops: those counted with their trip counts, those not."""
  counted = [lp for lp in loops if lp.trips is not None]
  unknown = [lp for lp in loops if lp.trips is None]
  where = lambda lp: f" (in {lp.outer}, runs {lp.runs}x)" if lp.outer else ""
  lines = []
  if counted:
    lines.append(f"while loops: {len(counted)} counted, body x trip count: "
                 + ", ".join(f"{lp.name} x{lp.trips}{where(lp)}" for lp in counted))
  if unknown:
    lines.append(f"while loops: {len(unknown)}, not counted (trip count unknown, bodies left out of every total): "
                 + ", ".join(f"{lp.name}{where(lp)}" for lp in unknown))
  return lines


def family(name: str) -> str:
  return re.sub(r"(\.\d+)+$", "", name)


def report(text: str, *, bandwidth_tbs: float, top: int, match: str = "") -> list[str]:
  ks, loops = kernels(text)
  total = sum(k.bytes * k.runs for k in ks)
  lines = [f"{sum(k.runs for k in ks)} kernels; {total / 1e9:.2f} GB read + written at most; "
           f"{total / (bandwidth_tbs * 1e12) * 1e3:.2f} ms at {bandwidth_tbs:g} TB/s"]
  lines += loop_lines(loops)
  by_bytes, by_count = collections.Counter(), collections.Counter()
  for k in ks:
    by_bytes[family(k.name)] += k.bytes * k.runs
    by_count[family(k.name)] += k.runs
  lines.append("by family: GB, kernels")
  lines += [f"  {b / 1e9:8.3f} {by_count[f]:5d}  {f}" for f, b in by_bytes.most_common(top)]
  lines.append("largest kernels: MB, result shape")
  runs = lambda k: f" x{k.runs}" if k.runs > 1 else ""
  lines += [f"  {k.bytes * k.runs / 1e6:8.1f}  {k.name}{runs(k)}  {k.shape[:100]}"
            for k in sorted(ks, key=lambda k: -k.bytes * k.runs)[:top]]
  if match:
    hits = [k for k in ks if re.search(match, k.shape)]
    lines.append(f"result shape matching {match!r}: {sum(k.runs for k in hits)} kernels, "
                 f"{sum(k.bytes * k.runs for k in hits) / 1e9:.2f} GB")
  scatters = [k for k in ks if k.scatter_dtype]
  lines.append(f"scatters: {sum(k.runs for k in scatters)}" + ("" if scatters else " (none)"))
  lines += [f"  {k.scatter_dtype}  {k.name}{runs(k)}  {k.shape[:100]}" for k in scatters]
  return lines


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("file", help="optimised HLO text of one program (launch.compile --hlo_dir)")
  p.add_argument("--bandwidth_tbs", type=float, default=3.35, help="memory bandwidth, TB/s (H100 SXM 3.35)")
  p.add_argument("--top", type=int, default=12, help="families and kernels listed")
  p.add_argument("--match", default="", help="also sum the kernels whose result shape matches this regex")
  args = p.parse_args(argv)
  try:
    with open(args.file) as f:
      lines = report(f.read(), bandwidth_tbs=args.bandwidth_tbs, top=args.top, match=args.match)
  except (OSError, ValueError, re.error) as e:
    print(f"error: {args.file}: {e}", file=sys.stderr)
    return 1
  print("\n".join(lines))
  return 0


if __name__ == "__main__":
  sys.exit(main())
