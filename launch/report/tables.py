"""Markdown tables of a report: groups, significance, influence, F1 by entity length, training length, unfinished
runs; the events section is events.py's."""

from __future__ import annotations

import statistics

from .. import sweep
from . import events
from .runs import RELATIONS
from .splits import ROLES, is_plain, join_labels, labels_of, split_label
from .stats import (ALPHA, BOOTSTRAP_RESAMPLES, INFLUENCE_K, METRICS, SHARE_TOPS, cell_flags, cell_name, compare,
                    duplicate_text, failed_cells, length_buckets, nonfinite_f1, pooled_by_length, seeds_text,
                    summarize)

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
          *([g["pointer_rope"]] if "pointer_rope" in g else []), *([g["trick"]] if "trick" in g else []),
          *([g["variant"] or "-"] if "variant" in g else []), str(g["n"])]


def _key_header(summary: list[dict]) -> list[str]:
  """Column names of `_key_cells`: pointer RoPE only when relation runs are present, max_len only when the groups
  are split by it, variant when cells shown alike differ in other config keys."""
  pointer = ["pointer RoPE"] if any("pointer_rope" in g for g in summary) else []
  max_len = ["max_len"] if any("max_len" in g for g in summary) else []
  trick = ["tricks"] if any("trick" in g for g in summary) else []
  variant = ["variant (non-default keys)"] if any("variant" in g for g in summary) else []
  return ["dataset", "encoder", *max_len, "head", "RoPE", *pointer, *trick, *variant, "n"]


def _row(cells) -> str:
  return "| " + " | ".join(cells) + " |"


def _metric_header(col: str, labels: dict[str, list[str]]) -> str:
  """A METRICS column named by the split its cells' configs say (`labels`: role -> `labels_of` the configs):
  "official dev F1"; "dev / holdout F1" when they differ (the splits column then names each row's)."""
  role, _, what = col.partition(" ")
  return f"{join_labels(labels[role], role)} {what}" if role in ROLES else col


def groups_table(summary: list[dict]) -> str:
  """One row per cell; F1/P/R columns named by the splits the cells' configs say (`splits.split_label`), with a
  "splits" column when cells differ in them; a "check" column, when some cell is flagged (`stats.cell_flags`:
  failed runs, seeds at F1 0 or not a number), says why that cell's numbers are not a result."""
  if not summary:
    return "(no finished runs)"
  flags = {id(g): cell_flags(g) for g in summary}
  check = ["check"] if any(flags.values()) else []
  configs = [g.get("config") for g in summary]
  labels = {role: labels_of(configs, role) for role in ROLES}
  mixed = any(len(found) > 1 for found in labels.values())
  cols = (_key_header(summary) + (["splits (dev / test)"] if mixed else [])
          + [_metric_header(c, labels) for c, _ in METRICS] + check)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for g in summary:
    cells = _key_cells(g) + ([" / ".join(split_label(g.get("config"), r) for r in ROLES)] if mixed else [])
    cells += [fmt_cell(c, *g["metrics"][c], g["n"]) for c, _ in METRICS]
    cells += [f"**flagged**: {'; '.join(flags[id(g)])}" if flags[id(g)] else "ok"] if check else []
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def relations_note(summary: list[dict]) -> str:
  """What F1 means for relation cells (task=relations): triple F1 in the form results.json's "match" names; "" when
  there is none."""
  cells = [g for g in summary if g.get("task") == RELATIONS]
  if not cells:
    return ""
  forms = sorted({str((m["results"].get(split) or {}).get("match")) for g in cells for m in g["members"]
                  for split in ("dev", "test") if (m["results"].get(split) or {}).get("match")})
  form = f" ({' / '.join(forms)} form: results.json's match)" if forms else ""
  return (f"Relation cells (task=relations; RoPE: the entity pointer's, pointer RoPE: the head and tail pointers'): "
          f"F1, P and R are of (subject, relation, object) triples{form}, here and in the comparisons below.")


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
  """Dev F1 (%) by gold entity length per group, pooled over seeds, with a "dev split" column naming it where some
  cell's is not the corpus's dev (`splits.split_label`: holdout); "" when no run has by_length."""
  buckets = length_buckets([m for g in summary for m in g["members"]])
  named = labels_of([g.get("config") for g in summary], "dev") != ["dev"]  # some dev split is not the corpus's dev
  lines = []
  for g in summary:
    members = g["members"]
    if not any((r["results"].get("dev") or {}).get("by_length") for r in members):
      continue
    f1 = pooled_by_length(members, buckets=buckets)
    cells = ["-" if f1[b] is None else f"{100 * f1[b]:.2f}" for b in buckets]
    lines.append("| " + " | ".join(_key_cells(g) + ([split_label(g.get("config"), "dev")] if named else []) + cells)
                 + " |")
  if not lines:
    return ""
  cols = _key_header(summary) + (["dev split"] if named else []) + [f"len {b}" for b in buckets]
  return "\n".join([_row(cols), "|" + "---|" * len(cols), *lines])


def fmt_epochs(epochs: list[float], n: int) -> str:
  """Mean epochs over seeds, the range when seeds differ, (n=k) when some seeds' count is unknown."""
  if not epochs:
    return "-"
  cell = f"{statistics.mean(epochs):.2f}"
  if max(epochs) - min(epochs) > 5e-3:
    cell += f" ({min(epochs):.2f}-{max(epochs):.2f})"
  return cell if len(epochs) == n else f"{cell} (n={len(epochs)})"


def fmt_seed_flags(flags: list[bool | None]) -> str:
  """Seeds for which a flag holds (stopped early, best at the end) out of those known, e.g. "1/3"; "?" when
  unknown."""
  known = [f for f in flags if f is not None]
  if not known:
    return "?"
  cell = f"{sum(known)}/{len(known)}"
  return cell if len(known) == len(flags) else f"{cell} ({len(flags) - len(known)} unknown)"


def training_table(summary: list[dict]) -> str:
  """Per group: epochs trained, seeds stopped early, seeds whose best checkpoint is their last evaluation (still
  improving when training ended), seeds with a per-epoch dev history."""
  if not summary:
    return ""
  cols = _key_header(summary) + ["epochs trained (mean over seeds)", "stopped early (seeds)",
                                 "best checkpoint = last evaluated (seeds)", "dev F1 history (seeds)"]
  lines = [_row(cols), "|" + "---|" * len(cols)]
  for g in summary:
    sources = sorted({m["history_source"] for m in g["members"] if m["history_source"]})
    hist = sum(bool(m["history"]) for m in g["members"])
    hist_cell = f"{hist}/{g['n']}" + (f" ({', '.join(sources)})" if sources else "")
    cells = _key_cells(g) + [fmt_epochs(g["epochs"], g["n"]), fmt_seed_flags(g["stopped_early"]),
                             fmt_seed_flags(g["best_at_end"]), hist_cell]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def no_history(summary: list[dict]) -> list[str]:
  """Finished runs with no per-epoch dev history (neither results.json's dev_history nor metrics.jsonl)."""
  return [m["run"] for g in summary for m in g["members"] if not m["history"]]


def fmt_p(p: float) -> str:
  """`p = 0.012`, or `p < 0.001` below 0.001."""
  return "p < 0.001" if p < 0.001 else f"p = {p:.3f}"


def fmt_p_holm(p: float, adjusted: float | None) -> str:
  """`p = 0.012 (Holm 0.048)`."""
  holm = "-" if adjusted is None else "< 0.001" if adjusted < 0.001 else f"{adjusted:.3f}"
  return f"{fmt_p(p)} (Holm {holm})"


def _points(x: float) -> str:
  return f"{100 * x:+.2f}"


def _interval(low, high) -> str:
  return "- (n = 1)" if low is None else f"[{_points(low)}, {_points(high)}]"


def study_names(studies) -> dict:
  """Study path -> short name: the path below the studies' common folder (its own name when there is one)."""
  studies = sorted({s for s in studies if s is not None})
  if len(studies) <= 1:
    return {s: s.rstrip("/").split("/")[-1] for s in studies}
  parts = [s.rstrip("/").split("/") for s in studies]
  common = 0
  while all(len(p) > common + 1 for p in parts) and len({p[common] for p in parts}) == 1:
    common += 1
  return {s: "/".join(p[common:]) for s, p in zip(studies, parts)}


def _influence_cell(inf: dict | None, flags=()) -> str:
  """The significance table's influence check; a comparison with a flagged cell says so instead (never "holds")."""
  if flags:
    return "flagged: " + "; ".join(flags)
  if inf is None:
    return "-"
  if inf["mean"] is None or not inf["top"]:
    return "holds (no record carries it)" if not inf["flagged"] else "flagged"
  after = f"{_points(inf['mean'])} without top {len(inf['top'])}"
  if inf["flagged"]:
    return f"flagged: {'sign flips' if inf['flip'] else 'halved'} ({after})"
  return f"holds ({after})"


def _where(r: dict, names: dict, several_studies: bool, max_len: bool) -> list[str]:
  a = r["a"]
  return [*([names.get(r.get("study"), "-")] if several_studies else []), a["dataset"], a["encoder"],
          *([str(r.get("max_len") or "")] if max_len else [])]


def significance_table(rows: list[dict], studies=None) -> str:
  """One line per comparison of `stats.compare` (numbered as in `influence_table`); "" when there is none.
  `studies`: every study of the report (short names are made from them; default: those of `rows`)."""
  if not rows:
    return ""
  names = study_names(r.get("study") for r in rows) if studies is None else study_names(studies)
  several = len(names) > 1
  max_len = any(r.get("max_len") is not None for r in rows)
  cols = ["#", *(["study"] if several else []), "dataset", "encoder", *(["max_len"] if max_len else []),
          "comparison (A vs B)", "split", "seeds", "F1(A) - F1(B), mean over seeds", "95% t-interval",
          "paired t-test over seeds", "paired bootstrap over records", "influence check", "significant"]
  lines = [_row(cols), "|" + "---|" * len(cols)]
  for i, r in enumerate(rows, 1):
    t_test = f"- ({r.get('t_why')})" if r.get("t_p") is None else fmt_p_holm(r["t_p"], r.get("t_p_holm"))
    boot = r["why"] if r["p"] is None else fmt_p_holm(r["p"], r.get("p_holm"))
    cells = [str(i), *_where(r, names, several, max_len), r["what"], split_label(r["a"].get("config"), r["split"]),
             ", ".join(map(str, r["seeds"])),
             _points(r["mean"]), _interval(r["low"], r["high"]), t_test, boot,
             _influence_cell(r.get("influence"), r.get("flags")),
             "**yes**" if r.get("significant") else "no"]
    lines.append(_row(cells))
  return "\n".join(lines)


def _record_name(rec: dict) -> str:
  return f"#{rec['index']}" + (f" (id {str(rec['id']).replace('|', '/')})" if rec.get("id") is not None else "")


def influence_table(rows: list[dict]) -> str:
  """Per comparison with per-record counts (numbered as in `significance_table`): the leave-one-out check of
  `stats.influence`; "" when no comparison has counts."""
  found = [(i, r) for i, r in enumerate(rows, 1) if r.get("influence") is not None]
  if not found:
    return ""
  k = max(r["influence"]["k"] for _, r in found)
  cols = ["#", "comparison", "F1(A) - F1(B) from the counts",
          "share carried by the top " + " / ".join(map(str, SHARE_TOPS)) + " records",
          f"top {k} records: index in the split (leave-one-out effect)", "F1(A) - F1(B) without them",
          "95% t-interval", "paired bootstrap", "check"]
  lines = [_row(cols), "|" + "---|" * len(cols)]
  for i, r in found:
    inf = r["influence"]
    where = ", ".join([r["a"]["dataset"], *([str(r["max_len"])] if r.get("max_len") is not None else [])])
    share = " / ".join("-" if inf["share"][n] is None else f"{100 * inf['share'][n]:.0f}%" for n in SHARE_TOPS)
    top = ", ".join(f"{_record_name(rec)} ({_points(rec['effect'])})" for rec in inf["top"]) or "-"
    cells = [str(i), f"{where}: {r['what']}", _points(inf["full"]), share, top,
             "-" if inf["mean"] is None else _points(inf["mean"]), _interval(inf["low"], inf["high"]),
             "-" if inf["p"] is None else fmt_p(inf["p"]),
             "**flagged**: " + "; ".join(r["flags"]) if r.get("flags") else "**flagged**" if inf["flagged"]
             else "holds"]
    lines.append(_row(cells))
  return "\n".join(lines)


def skipped_lines(skipped: list[dict], studies=None) -> list[str]:
  """One line per comparison that could not be paired (`stats.compare`), saying why. `studies` as in
  `significance_table`."""
  names = study_names(s.get("study") for s in skipped) if studies is None else study_names(studies)
  out = []
  for s in skipped:
    a = s["a"]
    where = ", ".join([*([names.get(s.get("study"), "-")] if len(names) > 1 else []), a["dataset"], a["encoder"],
                       *([f"max_len {s['max_len']}"] if s.get("max_len") is not None else [])])
    out.append(f"- skipped {where}: {s['what']}: {s['why']}")
  return out


def holm_lines(rows: list[dict], skipped: list[dict], studies=None) -> list[str]:
  """Per study: over how many comparisons Holm adjusted each p (its family), and the planned comparisons without
  either p (skipped ones, rows whose tests could not run), which are in no family. `studies` as in
  `significance_table`."""
  names = study_names(r.get("study") for r in rows + skipped) if studies is None else study_names(studies)
  out = []
  for study in sorted({r.get("study") for r in rows + skipped}, key=str):
    mine = [r for r in rows if r.get("study") == study]
    t, b = (sum(r.get(k) is not None for r in mine) for k in ("t_p", "p"))
    untested = [x for x in skipped if x.get("study") == study]
    untested += [r for r in mine if r.get("t_p") is None and r.get("p") is None]
    where = lambda x: ", ".join([x["a"]["dataset"],  # noqa: E731
                                 *([f"max_len {x['max_len']}"] if x.get("max_len") is not None else [])])
    out.append(f"- {names.get(study, '-')}: Holm over {t} comparison{'s' * (t != 1)} with a t-test p and {b} with a "
               "bootstrap p; " + (f"{len(untested)} planned untested: " + "; ".join(
                   f"{where(x)}: {x['what']}" for x in untested) if untested else "no planned comparison untested"))
  return out


def _lost_line(name: str, runs: list[dict]) -> str:
  """A `failed_cells` entry: its runs, their seeds and folders ("failed" alone for a run without config.json)."""
  if not runs[0].get("config_known", True):
    return f"- {name}: failed"
  nan = [r for r in runs if nonfinite_f1(r["results"]) and r["status"] == sweep.FINISHED]
  failed = [r for r in runs if r not in nan]
  parts = [f"{len(x)} run{'s' * (len(x) != 1)} {why} ({seeds_text(r['seed'] for r in x)})"
           for x, why in ((failed, "failed"), (nan, "with an F1 that is not a number")) if x]
  return f"- {name}: {', '.join(parts)}: " + "; ".join(r["run"] for r in runs)


def markdown(rows: list[dict], summary: list[dict], *, influence_k: int = INFLUENCE_K,
             resamples: int = BOOTSTRAP_RESAMPLES) -> str:
  parts = ["## Finished runs (mean ± sample std over seeds; F1/P/R in %)", "", groups_table(summary)]
  if not is_plain([g.get("config") for g in summary]):
    parts += ["", "Splits as each cell's config names them: official dev = the corpus's dev split reported as the "
              "test figure (data.test_split=dev; it chose no checkpoint); holdout = the share of the training split "
              "held out as dev (data.dev_split=holdout), which chose the checkpoint; test = the corpus's test."]
  notes = [n for n in (relations_note(summary), events.events_note(summary)) if n]
  parts += [x for n in notes for x in ("", n)]
  lost = failed_cells(rows, summary)
  if lost:
    nan = any(r["status"] == sweep.FINISHED for _, runs in lost for r in runs)
    parts += ["", "**Flagged**: failed runs of no cell above (every run of the cell failed"
              + (" or scored an F1 that is not a number" if nan else "") + ", or the run has no "
              "config.json; see Not finished):", "", *[_lost_line(name, runs) for name, runs in lost]]
  twice = [(g, d) for g in summary for d in duplicate_text(g)]
  if twice:
    parts += ["", "**Flagged**: seeds run more than once in a cell (the same resolved config and seed, e.g. a "
              "--config override that undid the swept value). Only the first run of a seed (DIRs as given, then by "
              "path) counts in n, the means and the figures; a study with two runs of one seed in a cell skips that cell's "
              "comparisons:", "",
              *[f"- {g['dataset']}, {g['encoder']}, {cell_name(g)}: {d}" for g, d in twice]]
  if any("variant" in g for g in summary):
    parts += ["", "Cells are runs whose configs (a key an older config.json lacks at today's default, "
              "model.dtype=auto as what it resolved to) differ in the seed only; cells shown alike are told apart "
              "by the keys they differ in (variant: their non-default values)."]
  compared, skipped = compare(summary, rows=rows, resamples=resamples, influence_k=influence_k)
  studies = [r.get("study") for r in compared + skipped]
  tests = significance_table(compared, studies)
  if tests or skipped:
    parts += ["", "## Significance (F1 points; runs paired by seed)", "",
              "Mean over seeds of F1(A) - F1(B) with a 95% t-interval (t quantile with n - 1 degrees of freedom) "
              "and the paired t-test over seeds; a two-sided paired bootstrap over records: "
              f"{resamples:,} resamples of record indices (`numpy.random.default_rng(0)`), the same for both cells "
              "and every seed, each F1 recomputed from the summed per-record counts; p = 2 x the share of resampled "
              "differences on the other side of 0. Both p values are Holm-adjusted within each study (the family: "
              "every comparison printed for one study folder that has that p). Rows with max_len `L1 - L2` are length arms: the "
              "difference at L1 minus the difference at L2. Split: the split compared, as the runs' config names "
              "it (official dev: the corpus's dev as the test figure; holdout: dev held out of the training split). "
              "Influence check: the top "
              f"{influence_k} records carrying the difference are left out of both cells; flagged when that halves "
              "the difference or flips its sign. A comparison is flagged too when a cell of it had a run fail or a "
              "seed score F1 0 (nothing learned: no result to compare). Significant: both adjusted p < "
              f"{ALPHA} and not flagged.", ""]
    parts += [tests] if tests else ["(no comparison could be paired)"]
    if skipped:
      parts += ["", *skipped_lines(skipped, studies)]
    parts += ["", "Holm families (one per study; a planned comparison without a p is in none):", "",
              *holm_lines(compared, skipped, studies)]
  influence = influence_table(compared)
  if influence:
    parts += ["", "## Influence of single records (leave-one-out over the per-record counts)", "",
              "Effect of a record: F1(A) - F1(B) (mean over seeds, F1 from the per-record counts) with the record "
              "dropped from both cells, minus the full difference. Share: the summed effects of the records that "
              "carry the difference most (in its direction) over the difference. Then the top records are left "
              "out of both cells: the difference, its t-interval over seeds and the bootstrap p without them. "
              "Records are named by their index in the reported split (and the corpus's id where results.json "
              "carries one).", "", influence]
  parts += events.section(summary, compared)
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
