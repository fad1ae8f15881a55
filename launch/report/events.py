"""The events rows of a report (task=events: GPLinker for events, experiments/phee_minilm.py's study): what an event
cell's F1 is, the PHEE paper's headline (EM and token F1 of Trigger, MainArgs, SubArgs; results.json's "phee",
`gp_jax.tasks.events.phee_score`) beside the argument F1 that selects checkpoints, and each comparison of event
cells (`stats.compare`'s rows, paired by seed) in the paper's EM F1s.

The argument F1's comparisons are the report's own (significance table: paired t-test over seeds and the paired
bootstrap over the per-record counts, which results.json keeps for the argument level). The PHEE scorer keeps no
per-record counts, so its figures get the seed level only: the mean difference, its t-interval and the paired t-test,
Holm-adjusted within one study over every PHEE figure x comparison printed (a family of their own, apart from the
argument F1's).
"""

from __future__ import annotations

import statistics

from .cells import finite
from .paired import holm, mean_t_interval, seed_t_test
from .runs import EVENTS
from .splits import split_label
from .stats import cell_name

FIGURES = ("Trigger", "MainArgs", "SubArgs")  # results.json phee.headline, in the paper's order
KINDS = (("em_f1", "EM F1"), ("token_f1", "token F1"))
SPLITS = ("dev", "test")


def is_events(g: dict) -> bool:
  return g.get("task") == EVENTS


def headline(results: dict | None, split: str, figure: str, kind: str = "em_f1") -> float | None:
  """results.json's phee.headline[figure][kind] of `split` (a fraction), None when the run has no PHEE figures."""
  value = ((((results or {}).get(split) or {}).get("phee") or {}).get("headline") or {}).get(figure, {}).get(kind)
  return None if value is None else float(value)


def _split_f1(results: dict | None, split: str, *path: str) -> float | None:
  """results.json's [split][path...] as a float (e.g. "event_level", "f1"), None when absent."""
  value = (results or {}).get(split)
  for key in path:
    value = value.get(key) if isinstance(value, dict) else None
  return None if value is None else float(value)


def _mean_std(values: list[float]) -> str:
  """"67.29 ± 0.41" in % (sample std), "± -" for one value, "-" for none."""
  if not values:
    return "-"
  std = f"{100 * statistics.stdev(values):.2f}" if len(values) > 1 else "-"
  return f"{100 * statistics.mean(values):.2f} ± {std}"


def _fmt(values: list[float | None], n: int) -> str:
  known = [v for v in values if finite(v)]  # NaN: not averaged, (n=k) says so
  cell = _mean_std(known)
  return cell if len(known) == n or not known else f"{cell} (n={len(known)})"


def events_note(summary: list[dict]) -> str:
  """What F1 means for event cells; "" when there is none."""
  if not any(is_events(g) for g in summary):
    return ""
  return ("Event cells (task=events; RoPE: the (event type, role) argument pointer's, pointer RoPE: the two link "
          "pointers'): F1, P and R are Su's argument level ((event type, role, text, start) over a sentence's "
          "events, triggers excluded; the checkpoint-selecting figure), here and in the comparisons below (the "
          "bootstrap on its per-record counts). The PHEE paper's figures are in the events section.")


def has_phee(summary: list[dict]) -> bool:
  """Whether some run of an event cell has the PHEE paper's figures (a PHEE-like corpus, `host.phee_like`)."""
  return any(headline(m["results"], split, f) is not None for g in summary if is_events(g) for m in g["members"]
             for split in SPLITS for f in FIGURES)


def figures_table(summary: list[dict]) -> str:
  """Per event cell and split (dev, test): the argument F1 (Su's, the selection figure), the event-level F1 and,
  when some run has them (`has_phee`), the PHEE paper's EM and token F1 of Trigger, MainArgs, SubArgs; mean ± sample
  std over seeds in %, "-" for none; "" without event cells."""
  cells = [g for g in summary if is_events(g)]
  if not cells:
    return ""
  kinds = KINDS if has_phee(summary) else ()
  cols = ["dataset", "encoder", "cell", "split", "n", "argument F1 (Su; selects)", "event-level F1",
          *[f"{f} {label}" for _, label in kinds for f in FIGURES]]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for g in cells:
    for split in SPLITS:
      runs = [m["results"] for m in g["members"]]
      if all((r or {}).get(split) is None for r in runs):
        continue
      n = len(runs)
      figures = [_fmt([headline(r, split, f, kind) for r in runs], n) for kind, _ in kinds for f in FIGURES]
      lines.append("| " + " | ".join([g["dataset"], g["encoder"], cell_name(g), split_label(g.get("config"), split),
                                      str(n),
                                      _fmt([_split_f1(r, split, "f1") for r in runs], n),
                                      _fmt([_split_f1(r, split, "event_level", "f1") for r in runs], n),
                                      *figures]) + " |")
  return "\n".join(lines)


def skipped_roles(summary: list[dict]) -> dict[str, dict[str, int]]:
  """PHEE scorer's skipped roles ({"pred" | "gold": {role: count}}), summed over the event cells' runs and splits."""
  out: dict[str, dict[str, int]] = {"pred": {}, "gold": {}}
  for g in summary:
    for m in g["members"] if is_events(g) else ():
      for split in SPLITS:
        skipped = ((((m["results"] or {}).get(split) or {}).get("phee") or {}).get("skipped") or {})
        for side in out:
          for role, count in (skipped.get(side) or {}).items():
            out[side][role] = out[side].get(role, 0) + int(count)
  return out


def paired_figures(compared: list[dict]) -> list[dict]:
  """Per comparison of `stats.compare` whose cells are all event cells: {index (1-based, as the significance
  table numbers it), row, figures: {figure: {values (per seed sum of weight x EM F1), mean, low, high, t_p, t_why,
  t_p_holm}} or why (a run lacks PHEE figures)}. Runs are the row's terms' members at the row's seeds, on its split;
  Holm within each study over every figure x comparison that has a p."""
  out = []
  for index, r in enumerate(compared, 1):
    terms = r.get("terms") or []
    if not terms or not all(is_events(g) for _, g, _ in terms):
      continue
    entry = {"index": index, "row": r, "figures": {}, "why": None}
    by_seed = [{m["seed"]: m for m in members} for _, _, members in terms]
    runs = [[by[s]["results"] for s in r["seeds"]] for by in by_seed]  # [term][seed]
    lacking = sum(headline(x, r["split"], f) is None for term in runs for x in term for f in FIGURES)
    if lacking:
      entry["why"] = f"no PHEE figures on {r['split']} ({lacking} of {len(FIGURES) * sum(map(len, runs))} values)"
    else:
      for f in FIGURES:
        values = [sum(w * headline(term[i], r["split"], f) for (w, _, _), term in zip(terms, runs))
                  for i in range(len(r["seeds"]))]
        mean, low, high = mean_t_interval(values)
        t_p, t_why = seed_t_test(values)
        entry["figures"][f] = {"values": values, "mean": mean, "low": low, "high": high, "t_p": t_p, "t_why": t_why}
    out.append(entry)
  for study in {e["row"].get("study") for e in out}:
    family = [fig for e in out if e["row"].get("study") == study for fig in e["figures"].values()]
    for fig, adjusted in zip(family, holm([fig["t_p"] for fig in family])):
      fig["t_p_holm"] = adjusted
  return out


def _points(x: float) -> str:
  return f"{100 * x:+.2f}"


def _p(p: float | None) -> str:
  return "-" if p is None else "< 0.001" if p < 0.001 else f"{p:.3f}"


def _figure_cell(fig: dict) -> str:
  interval = "" if fig["low"] is None else f" [{_points(fig['low'])}, {_points(fig['high'])}]"
  test = f"t-test {fig['t_why']}" if fig["t_p"] is None else f"p = {_p(fig['t_p'])} (Holm {_p(fig.get('t_p_holm'))})"
  return f"{_points(fig['mean'])}{interval}; {test}"


def paired_table(entries: list[dict]) -> str:
  """One line per event comparison (`paired_figures`): the argument F1 difference (as in the significance table)
  and each PHEE EM F1's; "" when there is none."""
  if not entries:
    return ""
  cols = ["#", "dataset", "comparison (A vs B)", "split", "seeds", "argument F1(A) - F1(B)",
          *[f"{f} EM F1(A) - F1(B) [95% t-interval]; paired t-test" for f in FIGURES]]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for e in entries:
    r = e["row"]
    figures = [e["why"]] * len(FIGURES) if e["why"] else [_figure_cell(e["figures"][f]) for f in FIGURES]
    lines.append("| " + " | ".join([str(e["index"]), r["a"]["dataset"], r["what"],
                                    split_label(r["a"].get("config"), r["split"]),
                                    ", ".join(map(str, r["seeds"])), _points(r["mean"]), *figures]) + " |")
  return "\n".join(lines)


def section(summary: list[dict], compared: list[dict]) -> list[str]:
  """The events section's markdown lines ([] without event cells)."""
  table = figures_table(summary)
  if not table:
    return []
  phee = has_phee(summary)
  what = "the PHEE paper's figures" if phee else "the event-level F1"
  parts = ["", f"## Events: {what} beside the argument F1 (%; mean ± sample std over seeds)", "",
           "Argument F1: Su's argument level, the figure that selects checkpoints and the one the significance "
           "table tests. Event-level F1: a predicted event with a trigger is a hit when its whole set of (type, "
           "role, text, start) equals a gold event's." + (
               " Trigger / MainArgs / SubArgs: the PHEE paper's scorer (exact match, EM, and token F1; results.json's "
               "phee.headline) on the events with a trigger." if phee else
               " No run holds the PHEE paper's figures (results.json's phee: PHEE-like corpora only)."), "", table]
  if not phee:
    return parts
  skipped = skipped_roles(summary)
  if any(skipped.values()):
    parts += ["", "Roles the PHEE scorer skipped (summed over runs and splits): " + "; ".join(
        f"{side}: " + ", ".join(f"{role} {n}" for role, n in sorted(roles.items()))
        for side, roles in skipped.items() if roles) + "."]
  entries = paired_figures(compared)
  if entries:
    parts += ["", "Comparisons of event cells in the paper's EM F1s (points; # as in the significance table; runs "
              "paired by seed as there): mean over seeds of F1(A) - F1(B), its 95% t-interval and the paired t-test "
              "over seeds, Holm-adjusted within each study over every figure and comparison of this table. The PHEE "
              "scorer keeps no per-record counts: no bootstrap here (the argument F1's is in the significance "
              "table).", "", paired_table(entries)]
  return parts
