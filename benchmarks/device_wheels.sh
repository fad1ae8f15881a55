#!/usr/bin/env bash
# Wheels of what `python -m benchmarks.device_check` imports and the GPU machine's image lacks, for that machine's
# Python (3.12, x86-64), into .whl/ (git-ignored; carried with the device call, <= 64 MiB). The image has jax 0.11
# with the CUDA plugin, flax, optax, orbax, torch, transformers, tokenizers, safetensors, absl, etils, tqdm and
# PyYAML; of this project's dependencies the check needs only ml-collections besides them (checked on CPU by
# importing the check's stages with the others blocked). docs/benchmarks.md has the command to run there.
set -euo pipefail
cd "$(dirname "$0")/.."
MISSING=("ml-collections==1.1.0")
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "${MISSING[@]}"
ls -l .whl
echo "total: $(du -sh .whl | cut -f1) in .whl/"
