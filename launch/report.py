"""Summarises finished runs: mean +- sample std over seeds per dataset x encoder x head x RoPE.

  python -m launch.report runs/rope
  python -m launch.report gs://BUCKET/runs/rope gs://BUCKET/runs/heads --out docs/figures/rope

A run is a folder holding config.json or results.json (found recursively; local or gs:// via etils.epath).
Finished runs are grouped by config.json's data.name, model.encoder, model.head and model.use_rope ("n/a" for the
crf and softmax taggers, which have no RoPE); each group
shows n (seeds) and mean +- std (statistics.stdev; "-" when n = 1) of dev/test F1, precision, recall (in %),
train tokens/s and parameter count. Preempted, failed and unfinished runs are listed apart, never averaged.

With --out PREFIX it also writes PREFIX.md (the same tables), PREFIX_f1.png (F1 with error bars per group) and
PREFIX_by_length.png (dev F1 by gold entity length in encoder tokens, RoPE on vs off per dataset, tp/pred/gold
pooled over seeds). Plots need matplotlib: pip install -e '.[plots]'.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys

from launch import sweep

LENGTH_BUCKETS = ("1", "2", "3-4", "5-8", "9+")  # results.json by_length keys (entity length in encoder tokens)
_RUN_FILES = ("config.json", "results.json")
_MAX_DEPTH = 8


# ----------------------------------------------------------------------------- reading runs


def find_runs(root) -> list[tuple[str, object]]:
  """(path relative to root, epath.Path) of every run folder under `root`, sorted; root itself may be one."""
  from etils import epath

  root = epath.Path(root)
  out = []

  def walk(path, rel, depth):
    try:
      children = list(path.iterdir())
    except (FileNotFoundError, NotADirectoryError):
      return
    if any(c.name in _RUN_FILES for c in children):
      out.append((rel or ".", path))
      return
    if depth < _MAX_DEPTH:
      for c in sorted(children, key=lambda c: c.name):
        if c.is_dir():
          walk(c, f"{rel}/{c.name}" if rel else c.name, depth + 1)

  walk(root, "", 0)
  return sorted(out, key=lambda r: r[0])


def last_metrics(path) -> tuple[int | None, float | None]:
  """(last logged step, last dev F1) from a run's metrics.jsonl; Nones when absent."""
  from etils import epath

  try:
    text = (epath.Path(path) / "metrics.jsonl").read_text()
  except FileNotFoundError:
    return None, None
  step = dev = None
  for line in text.splitlines():
    try:
      rec = json.loads(line)
    except json.JSONDecodeError:  # a line being written
      continue
    step = rec.get("step", step)
    if rec.get("split") == "dev" and "f1" in rec:
      dev = rec["f1"]
  return step, dev


def collect(roots) -> list[dict]:
  """One dict per run folder: run, status, group key fields, results (None if absent), error."""
  if isinstance(roots, str):
    roots = [roots]
  rows = []
  for root in roots:
    for rel, path in find_runs(root):
      config = sweep.read_json(path / "config.json") or {}
      results = sweep.read_json(path / "results.json")
      model, data = config.get("model", {}), config.get("data", {})
      rows.append({
          "run": rel if len(roots) == 1 else f"{str(root).rstrip('/')}/{rel}",
          "status": sweep.status_of(results),
          "dataset": data.get("name", "?"),
          "encoder": model.get("encoder", "?"),
          "head": model.get("head", "?"),
          "rope": model.get("use_rope", "?") if model.get("head", "standard") in SPAN_HEADS else NO_ROPE,
          "seed": config.get("seed"),
          "results": results,
      })
  return rows


# ----------------------------------------------------------------------------- statistics

GROUP_KEYS = ("dataset", "encoder", "head", "rope")
SPAN_HEADS = ("standard", "efficient")
NO_ROPE = "n/a"  # taggers (crf, softmax) have no RoPE; their config's use_rope is ignored
# (column, getter on results.json); F1/P/R are fractions in results.json and shown in %.
METRICS = (
    ("dev F1", lambda r: r.get("dev", {}).get("f1")),
    ("dev P", lambda r: r.get("dev", {}).get("precision")),
    ("dev R", lambda r: r.get("dev", {}).get("recall")),
    ("test F1", lambda r: r.get("test", {}).get("f1")),
    ("test P", lambda r: r.get("test", {}).get("precision")),
    ("test R", lambda r: r.get("test", {}).get("recall")),
    ("tokens/s", lambda r: r.get("train_tokens_per_s")),
    ("params", lambda r: r.get("parameters")),
)
PERCENT = {"dev F1", "dev P", "dev R", "test F1", "test P", "test R"}


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
  """(mean, sample std); std None when fewer than 2 values, both None when there are none."""
  if not values:
    return None, None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def summarize(rows: list[dict]) -> list[dict]:
  """Finished runs grouped by GROUP_KEYS: {key fields, n, runs, metrics: {column: (mean, std, count)}}."""
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    if row["status"] == sweep.FINISHED:
      groups.setdefault(tuple(str(row[k]) for k in GROUP_KEYS), []).append(row)
  out = []
  for key in sorted(groups):
    members = groups[key]
    metrics = {}
    for col, get in METRICS:
      values = [float(v) for v in (get(m["results"]) for m in members) if v is not None]
      metrics[col] = (*mean_std(values), len(values))
    out.append({**dict(zip(GROUP_KEYS, key)), "n": len(members), "runs": [m["run"] for m in members],
                "metrics": metrics})
  return out


def pooled_by_length(group_rows: list[dict], split: str = "dev") -> dict[str, float | None]:
  """F1 per length bucket from tp/pred/gold summed over the runs (None where pred + gold is 0)."""
  out = {}
  for b in LENGTH_BUCKETS:
    tp = pred = gold = 0
    for row in group_rows:
      cell = (row["results"].get(split) or {}).get("by_length", {}).get(b)
      if cell:
        tp, pred, gold = tp + cell["tp"], pred + cell["pred"], gold + cell["gold"]
    out[b] = 2 * tp / (pred + gold) if pred + gold else None
  return out


# ----------------------------------------------------------------------------- tables


def fmt_cell(col: str, mean, std, count: int, n: int) -> str:
  if mean is None:
    return "-"
  scale, digits = (100.0, 2) if col in PERCENT else (1.0, 0)
  m = f"{mean * scale:.{digits}f}"
  s = "-" if std is None else f"{std * scale:.{digits}f}"
  cell = f"{m} ± {s}"
  return cell if count == n else f"{cell} (n={count})"


def groups_table(summary: list[dict]) -> str:
  if not summary:
    return "(no finished runs)"
  cols = ["dataset", "encoder", "head", "RoPE", "n"] + [c for c, _ in METRICS]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for g in summary:
    cells = [g["dataset"], g["encoder"], g["head"], g["rope"], str(g["n"])]
    cells += [fmt_cell(c, *g["metrics"][c], g["n"]) for c, _ in METRICS]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def unfinished_table(rows: list[dict]) -> str:
  bad = [r for r in rows if r["status"] != sweep.FINISHED]
  if not bad:
    return ""
  lines = ["| run | status | steps | error |", "|---|---|---|---|"]
  for r in bad:
    res = r["results"] or {}
    status = r["status"] if r["results"] is not None else f"{r['status']} (no results.json)"
    err = str(res.get("error", "")).replace("|", "\\|").replace("\n", " ")[:200]
    lines.append(f"| {r['run']} | {status} | {res.get('steps', '-')} | {err} |")
  return "\n".join(lines)


def length_table(rows: list[dict], summary: list[dict]) -> str:
  """Dev F1 (%) by gold entity length per group, pooled over seeds; "" when no run has by_length."""
  lines = []
  for g in summary:
    members = [r for r in rows if r["run"] in g["runs"]]
    if not any((r["results"].get("dev") or {}).get("by_length") for r in members):
      continue
    f1 = pooled_by_length(members)
    cells = ["-" if f1[b] is None else f"{100 * f1[b]:.2f}" for b in LENGTH_BUCKETS]
    key = [g["dataset"], g["encoder"], g["head"], g["rope"], str(g["n"])]
    lines.append("| " + " | ".join(key + cells) + " |")
  if not lines:
    return ""
  head = "| dataset | encoder | head | RoPE | n | " + " | ".join(f"len {b}" for b in LENGTH_BUCKETS) + " |"
  return "\n".join([head, "|" + "---|" * (5 + len(LENGTH_BUCKETS)), *lines])


def markdown(rows: list[dict], summary: list[dict]) -> str:
  parts = ["## Finished runs (mean ± sample std over seeds; F1/P/R in %)", "", groups_table(summary)]
  lengths = length_table(rows, summary)
  if lengths:
    parts += ["", "## Dev F1 (%) by gold entity length in encoder tokens (tp/pred/gold pooled over seeds)", "",
              lengths]
  bad = unfinished_table(rows)
  if bad:
    parts += ["", "## Not finished (not averaged above)", "", bad]
  return "\n".join(parts) + "\n"


# back-compat name used by older callers
def markdown_table(rows: list[dict]) -> str:
  return markdown(rows, summarize(rows))


# ----------------------------------------------------------------------------- plots


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:
    raise ImportError("launch.report plots need matplotlib: pip install -e '.[plots]'") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _rope_label(rope: str) -> str:
  return {"True": "RoPE", "False": "no RoPE"}.get(rope, "tagger")


def _label(g: dict) -> str:
  return f"{g['dataset']}\n{g['encoder']}/{g['head']}\n{_rope_label(g['rope'])}"


def plot_f1(summary: list[dict], path: str):
  plt = _pyplot()
  fig, ax = plt.subplots(figsize=(max(4.0, 1.4 * len(summary) + 1), 4.0))
  xs = list(range(len(summary)))
  width = 0.38
  for off, split, color in ((-width / 2, "dev", "tab:blue"), (width / 2, "test", "tab:orange")):
    pts = [(x, g["metrics"][f"{split} F1"]) for x, g in zip(xs, summary) if g["metrics"][f"{split} F1"][0] is not None]
    if pts:
      ax.bar([x + off for x, _ in pts], [100 * m[0] for _, m in pts], width,
             yerr=[100 * (m[1] or 0.0) for _, m in pts], capsize=3, label=split, color=color)
  ax.set_xticks(xs)
  ax.set_xticklabels([f"{_label(g)}\nn={g['n']}" for g in summary], fontsize=7)
  ax.set_ylabel("F1 (%), mean ± sample std over seeds")
  ax.legend()
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def plot_by_length(rows: list[dict], summary: list[dict], path: str):
  plt = _pyplot()
  datasets = sorted({g["dataset"] for g in summary})
  fig, axes = plt.subplots(1, max(1, len(datasets)), figsize=(4.5 * max(1, len(datasets)), 3.8), squeeze=False)
  for ax, ds in zip(axes[0], datasets):
    groups = [g for g in summary if g["dataset"] == ds]
    several = len({(g["encoder"], g["head"]) for g in groups}) > 1
    xs = list(range(len(LENGTH_BUCKETS)))
    for g in groups:
      f1 = pooled_by_length([r for r in rows if r["run"] in g["runs"]])
      label = _rope_label(g["rope"]) + (f" {g['encoder']}/{g['head']}" if several else "")
      ys = [100 * f1[b] if f1[b] is not None else float("nan") for b in LENGTH_BUCKETS]
      ax.plot(xs, ys, marker="o", linestyle={"True": "-", "False": "--"}.get(g["rope"], ":"), label=f"{label} (n={g['n']})")
    ax.set_xticks(xs)
    ax.set_xticklabels(LENGTH_BUCKETS)
    ax.set_title(f"{ds} (dev, {'/'.join(sorted({g['encoder'] for g in groups}))} encoder)")
    ax.set_ylim(0, 100)
    ax.set_xlabel("gold entity length (encoder tokens)")
    ax.set_ylabel("F1 (%), tp/pred/gold pooled over seeds")
    ax.legend(fontsize=7)
  fig.tight_layout()
  _save(fig, path)
  plt.close(fig)


def _save(fig, path: str):
  from etils import epath

  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=120)
  epath.Path(path).write_bytes(buf.getvalue())


# ----------------------------------------------------------------------------- CLI


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m launch.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("roots", nargs="+", metavar="DIR", help="sweep folders holding run workdirs (local or gs://)")
  parser.add_argument("--out", default=None, metavar="PREFIX",
                      help="also write PREFIX.md, PREFIX_f1.png and PREFIX_by_length.png (e.g. docs/figures/rope)")
  args = parser.parse_args(argv)
  rows = collect(args.roots)
  summary = summarize(rows)
  text = markdown(rows, summary)
  print(text, end="")
  if not args.out:
    return 0
  from etils import epath

  out = epath.Path(args.out)
  out.parent.mkdir(parents=True, exist_ok=True)
  try:
    if summary:
      plot_f1(summary, f"{args.out}_f1.png")
      plot_by_length(rows, summary, f"{args.out}_by_length.png")
      text += f"\n![F1 per group]({out.name}_f1.png)\n\n![F1 by entity length]({out.name}_by_length.png)\n"
  except ImportError as e:
    epath.Path(f"{args.out}.md").write_text(text)
    print(f"wrote {args.out}.md; no plots: {e}", file=sys.stderr)
    return 1
  epath.Path(f"{args.out}.md").write_text(text)
  print(f"wrote {args.out}.md" + (f", {args.out}_f1.png, {args.out}_by_length.png" if summary else ""),
        file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
