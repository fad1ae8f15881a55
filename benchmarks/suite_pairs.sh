#!/bin/bash
# Two commits' README test command (pytest part) alternating from an empty compilation cache, for a time ratio
# measured in one sitting. Run it on an idle machine:
#   bash benchmarks/suite_pairs.sh COMMIT_A COMMIT_B [ROUNDS=2] [DIR=../gp_jax_pairs]
# Each commit gets a fresh clone and venv under DIR (DIR/shared links to ../shared: the corpus tests run); pytest
# output in DIR/<commit>-<round>.txt; one line per run: tests, seconds, the calibration loop's CPU-s before it.
set -u
A=${1:?commit A}; B=${2:?commit B}; ROUNDS=${3:-2}
REPO=$(cd "$(dirname "$0")/.." && pwd)
DIR=$(mkdir -p "${4:-$REPO/../gp_jax_pairs}" && cd "${4:-$REPO/../gp_jax_pairs}" && pwd)
. "$REPO/benchmarks/calibrate.sh"
# The clones find the corpora where a checkout does, at ../shared: DIR/shared links to this checkout's.
[ -e "$DIR/shared" ] || [ ! -d "$REPO/../shared" ] || ln -s "$(cd "$REPO/../shared" && pwd)" "$DIR/shared"
for c in "$A" "$B"; do
  rm -rf "$DIR/$c" && git clone -q "$REPO" "$DIR/$c" && git -C "$DIR/$c" checkout -q "$c" || exit 2
  (cd "$DIR/$c" && python3 -m venv .venv && . .venv/bin/activate && pip install -q -e '.[test]' &&
   python -m launch.compile --install_gpu_compiler) > "$DIR/$c-install.log" 2>&1 || { echo "install of $c failed"; exit 2; }
done
for round in $(seq "$ROUNDS"); do
  for c in "$A" "$B"; do
    cal=$(calibrate)
    (cd "$DIR/$c" && . .venv/bin/activate && GP_JAX_TEST_JIT_CACHE=fresh python -m pytest -q -ra -n auto \
      --dist worksteal -p no:cacheprovider --durations=30 > "$DIR/$c-$round.txt" 2>&1)
    echo "round $round $c: $(tail -1 "$DIR/$c-$round.txt") | calibration $cal CPU-s | $(date -u +%H:%M) | $(uptime)"
  done
done
