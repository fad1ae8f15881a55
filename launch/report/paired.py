"""Paired tests of two cells of runs: the mean difference over seeds with its t-interval and the paired t-test, the
paired bootstrap over records (of any weighted contrast of cells), Holm's adjustment of a family's p values, and the
influence of single records (leave-one-out). numpy and scipy.stats; stats.py pairs the report's cells and calls these."""

from __future__ import annotations

import math
import statistics

import numpy as np

# Deferred import below: scipy.stats (over a second to import), in the functions that use it, so that a report
# without paired tests (SLURM's --report job, a one-seed sweep) does not wait for it.

BOOTSTRAP_RESAMPLES = 10_000
_BOOTSTRAP_CELLS = 4_000_000  # record indices drawn per chunk (memory), not a statistical setting
INFLUENCE_K = 5  # records left out of both cells by the influence check (--influence_k)
SHARE_TOPS = (1, 5, 10)  # the influence table's share of the difference carried by the top 1, 5, 10 records


def t_cdf(t: float, df: float) -> float:
  """Student's t distribution function: P(T <= t) with `df` degrees of freedom (scipy.stats.t.cdf)."""
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  return float(scipy_stats.t.cdf(t, df))


def t_quantile(q: float, df: float) -> float:
  """The t with P(T <= t) = q (scipy.stats.t.ppf)."""
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  return float(scipy_stats.t.ppf(q, df))


def mean_t_interval(values, level: float = 0.95) -> tuple[float, float | None, float | None]:
  """(mean, low, high): the `level` t-interval of the mean of `values`; no interval for fewer than 2 values, nor
  when a value is not finite (the mean is then NaN or inf)."""
  values = [float(v) for v in values]
  if not all(math.isfinite(v) for v in values):
    return float(np.mean(values)), None, None
  mean = statistics.mean(values)
  if len(values) < 2:
    return mean, None, None
  half = t_quantile(0.5 + level / 2, len(values) - 1) * statistics.stdev(values) / len(values) ** 0.5
  return mean, mean - half, mean + half


def seed_t_test(values) -> tuple[float | None, str | None]:
  """(two-sided p, None) of a one-sample t-test of the per-seed differences against 0, i.e. the paired t-test of
  the two cells' per-seed F1s (scipy.stats.ttest_rel); (None, why) for one seed, a value that is not finite, or
  differences without spread."""
  values = np.asarray(values, np.float64)
  if len(values) < 2:
    return None, "n = 1"
  if not np.isfinite(values).all():
    return None, f"{int((~np.isfinite(values)).sum())} of {len(values)} values not a number"
  if np.ptp(values) <= 1e-12:  # equal up to rounding: scipy would warn and give a meaningless p
    return None, "no spread over seeds"
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  return float(scipy_stats.ttest_1samp(values, 0.0).pvalue), None


def holm(pvalues) -> list[float | None]:
  """Holm's step-down adjustment of one family's p values, in their order: the i-th smallest of m is multiplied by
  m - i + 1 (i from 1), capped at 1, then made non-decreasing along that order. None (not tested) and a p that is
  not a finite number (a test of NaN) are None and do not count in m."""
  tested = sorted((float(p), i) for i, p in enumerate(pvalues) if p is not None and math.isfinite(float(p)))
  out: list[float | None] = [None] * len(pvalues)
  running = 0.0
  for rank, (p, i) in enumerate(tested):
    running = max(running, min(1.0, (len(tested) - rank) * p))
    out[i] = running
  return out


def micro_f1(tp, fp, fn):
  """2 tp / (2 tp + fp + fn), elementwise; 0 where nothing was predicted or gold."""
  tp, fp, fn = (np.asarray(x, np.float64) for x in (tp, fp, fn))
  den = 2 * tp + fp + fn
  return np.divide(2 * tp, den, out=np.zeros_like(den), where=den > 0)


def _contrast_f1(totals, weights):
  """Per seed sum over cells of weight x micro-F1; totals [cell, seed, 3, ...] -> [seed, ...]."""
  f1 = micro_f1(totals[:, :, 0], totals[:, :, 1], totals[:, :, 2])
  return np.tensordot(np.asarray(weights, np.float64), f1, axes=1)


def contrast_bootstrap(counts, weights, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0):
  """Paired bootstrap over records of the mean over seeds of sum_c weights[c] x F1(cell c), e.g. weights (1, -1):
  F1(A) - F1(B); (1, -1, -1, 1): the difference at one max_len minus that at another.

  counts: int [C, S, 3, R]: per cell and seed (paired: row s of every cell shares a seed), the (tp, fp, fn) of each
  of the R records, in record order. Each resample draws R record indices with replacement from
  `numpy.random.default_rng(seed)` (as one `integers(0, R, size=(resamples, R))` call; drawn in chunks, the same
  numbers), the same indices for every cell and seed; each F1 is the micro-F1 of the counts summed over the drawn
  records. Returns (observed statistic, two-sided p, the resampled statistics): p = 2 x the share of resampled
  statistics on the other side of 0 from the observed one (0 itself counts as the other side), at most 1.
  """
  counts = np.asarray(counts, np.int64)
  weights = np.asarray(weights, np.float64)
  if counts.ndim != 4 or counts.shape[2] != 3 or counts.shape[0] != len(weights) or counts.shape[3] == 0:
    raise ValueError(f"counts must be [{len(weights)} cells, seeds, 3, records > 0], got {counts.shape}")
  cells, seeds, _, records = counts.shape
  observed = float(np.mean(_contrast_f1(counts.sum(-1), weights)))
  counts_RC = counts.reshape(cells * seeds * 3, records).T.astype(np.float64)
  rng = np.random.default_rng(seed)
  chunk = max(1, min(resamples, _BOOTSTRAP_CELLS // records))
  stats = []
  for start in range(0, resamples, chunk):
    n = min(chunk, resamples - start)
    idx_NR = rng.integers(0, records, size=(n, records))
    times_NR = np.bincount((np.arange(n)[:, None] * records + idx_NR).ravel(), minlength=n * records)
    sums = (times_NR.reshape(n, records).astype(np.float64) @ counts_RC).reshape(n, cells, seeds, 3)
    f1 = micro_f1(sums[..., 0], sums[..., 1], sums[..., 2])  # [n, cell, seed]
    stats.append(np.einsum("ncs,c->ns", f1, weights).mean(-1))
  stats = np.concatenate(stats)
  other_side = stats <= 0 if observed > 0 else stats >= 0 if observed < 0 else np.ones_like(stats, bool)
  return observed, min(1.0, 2 * float(other_side.mean())), stats


def paired_bootstrap(counts_a, counts_b, *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0):
  """`contrast_bootstrap` of F1(A) - F1(B): counts_a, counts_b int [S, 3, R] (row s of A and of B share a seed)."""
  a, b = np.asarray(counts_a, np.int64), np.asarray(counts_b, np.int64)
  if a.shape != b.shape or a.ndim != 3 or a.shape[1] != 3:
    raise ValueError(f"counts must both be [seeds, 3, records], got {a.shape} and {b.shape}")
  return contrast_bootstrap(np.stack([a, b]), (1.0, -1.0), resamples=resamples, seed=seed)


def influence(counts, weights, *, k: int = INFLUENCE_K, resamples: int = BOOTSTRAP_RESAMPLES, ids=None) -> dict:
  """How much of a contrast (`contrast_bootstrap`'s statistic, mean over seeds) single records carry.

  effect[r]: the statistic with record r dropped from every cell and seed, minus the full one. A record carries
  the difference in its direction when dropping it moves the statistic towards 0 (carried = -effect x sign).
  share[n]: the summed carried amount of the n records carrying most, as a share of |difference| (n in
  SHARE_TOPS; loo effects do not add up exactly, so a share can pass 1). The top k such records are then left out
  of every cell: the difference, its t-interval over seeds and the bootstrap p without them; flagged when that
  difference is at most half the full one (halved, or its sign flipped). top: [{index, id (ids[index] or None),
  effect}] of those records (index in the split's records)."""
  counts = np.asarray(counts, np.int64)
  weights = np.asarray(weights, np.float64)
  records = counts.shape[-1]
  totals = counts.sum(-1)  # [C, S, 3]
  full = float(np.mean(_contrast_f1(totals, weights)))
  effect = np.mean(_contrast_f1(totals[..., None] - counts, weights), axis=0) - full  # [R]
  carried = -effect * np.sign(full)
  order = np.argsort(-carried, kind="stable")
  order = order[carried[order] > 0]
  share = {n: (float(carried[order[:n]].sum()) / abs(full) if full else None) for n in SHARE_TOPS}
  top = order[:max(0, k)]
  keep = np.ones(records, bool)
  keep[top] = False
  out = {"full": full, "effect": effect, "share": share, "k": k, "mean": None, "low": None, "high": None,
         "p": None, "flagged": False, "flip": False,
         "top": [{"index": int(i), "id": ids[i] if ids is not None else None, "effect": float(effect[i])}
                 for i in top]}
  if keep.any():
    kept = counts[..., keep]
    out["mean"], out["low"], out["high"] = mean_t_interval(_contrast_f1(kept.sum(-1), weights))
    out["p"] = contrast_bootstrap(kept, weights, resamples=resamples)[1] if len(top) else None
  if full and out["mean"] is not None:
    out["flagged"] = out["mean"] / full <= 0.5
    out["flip"] = out["mean"] * full < 0
  return out
