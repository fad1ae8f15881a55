"""The study's comparisons of cells: which pairs each study plans (RoPE on vs off, GP vs CRF, EGP vs GP, each trick
vs plain, pointer RoPE on vs off, length arms), paired by seed, the Holm family (one per study), when a row is
significant, and which planned comparisons could not be tested and why (an arm without a finished run, cells that
cannot be paired). The tests themselves (t-interval, t-test, paired bootstrap, Holm, influence) are paired.py's."""

from __future__ import annotations

import numpy as np

from .. import sweep
from .cells import (cell_flags, cell_keys, cell_name, finite, js_key, nonfinite_f1, pointer_name, rope_name,
                    seeds_text, setting_order, variant_label)
from .paired import BOOTSTRAP_RESAMPLES, INFLUENCE_K, contrast_bootstrap, holm, influence, mean_t_interval, seed_t_test
from .runs import NO_ROPE, PLAIN

ALPHA = 0.05  # "significant": both Holm-adjusted p values below this, and the influence check passed
# Config keys a comparison's two cells may differ in (prefixes); any other difference skips the comparison.
ROPE_KEYS = ("model.use_rope",)
POINTER_ROPE_KEYS = ("model.pointer_rope",)
HEAD_KEYS = ("model.head", "model.use_rope")
TRICK_KEYS = ("adversarial.", "optimizer.ema_decay", "optimizer.ema_warmup")
LENGTH_KEYS = ("data.max_len", "data.buckets", "data.stride")
# Why a run of a planned arm gave no usable result, by status (finished: its F1 is not a number).
LOST = {sweep.FAILED: "failed", sweep.PREEMPTED: "preempted", sweep.STARTED: "unfinished (no results.json)",
        sweep.FINISHED: "F1 not a number"}


def _context(g: dict) -> tuple:
  return (g["dataset"], g["encoder"], g.get("max_len"))


def _arm(g: dict) -> tuple:
  """(head, RoPE, tricks, pointer RoPE): where a cell sits in its study's design."""
  return (g["head"], g["rope"], g.get("trick", PLAIN), g.get("pointer_rope", NO_ROPE))


def _planned(here) -> list[tuple[tuple, tuple, str, tuple[str, ...]]]:
  """(arm A, arm B, what, the config key prefixes A and B may differ in) of the comparisons planned among the arms
  `here` (`_arm`s of one study x dataset x encoder (x max_len) x variant, finished or not): RoPE on vs off per span
  head when the study ran both settings; GP (with RoPE) vs CRF when it ran both heads; EGP vs GP per RoPE setting it
  ran; each trick vs plain; pointer RoPE on vs off per head and RoPE when it ran both. An arm may have no finished
  run: `compare` then lists the comparison as untested."""
  here = sorted(set(here), key=lambda k: tuple(map(str, k)))
  pairs = []
  for pr in sorted({p for *_, p in here}, key=setting_order):  # entity runs: "n/a" only, names as before
    pt = "" if pr == NO_ROPE else f", {pointer_name(pr)}"
    plain = {(h, r) for (h, r, t, p) in here if t == PLAIN and p == pr}
    span, ropes = {h for h, r in plain if r != NO_ROPE}, {r for _, r in plain if r != NO_ROPE}
    if {"True", "False"} <= ropes:
      pairs += [((h, "True", PLAIN, pr), (h, "False", PLAIN, pr), f"RoPE on vs off ({h}{pt})", ROPE_KEYS)
                for h in sorted(span)]
    if "standard" in span and "crf" in {h for h, _ in plain} and "True" in ropes:
      pairs += [(("standard", "True", PLAIN, pr), ("crf", NO_ROPE, PLAIN, pr), f"GP vs CRF (GP with RoPE{pt})",
                 HEAD_KEYS)]
    if {"standard", "efficient"} <= span:
      pairs += [(("efficient", r, PLAIN, pr), ("standard", r, PLAIN, pr), f"EGP vs GP ({rope_name(r)}{pt})",
                 HEAD_KEYS[:1]) for r in ("True", "False") if r in ropes]
    pairs += [((h, r, t, pr), (h, r, PLAIN, pr), f"{t} vs plain ({h}, {rope_name(r)}{pt})", TRICK_KEYS)
              for (h, r, t, p) in here if p == pr and t != PLAIN]
  if {"True", "False"} <= {p for (_, _, t, p) in here if t == PLAIN}:
    pointer = sorted({(h, r) for (h, r, t, p) in here if t == PLAIN and p in ("True", "False")},
                     key=lambda hr: (hr[0], setting_order(hr[1])))
    pairs += [((h, r, PLAIN, "True"), (h, r, PLAIN, "False"),
               f"pointer RoPE on vs off ({h}{'' if r == NO_ROPE else ', ' + rope_name(r)})", POINTER_ROPE_KEYS)
              for h, r in pointer]
  return pairs


def _groups(keys) -> list[tuple]:
  """(context, variant) of these cell keys ((context, *arm, variant)), sorted."""
  return sorted({(k[0], k[-1]) for k in keys}, key=lambda cv: tuple(map(str, cv)))


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
  return sorted(k for k in set(a) | set(b) if js_key(a.get(k)) != js_key(b.get(k)))


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
  bad = [seed for seed, v in zip(seeds, values) if not finite(v)]
  if bad:  # a diverged run in a hand-made summary (stats.summarize leaves them out): untested at both levels
    t_p, t_why = None, f"{split} F1 not a number ({seeds_text(bad)})"
  else:
    t_p, t_why = seed_t_test(values)
  flags = []
  for (_, g, _), by in zip(terms, by_seed):
    found = cell_flags(g, [by[seed] for seed in seeds], splits=(split,))
    flags += [f"{cell_name(g)}: {f}" for f in found if f"{cell_name(g)}: {f}" not in flags]
  row = {"terms": terms, "split": split, "seeds": seeds, "values": values, "mean": mean, "low": low, "high": high,
         "t_p": t_p, "t_why": t_why, "p": None, "why": None, "influence": None, "flags": flags}
  counts = [[_per_record(r, split) for r in term] for term in results]
  missing = sum(c is None for term in counts for c in term)
  if bad:
    row["why"] = t_why
  elif missing:
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


def _arm_rows(family: list[dict], untested: list[dict], *, resamples: int,
              influence_k: int) -> tuple[list[dict], list[dict]]:
  """Length arms: for a comparison planned at several max_len, its difference at the longer minus that at the
  shorter (e.g. RoPE on-off at 579 minus on-off at 128), a row of its own; untested when the comparison is at one
  of the arms (`untested`: the study's skipped comparisons). Returns (rows, skipped)."""
  arms: dict[tuple, list[dict]] = {}
  for r in family + untested:
    if r.get("max_len") is not None and not r.get("arms"):
      arms.setdefault((r["a"]["dataset"], r["a"]["encoder"], r["what"]), []).append(r)
  rows, skipped = [], []
  for (_, _, what), found in arms.items():
    found.sort(key=lambda r: _max_len_order(r["max_len"]), reverse=True)
    for i, long in enumerate(found):
      for short in found[i + 1:]:
        base = {"study": long["study"], "a": long["a"], "b": long["b"], "arms": (long["max_len"], short["max_len"]),
                "max_len": f"{long['max_len']} - {short['max_len']}",
                "what": f"{what}: max_len {long['max_len']} minus {short['max_len']}"}
        lost = [str(r["max_len"]) for r in (long, short) if "t_p" not in r]  # a skipped one: not a row
        if lost:
          skipped.append({**base, "why": f"untested at max_len {' and '.join(lost)} (see there)"})
          continue
        extra = sorted({k for x, y in ((long["a"], short["a"]), (long["b"], short["b"]))
                        for k in _differing(x["config"], y["config"]) if not k.startswith(LENGTH_KEYS)})
        if extra:
          skipped.append({**base, "why": f"the arms differ in more than max_len: {_keys_text(extra)}"})
          continue
        terms = long["terms"] + [(-w, g, m) for w, g, m in short["terms"]]
        row, why = _contrast(terms, resamples=resamples, influence_k=influence_k)
        (skipped.append({**base, "why": why}) if why else rows.append({**base, **row}))
  return rows, skipped


def _lost_cells(rows: list[dict] | None) -> dict[tuple, list[dict]]:
  """Runs of a known config that gave no usable result (not finished, or an F1 that is not a number), by the cell
  key (context, *arm, variant) stats.summarize would give them; {} without `rows`."""
  lost = [r for r in rows or () if r.get("config_known", True)
          and (r["status"] != sweep.FINISHED or nonfinite_f1(r["results"]))]
  if not lost:
    return {}
  keys, vkeys = cell_keys(rows)
  out: dict[tuple, list[dict]] = {}
  for r in lost:
    ctx = (str(r["dataset"]), str(r["encoder"]), str(r.get("max_len")) if "max_len" in keys else None)
    arm = (str(r["head"]), str(r["rope"]), str(r.get("trick", PLAIN)), str(r.get("pointer_rope", NO_ROPE)))
    out.setdefault((ctx, *arm, variant_label(r, vkeys) if vkeys else ""), []).append(r)
  return out


def _missing_text(key: tuple, runs: list[dict]) -> str:
  """Why a planned arm has no cell: "no finished run of efficient, no RoPE: 3 failed (seeds 0, 1, 2)"."""
  name = cell_name(dict(zip(("head", "rope", "trick", "pointer_rope"), key[1:-1])))
  if not runs:
    return f"no finished run of {name}: no run of it in this study"
  by: dict[str, list] = {}
  for r in runs:
    by.setdefault(LOST.get(r["status"], r["status"]), []).append(r["seed"])
  return f"no finished run of {name}: " + ", ".join(f"{len(s)} {why} ({seeds_text(s)})" for why, s in by.items())


def _stub(key: tuple) -> dict:
  """A planned cell without a finished run, as a compared cell's fields (`missing`: True)."""
  ctx, head, rope, trick, pointer, variant = key
  return {"dataset": ctx[0], "encoder": ctx[1], **({"max_len": ctx[2]} if ctx[2] is not None else {}), "head": head,
          "rope": rope, "trick": trick, "pointer_rope": pointer, "variant": variant, "config": {}, "members": [],
          "missing": True}


def significant(row: dict, alpha: float = ALPHA) -> bool:
  """Holds after Holm's adjustment at both levels (seeds: paired t-test; records: paired bootstrap), is not flagged
  by the influence check, and no cell of it is flagged (`cell_flags`: a failed run, a seed at F1 0)."""
  return (row.get("t_p_holm") is not None and row["t_p_holm"] < alpha and row.get("p_holm") is not None
          and row["p_holm"] < alpha and row.get("influence") is not None and not row["influence"]["flagged"]
          and not row.get("flags"))


def compare(summary: list[dict], *, rows: list[dict] | None = None, resamples: int = BOOTSTRAP_RESAMPLES,
            influence_k: int = INFLUENCE_K) -> tuple[list[dict], list[dict]]:
  """(rows, skipped): each study's planned comparisons (`_planned`), one family per study (runs.study_of), each
  comparison on the runs of that study only, plus the length-arm rows (`_arm_rows`). `rows` (runs.collect's): the
  runs that did not finish, so that a planned arm whose runs all failed is named with them.

  A row: study, a, b, what, max_len, split (test when every paired run has it, else dev), seeds, values (per seed
  F1(A) - F1(B)), mean with its 95% t-interval (low, high), t_p (paired t-test over seeds; None with t_why), p
  (paired bootstrap over records; None with why when a run lacks per-record counts or the runs' records differ),
  influence (`influence`, None without counts), flags (`cell_flags` of its cells on the compared split and seeds,
  each "CELL: why"; a flagged comparison is never significant), t_p_holm and p_holm (Holm within the study, over
  the rows that have that p) and significant.
  A skipped (untested) comparison: study, a, b, what, max_len and why: an arm has no finished run in the study (a is
  then a stand-in with missing: True, and why names its runs that failed or did not finish), its cells differ in
  more than the compared setting, share a seed within a cell, or have no seed in common."""
  out, skipped = [], []
  lost = _lost_cells(rows)
  studies = {m.get("study") for g in summary for m in g["members"] + g.get("dropped", [])}
  for study in sorted(studies | {r.get("study") for runs in lost.values() for r in runs}, key=str):
    present = {(_context(g), *_arm(g), g.get("variant", "")): g for g in summary
               if any(m.get("study") == study for m in g["members"] + g.get("dropped", []))}
    failed = {k: [r for r in v if r.get("study") == study] for k, v in lost.items()}
    failed = {k: v for k, v in failed.items() if v}
    family, untested = [], []
    for ctx, variant in _groups([*present, *failed]):
      here = [k[1:-1] for k in [*present, *failed] if (k[0], k[-1]) == (ctx, variant)]
      for arm_a, arm_b, what, keys in _planned(here):
        key_a, key_b = (ctx, *arm_a, variant), (ctx, *arm_b, variant)
        a, b = present.get(key_a), present.get(key_b)
        base = {"study": study, "a": a or _stub(key_a), "b": b or _stub(key_b),
                "what": what + (f" [{variant}]" if variant else ""), "max_len": ctx[2]}
        if a is None or b is None:
          untested.append({**base, "why": "; ".join(_missing_text(k, failed.get(k, [])) for k, g in
                                                    ((key_a, a), (key_b, b)) if g is None)})
          continue
        # With the dropped runs: a seed run twice skips the comparison (`_paired_contrast`).
        members_a = [m for m in a["members"] + a.get("dropped", []) if m.get("study") == study]
        members_b = [m for m in b["members"] + b.get("dropped", []) if m.get("study") == study]
        extra = [k for k in _differing(a["config"], b["config"]) if not k.startswith(keys)]
        if extra:
          untested.append({**base, "why": f"the cells differ in more than the compared setting: {_keys_text(extra)}"})
          continue
        row, why = _contrast([(1.0, a, members_a), (-1.0, b, members_b)], resamples=resamples,
                             influence_k=influence_k)
        (untested.append({**base, "why": why}) if why else family.append({**base, **row}))
    arm_rows, arm_skipped = _arm_rows(family, untested, resamples=resamples, influence_k=influence_k)
    family += arm_rows
    skipped += untested + arm_skipped
    for key in ("t_p", "p"):
      for row, adjusted in zip(family, holm([r[key] for r in family])):
        row[f"{key}_holm"] = adjusted
    for row in family:
      row["significant"] = significant(row)
    out += family
  return out, skipped


def significance(summary: list[dict], *, resamples: int = BOOTSTRAP_RESAMPLES,
                 influence_k: int = INFLUENCE_K) -> list[dict]:
  """The rows of `compare` (comparisons that could be paired)."""
  return compare(summary, resamples=resamples, influence_k=influence_k)[0]
