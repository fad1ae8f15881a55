"""The headline table "Does RoPE matter?": the report's RoPE on vs off rows, one per dataset x head (x length arm).

  python -m launch.report.headline docs/study                        # print the table
  python -m launch.report.headline docs/study --write docs/results.md  # replace it between the page's markers

Every figure comes from `launch.report`'s own rows (`stats.compare` over the finished runs: the same cells, seeds,
Holm families, bootstrap and influence check as the report's significance table). The row's decision is the
report's rule (`stats.significant`); a row that misses it is "not decided at n = k". Where the power section of
docs/studies/rope_heads.md fixed more seeds than have finished (PLANNED), the row says "runs in progress: n = k of
N". The paper's figure is Su's RoPE ablation where he gives one (People's Daily, GP, dev, BERT-base).
"""

from __future__ import annotations

import argparse
import re
import sys

from .paired import INFLUENCE_K
from .runs import collect
from .splits import split_label
from .stats import compare, summarize

# Seeds fixed by the power section of docs/studies/rope_heads.md (2026-11-28) before the new runs: (regular
# expression on "dataset, max_len, what", n).
PLANNED = ((r"^msra, ", 5), (r"^cluener2020, .*\(standard\)", 5), (r"^people_daily, 128, ", 5))
DATASETS = {"people_daily": "People's Daily", "msra": "MSRA", "cluener2020": "CLUENER 2020", "conll2003": "CoNLL-2003",
            "germeval2014": "GermEval 2014",
            "phee": "PHEE (events: argument F1)"}  # in the table's order
HEADS = {"standard": "GP", "efficient": "EGP"}
ARMS = {"people_daily": {"579": "whole sentences (max_len 579)", "128": "128-token windows"}}
# Su's ablation (GlobalPointer blog / paper): People's Daily dev F1 with RoPE 96.25, without 54.35 (GP, BERT-base).
PAPER = {("people_daily", "standard"): "+41.90 (dev 96.25 vs 54.35, BERT-base, full training set)"}
BEGIN, END = "<!-- headline: begin (python -m launch.report.headline docs/study --write docs/results.md) -->", \
    "<!-- headline: end -->"


def _points(x: float) -> str:
  return f"{100 * x:+.2f}"


def _p(p) -> str:
  return "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def planned_n(key: str) -> int | None:
  """The fixed n of a row ("dataset, max_len, what"), None when the power section planned no runs for it."""
  return next((n for pattern, n in PLANNED if re.search(pattern, key)), None)


def headline_rows(rows: list[dict]) -> list[dict]:
  """The RoPE on vs off rows of `stats.compare` (length-arm differences left out), each with the table's cells."""
  out = []
  for r in rows:
    if not r["what"].startswith("RoPE on vs off") or r.get("arms"):
      continue
    a = r["a"]
    dataset, head, max_len = a["dataset"], a["head"], str(r.get("max_len"))
    n = len(r["seeds"])
    want = planned_n(f"{dataset}, {max_len}, {r['what']}")
    inf = r.get("influence")
    if r.get("flags"):
      check = "flagged: " + "; ".join(r["flags"])
    elif inf is None:
      check = "no per-record counts"
    elif inf["mean"] is None:
      check = "-"
    else:
      check = f"{'flagged' if inf['flagged'] else 'holds'}: {_points(inf['mean'])} without top {len(inf['top'])}"
    decision = "**significant**" if r.get("significant") else f"not decided at n = {n}"
    if want and n < want:
      decision += f" (runs in progress: n = {n} of {want})"
    elif r.get("p") is None and not r.get("significant"):
      decision += " (lacks per-record counts)"
    arm = ARMS.get(dataset, {}).get(max_len)
    out.append({"dataset": DATASETS.get(dataset, dataset) + (f", {arm}" if arm else ""),
                "head": HEADS.get(head, head), "n": n, "order": (list(DATASETS).index(dataset) if dataset in DATASETS
                                                                 else len(DATASETS), dataset, max_len, head != "standard"),
                "split": split_label(a["config"], r["split"]),
                "diff": _points(r["mean"]),
                "interval": "-" if r["low"] is None else f"[{_points(r['low'])}, {_points(r['high'])}]",
                "t": _p(r.get("t_p_holm")), "boot": _p(r.get("p_holm")) if r.get("p") is not None else
                "no per-record counts", "check": check, "decision": decision,
                "paper": PAPER.get((dataset, head), "-")})
  return sorted(out, key=lambda h: h["order"])


def table(rows: list[dict]) -> str:
  cols = ["dataset", "head", "reported split", "n (seeds)", "F1 RoPE - no RoPE (points)", "95% t-interval",
          "t-test over seeds, Holm p", "bootstrap over records, Holm p", f"influence (top {INFLUENCE_K} records out)",
          "decision", "paper (Su)"]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for h in rows:
    lines.append("| " + " | ".join([h["dataset"], h["head"], h["split"], str(h["n"]), h["diff"], h["interval"],
                                    h["t"], h["boot"], h["check"], h["decision"], h["paper"]]) + " |")
  return "\n".join(lines)


def write_between_markers(path: str, text: str) -> None:
  """Replace what lies between BEGIN and END in the file at `path` by `text`."""
  with open(path) as f:
    page = f.read()
  if BEGIN not in page or END not in page:
    raise SystemExit(f"error: {path} has no '{BEGIN}' ... '{END}' markers: add them where the table goes")
  start, stop = page.index(BEGIN) + len(BEGIN), page.index(END)
  with open(path, "w") as f:
    f.write(page[:start] + "\n" + text + "\n" + page[stop:])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m launch.report.headline", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("roots", nargs="+", metavar="DIR", help="study folders, as given to launch.report")
  parser.add_argument("--write", default="", metavar="PAGE", help="replace the table between the page's markers")
  args = parser.parse_args(argv)
  compared, _ = compare(summarize(collect(args.roots)))
  text = table(headline_rows(compared))
  if args.write:
    write_between_markers(args.write, text)
    print(f"wrote the headline table into {args.write}", file=sys.stderr)
  else:
    print(text)
  return 0


if __name__ == "__main__":
  sys.exit(main())
