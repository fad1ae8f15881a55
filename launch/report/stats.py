"""Statistics over runs: cells of finished runs with mean +- sample std per metric, F1 by entity length pooled
over seeds, and the study's comparisons: which cells are compared, paired by seed, in which Holm family (one per
study), and when a row is significant. The tests themselves (t-interval, t-test, paired bootstrap, Holm,
influence) are in paired.py, and their names are kept here for the report's callers."""

from __future__ import annotations

import json
import statistics

import numpy as np

from .. import sweep
from .paired import (BOOTSTRAP_RESAMPLES, INFLUENCE_K, SHARE_TOPS, contrast_bootstrap, holm,  # noqa: F401
                     influence, mean_t_interval, micro_f1, paired_bootstrap, seed_t_test, t_cdf, t_quantile)
from .runs import NO_ROPE, PLAIN, POINTER_TASKS, config_defaults

GROUP_KEYS = ("dataset", "encoder", "head", "rope")  # and pointer_rope, max_len, trick when needed (group_keys)
# (column, getter on results.json); F1/P/R are fractions in results.json and shown in %.
METRICS = (
    ("dev F1", lambda r: (r.get("dev") or {}).get("f1")),
    ("dev P", lambda r: (r.get("dev") or {}).get("precision")),
    ("dev R", lambda r: (r.get("dev") or {}).get("recall")),
    ("test F1", lambda r: (r.get("test") or {}).get("f1")),
    ("test P", lambda r: (r.get("test") or {}).get("precision")),
    ("test R", lambda r: (r.get("test") or {}).get("recall")),
    ("tokens/s", lambda r: r.get("train_tokens_per_s")),
    ("params", lambda r: r.get("parameters")),
)


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
  """(mean, sample std); std None when fewer than 2 values, both None when there are none."""
  if not values:
    return None, None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def group_keys(rows: list[dict]) -> tuple[str, ...]:
  """GROUP_KEYS, plus "pointer_rope" when some finished run is a pointer task (runs.POINTER_TASKS: relations,
  events; model.pointer_rope; "n/a" for entity runs), plus "max_len" when finished runs of one dataset differ in it
  (e.g. length arms of a study), plus "trick" when some finished run used training tricks (EMA, FGM, PGD:
  experiments/tricks.py)."""
  lengths: dict[str, set] = {}
  tricks, tasks = set(), set()
  for row in rows:
    if row["status"] == sweep.FINISHED:
      lengths.setdefault(row["dataset"], set()).add(row.get("max_len"))
      tricks.add(row.get("trick", PLAIN))
      tasks.add(row.get("task"))
  return (GROUP_KEYS + (("pointer_rope",) if tasks & set(POINTER_TASKS) else ())
          + (("max_len",) if any(len(v) > 1 for v in lengths.values()) else ())
          + (("trick",) if tricks - {PLAIN} else ()))


def _js(value) -> str:
  return json.dumps(value, sort_keys=True, default=str)


def _show(value) -> str:
  return value if isinstance(value, str) else str(value) if isinstance(value, (bool, int, float)) else _js(value)


def variant_keys(rows: list[dict], keys: tuple[str, ...]) -> list[str]:
  """Resolved config keys (runs.resolved_config) in which runs shown alike by `keys` (dataset, encoder, head, ...)
  differ: the keys that keep such runs in different cells, e.g. tune_threshold between two sweeps."""
  alike: dict[tuple, list[dict]] = {}
  for row in rows:
    alike.setdefault(tuple(str(row.get(k)) for k in keys), []).append(row.get("config") or {})
  out = set()
  for configs in alike.values():
    for k in set().union(*configs) if len(configs) > 1 else ():
      if len({_js(c.get(k)) for c in configs}) > 1:
        out.add(k)
  return sorted(out)


def variant_label(row: dict, keys: list[str]) -> str:
  """"key=value, ..." for each of `keys` where the run's resolved config is not today's default ("" if none)."""
  config, defaults = row.get("config") or {}, config_defaults(row.get("encoder"))
  return ", ".join(f"{k}={_show(config.get(k))}" for k in keys if _js(config.get(k)) != _js(defaults.get(k)))


def one_per_seed(runs: list[dict]) -> tuple[list[dict], list[dict]]:
  """(kept, dropped): the first run of each seed in the order given (DIRs as given, then by path); a later run of a
  seed already kept is dropped (the same resolved config and seed run twice). Runs without a seed are all kept."""
  kept, dropped, seen = [], [], set()
  for run in runs:
    seed = None if run["seed"] is None else _js(run["seed"])
    (dropped if seed in seen else kept).append(run)
    seen |= {seed} - {None}
  return kept, dropped


def summarize(rows: list[dict]) -> list[dict]:
  """Finished runs grouped into cells: one cell per resolved config but the seed (runs.resolved_config), shown by
  `group_keys(rows)` plus, when runs shown alike differ in other keys, a "variant" naming those keys (non-default
  values). Each: {key fields, [variant], config, head_kind, task, n (distinct seeds), runs, members (one run per
  seed, `one_per_seed`), dropped (later runs of a seed: never averaged, `cell_flags` names them), metrics: {column:
  (mean, std, count)}, epochs: [per seed], stopped_early and best_at_end: [per seed, None = unknown], failed: [{run,
  seed}] of the failed runs of the same resolved config (never averaged; `cell_flags` names them; runs without a
  config.json are in no cell: `failed_cells`)}."""
  keys = group_keys(rows)
  finished = [row for row in rows if row["status"] == sweep.FINISHED]
  vkeys = variant_keys(finished, keys)
  groups: dict[tuple, list[dict]] = {}
  for row in finished:
    config = row.get("config") or {}
    shown = tuple(str(row.get(k)) for k in keys)
    groups.setdefault((shown, tuple(_js(config.get(k)) for k in vkeys)), []).append(row)
  failed: dict[str, list[dict]] = {}
  for row in rows:
    if row["status"] == sweep.FAILED and row.get("config_known", True):
      failed.setdefault(_js(row.get("config") or {}), []).append(row)
  out = []
  for shown, variant in sorted(groups):
    members, dropped = one_per_seed(groups[(shown, variant)])
    metrics = {}
    for col, get in METRICS:
      values = [float(v) for v in (get(m["results"]) for m in members) if v is not None]
      metrics[col] = (*mean_std(values), len(values))
    out.append({**dict(zip(keys, shown)), **({"variant": variant_label(members[0], vkeys)} if vkeys else {}),
                "config": members[0].get("config") or {}, "head_kind": members[0]["head_kind"],
                "task": members[0].get("task"), "n": len(members),
                "runs": [m["run"] for m in members], "members": members, "dropped": dropped, "metrics": metrics,
                "epochs": [m["epochs"] for m in members if m["epochs"] is not None],
                "stopped_early": [m["stopped_early"] for m in members],
                "best_at_end": [m["best_at_end"] for m in members],
                "failed": [{"run": r["run"], "seed": r["seed"]}
                           for r in failed.get(_js(members[0].get("config") or {}), [])]})
  return out


def failed_cells(rows: list[dict], summary: list[dict]) -> list[tuple[str, list[dict]]]:
  """Cells with no finished run but failed ones (absent from `summary`): (dataset, encoder and `cell_name`, the
  failed runs), in run order; a failed run without a config.json is one entry of its own, named by its folder
  ("RUN (config unknown: no config.json)")."""
  known = {(True, _js(g["config"])) for g in summary}
  out: dict[tuple, list[dict]] = {}
  for row in rows:
    unknown = not row.get("config_known", True)  # its config is only today's defaults: never a cell
    key = (False, row["run"]) if unknown else (True, _js(row.get("config") or {}))
    if row["status"] == sweep.FAILED and key not in known:
      out.setdefault(key, []).append(row)
  shown = lambda r: {"head": r["head"], "rope": str(r["rope"]), "trick": r.get("trick", PLAIN),  # noqa: E731
                     "pointer_rope": r.get("pointer_rope", NO_ROPE)}
  return [(f"{runs[0]['dataset']}, {runs[0]['encoder']}, {cell_name(shown(runs[0]))}" if known_config else
           f"{runs[0]['run']} (config unknown: no config.json)", runs) for (known_config, _), runs in out.items()]


def cell_name(g: dict) -> str:
  """A cell as the report names it: head, RoPE, then the pointer RoPE (relation runs), tricks, max_len and variant
  that tell it apart."""
  parts = [g["head"] if g["rope"] == NO_ROPE else f"{g['head']}, {_rope_name(g['rope'])}"]
  parts += [pointer_name(g["pointer_rope"])] if g.get("pointer_rope", NO_ROPE) != NO_ROPE else []
  parts += [g["trick"]] if g.get("trick", PLAIN) != PLAIN else []
  parts += [f"max_len {g['max_len']}"] if "max_len" in g else []
  return ", ".join(parts) + (f" [{g['variant']}]" if g.get("variant") else "")


def zero_f1(results: dict | None, split: str) -> bool:
  """Whether a run scored F1 0 on `split` (no gold entity found): a failed training, not a result to compare."""
  f1 = ((results or {}).get(split) or {}).get("f1")
  return f1 is not None and float(f1) == 0.0


def seeds_text(seeds) -> str:
  """"seed 3" / "seeds 0, 1"; an unknown seed (no config.json) is "?"."""
  seeds = ["?" if s is None else str(s) for s in seeds]
  return f"seed{'s' * (len(seeds) != 1)} {', '.join(seeds)}"


def duplicate_text(g: dict) -> list[str]:
  """Per seed run more than once in the cell: which runs, which one counts."""
  out = []
  for kept in g["members"]:
    again = [d["run"] for d in g.get("dropped", ()) if kept["seed"] is not None and _js(d["seed"]) == _js(kept["seed"])]
    if again:
      out.append(f"seed {kept['seed']} run {1 + len(again)} times ({'; '.join([kept['run'], *again])}): only "
                 f"{kept['run']} counted")
  return out


def cell_flags(g: dict, members: list[dict] | None = None, splits=("dev", "test")) -> list[str]:
  """Why a cell's numbers are not a result, one phrase each: seeds run twice (`duplicate_text`), runs of it that
  failed, and seeds that scored F1 0 on one of `splits` (of `members`, default all of the cell's counted runs; seeds
  run twice only then). [] for a sound cell."""
  whole, members = members is None, g["members"] if members is None else members
  out = []
  for split in splits:
    zero = [m["seed"] for m in members if zero_f1(m["results"], split)]
    if zero:
      out.append(f"{split} F1 0 in {len(zero)} of {len(members)} seeds ({', '.join(map(str, zero))})")
  if g.get("failed"):
    out.append(f"{len(g['failed'])} run{'s' * (len(g['failed']) != 1)} failed "
               f"({seeds_text(r['seed'] for r in g['failed'])})")
  return out + (duplicate_text(g) if whole else [])


def length_buckets(rows: list[dict]) -> tuple[str, ...]:
  """Bucket labels of these runs in order (first seen first, should runs disagree)."""
  out = []
  for row in rows:
    out += [b for b in row["length_buckets"] if b not in out]
  return tuple(out)


def pooled_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, float | None]:
  """F1 per length bucket from tp/pred/gold summed over the runs (None where no gold entity has that length: a
  bucket of false spans only is not a score of 0)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
    tp = pred = gold = 0
    for row in group_rows:
      cell = (row["results"].get(split) or {}).get("by_length", {}).get(b)
      if cell:
        tp, pred, gold = tp + cell["tp"], pred + cell["pred"], gold + cell["gold"]
    out[b] = 2 * tp / (pred + gold) if gold else None
  return out


def gold_by_length(group_rows: list[dict], split: str = "dev", buckets=None) -> dict[str, list[int]]:
  """Gold entities per length bucket, one count per run that has the bucket (runs of one split and tokenizer agree)."""
  out = {}
  for b in buckets or length_buckets(group_rows):
    cells = [(row["results"].get(split) or {}).get("by_length", {}).get(b) for row in group_rows]
    out[b] = [int(c["gold"]) for c in cells if c]
  return out


# ----------------------------------------------------------------------------- significance

ALPHA = 0.05  # "significant": both Holm-adjusted p values below this, and the influence check passed
# Config keys a comparison's two cells may differ in (prefixes); any other difference skips the comparison.
ROPE_KEYS = ("model.use_rope",)
POINTER_ROPE_KEYS = ("model.pointer_rope",)
HEAD_KEYS = ("model.head", "model.use_rope")
TRICK_KEYS = ("adversarial.", "optimizer.ema_decay", "optimizer.ema_warmup")
LENGTH_KEYS = ("data.max_len", "data.buckets", "data.stride")


def _context(g: dict) -> tuple:
  return (g["dataset"], g["encoder"], g.get("max_len"))


def _rope_name(rope: str, what: str = "RoPE") -> str:
  """"RoPE", "no RoPE"; a value neither True nor False (missing: "?") is not taken for False."""
  return {"True": what, "False": f"no {what}", "?": f"{what} unknown"}.get(rope, f"{what}={rope}")


def pointer_name(pointer_rope: str) -> str:
  return _rope_name(pointer_rope, "pointer RoPE")


def setting_order(value: str) -> tuple:
  """"True", "False", "n/a", then any other value: the order of RoPE and pointer RoPE settings."""
  order = ("True", "False", NO_ROPE)
  return (order.index(value) if value in order else len(order), value)


def _comparisons(summary: list[dict]) -> list[tuple[dict, dict, str, tuple[str, ...]]]:
  """`comparisons`, each with the config key prefixes its two cells may differ in."""
  cells = {(_context(g), g["head"], g["rope"], g.get("trick", PLAIN), g.get("pointer_rope", NO_ROPE),
            g.get("variant", "")): g for g in summary}
  out = []
  for ctx, variant in sorted({(k[0], k[-1]) for k in cells}, key=lambda cv: tuple(map(str, cv))):
    here = sorted((k[1:-1] for k in cells if (k[0], k[-1]) == (ctx, variant)), key=lambda k: tuple(map(str, k)))
    pairs = []
    for pr in sorted({p for *_, p in here}, key=setting_order):  # entity runs: "n/a" only, names as before
      pt = "" if pr == NO_ROPE else f", {pointer_name(pr)}"
      heads = sorted({h for (h, _, t, p) in here if t == PLAIN and p == pr})
      pairs += [((h, "True", PLAIN, pr), (h, "False", PLAIN, pr), f"RoPE on vs off ({h}{pt})", ROPE_KEYS)
                for h in heads]
      pairs += [(("standard", "True", PLAIN, pr), ("crf", NO_ROPE, PLAIN, pr), f"GP vs CRF (GP with RoPE{pt})",
                 HEAD_KEYS)]
      pairs += [(("efficient", r, PLAIN, pr), ("standard", r, PLAIN, pr), f"EGP vs GP ({_rope_name(r)}{pt})",
                 HEAD_KEYS[:1]) for r in ("True", "False")]
      pairs += [((h, r, t, pr), (h, r, PLAIN, pr), f"{t} vs plain ({h}, {_rope_name(r)}{pt})", TRICK_KEYS)
                for (h, r, t, p) in here if p == pr and t != PLAIN]
    pointer = sorted({(h, r) for (h, r, t, p) in here if t == PLAIN and p == "True"},
                     key=lambda hr: (hr[0], setting_order(hr[1])))
    pairs += [((h, r, PLAIN, "True"), (h, r, PLAIN, "False"),
               f"pointer RoPE on vs off ({h}{'' if r == NO_ROPE else ', ' + _rope_name(r)})", POINTER_ROPE_KEYS)
              for h, r in pointer]
    suffix = f" [{variant}]" if variant else ""
    out += [(cells[(ctx, *a, variant)], cells[(ctx, *b, variant)], what + suffix, keys) for a, b, what, keys in pairs
            if (ctx, *a, variant) in cells and (ctx, *b, variant) in cells]
  return out


def comparisons(summary: list[dict]) -> list[tuple[dict, dict, str]]:
  """(group A, group B, what) for the study's comparisons, within one dataset x encoder (x max_len) and variant:
  RoPE on vs off per head; GP (standard head, with RoPE) vs CRF; EGP (efficient) vs GP with and without RoPE (all
  among runs without tricks); and each training trick against the plain runs of the same head and RoPE. Relation
  and event runs (runs.POINTER_TASKS) make these among cells of equal pointer RoPE (named with it, e.g. "RoPE on vs
  off (efficient, no pointer RoPE)"), plus pointer RoPE on vs off per head and RoPE (model.pointer_rope only)."""
  return [(a, b, what) for a, b, what, _ in _comparisons(summary)]


def _per_record(results: dict, split: str):
  """int [3, R] (tp, fp, fn) per record of `split`, or None when results.json has no (usable) per-record counts."""
  counts = (results.get(split) or {}).get("per_record")
  if not isinstance(counts, dict) or any(not isinstance(counts.get(k), list) for k in ("tp", "fp", "fn")):
    return None
  if len({len(counts[k]) for k in ("tp", "fp", "fn")}) > 1:
    return None
  return np.asarray([counts["tp"], counts["fp"], counts["fn"]], np.int64).reshape(3, -1)


def _record_ids(results: dict, split: str, records: int):
  """The corpus's record ids of `split` when results.json carries them (per_record "id" or "ids"), else None."""
  counts = (results.get(split) or {}).get("per_record") or {}
  ids = counts.get("id", counts.get("ids"))
  return ids if isinstance(ids, list) and len(ids) == records else None


def _differing(a: dict, b: dict) -> list[str]:
  return sorted(k for k in set(a) | set(b) if _js(a.get(k)) != _js(b.get(k)))


def _keys_text(keys: list[str], most: int = 4) -> str:
  return ", ".join(keys[:most]) + (f" and {len(keys) - most} more" if len(keys) > most else "")


def _contrast(terms, *, resamples: int, influence_k: int) -> tuple[dict | None, str | None]:
  """(row, None) for terms [(weight, group, members)] paired by seed, or (None, why it cannot be paired)."""
  try:
    return _paired_contrast(terms, resamples=resamples, influence_k=influence_k)
  except (ValueError, TypeError, KeyError, ArithmeticError) as e:  # a malformed results.json: say so, go on
    return None, f"could not compare: {type(e).__name__}: {e}"


def _paired_contrast(terms, *, resamples: int, influence_k: int) -> tuple[dict | None, str | None]:
  by_seed = []
  for _, _, members in terms:
    seen = {}
    for m in members:
      if m["seed"] in seen:
        return None, (f"two runs of one cell share seed {m['seed']} ({seen[m['seed']]['run']}, {m['run']}): their "
                      "resolved configs are the same; report their sweeps apart")
      seen[m["seed"]] = m
    by_seed.append(seen)
  seeds = sorted(set.intersection(*(set(s) - {None} for s in by_seed)), key=str)
  if not seeds:
    return None, "no seed in common (seeds " + " vs ".join(",".join(map(str, sorted(s, key=str))) or "-"
                                                           for s in by_seed) + ")"
  results = [[s[seed]["results"] for seed in seeds] for s in by_seed]  # [term][seed]
  split = "test" if all((r.get("test") or {}).get("f1") is not None for term in results for r in term) else "dev"
  if any((r.get(split) or {}).get("f1") is None for term in results for r in term):
    return None, f"a run has no {split} F1"
  weights = [w for w, _, _ in terms]
  values = [sum(w * term[i][split]["f1"] for w, term in zip(weights, results)) for i in range(len(seeds))]
  mean, low, high = mean_t_interval(values)
  t_p, t_why = seed_t_test(values)
  flags = []
  for (_, g, _), by in zip(terms, by_seed):
    found = cell_flags(g, [by[seed] for seed in seeds], splits=(split,))
    flags += [f"{cell_name(g)}: {f}" for f in found if f"{cell_name(g)}: {f}" not in flags]
  row = {"terms": terms, "split": split, "seeds": seeds, "values": values, "mean": mean, "low": low, "high": high,
         "t_p": t_p, "t_why": t_why, "p": None, "why": None, "influence": None, "flags": flags}
  counts = [[_per_record(r, split) for r in term] for term in results]
  missing = sum(c is None for term in counts for c in term)
  if missing:
    row["why"] = f"no per-record counts ({missing} of {len(terms) * len(seeds)} runs)"
  elif len({c.shape for term in counts for c in term}) > 1:
    row["why"] = "runs differ in their records"
  elif counts[0][0].shape[1] == 0:
    row["why"] = "no records"
  else:
    counts = np.stack([np.stack(term) for term in counts])
    row["bootstrap_mean"], row["p"], _ = contrast_bootstrap(counts, weights, resamples=resamples)
    ids = _record_ids(results[0][0], split, counts.shape[-1])
    row["influence"] = influence(counts, weights, k=influence_k, resamples=resamples, ids=ids)
  return row, None


def _max_len_order(value) -> tuple:
  return (0, int(value), "") if str(value).isdigit() else (1, 0, str(value))


def _arm_rows(family: list[dict], *, resamples: int, influence_k: int) -> tuple[list[dict], list[dict]]:
  """Length arms: for a comparison made at several max_len, its difference at the longer minus that at the
  shorter (e.g. RoPE on-off at 579 minus on-off at 128), a row of its own. Returns (rows, skipped)."""
  arms: dict[tuple, list[dict]] = {}
  for r in family:
    if r.get("max_len") is not None:
      arms.setdefault((r["a"]["dataset"], r["a"]["encoder"], r["what"]), []).append(r)
  rows, skipped = [], []
  for (_, _, what), found in arms.items():
    found.sort(key=lambda r: _max_len_order(r["max_len"]), reverse=True)
    for i, long in enumerate(found):
      for short in found[i + 1:]:
        base = {"study": long["study"], "a": long["a"], "b": long["b"], "arms": (long["max_len"], short["max_len"]),
                "max_len": f"{long['max_len']} - {short['max_len']}",
                "what": f"{what}: max_len {long['max_len']} minus {short['max_len']}"}
        extra = sorted({k for x, y in ((long["a"], short["a"]), (long["b"], short["b"]))
                        for k in _differing(x["config"], y["config"]) if not k.startswith(LENGTH_KEYS)})
        if extra:
          skipped.append({**base, "why": f"the arms differ in more than max_len: {_keys_text(extra)}"})
          continue
        terms = long["terms"] + [(-w, g, m) for w, g, m in short["terms"]]
        row, why = _contrast(terms, resamples=resamples, influence_k=influence_k)
        (skipped.append({**base, "why": why}) if why else rows.append({**base, **row}))
  return rows, skipped


def significant(row: dict, alpha: float = ALPHA) -> bool:
  """Holds after Holm's adjustment at both levels (seeds: paired t-test; records: paired bootstrap), is not flagged
  by the influence check, and no cell of it is flagged (`cell_flags`: a failed run, a seed at F1 0)."""
  return (row.get("t_p_holm") is not None and row["t_p_holm"] < alpha and row.get("p_holm") is not None
          and row["p_holm"] < alpha and row.get("influence") is not None and not row["influence"]["flagged"]
          and not row.get("flags"))


def compare(summary: list[dict], *, resamples: int = BOOTSTRAP_RESAMPLES,
            influence_k: int = INFLUENCE_K) -> tuple[list[dict], list[dict]]:
  """(rows, skipped): the study's comparisons (`comparisons`), one family per study (runs.study_of), each
  comparison on the runs of that study only, plus the length-arm rows (`_arm_rows`).

  A row: study, a, b, what, max_len, split (test when every paired run has it, else dev), seeds, values (per seed
  F1(A) - F1(B)), mean with its 95% t-interval (low, high), t_p (paired t-test over seeds; None with t_why), p
  (paired bootstrap over records; None with why when a run lacks per-record counts or the runs' records differ),
  influence (`influence`, None without counts), flags (`cell_flags` of its cells on the compared split and seeds,
  each "CELL: why"; a flagged comparison is never significant), t_p_holm and p_holm (Holm within the study) and
  significant.
  A skipped comparison: study, a, b, what, max_len and why: its cells differ in more than the compared setting,
  share a seed within a cell, or have no seed in common."""
  rows, skipped = [], []
  pairs = _comparisons(summary)
  for study in sorted({m.get("study") for g in summary for m in g["members"] + g.get("dropped", [])}, key=str):
    family = []
    for a, b, what, keys in pairs:
      # With the dropped runs: a seed run twice skips the comparison (`_paired_contrast`).
      members_a = [m for m in a["members"] + a.get("dropped", []) if m.get("study") == study]
      members_b = [m for m in b["members"] + b.get("dropped", []) if m.get("study") == study]
      if not members_a or not members_b:
        continue
      base = {"study": study, "a": a, "b": b, "what": what, "max_len": a.get("max_len")}
      extra = [k for k in _differing(a["config"], b["config"]) if not k.startswith(keys)]
      if extra:
        skipped.append({**base, "why": f"the cells differ in more than the compared setting: {_keys_text(extra)}"})
        continue
      row, why = _contrast([(1.0, a, members_a), (-1.0, b, members_b)], resamples=resamples,
                           influence_k=influence_k)
      (skipped.append({**base, "why": why}) if why else family.append({**base, **row}))
    arm_rows, arm_skipped = _arm_rows(family, resamples=resamples, influence_k=influence_k)
    family += arm_rows
    skipped += arm_skipped
    for key in ("t_p", "p"):
      for row, adjusted in zip(family, holm([r[key] for r in family])):
        row[f"{key}_holm"] = adjusted
    for row in family:
      row["significant"] = significant(row)
    rows += family
  return rows, skipped


def significance(summary: list[dict], *, resamples: int = BOOTSTRAP_RESAMPLES,
                 influence_k: int = INFLUENCE_K) -> list[dict]:
  """The rows of `compare` (comparisons that could be paired)."""
  return compare(summary, resamples=resamples, influence_k=influence_k)[0]
