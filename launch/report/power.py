"""Seeds needed before new runs: the power of the report's paired t-test over seeds, Holm-adjusted in its family.

  python -m launch.report.power docs/study                  # every RoPE on vs off row not yet significant
  python -m launch.report.power docs/study --min_n 5 --power 0.8 --only 'msra|cluener2020.*standard|people_daily, 128'

For each "RoPE on vs off" row of `launch.report` (`stats.compare`, the same cells, seeds and families) that is not
significant, the smallest number of seeds n at which the two-sided paired t-test over seeds reaches p < alpha / m
with the requested power, where m is the size of the row's Holm family (the study's comparisons that have a t-test
p) and alpha = stats.ALPHA: a p below alpha / m gives a Holm-adjusted p below alpha whatever the other rows do, so
n is enough for Holm (Bonferroni's bound, Holm's first step). Assumptions: the per-seed differences are normal and
independent; the true mean difference is the observed one, the true sd the observed sample sd (both from the seeds
run so far, so the plan is fixed before the new runs). The sd of 2 or 3 seeds is itself uncertain: the table also
gives n at the one-sided 80% upper confidence bound of the sd (chi-square with n - 1 degrees of freedom).
Fixed n per study: max(--min_n, the largest n at the observed sd of its rows that --only selects).

Power is the noncentral t's: with df = n - 1, c = t_{1 - a/2}(df), power = P(T' > c) + P(T' < -c),
T' ~ noncentral t(df, sqrt(n) mean / sd) (`paired_t_power`).
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys

from scipy import integrate
from scipy import stats as scipy_stats

from .runs import collect
from .stats import ALPHA, compare, summarize

POWER = 0.8  # the power asked for
MIN_N = 5  # the fewest seeds a study is fixed at, whatever the power calculation gives
SD_LEVEL = 0.8  # one-sided confidence of the sd's upper bound shown beside the point estimate
N_MAX = 10_000  # where the search for n gives up (an effect of 0, or one far below its spread)
ROPE = "RoPE on vs off"


def paired_t_power(effect: float, sd: float, n: int, *, alpha: float) -> float:
  """Power of the two-sided one-sample (paired) t-test at level `alpha` with `n` differences ~ N(effect, sd^2).

  scipy.stats.nct's tails; where it returns nan (far in the tail, at the large noncentralities of a 10-point effect
  with a 1-point spread), the same tails as an integral over the chi-square quantile u: with V = chi2_df^-1(u),
  power = int_0^1 [Phi(nc - c sqrt(V/df)) + Phi(-nc - c sqrt(V/df))] du."""
  if n < 2:
    return 0.0
  if sd <= 0:
    return 1.0 if effect else alpha
  df = n - 1
  crit = float(scipy_stats.t.ppf(1 - alpha / 2, df))
  nc = abs(effect) / sd * math.sqrt(n)
  value = float(scipy_stats.nct.sf(crit, df, nc) + scipy_stats.nct.cdf(-crit, df, nc))
  if math.isnan(value):

    def reject(u):
      scale = crit * math.sqrt(scipy_stats.chi2.ppf(u, df) / df)
      return scipy_stats.norm.cdf(nc - scale) + scipy_stats.norm.cdf(-nc - scale)

    value = integrate.quad(reject, 0.0, 1.0, limit=200, epsabs=1e-10)[0]
  return float(min(1.0, max(0.0, value)))


def required_n(effect: float, sd: float, *, alpha: float, power: float = POWER, n_max: int = N_MAX) -> int | None:
  """The smallest n >= 2 whose `paired_t_power` reaches `power` (power grows with n: doubling, then bisection);
  None when none up to `n_max` does."""
  enough = lambda n: paired_t_power(effect, sd, n, alpha=alpha) >= power  # noqa: E731
  low, high = 1, 2  # enough(low) is false (n = 1 has no test)
  while not enough(high):
    if high >= n_max:
      return None
    low, high = high, min(2 * high, n_max)
  while high - low > 1:
    mid = (low + high) // 2
    low, high = (low, mid) if enough(mid) else (mid, high)
  return high


def sd_upper(sd: float, n: int, level: float = SD_LEVEL) -> float:
  """One-sided `level` upper confidence bound of a normal sd estimated from n values: sd sqrt((n-1) / chi2_{1-level})."""
  return sd * math.sqrt((n - 1) / scipy_stats.chi2.ppf(1 - level, n - 1))


def row_key(r: dict) -> str:
  """"dataset, max_len, what" of a `stats.compare` row: what --only searches."""
  return f"{r['a']['dataset']}, {r.get('max_len')}, {r['what']}"


def family_sizes(rows: list[dict]) -> dict:
  """Study -> m: the comparisons of that study with a t-test p (the family Holm adjusts the seed p values in)."""
  out: dict = {}
  for r in rows:
    if r.get("t_p") is not None:
      out[r["study"]] = out.get(r["study"], 0) + 1
  return out


def study_of_dataset(rows: list[dict]) -> dict:
  """Dataset name -> its study (the folder the report takes a family from)."""
  return {r["a"]["dataset"]: r["study"] for r in rows}


def plan(rows: list[dict], *, power: float = POWER, min_n: int = MIN_N, alpha: float = ALPHA,
         include_significant: bool = False, only: str = "") -> tuple[list[dict], dict]:
  """(row plans, study -> fixed n) for the RoPE on vs off rows of `stats.compare` (length-arm differences left out).

  A row plan: study, dataset, what, max_len, n (seeds so far), mean and sd of the per-seed differences (F1
  fractions), m (family size), alpha_row (alpha / m), required (n at the observed sd), required_upper (n at
  `sd_upper`), t_p_holm, significant, power_fixed and power_fixed_upper (the power at the study's fixed n, at the
  observed sd and at `sd_upper`; None for a row not planned), planned (the row matches `only`, a regular expression searched in
  "dataset, max_len, what"; "" matches every row). Only planned rows fix their study's n."""
  sizes = family_sizes(rows)
  out, fixed = [], {}
  for r in rows:
    if not r["what"].startswith(ROPE) or r.get("arms") or (r.get("significant") and not include_significant):
      continue
    values = r["values"]
    n = len(values)
    mean = statistics.mean(values)
    sd = statistics.stdev(values) if n > 1 else None
    m = sizes.get(r["study"], 1)
    a = alpha / m
    need = required_n(mean, sd, alpha=a, power=power) if sd is not None else None
    upper = required_n(mean, sd_upper(sd, n), alpha=a, power=power) if sd is not None else None
    out.append({"study": r["study"], "dataset": r["a"]["dataset"], "what": r["what"], "max_len": r.get("max_len"),
                "n": n, "mean": mean, "sd": sd, "m": m, "alpha_row": a, "required": need, "required_upper": upper,
                "t_p_holm": r.get("t_p_holm"), "significant": bool(r.get("significant")),
                "planned": bool(re.search(only, row_key(r)))})
    if need is not None and out[-1]["planned"]:
      fixed[r["study"]] = max(fixed.get(r["study"], min_n), need)
  for p in out:  # the power the fixed n gives each row, at the observed sd and at its upper bound
    n_fixed = fixed.get(p["study"]) if p["planned"] else None
    p["power_fixed"] = p["power_fixed_upper"] = None
    if n_fixed and p["sd"] is not None:
      p["power_fixed"] = paired_t_power(p["mean"], p["sd"], n_fixed, alpha=p["alpha_row"])
      p["power_fixed_upper"] = paired_t_power(p["mean"], sd_upper(p["sd"], p["n"]), n_fixed, alpha=p["alpha_row"])
  return out, fixed


def _n(value) -> str:
  return "> %d" % N_MAX if value is None else str(value)


def _power(p: dict) -> str:
  if p["power_fixed"] is None:
    return "-"
  return f"{100 * p['power_fixed']:.0f}% / {100 * p['power_fixed_upper']:.0f}%"


def plan_table(plans: list[dict], fixed: dict) -> str:
  """Markdown: one line per planned row, the study's fixed n last."""
  cols = ["dataset", "comparison", "max_len", "n so far", "mean diff (points)", "sd of diffs (points)",
          "Holm family size m", "alpha / m", "t-test Holm p now", "required n (observed sd)",
          f"required n (sd at its {100 * SD_LEVEL:.0f}% upper bound)", "fixed n (study)",
          "power at the fixed n (observed sd / upper bound)"]
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for p in plans:
    holm = "-" if p["t_p_holm"] is None else f"{p['t_p_holm']:.3f}"
    sd = "-" if p["sd"] is None else f"{100 * p['sd']:.2f}"
    lines.append("| " + " | ".join([p["dataset"], p["what"], str(p["max_len"] or "-"), str(p["n"]),
                                    f"{100 * p['mean']:+.2f}", sd, str(p["m"]), f"{p['alpha_row']:.4f}", holm,
                                    _n(p["required"]), _n(p["required_upper"]),
                                    str(fixed.get(p["study"], "-")) if p["planned"] else "not planned",
                                    _power(p)]) + " |")
  return "\n".join(lines)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m launch.report.power", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("roots", nargs="+", metavar="DIR", help="study folders, as given to launch.report")
  parser.add_argument("--power", type=float, default=POWER, help=f"power asked for (default {POWER})")
  parser.add_argument("--min_n", type=int, default=MIN_N, help=f"fewest seeds per study (default {MIN_N})")
  parser.add_argument("--all", action="store_true", help="also the RoPE rows already significant")
  parser.add_argument("--only", default="", help="regular expression on 'dataset, max_len, what': the rows that "
                      "fix their study's n (the others are shown, not planned)")
  args = parser.parse_args(argv)
  if not 0 < args.power < 1:
    parser.error(f"--power must lie in (0, 1), got {args.power}")
  rows = collect(args.roots)
  compared, _ = compare(summarize(rows))  # as the report: "significant" needs the bootstrap and influence too
  try:
    re.compile(args.only)
  except re.error as e:
    parser.error(f"--only {args.only!r} is not a regular expression: {e}")
  plans, fixed = plan(compared, power=args.power, min_n=args.min_n, include_significant=args.all, only=args.only)
  if not plans:
    print("no RoPE on vs off row to plan (none, or all significant)", file=sys.stderr)
    return 0
  print(plan_table(plans, fixed))
  return 0


if __name__ == "__main__":
  sys.exit(main())
