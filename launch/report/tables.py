"""Markdown tables of a report: groups, F1 by entity length, training length, unfinished runs."""

from __future__ import annotations

import statistics

from launch import sweep
from launch.report.stats import METRICS, length_buckets, pooled_by_length, significance, summarize

PERCENT = {"dev F1", "dev P", "dev R", "test F1", "test P", "test R"}  # fractions in results.json, shown in %


def fmt_cell(col: str, mean, std, count: int, n: int) -> str:
  if mean is None:
    return "-"
  scale, digits = (100.0, 2) if col in PERCENT else (1.0, 0)
  m = f"{mean * scale:.{digits}f}"
  s = "-" if std is None else f"{std * scale:.{digits}f}"
  cell = f"{m} ± {s}"
  return cell if count == n else f"{cell} (n={count})"


def _key_cells(g: dict) -> list[str]:
  return [g["dataset"], g["encoder"], *([g["max_len"]] if "max_len" in g else []), g["head"], g["rope"],
          *([g["trick"]] if "trick" in g else []), str(g["n"])]


def _key_header(summary: list[dict]) -> list[str]:
  """Column names of `_key_cells`: max_len only when the groups are split by it."""
  max_len = ["max_len"] if any("max_len" in g for g in summary) else []
  trick = ["tricks"] if any("trick" in g for g in summary) else []
  return ["dataset", "encoder", *max_len, "head", "RoPE", *trick, "n"]


def _row(cells) -> str:
  return "| " + " | ".join(cells) + " |"


def groups_table(summary: list[dict]) -> str:
  if not summary:
    return "(no finished runs)"
  cols = _key_header(summary) + [c for c, _ in METRICS]
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
  cols = _key_header(summary) + [f"len {b}" for b in buckets]
  return "\n".join([_row(cols), "|" + "---|" * len(cols), *lines])


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
  cols = _key_header(summary) + ["epochs trained (mean over seeds)", "stopped early (seeds)",
                                 "dev F1 history (seeds)"]
  lines = [_row(cols), "|" + "---|" * len(cols)]
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


def fmt_p(p: float) -> str:
  """`p = 0.012`, or `p < 0.001` below 0.001."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def significance_table(rows: list[dict]) -> str:
  """One line per comparison of `stats.significance`; "" when there is none."""
  if not rows:
    return ""
  max_len = any("max_len" in r["a"] for r in rows)
  cols = ["dataset", "encoder", *(["max_len"] if max_len else []), "comparison (A vs B)", "split", "seeds",
          "F1(A) - F1(B), mean over seeds", "95% t-interval", "paired bootstrap"]
  lines = [_row(cols), "|" + "---|" * len(cols)]
  for r in rows:
    a = r["a"]
    interval = "- (n = 1)" if r["low"] is None else f"[{100 * r['low']:+.2f}, {100 * r['high']:+.2f}]"
    cells = [a["dataset"], a["encoder"], *([a.get("max_len", "")] if max_len else []), r["what"], r["split"],
             ", ".join(map(str, r["seeds"])), f"{100 * r['mean']:+.2f}", interval,
             r["why"] if r["p"] is None else fmt_p(r["p"])]
    lines.append(_row(cells))
  return "\n".join(lines)


def markdown(rows: list[dict], summary: list[dict]) -> str:
  parts = ["## Finished runs (mean ± sample std over seeds; F1/P/R in %)", "", groups_table(summary)]
  tests = significance_table(significance(summary))
  if tests:
    parts += ["", "## Significance (F1 points; runs paired by seed)", "",
              "Mean over seeds of F1(A) - F1(B) with a 95% t-interval (t quantile with n - 1 degrees of freedom), "
              "and a two-sided paired bootstrap over records: 10,000 resamples of record indices "
              "(`numpy.random.default_rng(0)`), the same for both cells and every seed, each F1 recomputed from the "
              "summed per-record counts; p = 2 x the share of resampled differences on the other side of 0.", "",
              tests]
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
