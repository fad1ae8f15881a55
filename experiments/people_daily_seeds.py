"""People's Daily, the 128-token arm of experiments/people_daily_study.py: its seeds 3 and 4.

The power section of docs/studies/rope_heads.md (2026-11-28, issue 61) fixed the arm at 5 seeds before these ran;
seeds 0-2 are people_daily_study.py's. The settings are that file's (its get_config), so these runs are further
seeds of the same cells: GP and EGP with RoPE on and off, and the CRF, max_len 128, trained on the test file with 10%
held out, the official dev reported. The 579-token arm stays at 3 seeds.

  python -m launch.local --config=experiments/people_daily_seeds.py --workdir=runs/pd_seeds
"""

from experiments import people_daily_study

SEEDS = (3, 4)
MAX_LEN = 128


def get_config(arg=None):
  return people_daily_study.get_config(arg)


def get_sweep(arg=None):
  del arg
  # Seed-major: per seed GP and EGP with RoPE on and off, then the CRF (points named as people_daily_study's).
  return [{"config.data.max_len": MAX_LEN, **p} for s in SEEDS for p in (
      [{"config.model.use_rope": rope, "config.model.head": head, "config.seed": s}
       for head in ("standard", "efficient") for rope in (True, False)]
      + [{"config.model.head": "crf", "config.seed": s}])]
