"""Summarises finished runs: mean +- sample std over seeds per dataset x encoder x head x RoPE.

  python -m launch.report runs/rope
  python -m launch.report gs://BUCKET/runs/rope gs://BUCKET/runs/heads --out docs/figures/rope

A run is a folder holding config.json or results.json (found recursively; local or gs:// via etils.epath).
Finished runs are grouped by config.json's data.name, model.encoder, model.head and model.use_rope ("n/a" for
tagger heads, which have no RoPE); each group shows n (seeds) and mean +- std (statistics.stdev; "-" when n = 1)
of dev/test F1, precision, recall (in %), train tokens/s and parameter count, then epochs trained and whether
training stopped early. Preempted, failed and unfinished runs are listed apart, never averaged.

results.json says which heads are taggers (head_kind), the by-length buckets (length_buckets) and the dev F1 of
every evaluation (dev_history). Older results.json files lack these: tagger heads are then those in
gp_jax.models.taggers.TAGGERS, the buckets gp_jax.evaluate.LENGTH_BUCKETS, and the dev history comes from the
run's metrics.jsonl ("split": "dev" lines; by epoch when the steps per epoch are known, else by step).

With --out PREFIX it also writes PREFIX.md (the same tables), PREFIX_f1.png (one panel per dataset: heads on
the x axis, RoPE on/off side by side, bar = mean over seeds, dots = seeds), PREFIX_by_length.png (dev F1 by gold
entity length in encoder tokens, tp/pred/gold pooled over seeds) and, when some run has a dev history,
PREFIX_epochs.png (dev F1 by epoch per head x RoPE cell: mean over seeds, band = min..max).
Plots need matplotlib: pip install -e '.[plots]'.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import statistics
import sys

from launch import sweep

_RUN_FILES = ("config.json", "results.json")
_MAX_DEPTH = 8
SPAN, TAGGER = "span", "tagger"  # results.json head_kind


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


def _metrics_lines(path) -> list[dict]:
  """Parsed lines of a run's metrics.jsonl ([] when absent; a line being written is skipped)."""
  from etils import epath

  try:
    text = (epath.Path(path) / "metrics.jsonl").read_text()
  except FileNotFoundError:
    return []
  out = []
  for line in text.splitlines():
    try:
      out.append(json.loads(line))
    except json.JSONDecodeError:
      continue
  return out


def last_metrics(path) -> tuple[int | None, float | None]:
  """(last logged step, last dev F1) from a run's metrics.jsonl; Nones when absent."""
  step = dev = None
  for rec in _metrics_lines(path):
    step = rec.get("step", step)
    if rec.get("split") == "dev" and "f1" in rec:
      dev = rec["f1"]
  return step, dev


def head_kind(head: str, results: dict | None) -> str:
  """"span" or "tagger": results.json's head_kind, else whether gp_jax's TAGGERS holds the head (older files)."""
  if results and results.get("head_kind"):
    return results["head_kind"]
  from gp_jax.models.taggers import TAGGERS  # pylint: disable=g-import-not-at-top

  return TAGGER if head in TAGGERS else SPAN


def length_buckets_of(results: dict | None) -> tuple[str, ...]:
  """By-length bucket labels in order: results.json's length_buckets, else gp_jax.evaluate's (older files)."""
  if results and results.get("length_buckets"):
    return tuple(results["length_buckets"])
  from gp_jax.evaluate import LENGTH_BUCKETS  # pylint: disable=g-import-not-at-top

  return tuple(label for label, *_ in LENGTH_BUCKETS)


def steps_per_epoch(config: dict, results: dict | None) -> float | None:
  """From results.json's steps/epochs, else ceil(train windows / global batch) as the batch iterator does."""
  results = results or {}
  if results.get("epochs") and results.get("steps"):
    return results["steps"] / results["epochs"]
  windows = ((results.get("split_stats") or {}).get("train") or {}).get("windows")
  batch = config.get("batch_size")
  return math.ceil(windows / batch) if windows and batch else None


def training_length(config: dict, results: dict | None, spe: float | None) -> tuple[float | None, bool | None]:
  """(epochs trained, stopped early); older files: steps / steps per epoch, and steps < the planned steps."""
  results = results or {}
  steps = results.get("steps")
  epochs = results.get("epochs")
  if epochs is None and steps is not None and spe:
    epochs = steps / spe
  stopped = results.get("stopped_early")
  if stopped is None and steps is not None:
    planned = config.get("num_train_steps") or (
        math.ceil(config["num_epochs"] * spe) if spe and config.get("num_epochs") else None)
    stopped = steps < planned if planned else None
  return epochs, stopped


def dev_history(path, results: dict | None, spe: float | None) -> tuple[list[dict], str | None]:
  """([{step, epoch (None if unknown), f1}] by step, source): results.json's dev_history, else metrics.jsonl."""
  if results and results.get("dev_history"):
    return [{"step": h["step"], "epoch": h.get("epoch"), "f1": h["f1"]} for h in results["dev_history"]], \
        "results.json"
  by_step = {}
  for rec in _metrics_lines(path):
    if rec.get("split") == "dev" and "f1" in rec and "step" in rec:
      by_step[rec["step"]] = rec["f1"]  # a resumed run logs a step again: the last value wins
  hist = [{"step": s, "epoch": s / spe if spe else None, "f1": by_step[s]} for s in sorted(by_step)]
  return hist, ("metrics.jsonl" if hist else None)


def collect(roots) -> list[dict]:
  """One dict per run folder: run, status, group key fields, results (None if absent), training length, history."""
  if isinstance(roots, str):
    roots = [roots]
  rows = []
  for root in roots:
    for rel, path in find_runs(root):
      config = sweep.read_json(path / "config.json") or {}
      results = sweep.read_json(path / "results.json")
      model, data = config.get("model", {}), config.get("data", {})
      head = model.get("head", "?")
      kind = head_kind(head, results)
      spe = steps_per_epoch(config, results)
      epochs, stopped = training_length(config, results, spe)
      history, source = dev_history(path, results, spe)
      rows.append({
          "run": rel if len(roots) == 1 else f"{str(root).rstrip('/')}/{rel}",
          "status": sweep.status_of(results),
          "dataset": data.get("name", "?"),
          "encoder": model.get("encoder", "?"),
          "head": head,
          "rope": NO_ROPE if kind == TAGGER else model.get("use_rope", "?"),
          "seed": config.get("seed"),
          "results": results,
          "head_kind": kind,
          "length_buckets": length_buckets_of(results),
          "epochs": epochs,
          "stopped_early": stopped,
          "history": history,
          "history_source": source,
      })
  return rows


# ----------------------------------------------------------------------------- statistics

GROUP_KEYS = ("dataset", "encoder", "head", "rope")
NO_ROPE = "n/a"  # tagger heads have no RoPE; their config's use_rope is ignored
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
  """Finished runs grouped by GROUP_KEYS: {key fields, head_kind, n, runs, members, metrics: {column: (mean, std,
  count)}, epochs: [per seed], stopped_early: [per seed, None = unknown]}."""
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
    out.append({**dict(zip(GROUP_KEYS, key)), "head_kind": members[0]["head_kind"], "n": len(members),
                "runs": [m["run"] for m in members], "members": members, "metrics": metrics,
                "epochs": [m["epochs"] for m in members if m["epochs"] is not None],
                "stopped_early": [m["stopped_early"] for m in members]})
  return out


def length_buckets(rows: list[dict]) -> tuple[str, ...]:
  """Bucket labels of these runs in order (first seen first, should runs disagree)."""
  out = []
  for row in rows:
    out += [b for b in row["length_buckets"] if b not in out]
  return tuple(out)


def pooled_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, float | None]:
  """F1 per length bucket from tp/pred/gold summed over the runs (None where pred + gold is 0)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
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


def _key_cells(g: dict) -> list[str]:
  return [g["dataset"], g["encoder"], g["head"], g["rope"], str(g["n"])]


def groups_table(summary: list[dict]) -> str:
  if not summary:
    return "(no finished runs)"
  cols = ["dataset", "encoder", "head", "RoPE", "n"] + [c for c, _ in METRICS]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for g in summary:
    cells = _key_cells(g) + [fmt_cell(c, *g["metrics"][c], g["n"]) for c, _ in METRICS]
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
  buckets = length_buckets([m for g in summary for m in g["members"]])
  lines = []
  for g in summary:
    members = g["members"]
    if not any((r["results"].get("dev") or {}).get("by_length") for r in members):
      continue
    f1 = pooled_by_length(members, buckets=buckets)
    cells = ["-" if f1[b] is None else f"{100 * f1[b]:.2f}" for b in buckets]
    lines.append("| " + " | ".join(_key_cells(g) + cells) + " |")
  if not lines:
    return ""
  head = "| dataset | encoder | head | RoPE | n | " + " | ".join(f"len {b}" for b in buckets) + " |"
  return "\n".join([head, "|" + "---|" * (5 + len(buckets)), *lines])


def fmt_epochs(epochs: list[float], n: int) -> str:
  """Mean epochs over seeds, the range when seeds differ, (n=k) when some seeds' count is unknown."""
  if not epochs:
    return "-"
  cell = f"{statistics.mean(epochs):.2f}"
  if max(epochs) - min(epochs) > 5e-3:
    cell += f" ({min(epochs):.2f}-{max(epochs):.2f})"
  return cell if len(epochs) == n else f"{cell} (n={len(epochs)})"


def fmt_stopped(stopped: list[bool | None]) -> str:
  """Seeds stopped early out of those known, e.g. "1/3"; "?" when unknown."""
  known = [s for s in stopped if s is not None]
  if not known:
    return "?"
  cell = f"{sum(known)}/{len(known)}"
  return cell if len(known) == len(stopped) else f"{cell} ({len(stopped) - len(known)} unknown)"


def training_table(summary: list[dict]) -> str:
  """Per group: epochs trained, seeds stopped early, seeds with a per-epoch dev history."""
  if not summary:
    return ""
  lines = ["| dataset | encoder | head | RoPE | n | epochs trained (mean over seeds) | stopped early (seeds) "
           "| dev F1 history (seeds) |", "|" + "---|" * 8]
  for g in summary:
    sources = sorted({m["history_source"] for m in g["members"] if m["history_source"]})
    hist = sum(bool(m["history"]) for m in g["members"])
    hist_cell = f"{hist}/{g['n']}" + (f" ({', '.join(sources)})" if sources else "")
    cells = _key_cells(g) + [fmt_epochs(g["epochs"], g["n"]), fmt_stopped(g["stopped_early"]), hist_cell]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def no_history(summary: list[dict]) -> list[str]:
  """Finished runs with no per-epoch dev history (neither results.json's dev_history nor metrics.jsonl)."""
  return [m["run"] for g in summary for m in g["members"] if not m["history"]]


def markdown(rows: list[dict], summary: list[dict]) -> str:
  parts = ["## Finished runs (mean ± sample std over seeds; F1/P/R in %)", "", groups_table(summary)]
  lengths = length_table(rows, summary)
  if lengths:
    parts += ["", "## Dev F1 (%) by gold entity length in encoder tokens (tp/pred/gold pooled over seeds)", "",
              lengths]
  training = training_table(summary)
  if training:
    parts += ["", "## Training length (epochs trained, early stopping, dev F1 history)", "", training]
    missing = no_history(summary)
    if missing:
      parts += ["", f"No per-epoch history recorded ({len(missing)} of "
                f"{sum(g['n'] for g in summary)} finished runs: no dev_history in results.json, no metrics.jsonl):",
                "", *[f"- {run}" for run in missing]]
  bad = unfinished_table(rows)
  if bad:
    parts += ["", "## Not finished (not averaged above)", "", bad]
  return "\n".join(parts) + "\n"


# back-compat name used by older callers
def markdown_table(rows: list[dict]) -> str:
  return markdown(rows, summarize(rows))


# ----------------------------------------------------------------------------- plots

ROPE_STYLE = {  # rope -> (label, bar colour, line style)
    "True": ("RoPE", "tab:blue", "-"),
    "False": ("no RoPE", "tab:orange", "--"),
    NO_ROPE: ("tagger (no RoPE)", "tab:gray", "-."),
}
CELL_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                "tab:cyan", "tab:gray")  # line plots: one per head x RoPE cell
_DPI = 120


def _pyplot():
  try:
    import matplotlib
  except ImportError as e:
    raise ImportError("launch.report plots need matplotlib: pip install -e '.[plots]'") from e
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  return plt


def _rope_label(rope: str) -> str:
  return ROPE_STYLE.get(rope, (f"RoPE={rope}",))[0]


def _grid(plt, n: int, *, panel_w: float, panel_h: float):
  """Figure with n panels, 2 per row; unused panels hidden. Returns (fig, axes in reading order)."""
  ncols = 2 if n > 1 else 1
  nrows = -(-n // ncols)
  fig, axes = plt.subplots(nrows, ncols, figsize=(panel_w * ncols, panel_h * nrows), squeeze=False)
  axes = list(axes.flat)
  for ax in axes[n:]:
    ax.set_visible(False)
  return fig, axes[:n]


def _head_order(groups: list[dict]) -> list[tuple[str, str]]:
  """(encoder, head) slots: span heads first, then taggers, each alphabetical."""
  return sorted({(g["encoder"], g["head"]) for g in groups},
                key=lambda eh: (any(g["head_kind"] == TAGGER for g in groups if (g["encoder"], g["head"]) == eh), eh))


def _rope_order(ropes) -> list[str]:
  order = list(ROPE_STYLE)
  return sorted(ropes, key=lambda r: (order.index(r) if r in order else len(order), r))


def _cell_order(summary: list[dict]) -> list[tuple[str, str]]:
  """(head, rope) cells: heads as on the F1 figure's x axis, RoPE before no RoPE."""
  heads, ropes = [], list(ROPE_STYLE)
  for _, head in _head_order(summary):
    heads += [head] if head not in heads else []
  cells = {(g["head"], g["rope"]) for g in summary}
  return sorted(cells, key=lambda k: (heads.index(k[0]), ropes.index(k[1]) if k[1] in ropes else len(ropes), k[1]))


def _cell_style(summary: list[dict]) -> dict[tuple[str, str], tuple[str, str, str]]:
  """(head, rope) -> (label, colour per cell, line style by RoPE), the same in every panel of a figure."""
  out = {}
  for i, (head, rope) in enumerate(_cell_order(summary)):
    label = head if rope == NO_ROPE else f"{head}, {_rope_label(rope)}"
    out[(head, rope)] = (label, CELL_COLOURS[i % len(CELL_COLOURS)], ROPE_STYLE.get(rope, ("", "", ":"))[2])
  return out


def _markers(summary: list[dict]) -> dict[str, str]:
  """Encoder -> marker (panels name their encoders in the title)."""
  return {e: "osD^v"[i % 5] for i, e in enumerate(sorted({g["encoder"] for g in summary}))}


def _cell_legend(fig, plt, summary: list[dict]):
  """Figure-level legend of the (head, rope) line styles, above the panels."""
  style = _cell_style(summary)
  handles = [plt.Line2D([], [], color=style[k][1], linestyle=style[k][2], linewidth=2, label=style[k][0])
             for k in _cell_order(summary)]
  fig.legend(handles=handles, loc="upper center", ncol=min(len(handles), 6), fontsize=10, frameon=False)


def _datasets(summary: list[dict]) -> list[str]:
  return sorted({g["dataset"] for g in summary})


def _encoders(groups: list[dict]) -> str:
  return "/".join(sorted({g["encoder"] for g in groups}))


def plot_f1(summary: list[dict], path: str | None = None):
  """One panel per dataset: heads on the x axis, RoPE on/off side by side; bar = mean over seeds, dots = seeds.

  Each panel shows test F1 when every group there has it, else dev F1 (named in the title). Returns the figure.
  """
  plt = _pyplot()
  datasets = _datasets(summary)
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  width = 0.38
  shown = {}
  for ax, ds in zip(axes, datasets):
    groups = [g for g in summary if g["dataset"] == ds]
    split = "test" if all(g["metrics"]["test F1"][0] is not None for g in groups) else "dev"
    slots = _head_order(groups)
    several = len({e for e, _ in slots}) > 1
    top = 0.0
    for x, slot in enumerate(slots):
      cell = {g["rope"]: g for g in groups if (g["encoder"], g["head"]) == slot}
      ropes = _rope_order(cell)
      for i, rope in enumerate(ropes):
        g = cell[rope]
        xb = x + (i - (len(ropes) - 1) / 2) * width
        seeds = [100 * m["results"][split]["f1"] for m in g["members"] if (m["results"].get(split) or {}).get("f1")
                 is not None]
        if not seeds:
          continue
        mean = statistics.mean(seeds)
        label, colour, _ = ROPE_STYLE.get(rope, (f"RoPE={rope}", "tab:olive", ":"))
        shown[label] = ax.bar(xb, mean, width * 0.92, color=colour, alpha=0.85, label=label)
        jitter = [(j - (len(seeds) - 1) / 2) * width * 0.18 for j in range(len(seeds))]
        ax.scatter([xb + d for d in jitter], seeds, s=14, color="black", zorder=3)
        hi = max(seeds)
        ax.annotate(f"{mean:.1f}", (xb, hi), xytext=(0, 3), textcoords="offset points", ha="center",
                    va="bottom", fontsize=8)
        ax.text(xb, 1.5, f"n={len(seeds)}", ha="center", va="bottom", fontsize=8, color="white", fontweight="bold")
        top = max(top, hi)
    ax.set_xticks(range(len(slots)))
    ax.set_xticklabels([f"{e}/{h}" if several else h for e, h in slots], fontsize=10)
    ax.set_xlim(-0.6, len(slots) - 0.4)
    ax.set_ylim(0, min(105.0, max(10.0, top * 1.12)))
    ax.set_title(f"{ds}: {split} F1 ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_ylabel(f"{split} F1 (%)", fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
  handles = [shown[k] for k in (s[0] for s in ROPE_STYLE.values()) if k in shown]
  handles += [h for k, h in shown.items() if h not in handles]
  if handles:
    dot = plt.Line2D([], [], marker="o", color="black", linestyle="", markersize=4, label="one seed")
    fig.legend(handles=handles + [dot], loc="upper center", ncol=len(handles) + 1, fontsize=10, frameon=False)
  fig.suptitle("F1 per dataset: bar = mean over seeds, dots = seeds, n = seeds", fontsize=11, y=0.96)
  fig.tight_layout(rect=(0, 0, 1, 0.935))
  if path:
    _save(fig, path)
  return fig


def plot_by_length(rows: list[dict], summary: list[dict], path: str | None = None):
  """One panel per dataset: dev F1 by gold entity length per head x RoPE cell (pooled over seeds)."""
  plt = _pyplot()
  datasets = _datasets(summary)
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  buckets = length_buckets([m for g in summary for m in g["members"]])
  xs = list(range(len(buckets)))
  style, markers = _cell_style(summary), _markers(summary)
  for ax, ds in zip(axes, datasets):
    groups = [g for g in summary if g["dataset"] == ds]
    for g in groups:
      f1 = pooled_by_length(g["members"], buckets=buckets)
      label, colour, ls = style[(g["head"], g["rope"])]
      ys = [100 * f1[b] if f1[b] is not None else float("nan") for b in buckets]
      ax.plot(xs, ys, marker=markers[g["encoder"]], markersize=4, color=colour, linestyle=ls, label=label)
    ax.set_xticks(xs)
    ax.set_xticklabels(buckets, fontsize=10)
    ax.set_title(f"{ds}: dev F1 by entity length ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_ylim(0, 100)
    ax.set_xlabel("gold entity length (encoder tokens)", fontsize=10)
    ax.set_ylabel("dev F1 (%), pooled over seeds", fontsize=10)
    ax.grid(alpha=0.3)
  _cell_legend(fig, plt, summary)
  fig.tight_layout(rect=(0, 0, 1, 0.94))
  if path:
    _save(fig, path)
  return fig


def _history_curve(members: list[dict], unit: str) -> tuple[list[float], list[float], list[float], list[float]]:
  """(x, mean, min, max) of dev F1 (%) over the seeds evaluated at each x (x = epoch or step)."""
  at: dict[float, list[float]] = {}
  for m in members:
    for h in m["history"]:
      at.setdefault(round(float(h[unit]), 6), []).append(100 * h["f1"])
  xs = sorted(at)
  return xs, [statistics.mean(at[x]) for x in xs], [min(at[x]) for x in xs], [max(at[x]) for x in xs]


def plot_epochs(summary: list[dict], path: str | None = None):
  """One panel per dataset with a dev history: dev F1 by epoch per head x RoPE cell, mean over seeds, band =
  min..max. A panel is by step when some run there has no known steps per epoch. None when no run has one."""
  datasets = [ds for ds in _datasets(summary) if any(m["history"] for g in summary if g["dataset"] == ds
                                                       for m in g["members"])]
  if not datasets:
    return None
  plt = _pyplot()
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  style, markers = _cell_style(summary), _markers(summary)
  for ax, ds in zip(axes, datasets):
    groups = [g for g in summary if g["dataset"] == ds and any(m["history"] for m in g["members"])]
    cells = _cell_order(summary)
    groups.sort(key=lambda g: cells.index((g["head"], g["rope"])))
    by_epoch = all(h["epoch"] is not None for g in groups for m in g["members"] for h in m["history"])
    unit = "epoch" if by_epoch else "step"
    for g in groups:
      members = [m for m in g["members"] if m["history"]]
      xs, mean, lo, hi = _history_curve(members, unit)
      label, colour, ls = style[(g["head"], g["rope"])]
      ax.plot(xs, mean, color=colour, linestyle=ls, marker=markers[g["encoder"]], markersize=3,
              label=f"{label} (n={len(members)})")
      if len(members) > 1:
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
    ax.set_title(f"{ds}: dev F1 during training ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_xlabel("epoch" if by_epoch else "training step (steps per epoch unknown)", fontsize=10)
    ax.set_ylabel("dev F1 (%)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.8)
  fig.suptitle("Dev F1 by epoch: line = mean over seeds, band = min..max over seeds, n = seeds", fontsize=11)
  fig.tight_layout()
  if path:
    _save(fig, path)
  return fig


def _save(fig, path: str):
  from etils import epath

  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=_DPI)
  epath.Path(path).write_bytes(buf.getvalue())


# ----------------------------------------------------------------------------- CLI


def write_plots(rows: list[dict], summary: list[dict], prefix: str) -> list[tuple[str, str]]:
  """Writes the figures; returns (title, file name) of each for the markdown links."""
  plt = _pyplot()
  name = prefix.rstrip("/").split("/")[-1]
  out = []
  for title, suffix, make in (("F1 per dataset, head and RoPE", "_f1.png", lambda p: plot_f1(summary, p)),
                              ("Dev F1 by entity length", "_by_length.png", lambda p: plot_by_length(rows, summary, p)),
                              ("Dev F1 by epoch", "_epochs.png", lambda p: plot_epochs(summary, p))):
    fig = make(f"{prefix}{suffix}")
    if fig is not None:
      plt.close(fig)
      out.append((title, f"{name}{suffix}"))
  return out


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m launch.report", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("roots", nargs="+", metavar="DIR", help="sweep folders holding run workdirs (local or gs://)")
  parser.add_argument("--out", default=None, metavar="PREFIX",
                      help="also write PREFIX.md and the PREFIX_*.png figures (e.g. docs/figures/rope)")
  args = parser.parse_args(argv)
  rows = collect(args.roots)
  summary = summarize(rows)
  text = markdown(rows, summary)
  print(text, end="")
  if not args.out:
    return 0
  from etils import epath

  epath.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
  written = []
  try:
    if summary:
      written = write_plots(rows, summary, args.out)
      text += "\n" + "".join(f"![{title}]({name})\n\n" for title, name in written)
      if not any(name.endswith("_epochs.png") for _, name in written):
        text += "(No dev F1 by epoch figure: no finished run recorded a per-epoch dev history.)\n"
  except ImportError as e:
    epath.Path(f"{args.out}.md").write_text(text)
    print(f"wrote {args.out}.md; no plots: {e}", file=sys.stderr)
    return 1
  epath.Path(f"{args.out}.md").write_text(text)
  folder = str(epath.Path(args.out).parent)
  print(f"wrote {args.out}.md" + "".join(f", {folder}/{name}" for _, name in written), file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
