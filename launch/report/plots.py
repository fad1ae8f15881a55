"""The report's figures (matplotlib): F1 per dataset, dev F1 by entity length, dev F1 by epoch."""

from __future__ import annotations

import io
import statistics

from etils import epath

from .cells import finite
from .runs import EVENTS, NO_ROPE, PLAIN, RELATIONS, TAGGER
from .splits import joined
from .stats import gold_by_length, length_buckets, pointer_name, pooled_by_length, setting_order

ROPE_STYLE = {  # rope -> (label, bar colour, line style)
    "True": ("RoPE", "tab:blue", "-"),
    "False": ("no RoPE", "tab:orange", "--"),
    NO_ROPE: ("tagger (no RoPE)", "tab:gray", "-."),
}
CELL_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive",
                "tab:cyan", "tab:gray")  # line plots: one per head x RoPE (x pointer RoPE) cell
_DPI = 120
LEGEND_LINE = 4.0  # legend handle length (font sizes) of line figures: a whole period of `_line_style`'s dashes


def _pyplot():
  """matplotlib, an optional extra ('.[plots]'), imported when a figure is first drawn."""
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


def _pointer(g: dict) -> str:
  """A cell's pointer RoPE (relation and event runs: "True" / "False"; "n/a" for entity runs and reports without
  pointer tasks)."""
  return g.get("pointer_rope", NO_ROPE)


def _pointer_label(pointer_rope: str) -> str:
  return "" if pointer_rope == NO_ROPE else pointer_name(pointer_rope)


def _head_order(groups: list[dict]) -> list[tuple[str, str, str]]:
  """(encoder, head, pointer RoPE) slots: span heads first, then taggers, each alphabetical, pointer RoPE first."""
  def key(slot):
    tagger = any(g["head_kind"] == TAGGER for g in groups if (g["encoder"], g["head"], _pointer(g)) == slot)
    return tagger, slot[:2], setting_order(slot[2])

  return sorted({(g["encoder"], g["head"], _pointer(g)) for g in groups}, key=key)


def _rope_order(ropes) -> list[str]:
  return sorted(ropes, key=setting_order)


def _cell_key(g: dict) -> tuple[str, str, str]:
  return g["head"], g["rope"], _pointer(g)


def _cell_order(summary: list[dict]) -> list[tuple[str, str, str]]:
  """(head, rope, pointer RoPE) cells: heads as on the F1 figure's x axis, RoPE before no RoPE, then pointer RoPE
  before none."""
  heads = []
  for _, head, _ in _head_order(summary):
    heads += [head] if head not in heads else []
  return sorted({_cell_key(g) for g in summary}, key=lambda k: (heads.index(k[0]), setting_order(k[1]), setting_order(k[2])))


def _cell_label(head: str, rope: str, pointer_rope: str) -> str:
  parts = [head] + ([] if rope == NO_ROPE else [_rope_label(rope)]) + [_pointer_label(pointer_rope)]
  return ", ".join(p for p in parts if p)


def _line_style(rope: str, cycle: int):
  """The line style of a cell: by RoPE in the palette's first pass; in its later passes (`cycle` > 0, the colours
  again) the RoPE's dash followed by cycle + 1 dots, so no two cells share colour and line style."""
  base = ROPE_STYLE.get(rope, ("", "", ":"))[2]
  if not cycle:
    return base
  dash = {"-": 6.0, "--": 3.0, "-.": 4.5}.get(base, 1.5)
  return (0, (dash, 1.5) + (1.0, 1.5) * (cycle + 1))


def _cell_style(summary: list[dict]) -> dict[tuple[str, str, str], tuple]:
  """(head, rope, pointer RoPE) -> (label, colour, line style): colours in turn, line style by RoPE (`_line_style`),
  the same in every panel of a figure."""
  out = {}
  for i, key in enumerate(_cell_order(summary)):
    cycle, colour = divmod(i, len(CELL_COLOURS))
    out[key] = (_cell_label(*key), CELL_COLOURS[colour], _line_style(key[1], cycle))
  return out


def _markers(summary: list[dict]) -> dict[str, str]:
  """Encoder -> marker (panels name their encoders in the title)."""
  return {e: "osD^v"[i % 5] for i, e in enumerate(sorted({g["encoder"] for g in summary}))}


def _cell_handles(plt, summary: list[dict], groups: list[dict] | None = None) -> list:
  """Legend entries of the (head, rope, pointer RoPE) line styles of `groups` (default: every cell)."""
  style = _cell_style(summary)
  drawn = {_cell_key(g) for g in (summary if groups is None else groups)}
  return [plt.Line2D([], [], color=style[k][1], linestyle=style[k][2], linewidth=2, label=style[k][0])
          for k in _cell_order(summary) if k in drawn]


_MARGIN_IN = 0.1  # inches kept free at the figure's edges and between the legend, the title and the panels


def _layout_with_legend(fig, handles: list, *, title: str | None = None, fontsize: int = 10,
                        handlelength: float = 2.0):
  """A legend centred above the panels (and `title` under it), in as few rows as fit the figure's width with equal
  rows; the figure grows by their height, so the panels keep their size, and the panels are laid out below."""
  renderer = fig.canvas.get_renderer()
  room = fig.get_figwidth() * fig.dpi - 2 * _MARGIN_IN * fig.dpi
  fits = 1
  for ncol in range(len(handles), 0, -1):
    trial = fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=fontsize, frameon=False,
                       handlelength=handlelength)
    wide = trial.get_window_extent(renderer).width
    trial.remove()
    if wide <= room:
      fits = ncol
      break
  rows = -(-len(handles) // fits)
  ncol = -(-len(handles) // rows)  # the same rows, filled evenly
  panels_h = fig.get_figheight()
  legend = fig.legend(handles=handles, loc="upper center", ncol=ncol, fontsize=fontsize, frameon=False,
                      handlelength=handlelength,
                      bbox_to_anchor=(0.5, 1.0))
  top = legend.get_window_extent(renderer).height / fig.dpi + _MARGIN_IN
  text = fig.text(0.5, 1.0, title, fontsize=11, ha="center", va="top") if title else None  # not a suptitle,
  # which tight_layout would make room for a second time
  if text is not None:
    top += text.get_window_extent(renderer).height / fig.dpi + _MARGIN_IN
  height = panels_h + top
  fig.set_figheight(height)
  if text is not None:
    text.set_y(1 - (legend.get_window_extent(renderer).height / fig.dpi + _MARGIN_IN) / height)
  fig.tight_layout(rect=(0, 0, 1, 1 - (top + _MARGIN_IN) / height))


def _panel(g: dict) -> str:
  """A figure panel per dataset, or per dataset x max_len when the groups are split by max_len."""
  return f"{g['dataset']}, max_len {g['max_len']}" if "max_len" in g else g["dataset"]


def _datasets(summary: list[dict]) -> list[str]:
  """Panel names in order (max_len numerically)."""
  order = {_panel(g): (g["dataset"], int(g["max_len"]) if str(g.get("max_len", "")).isdigit() else 0)
           for g in summary}
  return sorted(order, key=lambda p: (order[p], p))


def _encoders(groups: list[dict]) -> str:
  return "/".join(sorted({g["encoder"] for g in groups}))


def plot_f1(summary: list[dict], path: str | None = None):
  """One panel per dataset: heads on the x axis (a head's relation or event cells once per pointer RoPE setting), RoPE
  on/off side by side; bar = mean over seeds, dots = seeds.

  Each panel shows test F1 when every group there has it, else dev F1 (named in the title as the cells' configs
  name the split, `splits.split_label`: e.g. "official dev"; "triple F1" when every group there is task=relations,
  "argument F1" when every one is task=events). Returns the figure.
  """
  plt = _pyplot()
  datasets = _datasets(summary)
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  width = 0.38
  shown = {}
  for ax, ds in zip(axes, datasets):
    groups = [g for g in summary if _panel(g) == ds]
    split = "test" if all(g["metrics"]["test F1"][0] is not None for g in groups) else "dev"
    named = joined([g.get("config") for g in groups], split)  # "official dev" where the config says so
    slots = _head_order(groups)
    several = len({e for e, _, _ in slots}) > 1
    top = 0.0
    for x, slot in enumerate(slots):
      cell = {g["rope"]: g for g in groups if (g["encoder"], g["head"], _pointer(g)) == slot}
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
    ax.set_xticklabels([(f"{e}/{h}" if several else h).replace(" [", "\n[") + (f"\n{_pointer_label(p)}" if
                                                                                 p != NO_ROPE else "")
                        for e, h, p in slots], fontsize=10)
    ax.set_xlim(-0.6, len(slots) - 0.4)
    ax.set_ylim(0, min(105.0, max(10.0, top * 1.12)))
    tasks = {g.get("task") for g in groups}
    f1 = "triple F1" if tasks == {RELATIONS} else "argument F1" if tasks == {EVENTS} else "F1"
    ax.set_title(f"{ds}: {named} {f1} ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_ylabel(f"{named} {f1} (%)", fontsize=10)
    ax.tick_params(axis="y", labelsize=9)
    ax.grid(axis="y", alpha=0.3)
    ax.set_axisbelow(True)
  handles = [shown[k] for k in (s[0] for s in ROPE_STYLE.values()) if k in shown]
  handles += [h for k, h in shown.items() if h not in handles]
  if handles:
    handles.append(plt.Line2D([], [], marker="o", color="black", linestyle="", markersize=4, label="one seed"))
  _layout_with_legend(fig, handles, title="F1 per dataset: bar = mean over seeds, dots = seeds, n = seeds")
  if path:
    _save(fig, path)
  return fig


def _gold_label(counts: list[int]) -> str:
  """Gold entities of a bucket per run: one number, or the range when runs differ (other tokenizers)."""
  if not counts:
    return "?"
  return f"{min(counts):,}" if min(counts) == max(counts) else f"{min(counts):,}-{max(counts):,}"


def _has_by_length(g: dict) -> bool:
  """Whether some run of the cell has dev F1 by entity length (relation and event runs have none)."""
  return any((m["results"].get("dev") or {}).get("by_length") for m in g["members"])


def plot_by_length(rows: list[dict], summary: list[dict], path: str | None = None):
  """One panel per dataset: dev F1 by gold entity length per head x RoPE cell (pooled over seeds). A bucket
  without gold entities has no F1: no point, and no line through it. Tick labels give the gold entities per run.
  Cells without by_length (relation and event runs) are left out; None when no cell has it."""
  with_lengths = [g for g in summary if _has_by_length(g)]
  datasets = [ds for ds in _datasets(summary) if any(_panel(g) == ds for g in with_lengths)]
  if not datasets:
    return None
  plt = _pyplot()
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  buckets = length_buckets([m for g in with_lengths for m in g["members"]])
  xs = list(range(len(buckets)))
  style, markers = _cell_style(summary), _markers(summary)
  for ax, ds in zip(axes, datasets):
    groups = [g for g in with_lengths if _panel(g) == ds]
    for g in groups:
      f1 = pooled_by_length(g["members"], buckets=buckets)
      label, colour, ls = style[_cell_key(g)]
      ys = [100 * f1[b] if f1[b] is not None else float("nan") for b in buckets]
      ax.plot(xs, ys, marker=markers[g["encoder"]], markersize=4, color=colour, linestyle=ls, label=label)
    gold = gold_by_length([m for g in groups for m in g["members"]], buckets=buckets)
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{b}\n{_gold_label(gold[b])} gold" for b in buckets], fontsize=9)
    dev = joined([g.get("config") for g in groups], "dev")  # "holdout" where the config says so
    ax.set_title(f"{ds}: {dev} F1 by entity length ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_ylim(0, 100)
    ax.set_xlabel("gold entity length (encoder tokens); gold entities per run", fontsize=10)
    ax.set_ylabel(f"{dev} F1 (%), pooled over seeds", fontsize=10)
    ax.grid(alpha=0.3)
  _layout_with_legend(fig, _cell_handles(plt, summary, with_lengths), handlelength=LEGEND_LINE)
  if path:
    _save(fig, path)
  return fig


def _history_curve(members: list[dict], unit: str) -> tuple[list[float], ...]:
  """(x, mean, min, max, seeds) of dev F1 (%) over the seeds evaluated at each x (x = epoch or step; a value that is
  not a number is left out)."""
  at: dict[float, list[float]] = {}
  for m in members:
    for h in m["history"]:
      if finite(h["f1"]):
        at.setdefault(round(float(h[unit]), 6), []).append(100 * h["f1"])
  xs = sorted(at)
  return (xs, [statistics.mean(at[x]) for x in xs], [min(at[x]) for x in xs], [max(at[x]) for x in xs],
          [len(at[x]) for x in xs])


def plot_epochs(summary: list[dict], path: str | None = None):
  """One panel per dataset with a dev history: dev F1 by epoch per head x RoPE (x pointer RoPE) cell, mean over
  seeds, band = min..max; where some seeds have stopped (early stopping), the mean of those still training is drawn
  faint and the legend says from where and over how many. A panel is by step when some run there has no known steps
  per epoch. None when no run has one."""
  datasets = [ds for ds in _datasets(summary) if any(m["history"] for g in summary if _panel(g) == ds
                                                       for m in g["members"])]
  if not datasets:
    return None
  plt = _pyplot()
  fig, axes = _grid(plt, len(datasets), panel_w=6.4, panel_h=3.9)
  style, markers = _cell_style(summary), _markers(summary)
  drawn = []
  for ax, ds in zip(axes, datasets):
    groups = [g for g in summary if _panel(g) == ds and any(m["history"] for m in g["members"])]
    cells = _cell_order(summary)
    groups.sort(key=lambda g: cells.index(_cell_key(g)))
    drawn += groups
    by_epoch = all(h["epoch"] is not None for g in groups for m in g["members"] for h in m["history"])
    unit = "epoch" if by_epoch else "step"
    for g in groups:
      members = [m for m in g["members"] if m["history"]]
      n = len(members)
      xs, mean, lo, hi, seeds = _history_curve(members, unit)
      label, colour, ls = style[_cell_key(g)]
      fewer = [(x, k) for x, k in zip(xs, seeds) if k < n]
      if fewer:  # the seeds still training only: faint, under the all-seed line
        ax.plot(xs, mean, color=colour, linestyle=ls, linewidth=1.0, alpha=0.4, marker=markers[g["encoder"]],
                markersize=2)
        least = min(k for _, k in fewer)
        label += f" (n={n}; faint from {unit} {fewer[0][0]:g}: {'' if least == n - 1 else f'{least}-'}{n - 1} " \
                 f"seed{'s' * (n > 2)})"
      else:
        label += f" (n={n})"
      ax.plot(xs, [y if k == n else float("nan") for y, k in zip(mean, seeds)], color=colour, linestyle=ls,
              marker=markers[g["encoder"]], markersize=3, label=label)
      if n > 1:
        ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
    dev = joined([g.get("config") for g in groups], "dev")  # "holdout" where the config says so
    ax.set_title(f"{ds}: {dev} F1 during training ({_encoders(groups)} encoder)", fontsize=11)
    ax.set_xlabel("epoch" if by_epoch else "training step (steps per epoch unknown)", fontsize=10)
    ax.set_ylabel(f"{dev} F1 (%)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right", framealpha=0.8, handlelength=LEGEND_LINE)
  dev = joined([g.get("config") for g in drawn], "dev")
  fig.suptitle(f"{dev[0].upper() + dev[1:]} F1 by epoch: line = mean over all n seeds, band = min..max over seeds\n"
               "faint = mean over the seeds still training where others had stopped early", fontsize=11)
  fig.tight_layout()
  if path:
    _save(fig, path)
  return fig


def _save(fig, path: str):
  buf = io.BytesIO()
  fig.savefig(buf, format="png", dpi=_DPI)
  epath.Path(path).write_bytes(buf.getvalue())


def variant_tags(summary: list[dict]) -> dict[str, str]:
  """Variant (stats.summarize) -> its short tag on the figures' axes: "v1", "v2", ... in order of first sight."""
  variants = [g["variant"] for g in summary if g.get("variant")]
  return {v: f"v{i}" for i, v in enumerate(dict.fromkeys(variants), 1)}


def _trick_heads(summary: list[dict]) -> list[dict]:
  """Groups of runs with training tricks or a variant get their own head label ("standard [fgm+ema]", "standard
  [v1]"), so the figures keep them apart from the plain runs of the same head."""
  tags, out = variant_tags(summary), []
  for g in summary:
    parts = [t for t in (g.get("trick", PLAIN), tags.get(g.get("variant", ""))) if t and t != PLAIN]
    out.append({**g, "head": g["head"] + "".join(f" [{t}]" for t in parts)} if parts else g)
  return out


def write_plots(rows: list[dict], summary: list[dict], prefix: str) -> list[tuple[str, str]]:
  """Writes the figures; returns (title, file name) of each for the markdown links."""
  plt = _pyplot()
  summary = _trick_heads(summary)
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
