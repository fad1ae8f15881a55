#!/usr/bin/env bash
# Wheels of what `python -m gp_jax.main` and `python -m benchmarks.device_check` import and the GPU machine's image
# lacks, for that machine's Python (3.12, x86-64), into .whl/ (git-ignored; carried with the device call, <= 64 MiB
# with the tree). Then a check on this CPU: the trainer's imports, and a CLUENER-format corpus built through TFDS, with
# every installed distribution that is neither in the image (IMAGE, from /work/.library/device/KINDS.md) nor in WHEELS
# refused at import, so a wheel the device would lack fails here. docs/device/README.md has the device command.
#
#   bash benchmarks/device_wheels.sh           download, then check
#   bash benchmarks/device_wheels.sh --check   the check alone (GP_JAX_WHEELS_DROP="a b": pretend those are missing)
# PYTHON: the interpreter to check (and download with), default python3 from PATH; the tests pass their own.
set -euo pipefail
PYTHON="${PYTHON:-python3}"
cd "$(dirname "$0")/.."
WHEELS=("ml-collections==1.1.0" "tensorflow-datasets==4.9.10" "array-record==0.8.6" "dm-tree==0.1.10"
  "immutabledict==4.3.1" "simple-parsing==0.1.9" "docstring-parser==0.18.0" "tensorflow-metadata==1.21.0"
  "googleapis-common-protos==1.76.0" "termcolor==3.3.0" "toml==0.10.2" "tensorboardX==2.6.5"
  "importlib-resources==7.1.0")
SDISTS=("promise==2.3")  # no wheel on PyPI: built here (pure Python)
# The image 'cuda' of nvidia-h100-x1 / nvidia-h200 (KINDS.md, "Python packages already there", read 2026-11-17).
IMAGE="absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build certifi
charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core cuda-pathfinder
cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock flatbuffers flax fonttools
formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna
imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe
matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime
nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13
nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft
pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist
python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six sortedcontainers
statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm
tokenizers toolz torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope
triton typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp"

if [[ "${1:-}" != "--check" ]]; then
  rm -rf .whl && mkdir -p .whl
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "${WHEELS[@]}"
  "$PYTHON" -m pip wheel -q --no-deps -w .whl "${SDISTS[@]}"
  ls -l .whl
  echo "total: $(du -sh .whl | cut -f1) in .whl/ ($(ls .whl | wc -l) wheels)"
fi

ALLOWED="gp-jax $IMAGE ${WHEELS[*]%%==*} ${SDISTS[*]%%==*}"
for drop in ${GP_JAX_WHEELS_DROP:-}; do ALLOWED=$(tr ' ' '\n' <<<"$ALLOWED" | grep -vix -- "$drop" | tr '\n' ' '); done
GP_JAX_IMAGE_DISTS="$IMAGE" GP_JAX_ALLOWED_DISTS="$ALLOWED" JAX_PLATFORMS=cpu "$PYTHON" - <<'EOF'
"""Imports what the trainer imports, refusing every distribution outside GP_JAX_ALLOWED_DISTS and the image's."""
import importlib.abc
import importlib.machinery
import importlib.metadata
import os
import re
import sys
import tempfile

norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731
image = {norm(n) for n in os.environ["GP_JAX_IMAGE_DISTS"].split()}
allowed = {norm(n) for n in os.environ["GP_JAX_ALLOWED_DISTS"].split()}
todo = list(image)  # the image's packages come with their own requirements (as installed here; versions differ)
while todo:
  try:
    requires = importlib.metadata.requires(todo.pop()) or []
  except importlib.metadata.PackageNotFoundError:
    continue
  for req in requires:
    name = norm(re.match(r"[A-Za-z0-9._-]+", req).group())
    if "extra ==" not in req and name not in image:
      image.add(name)
      todo.append(name)
allowed |= image
owner = {}  # installed file -> its distribution
for dist in importlib.metadata.distributions():
  name = norm(dist.metadata["Name"])  # once a distribution: each .metadata parses METADATA again (~18,000 files)
  for f in dist.files or ():
    if f.suffix in (".py", ".so", ".pyd"):
      owner[os.path.realpath(dist.locate_file(f))] = name
refused = []


class Refuse(importlib.abc.MetaPathFinder):
  """Refuses a module whose file belongs to a distribution outside the allowed set (namespace packages pass)."""

  def find_spec(self, name, path=None, target=None):
    spec = importlib.machinery.PathFinder.find_spec(name, path)
    origin = getattr(spec, "origin", None)
    dist = owner.get(os.path.realpath(origin)) if origin and os.path.isabs(origin) else None
    if dist is not None and dist not in allowed:
      refused.append(f"{name} ({dist})")
      raise ModuleNotFoundError(f"{name}: distribution {dist} is neither in the GPU image nor in .whl/", name=name)
    return None


sys.meta_path.insert(0, Refuse())
import importlib  # noqa: E402
import pkgutil  # noqa: E402

import gp_jax  # noqa: E402
import gp_jax.main  # noqa: E402,F401

skip = ("gp_jax.main", "gp_jax.predict")  # absl CLIs: a second one would define its flags again
for mod in pkgutil.walk_packages(gp_jax.__path__, "gp_jax."):
  if not mod.name.startswith(skip):
    importlib.import_module(mod.name)
# Deferred imports on the trainer's path (tfds builds the corpus, transformers reads the tokenizer, ...).
for name in ("tensorflow_datasets", "transformers", "tokenizers", "safetensors", "tensorboardX", "orbax.checkpoint",
             "benchmarks.device_check"):
  importlib.import_module(name)

from gp_jax.data import corpora  # noqa: E402

with tempfile.TemporaryDirectory() as tmp:  # a three-record CLUENER through the TFDS builder (array_record)
  os.makedirs(f"{tmp}/data/cluener2020")
  for split in ("train", "dev", "test"):  # CLUENER's test split is unlabelled
    label = ', "label": {"name": {"叶老桂": [[9, 11]]}, "company": {"浙商银行": [[0, 3]]}}' if split != "test" else ""
    with open(f"{tmp}/data/cluener2020/{split}.json", "w", encoding="utf-8") as f:
      f.write(f'{{"text": "浙商银行企业信贷部叶老桂博士"{label}}}\n' * 3)
  records = list(corpora.load_split("cluener2020", "dev", manual_dir=f"{tmp}/data/cluener2020", data_dir=f"{tmp}/tfds"))
  assert len(records) == 3, records
if refused:
  print("refused imports (caught by their importers):", ", ".join(sorted(set(refused))))
print(f"import check: ok ({len(allowed)} distributions allowed)")
EOF
