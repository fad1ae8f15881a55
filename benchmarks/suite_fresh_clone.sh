#!/bin/bash
# The README test command timed in a fresh clone of this repository's HEAD, then the unit tier; CPU busy/idle from
# /proc/stat over the pytest run; per-test CPU from benchmarks.suite_cpu. Run it on an idle machine:
#   bash benchmarks/suite_fresh_clone.sh [CLONE_DIR]   (default: ../gp_jax_suite_clone, beside ../shared so the
#                                                       corpus tests run; the folder is replaced)
set -u
REPO=$(cd "$(dirname "$0")/.." && pwd)
. "$REPO/benchmarks/calibrate.sh"  # calibrate: the machine's speed when the run starts and ends
CLONE=${1:-$REPO/../gp_jax_suite_clone}
OUT=$CLONE.out
rm -rf "$CLONE" "$OUT" && mkdir -p "$OUT" && git clone -q "$REPO" "$CLONE" && cd "$CLONE" || exit 2
echo "$(git log --oneline -1) | start $(date -u) | $(uptime)"
start=$(date +%s)
python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' && python -m launch.compile --install_gpu_compiler || exit 2
echo "install $(( $(date +%s) - start )) s"
echo "calibration: a 20M-step Python loop takes $(calibrate) CPU-s"
( while true; do head -1 /proc/stat; sleep 5; done ) > "$OUT/stat.txt" &
sampler=$!
GP_JAX_SUITE_CPU="$OUT/cpu" python -m pytest -q -ra -n auto --dist worksteal --durations=40 -p no:cacheprovider \
  -p benchmarks.suite_cpu > "$OUT/pytest.txt" 2>&1
rc=$?
kill $sampler
tail -1 "$OUT/pytest.txt"
echo "rc=$rc whole=$(( $(date +%s) - start )) s | end $(date -u) | $(uptime)"
python3 - "$OUT/stat.txt" <<'PY'
import sys
rows = [list(map(int, line.split()[1:])) for line in open(sys.argv[1])]
d = [b - a for a, b in zip(rows[0], rows[-1])]
total = sum(d[:8])
print(f"pytest: CPU busy {100 * (total - d[3] - d[4]) / total:.1f}%, idle {100 * d[3] / total:.1f}%")
PY
python -m benchmarks.suite_cpu "$OUT/cpu" --top 15 > "$OUT/cpu.md" && head -1 "$OUT/cpu.md"
unit_start=$(date +%s)
python -m pytest -q -n auto --dist worksteal -m "not e2e" -p no:cacheprovider 2>&1 | tail -1
echo "unit tier wall $(( $(date +%s) - unit_start )) s | $(uptime)"
echo "calibration: a 20M-step Python loop takes $(calibrate) CPU-s"
