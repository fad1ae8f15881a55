"""Statistics over runs: groups of finished runs with mean +- sample std per metric, F1 by entity length pooled
over seeds, and significance of the study's comparisons (mean difference over seeds with a 95% t-interval, a
paired bootstrap over records). numpy and the standard library only."""

from __future__ import annotations

import math
import statistics

import numpy as np

from launch import sweep
from launch.report.runs import PLAIN

GROUP_KEYS = ("dataset", "encoder", "head", "rope")  # and "max_len" when a dataset's runs differ in it (group_keys)
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


def mean_std(values: list[float]) -> tuple[float | None, float | None]:
  """(mean, sample std); std None when fewer than 2 values, both None when there are none."""
  if not values:
    return None, None
  return statistics.mean(values), (statistics.stdev(values) if len(values) > 1 else None)


def group_keys(rows: list[dict]) -> tuple[str, ...]:
  """GROUP_KEYS, plus "max_len" when finished runs of one dataset differ in it (e.g. length arms of a study), plus
  "trick" when some finished run used training tricks (EMA, FGM, PGD: experiments/tricks.py)."""
  lengths: dict[str, set] = {}
  tricks = set()
  for row in rows:
    if row["status"] == sweep.FINISHED:
      lengths.setdefault(row["dataset"], set()).add(row.get("max_len"))
      tricks.add(row.get("trick", PLAIN))
  return (GROUP_KEYS + (("max_len",) if any(len(v) > 1 for v in lengths.values()) else ())
          + (("trick",) if tricks - {PLAIN} else ()))


def summarize(rows: list[dict]) -> list[dict]:
  """Finished runs grouped by `group_keys(rows)`: {key fields, head_kind, n, runs, members, metrics: {column: (mean,
  std, count)}, epochs: [per seed], stopped_early: [per seed, None = unknown]}."""
  keys = group_keys(rows)
  groups: dict[tuple, list[dict]] = {}
  for row in rows:
    if row["status"] == sweep.FINISHED:
      groups.setdefault(tuple(str(row.get(k)) for k in keys), []).append(row)
  out = []
  for key in sorted(groups):
    members = groups[key]
    metrics = {}
    for col, get in METRICS:
      values = [float(v) for v in (get(m["results"]) for m in members) if v is not None]
      metrics[col] = (*mean_std(values), len(values))
    out.append({**dict(zip(keys, key)), "head_kind": members[0]["head_kind"], "n": len(members),
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

BOOTSTRAP_RESAMPLES = 10_000
_BOOTSTRAP_CELLS = 4_000_000  # record indices drawn per chunk (memory), not a statistical setting


def _incomplete_beta(x: float, a: float, b: float) -> float:
  """Regularized incomplete beta I_x(a, b) by its continued fraction (Numerical Recipes 6.4, modified Lentz)."""
  if x <= 0.0:
    return 0.0
  if x >= 1.0:
    return 1.0
  if x > (a + 1) / (a + b + 2):  # the fraction converges fast below this point; use the symmetry above it
    return 1.0 - _incomplete_beta(1.0 - x, b, a)
  front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
  tiny = 1e-300
  c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
  d = 1.0 / (d if abs(d) > tiny else tiny)
  f = d
  for m in range(1, 500):
    for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                      -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
      d = 1.0 + numerator * d
      d = 1.0 / (d if abs(d) > tiny else tiny)
      c = 1.0 + numerator / c
      c = c if abs(c) > tiny else tiny
      f *= c * d
    if abs(c * d - 1.0) < 1e-15:
      break
  return front * f


def t_cdf(t: float, df: float) -> float:
  """Student's t distribution function: P(T <= t) with `df` degrees of freedom."""
  tail = 0.5 * _incomplete_beta(df / (df + t * t), df / 2, 0.5)
  return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
  """The t with P(T <= t) = q (bisection on t_cdf; scipy.stats.t.ppf without scipy)."""
  if q == 0.5:
    return 0.0
  if q < 0.5:
    return -t_quantile(1.0 - q, df)
  hi = 1.0
  while t_cdf(hi, df) < q:
    hi *= 2
  lo = 0.0
  for _ in range(200):
    mid = (lo + hi) / 2
    lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    if hi - lo < 1e-12 * hi:
      break
  return (lo + hi) / 2


def mean_t_interval(values, level: float = 0.95) -> tuple[float, float | None, float | None]:
  """(mean, low, high): the `level` t-interval of the mean of `values`; no interval for fewer than 2 values."""
  values = [float(v) for v in values]
  mean = statistics.mean(values)
  if len(values) < 2:
    return mean, None, None
  half = t_quantile(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values))
  return mean, mean - half, mean + half


def micro_f1(tp, fp, fn):
  """2 tp / (2 tp + fp + fn), elementwise; 0 where nothing was predicted or gold."""
  tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
  den = 2 * tp + fp + fn
  return np.divide(2 * tp, den, out=np.zeros_like(den), where=den > 0)


def paired_bootstrap(counts_a, counts_b, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0):
  """Paired bootstrap over records of the mean over seeds of F1(A) - F1(B).

  counts_a, counts_b: int [S, 3, R]: per seed (paired: row s of A and of B share a seed), the (tp, fp, fn) of each
  of the R records, in record order. Each resample draws R record indices with replacement from
  `numpy.random.default_rng(seed)` (as one `integers(0, R, size=(resamples, R))` call; drawn in chunks, the same
  numbers), the same indices for both cells and every seed; each F1 is the micro-F1 of the counts summed over the
  drawn records. Returns (observed statistic, two-sided p, the resampled statistics): p = 2 x the share of
  resampled statistics on the other side of 0 from the observed one (0 itself counts as the other side), at most 1.
  """
  a, b = np.asarray(counts_a, np.int64), np.asarray(counts_b, np.int64)
  if a.shape != b.shape or a.ndim != 3 or a.shape[1] != 3:
    raise ValueError(f"counts must both be [seeds, 3, records], got {a.shape} and {b.shape}")
  seeds, _, records = a.shape
  observed = float(np.mean(micro_f1(*a.sum(-1).T) - micro_f1(*b.sum(-1).T)))
  counts_RC = np.concatenate([a, b]).reshape(2 * seeds * 3, records).T.astype(np.float64)
  rng = np.random.default_rng(seed)
  chunk = max(1, min(resamples, _BOOTSTRAP_CELLS // records))
  stats = []
  for start in range(0, resamples, chunk):
    n = min(chunk, resamples - start)
    idx_NR = rng.integers(0, records, size=(n, records))
    times_NR = np.bincount((np.arange(n)[:, None] * records + idx_NR).ravel(), minlength=n * records)
    sums = (times_NR.reshape(n, records).astype(np.float64) @ counts_RC).reshape(n, 2, seeds, 3)
    f1 = micro_f1(sums[..., 0], sums[..., 1], sums[..., 2])  # [n, cell, seed]
    stats.append((f1[:, 0] - f1[:, 1]).mean(-1))
  stats = np.concatenate(stats)
  other_side = stats <= 0 if observed > 0 else stats >= 0 if observed < 0 else np.ones_like(stats, bool)
  return observed, min(1.0, 2 * float(other_side.mean())), stats


def _context(g: dict) -> tuple:
  return (g["dataset"], g["encoder"], g.get("max_len"))


def comparisons(summary: list[dict]) -> list[tuple[dict, dict, str]]:
  """(group A, group B, what) for the study's comparisons, within one dataset x encoder (x max_len): RoPE on vs
  off per head; GP (standard head, with RoPE) vs CRF; EGP (efficient) vs GP with and without RoPE (all among runs
  without tricks); and each training trick against the plain runs of the same head and RoPE."""
  cells = {(_context(g), g["head"], g["rope"], g.get("trick", PLAIN)): g for g in summary}
  out = []
  for ctx in sorted({_context(g) for g in summary}, key=lambda c: tuple(map(str, c))):
    heads = sorted({h for (c, h, _, t) in cells if c == ctx and t == PLAIN})
    pairs = [((h, "True", PLAIN), (h, "False", PLAIN), f"RoPE on vs off ({h})") for h in heads]
    pairs += [(("standard", "True", PLAIN), ("crf", "n/a", PLAIN), "GP vs CRF (GP with RoPE)")]
    pairs += [(("efficient", r, PLAIN), ("standard", r, PLAIN), f"EGP vs GP ({'RoPE' if r == 'True' else 'no RoPE'})")
              for r in ("True", "False")]
    pairs += [((h, r, t), (h, r, PLAIN), f"{t} vs plain ({h}, {'RoPE' if r == 'True' else 'no RoPE'})")
              for (c, h, r, t) in sorted(cells, key=lambda k: tuple(map(str, k))) if c == ctx and t != PLAIN]
    out += [(cells[(ctx, *a)], cells[(ctx, *b)], what) for a, b, what in pairs
            if (ctx, *a) in cells and (ctx, *b) in cells]
  return out


def _per_record(results: dict, split: str):
  """int [3, R] (tp, fp, fn) per record of `split`, or None when results.json has no per-record counts."""
  counts = (results.get(split) or {}).get("per_record")
  if not counts or any(k not in counts for k in ("tp", "fp", "fn")):
    return None
  return np.asarray([counts["tp"], counts["fp"], counts["fn"]], np.int64)


def significance(summary: list[dict], *, resamples: int = BOOTSTRAP_RESAMPLES) -> list[dict]:
  """One dict per comparison: context, what, split (test when every paired run has it, else dev), seeds, the mean
  over seeds of F1(A) - F1(B) with its 95% t-interval, and the paired bootstrap's p (None, with `why`, when a run
  lacks per-record counts or the runs' records differ)."""
  out = []
  for a, b, what in comparisons(summary):
    by_seed_a = {m["seed"]: m["results"] for m in a["members"]}
    by_seed_b = {m["seed"]: m["results"] for m in b["members"]}
    if len(by_seed_a) < len(a["members"]) or len(by_seed_b) < len(b["members"]):
      raise ValueError(f"{what}: two runs of one cell share a seed ({a['runs'] + b['runs']}); the cells' runs must "
                       "differ in seed only (report each sweep apart, or add the key they differ in)")
    seeds = sorted((set(by_seed_a) & set(by_seed_b)) - {None}, key=str)
    if not seeds:
      continue
    pairs = [(by_seed_a[s], by_seed_b[s]) for s in seeds]
    split = "test" if all((r.get("test") or {}).get("f1") is not None for pair in pairs for r in pair) else "dev"
    diffs = [ra[split]["f1"] - rb[split]["f1"] for ra, rb in pairs]
    mean, low, high = mean_t_interval(diffs)
    row = {"a": a, "b": b, "what": what, "split": split, "seeds": seeds, "mean": mean, "low": low, "high": high,
           "p": None, "why": None}
    counts = [(_per_record(ra, split), _per_record(rb, split)) for ra, rb in pairs]
    missing = sum(c is None for pair in counts for c in pair)
    if missing:
      row["why"] = f"no per-record counts ({missing} of {2 * len(seeds)} runs)"
    elif len({c.shape for pair in counts for c in pair}) > 1:
      row["why"] = "runs differ in their records"
    else:
      observed, row["p"], _ = paired_bootstrap([ca for ca, _ in counts], [cb for _, cb in counts],
                                               resamples=resamples)
      row["bootstrap_mean"] = observed
    out.append(row)
  return out
