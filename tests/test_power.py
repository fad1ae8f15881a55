"""launch/report/power.py: the paired t-test's power against a seeded Monte Carlo of t-tests, n, the plan."""

import math

import numpy as np
import pytest


@pytest.fixture(scope="module")
def power():
  """launch.report.power, imported by the tests that use it: it imports scipy (slow to import), which would
  otherwise be paid at collection by every xdist worker."""
  from launch.report import power  # pylint: disable=g-import-not-at-top

  return power


def _simulated_power(effect, sd, n, alpha, *, trials=40_000, seed=0):
  """Share of simulated paired t-tests (n differences ~ N(effect, sd^2)) with two-sided p < alpha, from the
  t statistic's formula and the central t's quantile (not the code under test)."""
  from scipy import stats as scipy_stats  # pylint: disable=g-import-not-at-top

  d = np.random.default_rng(seed).normal(effect, sd, size=(trials, n))
  t = d.mean(1) / (d.std(1, ddof=1) / math.sqrt(n))
  crit = scipy_stats.t.ppf(1 - alpha / 2, n - 1)
  return float(np.mean(np.abs(t) > crit))


@pytest.mark.parametrize("effect, sd, n, alpha", [
    (1.0, 1.0, 5, 0.05), (0.5, 1.0, 10, 0.05), (10.48, 1.81, 3, 0.05 / 15), (5.32, 1.34, 4, 0.01),
    (2.0, 1.0, 2, 0.01), (0.0, 1.0, 6, 0.05),
    (6.95, 1.48, 3, 0.01), (6.95, 1.48, 4, 0.01)])  # the last two: scipy's nct gives nan, the integral answers
def test_power_matches_monte_carlo(effect, sd, n, alpha, power):
  got = power.paired_t_power(effect, sd, n, alpha=alpha)
  sim = _simulated_power(effect, sd, n, alpha)
  se = math.sqrt(max(sim * (1 - sim), 1e-4) / 40_000)
  assert abs(got - sim) < 5 * se + 1e-3, (got, sim)


def test_power_far_in_the_tail_is_a_number(power):
  # scipy.stats.nct gives nan here (a 19-sd effect); the power must be 1, not nan.
  assert power.paired_t_power(0.0763, 0.0040, 3, alpha=0.01) == pytest.approx(1.0)
  assert power.paired_t_power(-0.0763, 0.0040, 3, alpha=0.01) == pytest.approx(1.0)


def test_required_n_is_the_first_n_with_enough_power(power):
  n = power.required_n(1.0, 1.0, alpha=0.05, power=0.8)
  # Textbook: d = 1, two-sided 0.05, 80% power -> 10 pairs.
  assert n == 10
  assert power.paired_t_power(1.0, 1.0, n, alpha=0.05) >= 0.8 > power.paired_t_power(1.0, 1.0, n - 1, alpha=0.05)
  assert power.required_n(0.0, 1.0, alpha=0.05, n_max=50) is None


def test_sd_upper_bound_covers_as_stated(power):
  # From 3 normal values, the bound lies at or above the true sd in 80% of samples.
  s = np.random.default_rng(1).normal(0.0, 2.0, size=(4000, 3)).std(1, ddof=1)
  bounds = np.array([power.sd_upper(x, 3, 0.8) for x in s])
  assert abs(np.mean(bounds >= 2.0) - 0.8) < 0.03


def _row(study, dataset, what, values, *, significant=False, max_len=None, t_p=0.01, arms=None):
  return {"study": study, "a": {"dataset": dataset}, "what": what, "values": values, "max_len": max_len,
          "t_p": t_p, "t_p_holm": t_p, "significant": significant, **({"arms": arms} if arms else {})}


def test_plan_counts_the_family_and_fixes_n_per_study(power):
  rows = [_row("s/a", "msra", "RoPE on vs off (standard)", [0.10, 0.11]),
          _row("s/a", "msra", "RoPE on vs off (efficient)", [0.05, 0.15]),
          _row("s/a", "msra", "GP vs CRF (GP with RoPE)", [0.0, 0.01]),
          _row("s/a", "msra", "EGP vs GP (RoPE)", [0.0, 0.01], t_p=None),  # no t-test p: not in the family
          _row("s/b", "cluener2020", "RoPE on vs off (standard)", [0.05, 0.06, 0.05], significant=True),
          _row("s/c", "pd", "RoPE on vs off (standard): max_len 579 minus 128", [0.1, 0.0, 0.2], arms=(579, 128))]
  plans, fixed = power.plan(rows, min_n=5)
  assert [p["what"] for p in plans] == ["RoPE on vs off (standard)", "RoPE on vs off (efficient)"]
  assert all(p["m"] == 3 and p["alpha_row"] == pytest.approx(0.05 / 3) for p in plans)
  wide = plans[1]
  assert wide["required"] == power.required_n(0.10, float(np.std([0.05, 0.15], ddof=1)), alpha=0.05 / 3)
  assert fixed == {"s/a": max(5, wide["required"])}
  assert wide["required"] > 5  # a 1-sd effect needs many seeds at alpha / 3
  plans, fixed = power.plan(rows, min_n=5, only="standard")
  assert [p["planned"] for p in plans] == [True, False] and fixed == {"s/a": 5}


def _compare_row(dataset, head, seeds, *, max_len=None, p=0.001, significant=False, test_split="test", inf=None):
  values = [0.1 + 0.01 * s for s in seeds]
  return {"what": f"RoPE on vs off ({head})", "a": {"dataset": dataset, "head": head,
                                                    "config": {"data.test_split": test_split}},
          "max_len": max_len, "seeds": list(seeds), "values": values, "split": "test", "mean": 0.1, "low": 0.05,
          "high": 0.15, "t_p": 0.01, "t_p_holm": 0.04, "p": p, "p_holm": p, "significant": significant,
          "influence": inf, "flags": []}


def test_headline_rows_mark_runs_in_progress_and_missing_counts():
  from launch.report import headline

  inf = {"mean": 0.09, "top": [{}] * 5, "flagged": False}
  rows = [_compare_row("germeval2014", "standard", (0, 1, 2), p=None),
          _compare_row("msra", "efficient", (0, 1), p=None),
          _compare_row("people_daily", "standard", (0, 1, 2, 3, 4), max_len=128, test_split="dev", inf=inf,
                       significant=True),
          {**_compare_row("people_daily", "standard", (0, 1, 2), max_len=128), "what": "GP vs CRF (GP with RoPE)"},
          {**_compare_row("people_daily", "standard", (0, 1, 2)), "arms": (579, 128)}]
  out = headline.headline_rows(rows)
  assert [(h["dataset"], h["head"]) for h in out] == [("People's Daily, 128-token windows", "GP"), ("MSRA", "EGP"),
                                                      ("GermEval 2014", "GP")]
  pd, msra, germeval = out
  assert pd["decision"] == "**significant**" and pd["split"] == "official dev" and pd["paper"].startswith("+41.90")
  assert pd["check"] == "holds: +9.00 without top 5" and pd["diff"] == "+10.00" and pd["interval"] == "[+5.00, +15.00]"
  assert msra["decision"] == "not decided at n = 2 (runs in progress: n = 2 of 5)"
  assert msra["boot"] == "no per-record counts" and msra["split"] == "test"
  assert germeval["decision"] == "not decided at n = 3 (lacks per-record counts)"
  assert "| People's Daily, 128-token windows | GP | official dev | 5 |" in headline.table(out)
